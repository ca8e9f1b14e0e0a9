"""tfcalc: transformer inference sizing (parameters, KV cache, memory) and profiling."""

__version__ = "0.1.0"
