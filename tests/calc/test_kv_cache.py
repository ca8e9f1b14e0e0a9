"""KV-cache formulas against hand-derived values and invariants (hypothesis)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tfcalc.calc.kv_cache import attention_variants, kv_bytes_per_token, kv_cache_bytes
from tfcalc.dtypes import get_dtype
from tfcalc.spec.model import MLASpec, ModelSpec
from tfcalc.spec.presets import load_model

BF16, FP8 = get_dtype("bf16"), get_dtype("fp8")


def test_llama3_70b_bytes_per_token_by_attention_kind() -> None:
    # 2 (K,V) x 80 layers x kv_heads x 128 head_dim x 2 bytes; the seed article's table: 2,621,440 / 327,680 / 40,960.
    spec = load_model("llama3-70b")
    got = {label.split()[0]: kv_bytes_per_token(variant, BF16) for label, variant in attention_variants(spec)}
    assert got == {"MHA": 2 * 80 * 64 * 128 * 2, "GQA": 2 * 80 * 8 * 128 * 2, "MQA": 2 * 80 * 1 * 128 * 2}
    assert got == {"MHA": 2_621_440, "GQA": 327_680, "MQA": 40_960}


def test_llama3_70b_fp8_cache_at_128k() -> None:
    # 163,840 B/token x 131,072 tokens = 20 GiB exactly.
    assert kv_cache_bytes(load_model("llama3-70b"), FP8, 131_072, 1) == 163_840 * 131_072 == 20 * 2**30


def test_deepseek_mla_caches_latent_not_heads() -> None:
    # (kv_lora_rank 512 + qk_rope_head_dim 64) x 61 layers x 2 bytes = 70,272 (DeepSeek-V2 paper sec. 2.1.2).
    spec = load_model("deepseek-v3")
    assert kv_bytes_per_token(spec, BF16) == (512 + 64) * 61 * 2 == 70_272
    mha = dict(attention_variants(spec))["MHA"]
    # Non-absorbed MLA stores K (128 nope + 64 rope) and V (128) for each of 128 heads: 40,960 elements per layer.
    assert kv_bytes_per_token(mha, BF16) == 128 * (192 + 128) * 61 * 2


def test_sliding_window_caps_gemma2_and_mistral() -> None:
    # Gemma 2 27B at 8192: 23 global layers hold 8192 tokens, 23 local layers hold 4096.
    gemma = load_model("gemma2-27b")
    per_layer = 2 * 16 * 128 * 2
    assert kv_cache_bytes(gemma, BF16, 8192) == per_layer * (23 * 8192 + 23 * 4096) == 2_315_255_808
    # Mistral 7B: every layer is windowed at 4096, so 32k context costs what 4k does.
    mistral = load_model("mistral-7b")
    assert kv_cache_bytes(mistral, BF16, 32_768) == kv_cache_bytes(mistral, BF16, 4096) == 131_072 * 4096
    # gpt-oss-120b at 128k: 18 layers of 128 tokens + 18 full layers (facts.md: 4,836,556,800 B).
    assert kv_cache_bytes(load_model("gpt-oss-120b"), BF16, 131_072) == 4_836_556_800


def test_block_scaled_kv_dtype_counts_scale_bits() -> None:
    # nvfp4: 4 bits + an 8-bit scale per 16 values = 4.5 bits; llama3-70b has 163,840 elements/token.
    spec = load_model("llama3-70b")
    assert kv_bytes_per_token(spec, get_dtype("nvfp4")) == 163_840 * 9 // 16


def _spec(heads: int, kv_heads: int, layers: int, head_dim: int, window: int | None = None) -> ModelSpec:
    return ModelSpec(name="t", vocab_size=100, hidden_size=heads * head_dim, num_layers=layers,
                     num_attention_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, intermediate_size=64,
                     sliding_window=window, sliding_window_layers=tuple(range(0, layers, 2)) if window else ())


shapes = st.tuples(st.sampled_from([1, 2, 4, 8, 16, 32, 64]), st.integers(1, 8), st.integers(1, 96),
                   st.sampled_from([32, 64, 80, 128, 256]), st.one_of(st.none(), st.integers(1, 8192)))


@given(shapes, st.integers(1, 200_000), st.integers(1, 200_000), st.integers(1, 512))
def test_cache_monotonic_in_context_and_linear_in_batch(shape, c1, c2, batch) -> None:
    heads, group, layers, head_dim, window = shape
    spec = _spec(heads * group, heads, layers, head_dim, window)
    lo, hi = sorted((c1, c2))
    assert kv_cache_bytes(spec, BF16, lo, batch) <= kv_cache_bytes(spec, BF16, hi, batch)
    assert kv_cache_bytes(spec, BF16, hi, batch) == batch * kv_cache_bytes(spec, BF16, hi, 1)
    assert kv_cache_bytes(spec, BF16, hi, batch) <= batch * hi * kv_bytes_per_token(spec, BF16)


@given(shapes, st.integers(1, 200_000))
def test_mqa_le_gqa_le_mha(shape, context) -> None:
    heads, group, layers, head_dim, window = shape
    spec = _spec(heads * group, heads, layers, head_dim, window)
    sizes = [kv_cache_bytes(variant, BF16, context) for _, variant in attention_variants(spec)]
    assert sizes == sorted(sizes, reverse=True)
    assert sizes[0] == kv_cache_bytes(replace(spec, num_kv_heads=spec.num_attention_heads), BF16, context)


def test_mla_spec_is_validated() -> None:
    from tfcalc.errors import SpecError

    with pytest.raises(SpecError, match="kv_lora_rank"):
        replace(load_model("deepseek-v3"), mla=MLASpec(q_lora_rank=None, kv_lora_rank=0, qk_nope_head_dim=128,
                                                        qk_rope_head_dim=64, v_head_dim=128))


def test_default_kv_format_follows_the_checkpoint_where_the_engine_does() -> None:
    """--kv-cache-dtype auto: TensorRT-LLM 1.0+, SGLang 0.5+ and vLLM 0.17+ take the format a ModelOpt checkpoint
    declares, vLLM 0.11 and gpt-fast keep the model dtype; with no engine, the checkpoint's. The pool then holds
    twice the tokens: an fp8 cache is half the bf16 bytes per token."""
    from tfcalc.calc.kv_cache import default_kv_dtype
    from tfcalc.spec.presets import load_engine

    base = replace(load_model("llama3-70b"), native_dtype="fp8_e4m3")
    declared = replace(base, checkpoint_kv_dtype="fp8")
    follows = {e: default_kv_dtype(declared, load_engine(e)).name
               for e in ("trtllm", "sglang", "vllm", "vllm@0.17", "vllm@0.11", "vllm@0.8", "gpt-fast")}
    assert follows == {"trtllm": "fp8_e4m3", "sglang": "fp8_e4m3", "vllm": "fp8_e4m3", "vllm@0.17": "fp8_e4m3",
                       "vllm@0.11": "bf16", "vllm@0.8": "bf16", "gpt-fast": "bf16"}
    assert default_kv_dtype(declared).name == "fp8_e4m3"
    assert default_kv_dtype(base, load_engine("trtllm")).name == "bf16"
    assert kv_bytes_per_token(declared, default_kv_dtype(declared)) * 2 == kv_bytes_per_token(base, get_dtype("bf16"))


def test_engine_checkpoint_dtype_key() -> None:
    """kv.checkpoint_dtype: optional, false by default, a one-line error for a non-boolean."""
    import yaml

    from tfcalc.errors import SpecError
    from tfcalc.spec.engine import engine_from_mapping
    from tfcalc.spec.presets import load_engine, preset_path

    data = yaml.safe_load(preset_path("engine", "vllm-0.21").read_text())
    data["kv"] = {**data["kv"], "checkpoint_dtype": "yes"}
    with pytest.raises(SpecError, match="kv.checkpoint_dtype") as caught:
        engine_from_mapping(data, "e.yaml", "e")
    assert "\n" not in str(caught.value)
    del data["kv"]["checkpoint_dtype"]
    assert not engine_from_mapping(data, "e.yaml", "e").kv.checkpoint_dtype
    assert load_engine("vllm").kv.checkpoint_dtype


# --- Gated DeltaNet (Qwen3-Next, Qwen3.5): no tokens cached, a fixed state per sequence -------------------------

QWEN35_27B_STATE = 48 * (3 * (2 * 16 * 128 + 48 * 128) * 2 + 48 * 128 * 128 * 4)


def test_qwen35_27b_cache_by_hand() -> None:
    """16 attention layers x K and V x 4 KV heads x 256 x 2 B per token; each of the 48 Gated DeltaNet layers holds
    3 conv rows of 2 x 16 x 128 + 48 x 128 channels (bf16) and 48 value heads' 128 x 128 state in float32 (the
    checkpoint's mamba_ssm_dtype), whatever the context; an fp8 KV cache leaves the states alone."""
    spec = load_model("qwen3.5-27b")
    assert kv_bytes_per_token(spec, BF16) == 16 * 2 * 4 * 256 * 2 == 65_536
    assert QWEN35_27B_STATE == 153_944_064
    assert kv_cache_bytes(spec, BF16, 32_768, 3) == 3 * (32_768 * 65_536 + QWEN35_27B_STATE)
    assert kv_cache_bytes(spec, FP8, 32_768, 1) == 32_768 * 32_768 + QWEN35_27B_STATE


