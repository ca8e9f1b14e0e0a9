"""The bundled decoder: embedding, N pre-norm residual blocks, final norm, lm_head; prefill and decode.

Built from the calculator's :class:`~tfcalc.spec.model.ModelSpec` with random weights (no checkpoints), so
its parameter count and KV-cache bytes can be checked against ``tfcalc params`` and ``tfcalc kv-cache``.
Layout follows gpt-fast (pytorch-labs/gpt-fast model.py): static KV cache, fused QKV, a cache position kept
on the device, and separate ``prefill`` / ``decode_step`` entry points so decode can be captured in a CUDA
graph or ``torch.compile(mode="reduce-overhead")``.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace

import torch
from torch import Tensor, nn

from tfcalc.errors import SpecError, UsageError
from tfcalc.model.layers import (
    CAUSAL,
    MASKED,
    SDPA_BACKENDS,
    Attention,
    FeedForward,
    KVCache,
    MoE,
    backend_works,
    check_kv_dtype,
    make_norm,
    rope_table,
    sdpa_context,
)
from tfcalc.spec.model import ModelSpec

# Order "auto" tries: torch's own preference on CUDA (cuDNN first on Hopper with recent cuDNN), math last.
BACKEND_PREFERENCE = ("cudnn", "flash", "efficient", "math")
SINKS = "explicit (sinks)"  # what a sink layer runs instead of SDPA


class TransformerBlock(nn.Module):
    """x + attn(norm(x)), then x + ffn(norm(x)) (pre-norm, GPT-2 / Llama). With ``norms_per_layer == 4``
    (Gemma 2, arXiv:2408.00118) each sub-layer's output is normed again before the residual add."""

    def __init__(self, spec: ModelSpec, layer: int) -> None:
        super().__init__()
        if spec.norms_per_layer not in (2, 4):
            raise SpecError(f"{spec.name}: the bundled model supports 2 or 4 norms per layer, "
                            f"not {spec.norms_per_layer}")
        self.sliding = spec.is_sliding_layer(layer)
        self.attention_norm = make_norm(spec, spec.hidden_size)
        self.attention = Attention(spec)
        self.ffn_norm = make_norm(spec, spec.hidden_size)
        self.ffn: nn.Module = (MoE(spec) if spec.is_moe_layer(layer)
                               else FeedForward(spec, spec.intermediate_size, spec.mlp_bias))
        post = spec.norms_per_layer == 4
        self.post_attention_norm = make_norm(spec, spec.hidden_size) if post else nn.Identity()
        self.post_ffn_norm = make_norm(spec, spec.hidden_size) if post else nn.Identity()

    def forward(self, x: Tensor, input_pos: Tensor, rope: Tensor, mask: Tensor | None, fresh: bool) -> Tensor:
        x = x + self.post_attention_norm(self.attention(self.attention_norm(x), input_pos, rope, mask, fresh))
        return x + self.post_ffn_norm(self.ffn(self.ffn_norm(x)))


