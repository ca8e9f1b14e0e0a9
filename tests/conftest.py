"""Suite-wide settings: property tests run the same examples on every machine and are never timed."""

from hypothesis import settings

# CI machines are small and shared: a slow example must not fail a test (deadline=None), and a failure must
# reproduce on the next run (derandomize=True: examples come from a fixed seed).
settings.register_profile("tfcalc", deadline=None, derandomize=True, print_blob=True)
settings.load_profile("tfcalc")