def test_qwen3_next_state_follows_the_model_dtype() -> None:
    """No mamba_ssm_dtype in its config: vLLM keeps both states in the model's bf16 (--mamba-ssm-cache-dtype auto)."""
    spec = load_model("qwen3-next-80b-a3b")
    one_token = 12 * 2 * 2 * 256 * 2
    assert kv_cache_bytes(spec, BF16, 1, 1) - one_token == 36 * (3 * 8192 * 2 + 32 * 128 * 128 * 2) == 39_518_208


@given(st.integers(1, 1 << 20), st.integers(1, 1 << 16), st.integers(1, 64),
       st.sampled_from(["qwen3.5-27b", "qwen3-next-80b-a3b", "qwen3.5-35b-a3b"]))
def test_hybrid_cache_is_the_per_layer_sum(context: int, more: int, batch: int, name: str) -> None:
    """Brute force over the layers: an attention layer holds the context's K and V, a Gated DeltaNet layer its state;
    a longer context adds only attention-layer tokens (linear in batch)."""
    spec = load_model(name)
    la = spec.linear_attention
    assert la is not None
    elements = 2 * spec.num_kv_heads * spec.head_dim
    state = 3 * la.conv_dim * 2 + la.recurrent_state_elements * (4 if la.recurrent_state_dtype == "fp32" else 2)
    by_layer = sum(state if spec.is_linear_layer(i) else context * elements * 2 for i in range(spec.num_layers))
    assert kv_cache_bytes(spec, BF16, context, batch) == batch * by_layer
    grown = kv_cache_bytes(spec, BF16, context + more, batch) - kv_cache_bytes(spec, BF16, context, batch)
    assert grown == batch * more * kv_bytes_per_token(spec, BF16)


