"""Measure one sweep point of the bundled decoder: prefill and decode timed separately, memory, experts touched.

Prefill: ``model.prefill`` of B random prompts of P tokens from an empty cache (TTFT = its median time).
Decode: G - 1 ``decode_step`` calls after an untimed prefill (the first generated token comes from the
prefill), so decode timing never includes prefill; TPOT = loop time / (G - 1). Each timed loop rewinds the
cache position to the end of the prompt rather than prefilling again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tfcalc.model.layers import backend_works
from tfcalc.model.transformer import Transformer
from tfcalc.profile.timing import Timing, time_call

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class Measurement:
    prefill: Timing
    decode_loop: Timing
    decode_steps: int
    attn_backend: str
    compiled: bool
    peak_memory_bytes: int | None
    distinct_experts: dict[int, float] | None  # MoE layer -> mean distinct experts a decode step touched


def torch_dtype(name: str) -> torch.dtype:
    from tfcalc.errors import UsageError

    if name not in DTYPES:
        raise UsageError(f"unknown profile dtype '{name}' (choose {', '.join(DTYPES)})")
    return DTYPES[name]


def backend_available(model: Transformer, backend: str, device: torch.device) -> bool:
    """Whether SDPA can run this model's attention with ``backend`` here ("auto" always can)."""
    if backend == "auto":
        return True
    spec, dtype = model.spec, model.tok_embeddings.weight.dtype
    return backend_works(backend, spec.num_attention_heads, spec.num_kv_heads, spec.head_dim, dtype, device)


def _decode_fn(model: Transformer, compile_decode: bool) -> tuple[Callable[[torch.Tensor], torch.Tensor], bool]:
    """``decode_step``, captured with ``torch.compile(mode="reduce-overhead")`` (CUDA graphs) when asked on CUDA.

    The compiled function is kept on the model, so later rows of the sweep reuse its graphs (a new batch size
    recompiles once).
    """
    if not compile_decode or model.tok_embeddings.weight.device.type != "cuda":
        return model.decode_step, False
    compiled = getattr(model, "compiled_decode_step", None)
    if compiled is None:
        compiled = torch.compile(model.decode_step, mode="reduce-overhead")
        model.compiled_decode_step = compiled
    return compiled, True


def measure(model: Transformer, batch: int, prompt_len: int, gen_len: int, backend: str, compile_decode: bool,
            warmup: int = 2, repeats: int = 5, expert_probe_steps: int = 8) -> Measurement:
    """Time prefill and decode of ``batch`` sequences (static cache of prompt_len + gen_len tokens)."""
    device = model.tok_embeddings.weight.device
    spec = model.spec
    model.requested_backend = backend
    model.attention_backend = backend
    model.setup_caches(batch, prompt_len + gen_len)
    generator = torch.Generator(device="cpu").manual_seed(0)
    prompt = torch.randint(1, spec.vocab_size, (batch, prompt_len), generator=generator).to(device)
    token = torch.randint(1, spec.vocab_size, (batch, 1), generator=generator).to(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    with torch.inference_mode():
        prefill = time_call(lambda: model.prefill(prompt, last_only=True), device, warmup, repeats, setup=model.reset)
        steps = gen_len - 1
        step, compiled = _decode_fn(model, compile_decode)

        # Decode starts after the prompt: prefill it once (untimed); before each timed loop only the position
        # is rewound, since the prompt's K/V stay in the cache and later slots are rewritten before use.
        model.reset()
        model.prefill(prompt, last_only=True)

        def rewind() -> None:
            model.cache_pos.fill_(prompt_len)

        def decode_loop() -> None:
            for _ in range(steps):
                step(token)

        try:
            decode = time_call(decode_loop, device, warmup, repeats, setup=rewind)
        except Exception:
            if not compiled:
                raise
            step, compiled = model.decode_step, False  # capture failed (e.g. data-dependent MoE dispatch)
            decode = time_call(decode_loop, device, warmup, repeats, setup=rewind)
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        distinct = _probe_experts(model, prompt, token, min(steps, expert_probe_steps)) if spec.moe else None
    return Measurement(prefill, decode, steps, model.attention_backend, compiled, peak, distinct)


def _probe_experts(model: Transformer, prompt: torch.Tensor, token: torch.Tensor, steps: int) -> dict[int, float]:
    """Mean number of distinct routed experts per MoE layer over ``steps`` decode steps (untimed)."""
    model.reset()
    model.prefill(prompt, last_only=True)
    totals: dict[int, float] = {}
    for _ in range(max(steps, 1)):
        model.decode_step(token)
        for layer, counts in model.expert_token_counts().items():
            totals[layer] = totals.get(layer, 0.0) + float((counts > 0).sum())
    return {layer: total / max(steps, 1) for layer, total in totals.items()}
