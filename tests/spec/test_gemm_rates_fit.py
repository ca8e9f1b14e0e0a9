"""benchmarks/validation/gemm_rates_fit.py reads aiconfigurator's older wheels (one folder per engine release, CSV
tables) as well as 0.12's parquet layout: every release, its 16-bit rows as bf16, its input quantisation by (M, K)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def fit(benchmark_script: Callable[[str], ModuleType]) -> ModuleType:
    return benchmark_script("validation/gemm_rates_fit.py")


def _release(root: Path, engine: str, version: str, quant: bool) -> None:
    folder = root / "h100_sxm" / engine / version
    folder.mkdir(parents=True)
    (folder / "gemm_perf.txt").write_text(
        "framework,version,device,op_name,kernel_source,gemm_dtype,m,n,k,latency\n"
        f"X,{version},H100,gemm,torch_flow,float16,8,4096,4096,0.020\n"
        f"X,{version},H100,gemm,torch_flow,fp8,8,4096,4096,0.018\n")
    if quant:
        for name, ms in (("computescale", 0.007), ("scale_matrix", 0.002)):
            (folder / f"{name}_perf.txt").write_text(
                "framework,version,device,op_name,kernel_source,m,k,quant_dtype,latency\n"
                f"X,{version},H100,{name},torch_ops,8,4096,fp8,{ms}\n")


def test_older_wheels_give_every_release_with_its_quantisation(fit: ModuleType, tmp_path: Path) -> None:
    _release(tmp_path, "trtllm", "1.2.0rc5", quant=True)
    _release(tmp_path, "trtllm", "1.0.0rc3", quant=True)
    _release(tmp_path, "sglang", "0.5.6.post2", quant=True)   # SGLang's quantize tables are not comparable
    tables = list(fit._tables(tmp_path))
    assert [(s, e, v) for s, e, v, _, _ in tables] == [("h100_sxm", "trtllm", "1.0.0rc3"),
                                                       ("h100_sxm", "trtllm", "1.2.0rc5"),
                                                       ("h100_sxm", "sglang", "0.5.6.post2")]
    _, _, _, table, quant = tables[0]
    assert sorted(table.gemm_dtype) == ["bfloat16", "fp8"]
    assert quant == {(8, 4096): pytest.approx(9e-6)}   # computescale + scale_matrix, seconds
    assert tables[2][4] == {}

