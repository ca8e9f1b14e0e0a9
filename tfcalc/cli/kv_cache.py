"""``tfcalc kv-cache``: KV-cache bytes per token and for batch x context."""

from typing import Annotated

import typer

from tfcalc.cli.common import (
    BatchOpt,
    ConfigOpt,
    ContextOpt,
    FormatOpt,
    KvDtypeOpt,
    OutputOpt,
    PresetOpt,
    check_sweep_rows,
    handle_errors,
    parse_dtype_list,
    resolve_models,
    run_sweep,
)
from tfcalc.output import emit, pick, wide
from tfcalc.units import parse_sizes

COLUMNS = pick("model", "attention", wide("kv_heads", "head_dim", "layers", "linear_layers", "sliding_window"),
               "context", "batch", "kv_dtype", "kv_bytes_per_token", "state_bytes", "kv_cache_bytes",
               "kv_cache_bytes_uncapped", wide("exceeds_max_context"))


@handle_errors
def kv_cache(preset: PresetOpt = None, config: ConfigOpt = None, context: ContextOpt = None,
             batch: BatchOpt = ["1"],  # noqa: B006 - Typer reads the default, never mutates it
             kv_dtype: KvDtypeOpt = None,
             compare_attention: Annotated[bool, typer.Option(
                 "--compare-attention", help="Show the same model as MHA, as configured, and MQA.")] = False,
             fmt: FormatOpt = None, output: OutputOpt = None) -> None:
    """KV-cache bytes per token (all layers) and in total for batch x context, window caps applied."""
    from tfcalc.calc.kv_cache import linear_name
    from tfcalc.report.kv_cache import iter_kv_cache_rows, kv_cache_row_count

    specs = resolve_models(preset, config)
    contexts, batches = parse_sizes(context, "context"), parse_sizes(batch, "batch")
    kv_dtypes = parse_dtype_list(kv_dtype)
    total = check_sweep_rows(kv_cache_row_count(specs, contexts, batches, kv_dtypes, compare_attention))
    swept = run_sweep(iter_kv_cache_rows(specs, contexts, batches, kv_dtypes, compare_attention), total, "kv-cache")
    rows = swept.items
    columns = COLUMNS
    hidden = {key for key, unused in (
        ("kv_cache_bytes_uncapped", all(row["kv_cache_bytes"] == row["kv_cache_bytes_uncapped"] for row in rows)),
        ("state_bytes", all(row["state_bytes"] is None for row in rows))) if unused}  # no window caps, no states
    columns = pick(*(c.key if c.show == "always" and c.key not in hidden else wide(c.key) for c in COLUMNS))
    notes = ["bytes per token: K and V of one token in every layer; KV cache: batch x context with sliding-window "
             "layers holding at most their window. GiB = 2^30 bytes."]
    mla = [spec for spec in specs if spec.mla is not None
           and any(row["model"] == spec.name and str(row["attention"]).startswith("MLA") for row in rows)]
    if mla:  # DeepSeek-V2 paper sec. 2.1.2; DSA's indexer key: vLLM DeepseekV32IndexerCache (docs/calculator.md)
        from tfcalc.calc.kv_cache import indexer_key_bytes, sparse_mla_record
        from tfcalc.dtypes import get_dtype

        dsa = [s for s in mla if s.sparse_indexer is not None and s.sparse_indexer.kind == "dsa"]
        keys = "/".join(str(n) for n in sorted({indexer_key_bytes(s) for s in dsa}))
        records = "/".join(str(n) for n in sorted({int(sparse_mla_record(s, get_dtype("fp8_e4m3")) or 0)
                                                    for s in dsa}))
        notes.append("MLA caches no K and V: its bytes per token are the compressed latent and the shared RoPE key, "
                     "kv_lora_rank + qk_rope_head_dim values per MLA layer"
                     + (f"; DeepSeek Sparse Attention adds its indexer's {keys}-byte key per indexed layer, and an "
                        f"8-bit cache stores the latent as FlashMLA's {records}-byte record" if dsa else "") + ".")
    if any(str(row["sliding_window"]).startswith("chunks") for row in rows):
        notes.append("Chunked local attention (Llama 4): those layers attend within fixed chunks and hold at most "
                     "one chunk; vLLM frees earlier chunks, SGLang and TensorRT-LLM by default keep them.")
    if any(row["attention"] == "CSA/HCA" for row in rows):
        notes.append("DeepSeek-V4 (CSA/HCA): every layer holds its window; a CSA layer adds one entry and one indexer "
                     "key per 4 tokens, an HCA layer one entry per 128; the fixed state is its compressors' unfinished "
                     "windows in fp32. An fp8 entry is FlashMLA's 584-byte record.")
    kinds = dict.fromkeys(linear_name(spec) for spec in specs if spec.linear_attention is not None
                          and any(row["model"] == spec.name and row["state_bytes"] is not None for row in rows))
    if kinds:
        notes.append(f"{' and '.join(kinds)} layers cache no tokens: each sequence holds a fixed state instead "
                     "(fixed state: batch x its conv and recurrent states in every such layer), included in the KV "
                     "cache.")
    over = dict.fromkeys((r["model"], r["context"]) for r in rows if r["exceeds_max_context"])
    notes += [f"note: {model} context {context:,} exceeds its max context" for model, context in over]
    emit(rows, columns, fmt, output, title="KV cache", notes=tuple(notes))
    swept.finish()