# --- Llama 4's chunked local attention ---------------------------------------------------------------------------

def _brute_keys(window: int | None, start: int, count: int, chunked: bool) -> int:
    """Keys attended, one (query, key) pair at a time: key j <= i inside the window or the query's chunk."""
    def visible(i: int, j: int) -> bool:
        if window is None:
            return True
        return j // window == i // window if chunked else i - j < window
    return sum(1 for i in range(start, start + count) for j in range(i + 1) if visible(i, j))


@given(window=st.one_of(st.none(), st.integers(1, 40)), start=st.integers(0, 90), count=st.integers(0, 90),
       chunked=st.booleans())
def test_keys_attended_equals_counting_the_mask(window: int | None, start: int, count: int, chunked: bool) -> None:
    from tfcalc.calc.kv_cache import keys_attended

    assert keys_attended(window, start, count, chunked) == _brute_keys(window, start, count, chunked)


def test_llama4_scout_decode_reads_its_chunk_and_caches_at_most_one() -> None:
    from tfcalc.calc.kv_cache import keys_read, tokens_held

    spec = load_model("llama4-scout-17b-16e")
    # layer 0 is chunked (8192), layer 3 NoPE with full attention
    assert [keys_read(spec, 0, c) for c in (1, 8192, 8193, 20000)] == [1, 8192, 1, 20000 - 16384]
    assert [keys_read(spec, 3, c) for c in (1, 8193, 20000)] == [1, 8193, 20000]
    assert tokens_held(spec, 0, 20000) == 8192 and tokens_held(spec, 3, 20000) == 20000
    # 12 NoPE layers hold all 131072 tokens, 36 chunked layers one 8192-token chunk: 8 KV heads x 128 x 2 x 2 B
    bf16 = get_dtype("bf16")
    assert kv_cache_bytes(spec, bf16, 131072) == (12 * 131072 + 36 * 8192) * 8 * 128 * 2 * 2


