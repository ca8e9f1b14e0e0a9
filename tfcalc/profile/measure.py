"""Measure one sweep point of the bundled decoder: prefill and decode timed separately, memory, experts touched.

Prefill: ``model.prefill`` of B random prompts of P tokens from an empty cache (TTFT = its median time).
Decode: G - 1 ``decode_step`` calls after an untimed prefill (the first generated token comes from the
prefill), so decode timing never includes prefill; TPOT = loop time / (G - 1). Each timed loop rewinds the
cache position to the end of the prompt rather than prefilling again.

Decode reads the live part of the cache (``tfcalc.model.transformer``): eager steps slice it (``live``); a
compiled step runs flex_attention over the live blocks (``flex``); ``static`` reads the whole cache.

Compiled decode (CUDA, dense models): ``torch.compile(decode_step, mode="reduce-overhead", fullgraph=True)``.
It is primed before any timing (compile, CUDA-graph warm-up and recording: three calls), and it counts as
compiled only if that raised nothing (a graph break or the recompile limit raises under ``fullgraph``) and
inductor skipped no CUDA graph (``counters["inductor"]["cudagraph_skips"]``, bumped for e.g. mutated
non-static inputs); otherwise decode runs eagerly (``live``) and the row says ``compiled: false``.

A sharded model (``tfcalc.model.parallel``) times its collectives in the same timed calls: the time spent in them
per prefill and per decode loop (median over the repeats, as the phases themselves) and how many there were.
Its caller keeps decode eager (collectives are timed on the host side of each call), and ``seed`` gives each
attention replica its own prompts.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tfcalc.model.fp8 import fp8_gemms
from tfcalc.model.layers import CAUSAL, LIVE, MASKED, OPEN
from tfcalc.model.parallel import Collectives
from tfcalc.model.transformer import Transformer
from tfcalc.profile.device import DTYPES, is_oom, torch_dtype  # noqa: F401 (DTYPES, torch_dtype: callers)
from tfcalc.profile.timing import Timing, summarize, time_call


@dataclass(frozen=True, kw_only=True)
class Measurement:
    prefill: Timing
    decode_loop: Timing
    decode_steps: int
    attn_backend: str
    compiled: bool
    decode_attention: str  # live / flex / static: how the timed decode steps read the cache
    fp8_gemm: str | None  # scaled_mm / dequantized when the weights are FP8
    peak_memory_bytes: int | None
    distinct_experts: dict[int, float] | None  # MoE layer -> mean distinct experts a decode step touched
    comm_prefill: Timing | None = None  # seconds in collectives per prefill (sharded models)
    comm_decode_loop: Timing | None = None  # seconds in collectives per decode loop of decode_steps steps
    collectives_prefill: int = 0  # collectives one prefill makes
    collectives_decode_loop: int = 0


def backend_available(model: Transformer, backend: str, device: torch.device) -> bool:
    """Whether SDPA can run any of this model's attention calls with ``backend`` here ("auto" always can).
    A backend that runs only some (flash takes no mask: prefill and live decode) runs those, and the row's
    ``attn_backend`` names what ran each phase."""
    if backend == "auto":
        return True
    calls = [(CAUSAL, False), (MASKED, False), (OPEN, True), (MASKED, True)]
    return any(model._probe(backend, kind, decode=decode) for kind, decode in calls)


Step = Callable[[torch.Tensor], torch.Tensor]
PRIMING_CALLS = 3  # CUDA-graph trees: the first call compiles and warms up, the second records, the third replays


def reduce_overhead(fn: Step) -> Step:
    return torch.compile(fn, mode="reduce-overhead", fullgraph=True)


def decode_fn(model: Transformer, token: torch.Tensor, rewind: Callable[[], object], compile_decode: bool,
              compiler: Callable[[Step], Step] | None = None) -> tuple[Step, bool]:
    """The decode step to time and whether it is compiled: ``compiler(model.decode_step)`` (default
    :func:`reduce_overhead` on CUDA), primed untimed with ``rewind()`` before each call, so that the compile,
    warm-up and capture never reach the timing whatever ``--warmup`` says. Eager ``decode_step`` when not asked,
    on the CPU by default, for MoE models (their dispatch reads expert counts back to the host: not capturable),
    or when compiling or capturing fails (with a warning saying why).

    The compiled function is kept on the model, so later rows of the sweep reuse it (a new shape recompiles once
    and, after the second, dynamically).
    """
    device = model.tok_embeddings.weight.device
    if compiler is None and device.type == "cuda":
        compiler = reduce_overhead
    model.decode_ran = model.decode_mode(compiled=False)
    if not compile_decode or compiler is None or model.spec.moe is not None or model.decode_attention == LIVE:
        return model.decode_step, False
    from torch._dynamo.utils import counters

    compiled = getattr(model, "compiled_decode_step", None)
    if compiled is None:
        compiled = compiler(model.decode_step)
        model.compiled_decode_step = compiled
    skips = counters["inductor"]["cudagraph_skips"]
    try:
        for _ in range(PRIMING_CALLS):
            rewind()
            compiled(token)
    except Exception as exc:
        if is_oom(exc):
            raise
        warnings.warn(f"decode runs eagerly: torch.compile failed ({type(exc).__name__}: "
                      f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''})", stacklevel=2)
        return model.decode_step, False
    if counters["inductor"]["cudagraph_skips"] != skips:
        warnings.warn("decode runs eagerly: inductor skipped its CUDA graph (TORCH_LOGS=cudagraphs says why)",
                      stacklevel=2)
        return model.decode_step, False
    model.decode_ran = model.decode_mode(compiled=True)
    return compiled, True


def _timed(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int, setup: Callable[[], object],
           comm: Collectives | None) -> tuple[Timing, Timing | None, int]:
    """``time_call`` of ``fn``, and with ``comm`` the seconds its collectives took per timed call (tallied
    between calls, after each call's own synchronisation) and how many it made."""
    if comm is None:
        return time_call(fn, device, warmup, repeats, setup=setup), None, 0
    tallies: list[tuple[float, int]] = []
    started = False

    def tallied_setup() -> None:
        nonlocal started
        if started:
            tallies.append((comm.seconds(), comm.calls))
        setup()
        comm.reset()
        started = True

    timing = time_call(fn, device, warmup, repeats, setup=tallied_setup)
    tallies.append((comm.seconds(), comm.calls))
    timed = tallies[warmup:]
    return timing, summarize([seconds for seconds, _ in timed]), timed[-1][1]


def measure(model: Transformer, batch: int, prompt_len: int, gen_len: int, backend: str, compile_decode: bool,
            warmup: int = 2, repeats: int = 5, expert_probe_steps: int = 8,
            compiler: Callable[[Step], Step] | None = None, seed: int = 0) -> Measurement:
    """Time prefill and decode of ``batch`` sequences (static cache of prompt_len + gen_len tokens)."""
    device = model.tok_embeddings.weight.device
    spec = model.spec
    comm = model.parallel.comm if model.parallel is not None else None
    model.requested_backend = backend
    model.setup_caches(batch, prompt_len + gen_len)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    prompt = torch.randint(1, spec.vocab_size, (batch, prompt_len), generator=generator).to(device)
    token = torch.randint(1, spec.vocab_size, (batch, 1), generator=generator).to(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    with torch.inference_mode():
        prefill, comm_prefill, calls_prefill = _timed(lambda: model.prefill(prompt, last_only=True), device, warmup,
                                                      repeats, model.reset, comm)
        steps = gen_len - 1

        # Decode starts after the prompt: prefill it once (untimed); before each timed loop only the position
        # is rewound, since the prompt's K/V stay in the cache and later slots are rewritten before use.
        model.reset()
        model.prefill(prompt, last_only=True)

        def rewind() -> None:
            model.cache_pos.fill_(prompt_len)

        step, compiled = decode_fn(model, token, rewind, compile_decode, compiler)

        def decode_loop() -> None:
            for _ in range(steps):
                step(token)

        decode, comm_decode, calls_decode = _timed(decode_loop, device, warmup, repeats, rewind, comm)
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        distinct = _probe_experts(model, prompt, token, min(steps, expert_probe_steps)) if spec.moe else None
    return Measurement(prefill=prefill, decode_loop=decode, decode_steps=steps, attn_backend=model.attention_backend,
                       compiled=compiled, decode_attention=model.decode_ran, fp8_gemm=fp8_gemms(model),
                       peak_memory_bytes=peak, distinct_experts=distinct, comm_prefill=comm_prefill,
                       comm_decode_loop=comm_decode, collectives_prefill=calls_prefill,
                       collectives_decode_loop=calls_decode)


def _probe_experts(model: Transformer, prompt: torch.Tensor, token: torch.Tensor, steps: int) -> dict[int, float]:
    """Mean number of distinct routed experts per MoE layer over ``steps`` decode steps (untimed)."""
    model.reset()
    model.prefill(prompt, last_only=True)
    totals: dict[int, float] = {}
    for _ in range(max(steps, 1)):
        model.decode_step(token)
        for layer, counts in model.expert_token_counts().items():
            if model.parallel is not None:  # each rank routed its own tokens: count over the deployment
                counts = model.parallel.total_expert_counts(counts)
            totals[layer] = totals.get(layer, 0.0) + float((counts > 0).sum())
    return {layer: total / max(steps, 1) for layer, total in totals.items()}
