"""The bundled decoder: embedding, N pre- or post-norm residual blocks, final norm, lm_head; prefill and decode.

Built from the calculator's :class:`~tfcalc.spec.model.ModelSpec` with random weights (no checkpoints), so
its parameter count and KV-cache bytes can be checked against ``tfcalc params`` and ``tfcalc kv-cache``.
Layout follows gpt-fast (pytorch-labs/gpt-fast model.py): static KV cache, fused QKV, a cache position kept
on the device, and separate ``prefill`` / ``decode_step`` entry points so decode can be captured in a CUDA
graph or ``torch.compile(mode="reduce-overhead")``.

Decode attention (``decode_attention``) reads only the live part of the cache:

- ``live`` (eager): the step reads the position back to the host and attends over exactly the filled slots
  (a slice, then SDPA with no mask);
- ``flex`` (what ``auto`` picks inside ``torch.compile``): flex_attention with a block mask of the live blocks
  built on the device from the position, so the captured graph replays for every length and inductor's
  flash-decoding kernel loads only those blocks;
- ``static``: SDPA over the whole static cache with a mask (capturable, reads every slot; for comparison).
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import replace

import torch
from torch import Tensor, nn

from tfcalc.errors import SpecError, UsageError
from tfcalc.model.deltanet import GatedDeltaNet
from tfcalc.model.fp8 import FORMATS as FP8_FORMATS
from tfcalc.model.fp8 import quantize_block
from tfcalc.model.layers import (
    CAUSAL,
    CHUNK,
    FLEX,
    FRESH,
    LIVE,
    MASKED,
    OPEN,
    SDPA_BACKENDS,
    STATIC,
    Attention,
    FeedForward,
    MoE,
    Step,
    backend_works,
    check_kv_dtype,
    global_rope_table,
    live_block_mask,
    make_norm,
    rope_table,
    sdpa_context,
)
from tfcalc.model.mamba import Mamba2Mixer
from tfcalc.model.mla import MLAttention
from tfcalc.model.parallel import Collectives, Parallel, check_sharding, world_size
from tfcalc.model.scaling import layer_kind, scale_spec
from tfcalc.spec.model import ModelSpec

# Order "auto" tries: torch's own preference on CUDA (cuDNN first on Hopper with recent cuDNN), math last.
BACKEND_PREFERENCE = ("cudnn", "flash", "efficient", "math")
SINKS, SOFTCAP = "explicit (sinks)", "explicit (softcap)"  # what such layers run instead of SDPA
LINEAR, DELTANET, MAMBA = "linear", "gated deltanet", "mamba2"  # a recurrent layer's kind of call and what runs it
NO_MIXER = "no mixer"  # the call of a block without a token mixer (Nemotron-H's MLP and MoE blocks): none
RECURRENT = (GatedDeltaNet, Mamba2Mixer)  # token mixers holding a fixed per-sequence state instead of a KV cache
Mixer = Attention | MLAttention | GatedDeltaNet | Mamba2Mixer
DECODE_ATTENTION = ("auto", LIVE, FLEX, STATIC)


def make_mixer(spec: ModelSpec, layer: int) -> Mixer:
    """The token mixer of ``layer``: Gated DeltaNet or Mamba-2 on a linear-attention layer (by
    ``linear_attention.kind``), MLA where the spec has it, else softmax attention (a sliding window or none, RoPE or
    NoPE)."""
    la = spec.linear_attention
    if spec.is_linear_layer(layer) and la is not None:
        return Mamba2Mixer(spec) if la.kind == "mamba2" else GatedDeltaNet(spec)
    if spec.mla is not None:
        return MLAttention(spec, layer)
    return Attention(spec, spec.is_sliding_layer(layer), nope=layer in spec.nope_layers)


class TransformerBlock(nn.Module):
    """x + attn(norm(x)), then x + ffn(norm(x)) (pre-norm, GPT-2 / Llama). With ``norms_per_layer == 4``
    (Gemma 2, arXiv:2408.00118) each sub-layer's output is normed again before the residual add. On a
    linear-attention layer (``spec.is_linear_layer``) the token mixer in ``attention`` is a
    :class:`~tfcalc.model.deltanet.GatedDeltaNet` (Qwen3-Next, Qwen3.5) or a
    :class:`~tfcalc.model.mamba.Mamba2Mixer` (Nemotron-H); a NoPE layer (``spec.nope_layers``: Llama 4, Nemotron-H's
    attention) applies no RoPE. A Nemotron-H block holds one of the two halves (``spec.has_mixer`` /
    ``spec.has_ffn``, transformers NemotronHBlock): x + mixer(norm(x)) or x + ffn(norm(x)), one norm
    (``norms_per_layer == 1``); the missing half's ``attention`` or ``ffn`` (and its norm) is None, as in a DeciLM
    layer with a no-op attention (vLLM nemotron_nas.py). Each dense MLP is ``spec.ffn_width(layer)`` wide.
    Gemma 4's MoE layers (``moe.dense_mlp_beside``, 7 norms; transformers Gemma4TextDecoderLayer) run a dense MLP
    beside the experts: x + post(post_mlp(mlp(ffn_norm(x))) + post_moe(moe(x))), the MoE norming its experts' input
    itself and routing on x. ``norm_placement`` post (OLMo 2, EXAONE 4; transformers Olmo2DecoderLayer): x +
    norm(attn(x)), then x + norm(ffn(x)). Granite's ``residual_multiplier`` r: x + r attn(norm(x)), then
    x + r ffn(norm(x)). A parallel block (``spec.parallel_block``: Command R, transformers CohereDecoderLayer)
    runs both halves on one norm's output: x + attn(n) + ffn(n), n = norm(x)."""

    def __init__(self, spec: ModelSpec, layer: int, weights_dtype: str | None = None) -> None:
        super().__init__()
        beside = spec.is_moe_layer(layer) and spec.moe is not None and spec.moe.dense_mlp_beside
        mixer, ffn = spec.has_mixer(layer), spec.has_ffn(layer)
        shape = spec.layer_kind_spec(spec.is_sliding_layer(layer))
        la = spec.linear_attention
        if la is not None and la.kind == "kda" and spec.is_linear_layer(layer):
            raise SpecError(f"{spec.name}: the bundled model has no Kimi Delta Attention (KDA) layer; tfcalc params, "
                            "kv-cache, plan and estimate size it")
        k3 = [name for name, used in (("SiTU activation", spec.activation == "situ"),
                                      ("gated MLA", spec.mla is not None and spec.attention_output_gate),
                                      ("attention residuals", spec.attention_residual_block > 0),
                                      ("latent-MoE norm", spec.moe is not None and spec.moe.latent_norm)) if used]
        if k3:  # Kimi K3's parts
            raise SpecError(f"{spec.name}: the bundled model has no {', '.join(k3)}; tfcalc params, kv-cache, plan "
                            "and estimate size it")
        if shape.mla is None and shape.value_head_dim != shape.head_dim:
            raise SpecError(f"{spec.name}: the bundled model runs values as wide as keys, not values of "
                            f"{shape.value_head_dim} beside keys of {shape.head_dim} (v_head_dim)")
        if not (mixer and ffn):  # one pre-norm, its half's (Nemotron-H: 1 per layer; DeciLM: 1 of 2)
            if spec.norms_per_layer not in (1, 2) or spec.norm_placement != "pre":
                raise SpecError(f"{spec.name}: layer {layer} holds only {'a mixer' if mixer else 'an FFN'}, which the "
                                f"bundled model runs behind its one pre-norm (norms_per_layer 1 or 2), not "
                                f"{spec.norms_per_layer}")
        elif spec.norms_per_layer not in ((7,) if beside else (1,) if spec.parallel_block else (2, 4)):
            raise SpecError(f"{spec.name}: the bundled model supports 2 or 4 norms per layer (7 with an MoE beside "
                            f"a dense MLP), not {spec.norms_per_layer}")
        self.sliding = spec.is_sliding_layer(layer)
        pre = spec.norm_placement == "pre"  # "post": the inputs go un-normed, the two norms sit on the outputs
        self.attention_norm = (make_norm(spec, spec.hidden_size) if pre else nn.Identity()) if mixer else None
        self.linear = spec.is_linear_layer(layer)
        self.attention: Mixer | None = make_mixer(spec, layer) if mixer else None
        self.parallel = spec.parallel_block
        self.ffn_norm = ((make_norm(spec, spec.hidden_size) if pre else nn.Identity())
                         if ffn and not self.parallel else None)
        self.ffn: nn.Module | None = None
        if ffn:
            self.ffn = (MoE(spec, weights_dtype) if spec.is_moe_layer(layer)
                        else FeedForward(spec, spec.ffn_width(layer), spec.mlp_bias))
        post = spec.norms_per_layer >= 4 or not pre
        # Granite's residual_multiplier, None where it is 1: the usual block's forward stays what it was (a float
        # attribute read in forward would enter torch.compile's guards)
        self.residual = None if spec.residual_multiplier == 1.0 else spec.residual_multiplier
        self.post_attention_norm = make_norm(spec, spec.hidden_size) if post else nn.Identity()
        self.post_ffn_norm = make_norm(spec, spec.hidden_size) if post else nn.Identity()
        self.mlp = FeedForward(spec, spec.intermediate_size, spec.mlp_bias) if beside else None
        self.post_mlp_norm = make_norm(spec, spec.hidden_size) if beside else None
        self.post_moe_norm = make_norm(spec, spec.hidden_size) if beside else None

    def forward(self, x: Tensor, step: Step) -> Tensor:
        if self.parallel and self.attention is not None and self.attention_norm is not None and self.ffn is not None:
            normed = self.attention_norm(x)
            return x + self.attention(normed, step) + self.ffn(normed)
        if self.attention is not None and self.attention_norm is not None:
            x = x + self._scaled(self.post_attention_norm(self.attention(self.attention_norm(x), step)))
        if self.ffn is None or self.ffn_norm is None:
            return x
        if self.mlp is not None and self.post_mlp_norm is not None and self.post_moe_norm is not None:
            both = self.post_mlp_norm(self.mlp(self.ffn_norm(x))) + self.post_moe_norm(self.ffn(x))
            return x + self._scaled(self.post_ffn_norm(both))
        return x + self._scaled(self.post_ffn_norm(self.ffn(self.ffn_norm(x))))

    def _scaled(self, out: Tensor) -> Tensor:
        """A sub-layer's output as the residual adds it: times Granite's residual_multiplier (1 elsewhere)."""
        return out if self.residual is None else out * self.residual