class Transformer(nn.Module):
    """Decoder-only transformer for one spec. Call :meth:`setup_caches` once, then :meth:`prefill` and
    :meth:`decode_step`; ``cache_pos`` (a device tensor) counts the tokens already in the cache.

    Attention makes two kinds of SDPA call (:func:`tfcalc.model.layers.attend`): CAUSAL (``is_causal``, no mask)
    for a prefill from an empty cache, MASKED for decode, chunked prefill and windows longer than the prompt allow.
    Each kind gets its own backend (``causal_backend``, ``masked_backend``), resolved by :meth:`setup_caches`, and
    :attr:`attention_backend` reports what each phase ran.
    """

    def __init__(self, spec: ModelSpec, attention_backend: str = "auto") -> None:
        super().__init__()
        if spec.mla is not None:
            raise SpecError(f"{spec.name}: the bundled decoder does not implement MLA (DeepSeek multi-head "
                            "latent attention) yet; the calculator commands (params, kv-cache, memory) handle it")
        if attention_backend not in ("auto", *SDPA_BACKENDS):
            raise UsageError(f"unknown attention backend '{attention_backend}' "
                             f"(known: auto, {', '.join(SDPA_BACKENDS)})")
        self.spec = spec
        self.requested_backend = attention_backend
        self.causal_backend: str | None = None  # None: a fresh prefill takes the masked call too
        self.masked_backend: str | None = None
        self.prefill_ran: tuple[str, ...] = ()  # the backends the last prefill ran
        self.tok_embeddings = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(TransformerBlock(spec, i) for i in range(spec.num_layers))
        self.norm = make_norm(spec, spec.hidden_size)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        if spec.tie_word_embeddings:
            self.lm_head.weight = self.tok_embeddings.weight
        self.register_buffer("cache_pos", torch.zeros((), dtype=torch.long), persistent=False)
        self.max_len = 0

    def setup_caches(self, batch: int, max_len: int, kv_dtype: torch.dtype | None = None) -> None:
        """Allocate each layer's KV cache [batch, Hkv, max_len, D] (zeros), the RoPE table and the position
        grid, reset the position to 0, and resolve the attention backends (:meth:`resolve_backends`)."""
        weight = self.tok_embeddings.weight
        dtype, device = weight.dtype, weight.device
        kv_dtype = kv_dtype or dtype
        if kv_dtype != dtype:
            check_kv_dtype(kv_dtype, device)
        spec = self.spec
        for block in self.layers:
            block.attention.kv_cache = KVCache(batch, spec.num_kv_heads, max_len, spec.head_dim, kv_dtype,
                                               dtype, device)
        self.max_len = max_len
        # fp32 (or wider) cos/sin: bf16 would round the angle of late positions (RoPE runs fused under compile)
        self.register_buffer("rope", rope_table(spec, max_len, torch.promote_types(dtype, torch.float32), device),
                             persistent=False)  # [S, 2, D/2]
        self.register_buffer("positions", torch.arange(max_len, device=device), persistent=False)  # [S]
        self.cache_pos.zero_()
        if device.type != "meta":
            self.resolve_backends()

    def resolve_backends(self) -> None:
        """Pick the backend of each call kind: the requested one where it runs that kind here, else the first of
        cudnn, flash, efficient (fused) that does, math last. A prefill prefers a fused backend's MASKED call
        over a CAUSAL call on math, and a requested backend's MASKED call over another backend's CAUSAL one."""
        spec, weight = self.spec, self.tok_embeddings.weight
        args = (spec.num_attention_heads, spec.num_kv_heads, spec.head_dim, weight.dtype, weight.device)
        forced = () if self.requested_backend == "auto" else (self.requested_backend,)
        fused = tuple(b for b in BACKEND_PREFERENCE if b != "math")
        prefill = ([(kind, b) for b in forced for kind in (CAUSAL, MASKED)] + [(CAUSAL, b) for b in fused]
                   + [(MASKED, b) for b in (*fused, "math")] + [(CAUSAL, "math")])
        kind, backend = next(c for c in prefill if backend_works(c[1], *args, kind=c[0]))
        self.causal_backend = backend if kind == CAUSAL else None
        self.masked_backend = next(b for b in (*forced, *fused, "math") if backend_works(b, *args, kind=MASKED))
        self.prefill_ran = self._ran(self.max_len, fresh=True)

    def _layer_calls(self, t: int, fresh: bool) -> list[tuple[str, str]]:
        """Per layer, for T new tokens: the kind of call it makes (CAUSAL or MASKED) and what runs it."""
        window = self.spec.sliding_window or self.max_len
        calls = []
        for block in self.layers:
            if block.attention.sinks is not None:
                calls.append((MASKED, SINKS))
            elif fresh and self.causal_backend and (not block.sliding or t <= window):
                calls.append((CAUSAL, self.causal_backend))
            else:
                calls.append((MASKED, self.masked_backend or "auto"))
        return calls

    def _ran(self, t: int, fresh: bool) -> tuple[str, ...]:
        return tuple(sorted({backend for _, backend in self._layer_calls(t, fresh)}))

    @property
    def attention_backend(self) -> str:
        """What ran attention: one name when prefill and decode agree, else "X prefill / Y decode" (several
        names joined by "+" when layers differ, e.g. windowed layers on the masked call)."""
        if self.masked_backend is None:
            return self.requested_backend
        prefill, decode = "+".join(self.prefill_ran), "+".join(self._ran(1, fresh=False))
        return prefill if prefill == decode else f"{prefill} prefill / {decode} decode"

    def kv_cache_bytes(self) -> int:
        """Bytes held by all layers' K and V tensors."""
        return sum(block.attention.kv_cache.nbytes for block in self.layers if block.attention.kv_cache)

    def expert_token_counts(self) -> dict[int, Tensor]:
        """Tokens routed to each expert [E] by the last forward, per MoE layer index."""
        return {i: block.ffn.expert_counts.clone() for i, block in enumerate(self.layers)
                if isinstance(block.ffn, MoE)}

    def forward(self, tokens: Tensor, input_pos: Tensor, fresh: bool = False) -> Tensor:
        """tokens [B, T] at absolute positions input_pos [T] -> hidden states [B, T, hidden].

        Query at position p sees key slots j <= p (and j > p - window on sliding layers). ``fresh`` (the cache
        is empty, input_pos = 0..T-1): the keys are the T new tokens and full-attention layers take the causal
        call; otherwise the keys are the whole static cache, whose unwritten slots the same rule excludes, so
        chunked prefill and decode share one mask of static shape [T, S].
        """
        t = tokens.shape[1]
        calls = self._layer_calls(t, fresh)
        q_pos, k_pos = input_pos[:, None], (self.positions[:t] if fresh else self.positions)[None, :]
        causal = k_pos <= q_pos  # [T, keys]
        window = causal & (k_pos > q_pos - (self.spec.sliding_window or self.max_len))
        rope = self.rope[input_pos]  # [T, 2, D/2]
        x = self.tok_embeddings(tokens)  # [B, T, hidden]
        sdpa = {backend for _, backend in calls if backend != SINKS}
        shared = sdpa.pop() if len(sdpa) == 1 else None  # one sdpa_kernel context (~8 us on the host) per forward
        with sdpa_context(shared) if shared else nullcontext():
            for block, (kind, backend) in zip(self.layers, calls, strict=True):
                mask = None if kind == CAUSAL else window if block.sliding else causal
                with nullcontext() if shared or backend == SINKS else sdpa_context(backend):
                    x = block(x, input_pos, rope, mask, fresh)
        return self.norm(x)

    def prefill(self, tokens: Tensor, last_only: bool = False) -> Tensor:
        """Run tokens [B, T] after what the cache holds (a fresh prompt, or the next chunk of one) and
        advance the position by T. Returns logits [B, T, V], or [B, 1, V] with ``last_only``.

        Reads the position back to the host once (prefill is not captured; decode never does this)."""
        t = tokens.shape[1]
        start = int(self.cache_pos)
        if start + t > self.max_len:
            raise UsageError(f"prefill of {t} tokens at position {start} exceeds the cache ({self.max_len})")
        h = self.forward(tokens, self.positions[start:start + t], fresh=start == 0)
        self.prefill_ran = self._ran(t, fresh=start == 0)
        self.cache_pos += t
        return self.lm_head(h[:, -1:] if last_only else h)

    def decode_step(self, token: Tensor) -> Tensor:
        """One token per sequence, token [B, 1], at position ``cache_pos`` -> logits [B, 1, V].

        Static shapes and no host synchronisation (for dense models), so it can be captured: the position stays
        on the device, and the only tensors written in place are module buffers (the KV caches, ``cache_pos``),
        which torch.compile marks as static inputs and CUDA-graph trees therefore allow to be mutated. The caller
        keeps ``cache_pos < max_len``.
        """
        h = self.forward(token, self.cache_pos.view(1))
        self.cache_pos += 1
        return self.lm_head(h)

    def reset(self) -> None:
        """Start a new sequence: position 0 (stale cache entries are masked out)."""
        self.cache_pos.zero_()


