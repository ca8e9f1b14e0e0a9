"""The bundled decoder: embedding, N pre-norm residual blocks, final norm, lm_head; prefill and decode.

Built from the calculator's :class:`~tfcalc.spec.model.ModelSpec` with random weights (no checkpoints), so
its parameter count and KV-cache bytes can be checked against ``tfcalc params`` and ``tfcalc kv-cache``.
Layout follows gpt-fast (pytorch-labs/gpt-fast model.py): static KV cache, fused QKV, a cache position kept
on the device, and separate ``prefill`` / ``decode_step`` entry points so decode can be captured in a CUDA
graph or ``torch.compile(mode="reduce-overhead")``.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor, nn

from tfcalc.errors import SpecError, UsageError
from tfcalc.model.layers import (
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

    def forward(self, x: Tensor, input_pos: Tensor, rope: Tensor, causal: Tensor, window: Tensor) -> Tensor:
        mask = window if self.sliding else causal
        x = x + self.post_attention_norm(self.attention(self.attention_norm(x), input_pos, rope, mask))
        return x + self.post_ffn_norm(self.ffn(self.ffn_norm(x)))


class Transformer(nn.Module):
    """Decoder-only transformer for one spec. Call :meth:`setup_caches` once, then :meth:`prefill` and
    :meth:`decode_step`; ``cache_pos`` (a device tensor) counts the tokens already in the cache."""

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
        self.attention_backend = attention_backend  # resolved by setup_caches when "auto"
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
        grid, reset the position to 0, and resolve an ``auto`` attention backend to the first of
        cudnn, flash, efficient, math that runs this model's attention call here."""
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
        self.register_buffer("rope", rope_table(spec, max_len, torch.promote_types(dtype, torch.float32), device),
                             persistent=False)  # [S, 2, D/2]
        self.register_buffer("positions", torch.arange(max_len, device=device), persistent=False)  # [S]
        self.cache_pos.zero_()
        if self.requested_backend == "auto" and device.type != "meta":
            args = (spec.num_attention_heads, spec.num_kv_heads, spec.head_dim, dtype, device)
            self.attention_backend = next(b for b in BACKEND_PREFERENCE if backend_works(b, *args))

    def kv_cache_bytes(self) -> int:
        """Bytes held by all layers' K and V tensors."""
        return sum(block.attention.kv_cache.nbytes for block in self.layers if block.attention.kv_cache)

    def expert_token_counts(self) -> dict[int, Tensor]:
        """Tokens routed to each expert [E] by the last forward, per MoE layer index."""
        return {i: block.ffn.expert_counts.clone() for i, block in enumerate(self.layers)
                if isinstance(block.ffn, MoE)}

    def forward(self, tokens: Tensor, input_pos: Tensor) -> Tensor:
        """tokens [B, T] at absolute positions input_pos [T] -> hidden states [B, T, hidden].

        Query at position p sees cache slots j <= p (and j > p - window on sliding layers); slots beyond
        the written ones are excluded by the same rule, so prefill, chunked prefill and decode share one mask.
        """
        q_pos, k_pos = input_pos[:, None], self.positions[None, :]
        causal = k_pos <= q_pos  # [T, S]
        window = causal & (k_pos > q_pos - (self.spec.sliding_window or self.max_len))
        rope = self.rope[input_pos]  # [T, 2, D/2]
        x = self.tok_embeddings(tokens)  # [B, T, hidden]
        with sdpa_context(self.attention_backend):
            for block in self.layers:
                x = block(x, input_pos, rope, causal, window)
        return self.norm(x)

    def prefill(self, tokens: Tensor, last_only: bool = False) -> Tensor:
        """Run tokens [B, T] after what the cache holds (a fresh prompt, or the next chunk of one) and
        advance the position by T. Returns logits [B, T, V], or [B, 1, V] with ``last_only``."""
        t = tokens.shape[1]
        start = int(self.cache_pos)
        if start + t > self.max_len:
            raise UsageError(f"prefill of {t} tokens at position {start} exceeds the cache ({self.max_len})")
        h = self.forward(tokens, self.positions[start:start + t])
        self.cache_pos += t
        return self.lm_head(h[:, -1:] if last_only else h)

    def decode_step(self, token: Tensor) -> Tensor:
        """One token per sequence, token [B, 1], at position ``cache_pos`` -> logits [B, 1, V].

        Static shapes and no host synchronisation (for dense models), so it can be captured; the caller keeps
        ``cache_pos < max_len``.
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