def _shapes(attention: nn.Module, decode: bool) -> tuple[int, int, int, int]:
    """(query heads, KV heads, qk dim, v dim) of the SDPA calls a layer makes in one phase."""
    if isinstance(attention, MLAttention):
        return attention.call_shapes(decode)
    assert isinstance(attention, Attention)
    return attention.heads, attention.kv_heads, attention.head_dim, attention.head_dim


class Transformer(nn.Module):
    """Decoder-only transformer for one spec. Call :meth:`setup_caches` once, then :meth:`prefill` and
    :meth:`decode_step`; ``cache_pos`` (a device tensor) counts the tokens already in the cache.

    SDPA calls come in kinds (:mod:`tfcalc.model.layers`): CAUSAL for a prefill from an empty cache, MASKED for
    chunked prefill, windows longer than the prompt and static-cache decode, OPEN for live decode. Each gets its
    backend (``causal_backend``, ``masked_backend`` for prefill shapes; ``decode_backends`` per kind for decode
    shapes, which MLA's absorbed decode changes), resolved by :meth:`setup_caches`; :attr:`attention_backend`
    reports what each phase ran. A DSA layer (MLA with ``spec.sparse_indexer``) masks its prefill by the top-k
    choice (MASKED, never CAUSAL) and decodes over the k latents it gathers: OPEN live (all k visible), MASKED in
    static and flex decode (k of the whole static cache, of which early positions see fewer).
    """

    def __init__(self, spec: ModelSpec, attention_backend: str = "auto", decode_attention: str = "auto",
                 weights_dtype: str | None = None, parallel: Parallel | None = None) -> None:
        super().__init__()
        if attention_backend not in ("auto", *SDPA_BACKENDS):
            raise UsageError(f"unknown attention backend '{attention_backend}' "
                             f"(known: auto, {', '.join(SDPA_BACKENDS)})")
        if decode_attention not in DECODE_ATTENTION:
            raise UsageError(f"unknown decode attention '{decode_attention}' (known: {', '.join(DECODE_ATTENTION)})")
        self.spec = spec
        self.requested_backend = attention_backend
        self.decode_attention = decode_attention
        self.causal_backend: str | None = None  # None: a fresh prefill takes the masked call too
        self.masked_backend: str | None = None
        self.decode_backends: dict[str, str] = {}  # OPEN / MASKED -> backend, for decode shapes
        self.prefill_ran: tuple[str, ...] = ()  # the backends the last prefill ran
        self.decode_ran = LIVE  # the decode mode the profiler timed (FLEX when it compiled the step)
        self.tok_embeddings = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList()
        for i in range(spec.num_layers):
            block = TransformerBlock(spec, i, weights_dtype)
            if weights_dtype is not None:  # one block at a time: the peak stays one block above the FP8 model
                quantize_block(block, weights_dtype)
            if parallel is not None:  # this rank's slices, kept as each block is built (tfcalc.model.parallel)
                parallel.shard_block(block)
            self.layers.append(block)
        self.norm = make_norm(spec, spec.hidden_size)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        if spec.tie_word_embeddings:
            self.lm_head.weight = self.tok_embeddings.weight
        self.parallel = parallel
        if parallel is not None:
            parallel.shard_vocabulary(self)
        # Gemma: sqrt(hidden) rounded to the model's dtype (transformers' embed_scale.to(weight.dtype)), kept as a
        # Python float so that a captured step holds no CPU tensor
        self.embed_scale = float(torch.tensor(math.sqrt(spec.hidden_size), dtype=torch.get_default_dtype(),
                                              device="cpu")) if spec.embedding_scale_sqrt_hidden else None
        if spec.embedding_multiplier != 1.0:  # Granite: inputs_embeds * embedding_multiplier
            self.embed_scale = (self.embed_scale or 1.0) * spec.embedding_multiplier
        self.logits_scale = None if spec.logits_scaling == 1.0 else spec.logits_scaling  # Granite's; None where 1
        self.register_buffer("cache_pos", torch.zeros((), dtype=torch.long), persistent=False)
        self.max_len = 0

    # --- caches and backends ---------------------------------------------------------------------------------

    def setup_caches(self, batch: int, max_len: int, kv_dtype: torch.dtype | None = None) -> None:
        """Allocate each layer's cache (zeros: [batch, Hkv, max_len, D] K and V, a window's rolling buffer, or
        MLA's latent; a Gated DeltaNet or Mamba-2 layer's fixed conv and recurrent state instead; nothing for a block
        without a mixer), the RoPE table and the position grid, reset the position to 0, and resolve the attention
        backends (:meth:`resolve_backends`)."""
        weight = self.tok_embeddings.weight
        dtype, device = weight.dtype, weight.device
        kv_dtype = kv_dtype or dtype
        if kv_dtype != dtype:
            check_kv_dtype(kv_dtype, device)
        for block in self.layers:
            if isinstance(block.attention, RECURRENT):
                block.attention.state = block.attention.make_state(batch, dtype, device)
            elif block.attention is not None:
                block.attention.kv_cache = block.attention.make_cache(batch, max_len, kv_dtype, dtype, device)
        self.max_len = max_len
        rope_dim = self.spec.rotary_dim
        # fp32 (or wider) cos/sin: bf16 would round the angle of late positions (RoPE runs fused under compile)
        self.register_buffer("rope", global_rope_table(self.spec, max_len, torch.promote_types(dtype, torch.float32),
                                                       device), persistent=False)  # [S, 2, Dr/2]
        # the sliding layers' own table: Gemma 3's local base (unscaled), or Gemma 4's sliding head size
        local = self.spec.rope_local_theta
        sliding = (replace(self.spec, rope_theta=local, rope_scaling=None) if local is not None
                   else self.spec if self.spec.full_attention is not None else None)
        self.register_buffer("rope_local", None if sliding is None else rope_table(
            sliding, max_len, torch.promote_types(dtype, torch.float32), device, rope_dim), persistent=False)
        self.register_buffer("positions", torch.arange(max_len, device=device), persistent=False)  # [S]
        self.cache_pos.zero_()
        if device.type != "meta" and self._attention_layers():
            self.resolve_backends()

    def _attention_layers(self) -> list[Attention | MLAttention]:
        """The layers with softmax attention (all but the recurrent ones and those without a mixer)."""
        return [block.attention for block in self.layers if isinstance(block.attention, (Attention, MLAttention))]

    def _probe(self, backend: str, kind: str, decode: bool) -> bool:
        heads, kv_heads, qk, v = _shapes(self._attention_layers()[0], decode)
        weight = self.tok_embeddings.weight
        per_sequence = {"per_sequence": True} if self.spec.sparse_indexer is not None else {}  # DSA's top-k masks
        return backend_works(backend, heads, kv_heads, qk, weight.dtype, weight.device, kind=kind,
                             v_dim=None if v == qk else v, **per_sequence)

    def resolve_backends(self) -> None:
        """Pick the backend of each call kind: the requested one where it runs that kind here, else the first of
        cudnn, flash, efficient (fused) that does, math last. A prefill prefers a fused backend's MASKED call
        over a CAUSAL call on math, and a requested backend's MASKED call over another backend's CAUSAL one."""
        forced = () if self.requested_backend == "auto" else (self.requested_backend,)
        fused = tuple(b for b in BACKEND_PREFERENCE if b != "math")
        prefill = ([(kind, b) for b in forced for kind in (CAUSAL, MASKED)] + [(CAUSAL, b) for b in fused]
                   + [(MASKED, b) for b in (*fused, "math")] + [(CAUSAL, "math")])
        kind, backend = next(c for c in prefill if self._probe(c[1], c[0], decode=False))
        self.causal_backend = backend if kind == CAUSAL else None
        self.masked_backend = next(b for b in (*forced, *fused, "math") if self._probe(b, MASKED, decode=False))
        self.decode_backends = {k: next(b for b in (*forced, *fused, "math") if self._probe(b, k, decode=True))
                                for k in (OPEN, MASKED)}
        self.prefill_ran = self._ran(self.max_len, FRESH)

    def decode_mode(self, compiled: bool) -> str:
        """The decode mode a step runs: the requested one, or for ``auto`` FLEX when compiled, LIVE when eager."""
        if self.decode_attention != "auto":
            return self.decode_attention
        return FLEX if compiled else LIVE

    def _layer_calls(self, t: int, mode: str) -> list[tuple[str, str]]:
        """Per layer, for T new tokens in ``mode``: the kind of call it makes and what runs it."""
        calls = []
        for block in self.layers:
            attn = block.attention
            sparse = isinstance(attn, MLAttention) and attn.sparse  # DSA (see the class docstring)
            if attn is None:
                calls.append((NO_MIXER, ""))
            elif isinstance(attn, RECURRENT):
                calls.append((LINEAR, DELTANET if isinstance(attn, GatedDeltaNet) else MAMBA))
            elif mode == FLEX and not sparse:
                calls.append((FLEX, "flex"))
            elif attn.explicit:
                calls.append(("explicit", SINKS if attn.sinks is not None else SOFTCAP))
            elif (mode == FRESH and self.causal_backend and not sparse
                  and (attn.window is None or t <= attn.window)):
                calls.append((CAUSAL, self.causal_backend))
            elif mode in (FRESH, CHUNK):
                calls.append((MASKED, self.masked_backend or "auto"))
            else:
                kind = OPEN if mode == LIVE else MASKED
                calls.append((kind, self.decode_backends.get(kind, "auto")))
        return calls

    def _ran(self, t: int, mode: str) -> tuple[str, ...]:
        return tuple(sorted({backend for _, backend in self._layer_calls(t, mode) if backend}))

    @property
    def attention_backend(self) -> str:
        """What ran attention: one name when prefill and decode agree, else "X prefill / Y decode" (several
        names joined by "+" when layers differ, e.g. windowed layers on the masked call)."""
        if self.masked_backend is None:
            return self.requested_backend
        prefill, decode = "+".join(self.prefill_ran), "+".join(self._ran(1, self.decode_ran))
        return prefill if prefill == decode else f"{prefill} prefill / {decode} decode"

    def kv_cache_bytes(self) -> int:
        """Bytes held by all attention layers' KV caches (Gated DeltaNet and Mamba-2 states: :meth:`state_bytes`)."""
        return sum(attn.kv_cache.nbytes for attn in self._attention_layers() if attn.kv_cache is not None)

    def state_bytes(self) -> int:
        """Bytes of the recurrent (Gated DeltaNet, Mamba-2) layers' fixed per-sequence states (conv and recurrent)."""
        return sum(block.attention.state.nbytes for block in self.layers
                   if isinstance(block.attention, RECURRENT) and block.attention.state is not None)

    def expert_token_counts(self) -> dict[int, Tensor]:
        """Tokens routed to each expert [E] by the last forward, per MoE layer index."""
        return {i: block.ffn.expert_counts.clone() for i, block in enumerate(self.layers)
                if isinstance(block.ffn, MoE)}

    # --- forward -----------------------------------------------------------------------------------------------

    def forward(self, tokens: Tensor, input_pos: Tensor, mode: str, start: int | None = None) -> Tensor:
        """tokens [B, T] at absolute positions input_pos [T] -> hidden states [B, T, hidden].

        The query at position p sees keys at positions <= p (and > p - window on sliding layers, in p's chunk of
        window tokens on chunked ones), however the mode (FRESH, CHUNK, LIVE, STATIC, FLEX) lays them out;
        ``start`` is the host's copy of input_pos[0] (None in a compiled step).
        """
        t = tokens.shape[1]
        calls = self._layer_calls(t, mode)
        step = Step(input_pos, start, mode, self.rope[input_pos],
                    None if self.rope_local is None else self.rope_local[input_pos],
                    causal_call=self.causal_backend is not None)
        if mode == FLEX:
            caches = {(attn.kv_cache.length, attn.kv_cache.chunked) for attn in self._attention_layers()}
            for n, chunked in caches:  # a chunk's ring holds its chunk from slot 0: live slots 0..position mod n
                masks = step.chunk_block_masks if chunked else step.block_masks
                masks[n] = live_block_mask(self.cache_pos % n if chunked else self.cache_pos, n, input_pos.device)
        x = self.tok_embeddings(tokens)  # [B, T, hidden]
        if self.embed_scale is not None:
            x = x * self.embed_scale
        sdpa = {backend for kind, backend in calls if kind in (CAUSAL, MASKED, OPEN)}
        shared = sdpa.pop() if len(sdpa) == 1 else None  # one sdpa_kernel context (~8 us on the host) per forward
        with sdpa_context(shared) if shared else nullcontext():
            for block, (kind, backend) in zip(self.layers, calls, strict=True):
                own = kind in (CAUSAL, MASKED, OPEN) and not shared
                with sdpa_context(backend) if own else nullcontext():
                    x = block(x, step)
        return self.norm(x)

    def logits(self, h: Tensor) -> Tensor:
        """lm_head, divided by Granite's logits_scaling and soft-capped to c tanh(z / c) where the spec caps final
        logits (Gemma 2)."""
        z = self.lm_head(h)
        if self.logits_scale is not None:
            z = z / self.logits_scale
        cap = self.spec.final_logit_softcapping
        return z if cap is None else cap * torch.tanh(z / cap)

    def prefill(self, tokens: Tensor, last_only: bool = False) -> Tensor:
        """Run tokens [B, T] after what the cache holds (a fresh prompt, or the next chunk of one) and
        advance the position by T. Returns logits [B, T, V], or [B, 1, V] with ``last_only``.

        Reads the position back to the host once (prefill is not captured)."""
        t = tokens.shape[1]
        start = int(self.cache_pos)
        if start + t > self.max_len:
            raise UsageError(f"prefill of {t} tokens at position {start} exceeds the cache ({self.max_len})")
        mode = FRESH if start == 0 else CHUNK if t > 1 else self.decode_mode(compiled=False)
        h = self.forward(tokens, self.positions[start:start + t], mode, start)
        if mode == FRESH:
            self.prefill_ran = self._ran(t, mode)
        self.cache_pos += t
        return self.logits(h[:, -1:] if last_only else h)

    def decode_step(self, token: Tensor) -> Tensor:
        """One token per sequence, token [B, 1], at position ``cache_pos`` -> logits [B, 1, V].

        LIVE reads the position back to the host to slice the cache (eager only); FLEX and STATIC keep it on the
        device, with static shapes and no host synchronisation (for dense models), so the step can be captured:
        the only tensors written in place are module buffers (the caches, ``cache_pos``), which torch.compile
        marks as static inputs and CUDA-graph trees therefore allow to be mutated. The caller keeps
        ``cache_pos < max_len``.
        """
        mode = self.decode_mode(compiled=torch.compiler.is_compiling())
        start = int(self.cache_pos) if mode == LIVE else None
        h = self.forward(token, self.cache_pos.view(1), mode, start)
        self.cache_pos += 1
        return self.logits(h)

    def reset(self) -> None:
        """Start a new sequence: position 0 (stale cache entries are masked out or never read; Gated DeltaNet and
        Mamba-2 states, which carry everything before, are zeroed)."""
        self.cache_pos.zero_()
        for block in self.layers:
            if isinstance(block.attention, RECURRENT) and block.attention.state is not None:
                block.attention.state.reset()


