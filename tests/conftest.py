"""Suite-wide settings: property tests run the same examples on every machine and are never timed."""

import pytest
from hypothesis import settings

# CI machines are small and shared: a slow example must not fail a test (deadline=None), and a failure must
# reproduce on the next run (derandomize=True: examples come from a fixed seed).
settings.register_profile("tfcalc", deadline=None, derandomize=True, print_blob=True)
settings.load_profile("tfcalc")


@pytest.fixture
def fixed_ceilings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Device ceilings injected into the profiler (copy 20 GB/s, matmul 100 GFLOP/s, as a small CPU measures
    them): a profile test would otherwise re-measure a 256 MiB copy and a matmul per dtype, about a second each
    on a loaded 2-core machine. Tests of the ceilings themselves do not use it."""
    from tfcalc.profile import sweep as profiler
    from tfcalc.profile.ceilings import Ceiling
    from tfcalc.profile.timing import Timing

    timing = Timing(median_s=1e-3, p25_s=1e-3, p75_s=1e-3, min_s=1e-3, repeats=1)

    def ceiling(name: str, dtype: str, value: float) -> Ceiling:
        return Ceiling(name=name, dtype=dtype, size=1 << 28 if name == "copy" else 1024, value=value, timing=timing)

    monkeypatch.setattr(profiler, "copy_bandwidth", lambda device: ceiling("copy", "uint8", 20e9))
    monkeypatch.setattr(profiler, "matmul_flops", lambda device, dtype: ceiling("matmul", str(dtype), 1e11))
    monkeypatch.setattr(profiler, "fp8_matmul_flops", lambda device: ceiling("matmul", "fp8_e4m3", 2e11))