def scale_spec(spec: ModelSpec, *, layers: int | None = None, hidden: int | None = None,
               heads: int | None = None, kv_heads: int | None = None, head_dim: int | None = None,
               intermediate: int | None = None, vocab: int | None = None, experts: int | None = None,
               experts_per_token: int | None = None, expert_intermediate: int | None = None) -> ModelSpec:
    """A scaled-down copy of ``spec`` (``spec.with_overrides``; ``layers`` trims per-layer patterns).

    ``experts_per_token`` is capped at ``experts``; a shared expert keeps its width unless
    ``expert_intermediate`` is given, which sets both.
    """
    names = {"hidden_size": hidden, "num_attention_heads": heads, "num_kv_heads": kv_heads, "head_dim": head_dim,
             "intermediate_size": intermediate, "vocab_size": vocab}
    changes: dict[str, object] = {k: v for k, v in names.items() if v is not None}
    moe = spec.moe
    if moe is not None and (experts or experts_per_token or expert_intermediate):
        e = experts or moe.num_experts
        moe = replace(moe, num_experts=e, experts_per_token=min(experts_per_token or moe.experts_per_token, e),
                      expert_intermediate_size=expert_intermediate or moe.expert_intermediate_size,
                      shared_expert_intermediate_size=(expert_intermediate or moe.shared_expert_intermediate_size)
                      if moe.num_shared_experts else 0)
        changes["moe"] = moe
    return spec.with_overrides(layers=layers, **changes)


def build_model(spec: ModelSpec, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                attention_backend: str = "auto", **overrides: int | None) -> Transformer:
    """A randomly initialised :class:`Transformer` for ``spec`` scaled by ``overrides`` (see :func:`scale_spec`:
    layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, experts, experts_per_token,
    expert_intermediate). The meta device builds without memory, for counting."""
    spec = scale_spec(spec, **overrides)
    with torch.device(device):
        model = Transformer(spec, attention_backend)
    return model.to(dtype=dtype).eval()
