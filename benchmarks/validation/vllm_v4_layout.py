"""DeepSeek-V4's KV layout in tfcalc (calc.engine.v4_layout) against vLLM's own planner code.

Builds the cache specs vLLM's DeepSeek-V4 model declares (its SWA cache, the compressed MLA caches, the indexer keys
and the compressor states, as models/deepseek_v4 and v1/attention/backends/mla/sparse_swa.py construct them with the
fp8_ds_mla cache), runs that release's grouping, block allocation and "Maximum concurrency" functions on them, and
compares block ids per GiB and blocks per request with tfcalc's layout of the matching grouping. Needs a vLLM
release's Python sources importable (no GPU, no compiled extension), for example::

    pip download vllm==0.34.0 --no-deps -d /tmp/w && unzip -q /tmp/w/vllm-0.34.0-*.whl '*.py' -d /tmp/v034
    PYTHONPATH=/tmp/v034:$DEPS python benchmarks/validation/vllm_v4_layout.py

($DEPS: pydantic, msgspec and the other pure-Python packages its config modules import). Exits 1 on a mismatch.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tfcalc.calc.engine import v4_layout  # noqa: E402

GIB = 1 << 30
CASES = [(1_048_576, 16_384), (131_072, 8192), (65_536, 16_384), (30_000, 16_384), (13_528, 16_384), (200, 8192)]


def _spec(cls: type, **fields: object) -> object:
    """A vLLM spec from the fields this release's class has (tokens_per_state was compress_ratio before 0.31)."""
    names = {f.name for f in dataclasses.fields(cls)}
    if "tokens_per_state" in fields and "tokens_per_state" not in names:
        fields["compress_ratio"] = fields.pop("tokens_per_state")
    return cls(**{k: v for k, v in fields.items() if k in names})


def vllm_specs(ratios: list[int]) -> dict[str, object]:
    """Every layer's cache specs as vLLM's DeepSeek-V4 declares them (fp8_ds_mla, fp8 indexer keys)."""
    import torch
    from vllm.v1.kv_cache_interface import MLAAttentionSpec, SlidingWindowMLASpec

    common = {"num_kv_heads": 1, "max_tp_shards": 1, "alignment": 576}
    out: dict[str, object] = {}
    for i, ratio in enumerate(ratios):
        out[f"layers.{i}.swa"] = _spec(SlidingWindowMLASpec, block_size=64, head_size=512, dtype=torch.uint8,
                                       sliding_window=128, cache_dtype_str="fp8_ds_mla", state_content_bytes=584,
                                       model_version="deepseek_v4", **common)
        if ratio <= 1:
            continue
        out[f"layers.{i}.mla"] = _spec(MLAAttentionSpec, block_size=256, head_size=512, dtype=torch.uint8,
                                       tokens_per_state=ratio, cache_dtype_str="fp8_ds_mla",
                                       model_version="deepseek_v4", state_content_bytes=584, **common)
        overlap = 2 if ratio == 4 else 1
        out[f"layers.{i}.compressor"] = _spec(SlidingWindowMLASpec, block_size=4 if ratio == 4 else 8,
                                              head_size=2 * overlap * 512, dtype=torch.float32,
                                              sliding_window=overlap * ratio, **common)
        if ratio == 4:
            out[f"layers.{i}.indexer"] = _spec(MLAAttentionSpec, block_size=256, head_size=132, dtype=torch.uint8,
                                               tokens_per_state=4, **common)
            out[f"layers.{i}.indexer_compressor"] = _spec(SlidingWindowMLASpec, block_size=4, head_size=2 * 2 * 128,
                                                          dtype=torch.float32, sliding_window=8, **common)
    return out


def _config(max_model_len: int, in_flight: int) -> types.SimpleNamespace:
    layout = None
    try:
        from vllm.config.cache import _layout_from_name
        layout = _layout_from_name("BLHNC")
    except ImportError:
        pass
    ns = types.SimpleNamespace
    return ns(cache_config=ns(get_resolved_kv_cache_layout=lambda: layout, num_gpu_blocks_override=None),
              scheduler_config=ns(disable_hybrid_kv_cache_manager=False, max_num_batched_tokens=in_flight),
              model_config=ns(max_model_len=max_model_len), speculative_config=None, kv_transfer_config=None,
              parallel_config=ns(decode_context_parallel_size=1, prefill_context_parallel_size=1,
                                 dcp_kv_cache_interleave_size=1, cp_kv_cache_interleave_size=1),
              max_in_flight_tokens=in_flight, num_speculative_tokens=0)


def vllm_numbers(ratios: list[int], max_model_len: int, in_flight: int) -> tuple[str, int, int]:
    """(vLLM's grouping era, block ids in 64 GiB, blocks one request of max_model_len reserves)."""
    from vllm.v1.core import kv_cache_utils as utils
    from vllm.v1.kv_cache_interface import KVCacheConfig

    specs, cfg = vllm_specs(ratios), _config(max_model_len, in_flight)
    try:
        from vllm.v1.core import kv_cache_planning as planning  # 0.30+
    except ImportError:
        planning = utils
    if hasattr(planning, "_get_packed_kv_cache_groups"):  # 0.29+
        era = "outermost"
        groups = planning._get_packed_kv_cache_groups(cfg, specs)
        try:
            per_block = planning._get_kv_cache_bytes_per_block(groups, cfg.cache_config.get_resolved_kv_cache_layout())
        except TypeError:   # 0.29: the groups alone
            per_block = planning._get_kv_cache_bytes_per_block(groups)
        blocks = 64 * GIB // per_block
    else:
        era = "packed" if hasattr(utils, "_get_kv_cache_config_packed") else "tuple"
        groups = utils.get_kv_cache_groups(cfg, specs)
        blocks = utils.get_kv_cache_config_from_groups(cfg, groups, 64 * GIB).num_blocks
    concurrency = utils.get_max_concurrency_for_kv_cache_config(
        cfg, KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=groups))
    return era, blocks, round(blocks / concurrency)


def main() -> int:
    presets = Path(__file__).resolve().parents[2] / "presets" / "models"
    failures = 0
    for name in ("deepseek-v4-flash", "deepseek-v4-pro"):
        data = yaml.safe_load((presets / f"{name}.yaml").read_text())
        ca = data["compressed_attention"]
        ratios = [4 if i in ca["csa_layers"] else 128 if i in ca["hca_layers"] else 0
                  for i in range(data["num_layers"])]
        csa, hca = ratios.count(4), ratios.count(128)
        for context, in_flight in CASES:
            era, blocks, per_request = vllm_numbers(ratios, context, in_flight)
            for concurrency in ("weighted", "pages"):
                ours = v4_layout(len(ratios), csa, hca, 4, 128, 584, 132, (8192, 2048, 4096), 576, era, concurrency)
                mine = (64 * GIB // ours.bytes_per_block, ours.blocks_per_request(context, in_flight))
                if mine == (blocks, per_request):
                    break
            ok = mine == (blocks, per_request)
            failures += not ok
            print(f"{name:18} {era:9} L={context:>9,} in flight {in_flight:>6,}: vLLM {blocks:,} block ids / 64 GiB, "
                  f"{per_request:,} per request; tfcalc ({concurrency}) {mine[0]:,}, {mine[1]:,} "
                  f"{'ok' if ok else 'MISMATCH'}")
    print(f"{failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