# --- Gemma 4: full layers of their own shape ---------------------------------------------------------------------

@given(st.integers(1, 1 << 20), st.integers(1, 64), st.sampled_from(["gemma4-31b", "gemma4-26b-a4b"]))
def test_gemma4_cache_is_the_per_layer_sum(context: int, batch: int, name: str) -> None:
    """Brute force over the layers: a sliding layer holds min(context, 1024) tokens of K and V over its KV heads of
    256, a global layer the whole context over its own KV heads of 512 (K and V apart, though V is K's projection)."""
    spec = load_model(name)
    local, full = 2 * spec.num_kv_heads * 256, 2 * spec.full_attention.num_kv_heads * 512
    by_layer = sum(min(context, 1024) * local if spec.is_sliding_layer(i) else context * full
                   for i in range(spec.num_layers))
    assert kv_cache_bytes(spec, BF16, context, batch) == batch * by_layer * 2
    assert kv_bytes_per_token(spec, BF16) == 2 * sum(local if spec.is_sliding_layer(i) else full
                                                     for i in range(spec.num_layers))


def test_gemma4_31b_by_hand_and_its_attention_variants() -> None:
    spec = load_model("gemma4-31b")
    # 50 sliding layers x 2 x 16 x 256 + 10 global x 2 x 4 x 512 elements, 2 bytes each
    assert kv_bytes_per_token(spec, BF16) == (50 * 8192 + 10 * 4096) * 2 == 901_120
    assert kv_cache_bytes(spec, BF16, 131072, 1) == (50 * 1024 * 8192 + 10 * 131072 * 4096) * 2  # 10.78 GiB
    sizes = {kind: kv_cache_bytes(variant, BF16, 65536, 1) for kind, variant in attention_variants(spec)}
    assert sizes["MQA"] < sizes["GQA"] < sizes["MHA"]
    mha = dict(attention_variants(spec))["MHA"]
    assert (mha.num_kv_heads, mha.full_attention.num_kv_heads) == (32, 32)


# --- DeepSeek-V4: a window on every layer, compressed entries on CSA / HCA layers ---------------------------------