def build_model(spec: ModelSpec, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                attention_backend: str = "auto", decode_attention: str = "auto", weights_dtype: str | None = None,
                seed: int | None = None, parallel: Parallel | None = None, **overrides: int | None) -> Transformer:
    """A randomly initialised :class:`Transformer` for ``spec`` scaled by ``overrides`` (see
    :func:`~tfcalc.model.scaling.scale_spec`: layers, hidden, heads, kv_heads, head_dim, intermediate, vocab,
    experts, experts_per_token, expert_intermediate), built directly in ``dtype`` on ``device`` (no float32 copy
    first); ``weights_dtype`` fp8 / fp8_block quantizes each block's matrices as it is built, and draws expert
    stacks one expert at a time (:mod:`tfcalc.model.fp8`). The meta device builds without memory, for counting.

    ``seed`` seeds torch's generators first, so that the same seed draws the same weights on the same kind of
    device; ``parallel`` keeps this rank's shard of that same model (:mod:`tfcalc.model.parallel`)."""
    if weights_dtype is not None and weights_dtype not in FP8_FORMATS:
        raise UsageError(f"unknown weights dtype '{weights_dtype}' (choose {', '.join(sorted(FP8_FORMATS))})")
    if spec.compressed_attention is not None:
        raise SpecError(f"{spec.name}: the bundled model does not run DeepSeek-V4's compressed attention (CSA/HCA) or "
                        "hyper-connections")
    if spec.sparse_indexer is not None and spec.sparse_indexer.kind != "dsa":
        raise SpecError(f"{spec.name}: the bundled model does not run MiniMax-M3's block-sparse attention (MSA)")
    spec = scale_spec(spec, **overrides)
    if parallel is not None:
        check_sharding(spec, parallel.tp, parallel.ep)
    if seed is not None:
        torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device), torch.no_grad():
            model = Transformer(spec, attention_backend, decode_attention, weights_dtype, parallel)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def check_fp8_sharding(spec: ModelSpec, tp: int, ep: int, weights_dtype: str | None) -> None:
    """Refuse, before any rank starts, FP8 block-scaled shards that do not fall on 128x128 blocks
    (:meth:`~tfcalc.model.fp8.FP8Weight.select`): each tp rank's sharding of the first block of each kind
    (:func:`~tfcalc.model.scaling.layer_kind`: dense / MoE, linear / attention, ...), built on the meta device (no
    memory; every replica slices alike). Per-tensor scales shard anywhere."""
    if weights_dtype is None or FP8_FORMATS[weights_dtype] != "fp8_block" or tp * ep == 1:
        return
    firsts: dict[str, int] = {}
    for i in range(spec.num_layers):
        firsts.setdefault(layer_kind(spec, i), i)
    layers = sorted(firsts.values())
    meta = torch.device("meta")
    for rank in range(tp):
        par = Parallel(tp=tp, ep=ep, rank=rank, world=world_size(tp, ep), comm=Collectives(meta))
        for layer in layers:
            with torch.device(meta), torch.no_grad():
                block = TransformerBlock(spec, layer, weights_dtype)
                quantize_block(block, weights_dtype)
                par.shard_block(block)


__all__ = ["Transformer", "TransformerBlock", "build_model", "check_fp8_sharding", "scale_spec"]