def test_deepseek_v4_flash_fp8_cache_by_hand() -> None:
    """An fp8 entry is FlashMLA's record, 448 fp8 + 7 E8M0 scales + 64 x 2 bf16 + 1 pad = 584 B; a CSA indexer key 128
    fp8 + a 4-byte scale = 132 B. At 131,072 tokens: 43 layers x 128 window entries, 21 CSA layers x 32,768 (entry +
    key), 20 HCA layers x 1,024 entries; the compressors' fp32 states: 21 x (8 x 2,048 + 8 x 512) x 4 + 20 x 128 x
    1,024 x 4."""
    from tfcalc.calc.kv_cache import compressed_entry_bytes, state_exact_bytes_per_sequence

    spec = load_model("deepseek-v4-flash")
    assert compressed_entry_bytes(spec, FP8) == 448 + 7 + 128 + 1 == 584
    state = 21 * (8 * 2048 + 8 * 512) * 4 + 20 * 128 * 1024 * 4
    assert state_exact_bytes_per_sequence(spec) == state
    held = 43 * 128 * 584 + 21 * 32768 * (584 + 132) + 20 * 1024 * 584
    assert kv_cache_bytes(spec, FP8, 131_072, 2) == 2 * (held + state)
    assert kv_bytes_per_token(spec, FP8) == -(-(43 * 584 * 512 + 21 * 716 * 128 + 20 * 584 * 4) // 512)


def test_deepseek_v4_cache_counts_what_transformers_caches() -> None:
    """A small DeepSeek-V4 run by transformers 5.25 on the CPU: each layer keeps min(n, window - 1) window tokens
    between steps (tfcalc holds min(n, window): the token the next step writes, as vLLM's SWA cache does), and
    exactly as many compressed entries (and CSA indexer keys) as tfcalc counts, floor(n / ratio)."""
    import torch  # noqa: TID251 - test-only comparison with transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    from tfcalc.calc.kv_cache import compressed_held_bytes
    from tfcalc.spec.hf_config import spec_from_hf_config

    config = {"model_type": "deepseek_v4", "vocab_size": 64, "hidden_size": 64, "moe_intermediate_size": 32,
              "num_hidden_layers": 4, "num_attention_heads": 4, "head_dim": 32, "q_lora_rank": 16,
              "num_experts_per_tok": 2, "n_routed_experts": 4, "o_groups": 2, "o_lora_rank": 16, "index_n_heads": 2,
              "index_head_dim": 16, "index_topk": 4, "sliding_window": 8, "qk_rope_head_dim": 8, "num_hash_layers": 1,
              "layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                              "compressed_sparse_attention"],
              "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 16}}
    spec = spec_from_hf_config(config, origin="tiny.json", name="tiny")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config)).eval()
    for n in (3, 37, 64):
        with torch.no_grad():
            cache = model(torch.randint(0, 64, (1, n)), use_cache=True).past_key_values
        elements = 0
        for layer in cache.layers:
            assert layer.keys.shape[-2] == min(n, 8 - 1)
            elements += min(n, 8) * 32
            for entries in getattr(layer, "compressed_kv", {}).values():
                elements += entries.shape[1] * entries.shape[2]
        assert compressed_held_bytes(spec, BF16, n) == 2 * elements, n


@given(st.sampled_from(["deepseek-v4-flash", "deepseek-v4-pro"]), st.integers(1, 2_000_000),
       st.integers(1, 2_000_000), st.integers(1, 64))
def test_deepseek_v4_cache_monotonic_in_context_and_linear_in_batch(name: str, c1: int, c2: int, batch: int) -> None:
    spec = load_model(name)
    lo, hi = sorted((c1, c2))
    assert kv_cache_bytes(spec, FP8, lo, batch) <= kv_cache_bytes(spec, FP8, hi, batch)
    assert kv_cache_bytes(spec, FP8, hi, batch) == batch * kv_cache_bytes(spec, FP8, hi, 1)
    assert kv_cache_bytes(spec, FP8, hi, 1) <= hi * kv_bytes_per_token(spec, FP8) + kv_cache_bytes(spec, FP8, 0, 1)


def test_deepseek_v4_has_no_attention_variants_and_defaults_to_fp8() -> None:
    from tfcalc.calc.kv_cache import default_kv_dtype

    spec = load_model("deepseek-v4-pro")
    assert attention_variants(spec) == [("CSA/HCA", spec)]
    assert default_kv_dtype(spec).name == FP8.name
