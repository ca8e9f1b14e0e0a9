"""Which aiconfigurator reference points rest on kernel-table rows that no serving engine would time: written to
aiconfigurator_caveats.json, which validate.py reads to tag those points (docs/estimate-validation.md, twenty-second
round). Run with aiconfigurator installed (it reads its bundled tables):

    python benchmarks/validation/aic_caveats.py            # write the file
    python benchmarks/validation/aic_caveats.py --show     # the evidence, table by table

Caveats, each a mechanism of the collector or of aiconfigurator's model rather than of the engine:

- ``routing``: vLLM's and SGLang's MoE collectors route a DeepSeek-V3-style model (``n_group`` > ``topk_group``)
  through group-limited top-k with a zero correction bias, on synthetic logits in which every group ties. Ties go to
  the lowest-numbered groups and experts, so the timed rank (rank 0) receives 5 of each token's 8 rows at ep 8
  instead of 1 (``timed_rank_rows``; the tables' latencies follow that count from ep 2 to ep 256). TensorRT-LLM's
  collector routes with plain top-k and is unaffected.
- ``sliced``: a table row whose experts are sliced over more GPUs (moe_tp) is slower than the row sliced over half as
  many at the same tokens: each GPU does half the work, so a row more than 10 % slower (median over 64+ tokens) is a
  collection fault, not a kernel property.
- ``unsplit``: the shape's balanced-routing rows at moe_ep 2 are no faster than at moe_ep 1 (median over 4,096+
  tokens >= 0.9; each rank holds half the experts and computes half the rows, so ~0.5 is fair). SGLang's collector
  gives its Triton fused MoE the timed rank's tokens with remote expert IDs clamped to local expert 0
  (collector/sglang/collect_moe.py ``run_op``: ``topk_ids.clamp(min=0)``, zero weights), so every row of a token
  that reaches rank 0 is computed there; under its balanced top-2 of 8 (token t picks t and t + 4 mod 8) that is
  1, 1/2 and 1/4 of the ep-1 rows at ep 2, 4 and 8 instead of 1/2, 1/4 and 1/8, as Mixtral's rows show. The
  engine's kernel writes zeros for remote rows instead of computing them.
- ``interpolated``: the decode step's tokens B fall between two token counts n1 < B < n2 of the table across which
  the collector's power-law workload changes its loads (x^-a on [0.01, 2] while T k <= E, on [1, 0.8 T] above:
  n1 k <= E < B k), and aiconfigurator interpolates linearly between the two rows. Its price at B then blends a row
  of the lighter loads into one of the heavier loads B itself draws, short by up to s = (1 - w)(L2 - L1) / L(B) of
  the interpolated latency L(B) (w = (B - n1) / (n2 - n1), L1 and L2 the rows' latencies); a point is tagged where
  s >= ``INTERPOLATED_SHORTFALL`` (a fifth of the kernel: the accuracy goal's own margin).
- ``extrapolated``: the prefill's tokens T exceed the table's largest row n_max, and aiconfigurator holds that row's
  utilisation against its MoE roofline, L(n_max) R(T) / R(n_max) (aic-core perf_database/moe.rs: beyond the rows
  "the boundary util is held (k_tail=1)"; operators/moe.rs moe_sol: R = max(math, memory time)). Where the roofline
  is compute-bound at the two last rows and at T, as at every tagged point, that is L(n_max) T / n_max, and the
  utilisation drop below the row before equals the drop in time per token; where that drop is more than
  ``EXTRAPOLATED_DROP`` (one power-law draw lighter than its neighbours: gpt-oss-20b's SGLang rows on the H100 at
  moe_ep 4 take 5.74 ms at 12,288 tokens and 5.63 ms at 16,384; aiconfigurator prices 121,000 tokens at 41.57 ms,
  5.63 x 121,000 / 16,384), every token of the prefill inherits that draw's light loads. (Where the roofline is
  memory-bound at the last row the two readings part: bf16 experts of 2,048 x 512, 256 of them top-8, on the
  B200's TensorRT-LLM table are priced at 32,768 tokens 0.91x twice the 16,384-token row, the roofline's ratio.)
- ``unreduced``: a DeepSeek-V4 point at tp > 1. aiconfigurator's model (sdk/models/deepseek_v4.py) has no
  all-reduce after attention, and its attention module tables are timed on one GPU with the tp shapes, the
  all-reduce short-circuited at world size 1 (collector/sglang/collect_dsv4_attn.py ``_tp_load_model_patch``); the
  engines reduce the row-parallel wo_b's output (vLLM, SGLang: RowParallelLinear with reduce_results). Its TTFT and
  TPOT leave out one all-reduce of tokens x hidden x 2 bytes per layer.
- ``older``: the point's engine version has no rows for its MoE layout (moe_tp x moe_ep), and aiconfigurator fills
  the gap from the nearest earlier version that has them (aiconfigurator_core/sdk/perf_database.py: "older versions
  fill only missing shapes") -- another release's kernel. Tagged where the two versions disagree on the nearest
  layout both hold by more than ``OLDER_DISAGREEMENT`` (median latency ratio over its token counts): the borrowed
  rows then time a kernel the point's engine no longer runs (vLLM 0.24's bf16 MoE on the B200 runs Qwen3-30B-A3B's
  experts at moe_tp 2 in 0.74x the time of vLLM 0.22's, median over token counts, 0.58x at 8,192 tokens; vLLM 0.22's
  moe_tp 4 rows price the point).
- ``dsa_extrapolated``: a DeepSeek Sparse Attention model (DeepSeek-V3.2, GLM-5) whose prefill of prompts longer than
  the indexer's top-k holds more than ``DSA_EXTRAPOLATED`` times the tokens of the engine's largest such
  dsa_context_module row: aiconfigurator prices the attention far outside what the collector timed, and not in
  proportion to the work (SGLang 0.5.14's rows stop at 8,192 tokens on the H200; its context attention for
  DeepSeek-V3.2 at 6,000-token prompts grows 1.8x from 4 prompts to 24, vLLM's 6.3x).
- ``untuned``: vLLM's per-tensor FP8 experts (ModelOpt checkpoints) on Hopper, whose rows in aiconfigurator's vLLM
  table are FlashInfer's CUTLASS fused MoE (kernel_source ``..._flashinfer_cutlass_...``). A vLLM server tunes that
  kernel's tactics at start-up (vllm/model_executor/warmup/kernel_warmup.py ``flashinfer_autotune``, SM 9.0+ by
  default); aiconfigurator's vLLM collector (collector/vllm/collect_moe.py) calls no autotune, so the rows time
  FlashInfer's heuristic tactics. Tagged where they are more than ``UNTUNED_EXCESS`` times TensorRT-LLM's autotuned
  rows of the same shape and layout (``autotuned_ratio``, median over token counts; Nemotron 3 Super's experts on an
  H200 at moe_tp 2: 5.2x); vLLM's bf16 FlashInfer CUTLASS rows of Gemma 4 on a B200 are 1.1x, not tagged.
- ``untuned_gemm``: a TensorRT-LLM NVFP4 point of a dense transformer on Blackwell whose decode step aiconfigurator
  prices from NVFP4 gemm rows timed on the CUTLASS kernel's fallback tactic. Its collector (collector/trtllm/
  collect_gemm.py run_gemm) times ``Linear.forward`` with a bf16 input and no ``autotune()`` context; the linear's
  ``trtllm::nvfp4_gemm`` asks ``AutoTuner.choose_one``, which outside tuning mode and without a cache entry returns
  the fallback (tensorrt_llm/_torch/autotuner.py), ("cutlass", -1) in NVFP4GemmUnifiedRunner.forward
  (custom_ops/torch_custom_ops.py), whose C++ runner then takes getDefaultGemmConfig: one 128 x 256 tile, cluster
  1 x 1 (thop/fp4Gemm.cpp). trtllm-serve tunes at start-up (pyexecutor/model_engine.py _run_autotuner_warmup:
  ``with autotune()``). The rows are no function of the weights up to one wave of tiles: on the B200 at 8 tokens and
  K = 8,192 they take 21.6 us at N = 128 and 23.3 us at N = 12,288 (96x the weights), then 69.7 us at 65,536. The
  excess per projection: its price less [the 128 x 128 row + the 65,536-wide row of its K x N / 65,536] (the rows'
  own throughput where the fallback tile fills the GPU, floor included), over the layers; tagged where it is more
  than ``UNTUNED_GEMM_SHARE`` of the TPOT.
- ``msa_disordered``: a MiniMax-M3 point whose engine's msa_context_module rows (its query heads per GPU, its GEMM
  format) are no function of the work: some row takes more than ``MSA_DISORDER`` times a row with at least as many
  sequences of at least as long prompts. TensorRT-LLM 1.3.0rc23's B200 rows (kernel_source msa_fmha_sm100, timed
  eagerly: collector/trtllm/collect_msa_module.py ``use_cuda_graph = not (msa_fmha_sm100 and is_context)``, the
  indexer planning fmha_sm100 with host-side work in the timed loop) jump between 3 and 490 ms: at 16 heads two
  one-token prompts take 35.2 ms and two of 32 tokens 3.2 ms; one prompt of 16,384 tokens 80.3 ms, of 32,768 37.0.
- ``msa_extrapolated``: a MiniMax-M3 point whose prefill holds more sequences than any msa_context_module row of the
  engine at prompts at least as long (the collector caps sequences x tokens), where those rows' time per sequence
  grows with the sequences (by more than ``MSA_GROWTH`` from one sequence to the most): aiconfigurator prices
  the batch beyond its rows for less than its rows' per-sequence time. TensorRT-LLM's H200 rows (its Triton MSA
  path, per-query FP32 copies of the keys) hold 1-32 prompts of 3,072 tokens at 11.4-12.8 ms each; at 64 prompts
  of 3,000 aiconfigurator prices the layer at 557 ms, 8.7 ms a prompt.
- ``min_latency``: a TensorRT-LLM point with NVFP4 experts whose decode step (at most 128 tokens, gated experts)
  aiconfigurator prices from the table's TRTLLM-gen min-latency rows (kernel_source ``moe_torch_flow_min_latency``;
  aic-core operators/moe.rs probes that grid first for nvfp4 at <= 128 tokens). Its collector times that kernel only
  on SM100 for at most 256 experts (collector/trtllm/collect_moe.py), so B200 and GB200 points of such shapes get it,
  B300 ones and Kimi K2.5's 384 experts the CUTLASS rows. TensorRT-LLM runs it only when asked (moe_config.backend
  TRTLLM): its default, AUTO, resolves NVFP4 experts to CUTLASS (tensorrt_llm/_torch/model_config.py
  resolve_moe_backend), which takes 1.3-4x the min-latency kernel's time on the same rows.
- ``double_reduce``: a vLLM point at tp > 1 of a model aiconfigurator prices with its DeepSeek model (families
  DEEPSEEK and KIMIK25: DeepSeek-V3, Kimi K2, Kimi K2.5). sdk/models/deepseek.py adds vLLM's two all-reduces per
  layer (``context_tp_allreduce`` / ``generation_tp_allreduce``) beside its MoE pre- and post-dispatch ops, which on
  vLLM are custom all-reduces of their own (aic-core operators/moe_dispatch.rs: the pre-dispatch one is "a proxy for
  the attention-output all-reduce", skipped only where the model sets ``attn_ar_modeled``, which this model does
  not): four all-reduces of the hidden states per layer where vLLM runs two, o_proj's and the MoE block's
  (vllm/model_executor/models/deepseek_v2.py: RowParallelLinear reduces o_proj, DeepseekV2MoE.forward reduces the
  routed and shared experts' sum once). Tagged only where no other caveat applies.
- ``ssm_unmeasured``: a Mamba-2 model (Nemotron-H) whose decode step, as tfcalc counts it, spends more than
  ``SSM_STATE_SHARE`` of its bytes reading and writing the sequences' SSM states: aiconfigurator's mamba2 tables hold
  only the causal-conv kernels (causal_conv1d_fn / _update), and its price for the scan and the state update is all
  but nothing (Nemotron-H 56B at tp 2, 64 sequences: 1 us per layer and step, where reading and writing 64 states of
  128 heads x 64 x 256 fp32 takes about 0.2 ms on an H200).
- ``kda_conv``: a Kimi Delta Attention model (Kimi K3) whose prefill aiconfigurator prices with a KDA convolution row
  that times a host path, where that row's excess over the kernel is more than ``KDA_CONV_SHARE`` of the point's
  TTFT. Its vLLM KDA collector (collector/vllm/collect_kda.py run_kda_context_benchmark) calls causal_conv1d_fn three
  times per layer without the step's metadata and outside CUDA graphs, so each call copies query_start_loc to the
  host, builds its program map in numpy and copies it back (vllm/model_executor/layers/mamba/ops/causal_conv1d.py,
  ``metadata is None``): 0.45 ms per layer at 1 token on the B300 (systems/data/b300_sxm/kda/vllm/0.1.dev19262,
  causal_conv1d_fn_qkv3). vLLM's KDA layer passes ``metadata=attn_metadata`` (vllm/model_executor/layers/kda.py
  KimiDeltaAttention._forward), built once per step; SGLang's own rows of the kernel (kda/sglang/0.5.16) take 7-21
  us. SGLang 0.5.14, the version aiconfigurator runs, has no KDA table, and its points take the vLLM rows too. The
  excess: (the row the point's engine version queries - SGLang 0.5.16's row) x the KDA layers.
- ``gdn_tp_table``: a TensorRT-LLM point of a Gated DeltaNet model at tp > 1. aiconfigurator's TensorRT-LLM gdn_perf
  tables (systems/data/*/linear_attention/trtllm/1.3.0rc20) hold one head shape per d_model, the unsharded one
  (16 key heads), while its model asks for the GPU's heads (sdk/models/qwen35.py ``gdn_nk_per_tp`` /
  ``gdn_nv_per_tp``). The shape is then filled across engines (systems/perf_data_reuse_manifest.yaml: causal_conv1d_fn
  and chunk_gated_delta_rule ``tier: shared`` for sglang, trtllm and vllm; perf_database/source_resolution.rs channel
  4 takes the other frameworks in sorted order, sglang first) from SGLang 0.5.14's rows, whose scan costs 4.3x
  TensorRT-LLM's own rows at the unsharded shape (Qwen3.5-122B's 16 / 64 heads, 24 x 2,000 tokens on the H200: 21.1
  against 4.95 ms). TensorRT-LLM's own rows are a function of the heads (d_model 4,096, 16 x 2,048 tokens: 1.78 ms at
  32 value heads, 3.38 at 64), so the excess is the borrowed rows (scan and conv) less TensorRT-LLM's own at the
  unsharded shape x (the GPU's value heads / the model's), over the GDN layers; tagged where it is more than
  ``GDN_TP_SHARE`` of the TTFT.
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "aiconfigurator_caveats.json"
# the engines whose MoE collector routes grouped models through group-limited top-k (collector/vllm/collect_moe.py
# use_grouped_topk for deepseek_v3; collector/sglang/collect_moe.py use_grouped_topk); TensorRT-LLM's uses
# RenormalizeMoeRoutingMethod outside its min-latency mode (collector/trtllm/collect_moe.py)
GROUPED_ROUTING_ENGINES = frozenset({"vllm", "sglang"})
SLICED_EXCESS = 1.10
UNSPLIT_RATIO = 0.9
INTERPOLATED_SHORTFALL = 0.2
OLDER_DISAGREEMENT = 0.2
DSA_EXTRAPOLATED = 4.0
SSM_STATE_SHARE = 0.2
# the engines that tune FlashInfer's MoE tactics at start-up while aiconfigurator's collector for them does not
# (vllm kernel_warmup.flashinfer_autotune; SGLang leaves flashinfer_cutlass out of its autotune list)
AUTOTUNING_ENGINES = frozenset({"vllm"})
UNTUNED_EXCESS = 1.25
EXTRAPOLATED_DROP = 0.2
MSA_DISORDER = 2.0
MSA_GROWTH = 0.05
KDA_CONV_SHARE = 0.05  # a quarter of the accuracy goal's 20 %
KDA_KERNEL_VERSION = "0.5.16"  # SGLang's KDA table: the conv kernel without a host path
GDN_TP_SHARE = 0.05  # a quarter of the accuracy goal's 20 %, as KDA_CONV_SHARE
UNTUNED_GEMM_SHARE = 0.05  # a quarter of the accuracy goal's 20 %, as KDA_CONV_SHARE
UNTUNED_GEMM_TOP_N = 65536  # the widest N of aiconfigurator's gemm tables (collector common_test_cases)
# aiconfigurator's model families whose vLLM model prices its all-reduces twice (sdk/models/deepseek.py)
DOUBLE_REDUCE = frozenset({"DEEPSEEK", "KIMIK25"})


def timed_rank_rows(experts: int, top_k: int, groups: int, groups_per_token: int, ep: int,
                    tokens: int = 1024) -> float:
    """Rows per token that rank 0 (experts 0 .. E/ep - 1) computes when the collector's balanced logits (token t
    picks experts (t + j ceil(E/k)) mod E, j < k) go through sigmoid scoring and group-limited top-k with zero bias,
    ties to the lowest index: brute force over ``tokens`` tokens. Fair routing gives k / ep."""
    import numpy as np

    stride = -(-experts // top_k)
    picked = (np.arange(tokens)[:, None] + np.arange(top_k)[None, :] * stride) % experts
    onehot = np.zeros((tokens, experts))
    np.put_along_axis(onehot, picked, 1.0, axis=1)
    logits = np.exp(onehot) / np.exp(onehot).sum(axis=1, keepdims=True)
    scores = (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
    per_group = experts // groups
    group_scores = np.sort(scores.reshape(tokens, groups, per_group), axis=2)[:, :, -2:].sum(axis=2)
    kept = np.argsort(-group_scores, axis=1, kind="stable")[:, :groups_per_token]
    mask = np.zeros((tokens, groups), dtype=bool)
    np.put_along_axis(mask, kept, True, axis=1)
    masked = np.where(np.repeat(mask, per_group, axis=1), scores, -np.inf)
    chosen = np.argsort(-masked, axis=1, kind="stable")[:, :top_k]
    return float((chosen < experts // ep).sum() / tokens)


@functools.cache
def _tables(root: Path, system: str, engine: str, version: str):
    """One engine version's moe_perf table on one system, read once (None where it has none); callers filter it and
    never write to it."""
    import pandas as pd

    path = root / system / "moe" / engine / version / "moe_perf.parquet"
    return pd.read_parquet(path) if path.exists() else None


def extrapolation_drop(df, moe_dtype: str, distribution: str, shape: tuple[int, int, int, int], moe_tp: int,
                       moe_ep: int, tokens: int) -> float | None:
    """Where ``tokens`` exceed the largest row n2 of the table's rows of ``shape`` (hidden, full expert width,
    experts, top-k) at (``moe_tp``, ``moe_ep``): 1 - (L2 / n2) / (L1 / n1), how far the last row's time per token
    falls below the row n1 before it (aiconfigurator holds L2's utilisation against its roofline, which is L2 scaled
    to ``tokens`` where the roofline is compute-bound: module docstring); None elsewhere."""
    latency = _layouts(df, moe_dtype, distribution, shape).get((moe_tp, moe_ep), {})
    if len(latency) < 2 or tokens <= max(latency):
        return None
    n1, n2 = sorted(latency)[-2:]
    return 1 - (latency[n2] / n2) / (latency[n1] / n1)


def _version_key(version: str) -> tuple:
    """Sort key of an engine version directory name (0.5.14, 1.3.0rc20): numbers compared as numbers."""
    import re

    return tuple(int(part) if part.isdigit() else part for part in re.findall(r"\d+|[a-z]+", version))


def _layouts(df, moe_dtype: str, distribution: str, shape: tuple[int, int, int, int]) -> dict:
    """{(moe_tp, moe_ep): {tokens: latency}} of one table's rows of ``shape`` (hidden, full expert width, experts,
    top-k); empty where the table is missing."""
    if df is None:
        return {}
    hidden, width, experts, top_k = shape
    rows = df[(df.moe_dtype == moe_dtype) & (df.distribution == distribution) & (df.hidden_size == hidden)
              & (df.inter_size == width) & (df.num_experts == experts) & (df.topk == top_k)]
    out: dict = {}
    for r in rows.itertuples():
        out.setdefault((r.moe_tp_size, r.moe_ep_size), {})[r.num_tokens] = r.latency
    return out


def nearest_shared_ratio(own: dict, donor: dict, moe_tp: int, moe_ep: int) -> tuple[tuple[int, int], float] | None:
    """The layout nearest (``moe_tp``, ``moe_ep``) that both {(moe_tp, moe_ep): {tokens: latency}} tables hold -- the
    same moe_ep first, then the fewest halvings or doublings away -- and the median over its shared token counts of
    ``donor``'s latency / ``own``'s; None where they share no layout."""
    import math

    shared = [k for k in own if k in donor]
    if not shared:
        return None
    near = min(shared, key=lambda k: (k[1] != moe_ep,
                                      abs(math.log2(k[0] / moe_tp)) + abs(math.log2(k[1] / moe_ep))))
    ratios = [donor[near][t] / own[near][t] for t in own[near] if t in donor[near] and own[near][t] > 0]
    return (near, statistics.median(ratios)) if ratios else None


def older_fill(root: Path, system: str, engine: str, version: str, moe_dtype: str, distribution: str,
               shape: tuple[int, int, int, int], moe_tp: int, moe_ep: int) -> tuple[str, tuple[int, int], float] | None:
    """Where ``version``'s table has no rows for (``moe_tp``, ``moe_ep``) and an earlier version's has: (the nearest
    such version, ``nearest_shared_ratio`` of the two); None where the layout is the version's own or no earlier
    version or shared layout has it."""
    own = _layouts(_tables(root, system, engine, version), moe_dtype, distribution, shape)
    if (moe_tp, moe_ep) in own or not own:
        return None
    folder = root / system / "moe" / engine
    earlier = sorted((d.name for d in folder.iterdir() if d.is_dir() and _version_key(d.name) < _version_key(version)),
                     key=_version_key, reverse=True)
    for donor in earlier:
        theirs = _layouts(_tables(root, system, engine, donor), moe_dtype, distribution, shape)
        if (moe_tp, moe_ep) in theirs:
            shared = nearest_shared_ratio(own, theirs, moe_tp, moe_ep)
            return (donor, *shared) if shared else None
    return None


def _median_ratio(df, moe_dtype: str, distribution: str, shape: tuple[int, int, int, int], min_tokens: int,
                  fixed: dict[str, int], column: str, top: int, bottom: int) -> float | None:
    """Median over token counts >= ``min_tokens`` of latency(``column`` = top) / latency(``column`` = bottom) for
    one table's rows of ``shape`` (hidden, full expert width, experts, top-k) with the ``fixed`` columns; None where
    either layout is missing."""
    if df is None:
        return None
    hidden, width, experts, top_k = shape
    rows = df[(df.moe_dtype == moe_dtype) & (df.distribution == distribution) & (df.hidden_size == hidden)
              & (df.inter_size == width) & (df.num_experts == experts) & (df.topk == top_k)
              & (df.num_tokens >= min_tokens)]
    for name, value in fixed.items():
        rows = rows[rows[name] == value]
    upper, lower = rows[rows[column] == top], rows[rows[column] == bottom]
    numerator = dict(zip(upper.num_tokens, upper.latency, strict=True))
    denominator = dict(zip(lower.num_tokens, lower.latency, strict=True))
    ratios = [numerator[t] / denominator[t] for t in numerator if t in denominator and denominator[t] > 0]
    return statistics.median(ratios) if ratios else None


def sliced_excess(df, moe_dtype: str, distribution: str, shape: tuple[int, int, int, int], moe_tp: int,
                  moe_ep: int) -> float | None:
    """Median over token counts >= 64 of latency(moe_tp) / latency(moe_tp / 2) for one table's rows of ``shape``
    (hidden, full expert width, experts, top-k) at ``moe_ep``; None where either layout is missing."""
    if moe_tp < 2:
        return None
    return _median_ratio(df, moe_dtype, distribution, shape, 64, {"moe_ep_size": moe_ep}, "moe_tp_size", moe_tp,
                         moe_tp // 2)


def unsplit_ratio(df, moe_dtype: str, shape: tuple[int, int, int, int]) -> float | None:
    """Median over token counts >= 4,096 of latency(moe_ep 2) / latency(moe_ep 1) for one table's balanced rows of
    ``shape`` (hidden, full expert width, experts, top-k) at moe_tp 1; None where either layout is missing."""
    return _median_ratio(df, moe_dtype, "balanced", shape, 4096, {"moe_tp_size": 1}, "moe_ep_size", 2, 1)


def interpolation_shortfall(df, moe_dtype: str, distribution: str, shape: tuple[int, int, int, int], moe_tp: int,
                            moe_ep: int, tokens: int) -> float | None:
    """Where the table's rows of ``shape`` (hidden, full expert width, experts, top-k) at (``moe_tp``, ``moe_ep``)
    hold no row at ``tokens`` and the power-law workload changes its loads between the rows n1 < tokens < n2 around
    it (n1 k <= E < tokens k): the most the linear interpolation can fall short, (1 - w)(L2 - L1) / L, as a
    fraction of the interpolated latency L (module docstring); None elsewhere."""
    if df is None:
        return None
    hidden, width, experts, top_k = shape
    rows = df[(df.moe_dtype == moe_dtype) & (df.distribution == distribution) & (df.hidden_size == hidden)
              & (df.inter_size == width) & (df.num_experts == experts) & (df.topk == top_k)
              & (df.moe_tp_size == moe_tp) & (df.moe_ep_size == moe_ep)]
    latency = dict(zip(rows.num_tokens, rows.latency, strict=True))
    below, above = [n for n in latency if n < tokens], [n for n in latency if n > tokens]
    if tokens in latency or not below or not above:
        return None
    n1, n2 = max(below), min(above)
    if not n1 * top_k <= experts < tokens * top_k:
        return None
    w = (tokens - n1) / (n2 - n1)
    interpolated = (1 - w) * latency[n1] + w * latency[n2]
    return (1 - w) * (latency[n2] - latency[n1]) / interpolated


def dsa_table_tokens(root: Path, system: str, engine: str, version: str, aic_model: str, topk: int) -> int | None:
    """The most tokens (batch x prompt) of one engine's dsa_context_module rows with prompts longer than ``topk`` for
    ``aic_model`` (any model's where it has none); None without such a table."""
    import pandas as pd

    table = root / system / "sparse_attention" / engine / version / "dsa_context_module_perf.parquet"
    if not table.exists():
        return None
    df = pd.read_parquet(table)
    df = df[df.isl > topk]
    own = df[df.model == aic_model]
    rows = own if len(own) else df
    return int((rows.batch_size * rows.isl).max()) if len(rows) else None


def autotuned_ratio(root: Path, system: str, moe_dtype: str, shape: tuple[int, int, int, int], moe_tp: int,
                    moe_ep: int, vllm_table) -> tuple[str, float] | None:  # noqa: ANN001 - a pandas.DataFrame
    """(TensorRT-LLM version, median over shared token counts of vLLM's balanced rows / TensorRT-LLM's) for one shape
    (hidden, full expert width, experts, top-k) and layout, from the newest TensorRT-LLM table holding it (its
    collector autotunes the CUTLASS MoE); None where none does."""
    versions = sorted((d.name for d in (root / system / "moe" / "trtllm").iterdir() if d.is_dir()), key=_version_key)
    own = _layouts(vllm_table, moe_dtype, "balanced", shape).get((moe_tp, moe_ep), {})
    for version in reversed(versions):
        table = _tables(root, system, "trtllm", version)
        other = _layouts(table, moe_dtype, "balanced", shape).get((moe_tp, moe_ep), {}) if table is not None else {}
        shared = sorted(set(own) & set(other))
        if shared:
            return version, statistics.median(own[n] / other[n] for n in shared)
    return None


def flashinfer_cutlass_rows(df, moe_dtype: str, shape: tuple[int, int, int, int]) -> bool:  # noqa: ANN001
    """Whether a table's rows of ``shape`` (hidden, full expert width, experts, top-k) and ``moe_dtype`` are
    FlashInfer's CUTLASS fused MoE (their kernel_source)."""
    hidden, width, experts, top_k = shape
    rows = df[(df.moe_dtype == moe_dtype) & (df.hidden_size == hidden) & (df.inter_size == width)
              & (df.num_experts == experts) & (df.topk == top_k)]
    return bool(len(rows)) and bool(rows.kernel_source.str.contains("flashinfer_cutlass").all())


def msa_context_rows(root: Path, p: dict, heads: int, gemm: str):  # noqa: ANN201 - a pandas.DataFrame or None
    """The point's engine's msa_context_module rows without a cached prefix at its query heads per GPU (TensorRT-LLM
    and vLLM store a GPU's heads at tp_size 1, SGLang the model's heads at the tp) and GEMM format; None without a
    table."""
    import pandas as pd

    path = root / p["gpu"] / "msa" / p["backend"] / p["version"] / "msa_context_module_perf.parquet"
    if not path.exists():
        return None
    df = pd.read_parquet(path)
    df = df[(df.gemm_type == gemm) & (df.kv_cache_dtype == "bfloat16") & (df.step == 0)]
    local = df[(df.tp_size == 1) & (df.num_heads == heads // p["tp"])]
    return local if len(local) else df[(df.tp_size == p["tp"]) & (df.num_heads == heads)]


def msa_disorder(rows) -> tuple[float, tuple, tuple]:  # noqa: ANN001 - a pandas.DataFrame
    """The largest ratio of a row's latency to that of a row with at least as many sequences and at least as long
    prompts, with the two rows as (sequences, tokens, ms)."""
    cells = list(zip(rows.batch_size, rows.isl, rows.latency, strict=True))
    worst = (0.0, (), ())
    for b1, s1, t1 in cells:
        for b2, s2, t2 in cells:
            if b2 >= b1 and s2 >= s1 and t1 / t2 > worst[0]:
                worst = (t1 / t2, (b1, s1, t1), (b2, s2, t2))
    return worst


def msa_beyond(rows, batch: int, isl: int) -> tuple[int, int, float] | None:  # noqa: ANN001 - a pandas.DataFrame
    """Where ``batch`` prompts of ``isl`` tokens lie beyond the rows at the shortest prompt length of at least
    ``isl``: (that length, its most sequences, the growth of its time per sequence from one to them); None where
    a row holds them."""
    longer = rows[rows.isl >= isl]
    if not len(longer):
        return None
    at = longer[longer.isl == longer.isl.min()]
    most = int(at.batch_size.max())
    if most >= batch or 1 not in set(at.batch_size):
        return None
    one = float(at[at.batch_size == 1].latency.iloc[0])
    per_seq = float(at[at.batch_size == most].latency.iloc[0]) / most
    return int(at.isl.iloc[0]), most, per_seq / one - 1


def min_latency_ratio(df, shape: tuple[int, int, int, int], distribution: str, moe_tp: int, moe_ep: int,
                      tokens: int) -> float | None:
    """Where aiconfigurator prices a TensorRT-LLM NVFP4 decode of ``tokens`` (<= 128) from the min-latency rows of
    ``shape`` (hidden, full expert width, experts, top-k) at (``moe_tp``, ``moe_ep``): the median over the token counts
    up to 128 of those rows' latency / the CUTLASS rows'; None where the table has no such rows."""
    if df is None or tokens > 128 or "kernel_source" not in df:
        return None
    hidden, width, experts, top_k = shape
    rows = df[(df.moe_dtype == "nvfp4") & (df.distribution == distribution) & (df.hidden_size == hidden)
              & (df.inter_size == width) & (df.num_experts == experts) & (df.topk == top_k)
              & (df.moe_tp_size == moe_tp) & (df.moe_ep_size == moe_ep) & (df.num_tokens <= 128)]
    fast = dict(zip(*(rows[rows.kernel_source == "moe_torch_flow_min_latency"][c] for c in ("num_tokens", "latency")),
                    strict=True))
    slow = dict(zip(*(rows[rows.kernel_source == "moe_torch_flow_cutlass"][c] for c in ("num_tokens", "latency")),
                    strict=True))
    ratios = [fast[t] / slow[t] for t in fast if t in slow and slow[t] > 0]
    return statistics.median(ratios) if ratios else None


@functools.cache
def aic_family(aic_model: str) -> str:
    """aiconfigurator's model family of a checkpoint (sdk/common.py ARCHITECTURE_TO_MODEL_FAMILY of its bundled
    config.json's first architecture, or of tfcalc's fixture where it bundles none); "" where unknown."""
    import aiconfigurator_core
    from aiconfigurator_core.sdk.common import ARCHITECTURE_TO_MODEL_FAMILY

    sys.path.insert(0, str(HERE))
    import aiconfigurator_points as collect

    path = Path(aiconfigurator_core.__file__).parent / "model_configs" / (aic_model.replace("/", "--") + "_config.json")
    if aic_model in collect.FIXTURE_CONFIGS:
        path = HERE.parent.parent / "tests" / "fixtures" / "hf_configs" / collect.FIXTURE_CONFIGS[aic_model]
    if not path.exists():
        return ""
    architectures = json.loads(path.read_text()).get("architectures") or [""]
    return ARCHITECTURE_TO_MODEL_FAMILY.get(architectures[0], "")


def ssm_state_share(spec, p: dict) -> float:  # noqa: ANN001 - ModelSpec
    """The part of a decode step's bytes (``work.decode_work`` at the point's mean context) that are the Mamba-2 states
    read and written, on one GPU of the point's tp group."""
    from tfcalc.calc import work
    from tfcalc.calc.kv_cache import state_dtypes
    from tfcalc.dtypes import get_dtype, parse_weight_precision

    m = work.make_model(spec, parse_weight_precision(p["weights_dtype"]),
                        get_dtype("bf16"), p["tp"], p.get("ep", 1))
    conv, recurrent = state_dtypes(spec)
    state = float(conv.bytes_for(m.sh.state_conv_elements) + recurrent.bytes_for(m.sh.state_recurrent_elements))
    traffic = 2 * p["batch"] * spec.num_linear_layers * state
    return traffic / work.decode_work(m, p["batch"], p["isl"] + p["osl"] // 2).bytes


def kda_conv_excess(spec, p: dict) -> tuple[float, bool]:  # noqa: ANN001 - ModelSpec
    """(ms that aiconfigurator's KDA prefill convolution adds to the point's TTFT over the kernel's own time, whether
    the point's engine version has a KDA table of its own): the causal_conv1d_fn_qkv3 row its engine version
    queries less SGLang 0.5.16's, at the point's batch, prompt and KDA heads per GPU, times the KDA layers."""
    import aiconfigurator_core
    from aiconfigurator_core.sdk import operations as ops
    from aiconfigurator_core.sdk.perf_database import get_database

    la = spec.linear_attention
    heads = la.num_value_heads // p["tp"]
    op = ops.KDAKernel("conv", 1, "causal_conv1d_fn_qkv3", "context", spec.hidden_size, heads, la.key_head_dim,
                       heads, la.value_head_dim, la.conv_kernel)

    def row(backend: str, version: str) -> float:
        db = get_database(p["gpu"], backend, version, allow_unlisted_version=True)
        return float(op._engine_query(db, batch_size=p["batch"], s=p["isl"], prefix=0))

    own = (Path(aiconfigurator_core.__file__).parent / "systems" / "data" / p["gpu"] / "kda" / p["backend"]
           / p["version"]).is_dir()
    return (row(p["backend"], p["version"]) - row("sglang", KDA_KERNEL_VERSION)) * spec.num_linear_layers, own


def gdn_tp_excess(root: Path, p: dict, spec) -> tuple[float, float, float, str] | None:  # noqa: ANN001 - ModelSpec
    """Where a TensorRT-LLM Gated DeltaNet point's engine table holds the unsharded heads but not the GPU's: (the scan's
    ms a layer as aiconfigurator prices it, TensorRT-LLM's own unsharded row x the GPU's share of the value heads,
    the ms the borrowed scan and conv rows add over the GDN layers, the engine whose rows aiconfigurator took);
    None elsewhere."""
    import logging

    import pandas as pd
    from aiconfigurator_core.sdk import operations as ops
    from aiconfigurator_core.sdk.perf_database import get_database

    la = spec.linear_attention
    tp = p["tp"]
    path = root / p["gpu"] / "linear_attention" / p["backend"] / p["version"] / "gdn_perf.parquet"
    if tp == 1 or not path.exists():
        return None
    df = pd.read_parquet(path)
    df = df[(df.phase == "context") & (df.d_model == spec.hidden_size)]
    def held(split: int) -> bool:
        return bool(((df.num_k_heads == la.num_key_heads // split)
                     & (df.num_v_heads == la.num_value_heads // split)).any())

    if held(tp) or not held(1):
        return None
    logging.disable(logging.WARNING)
    db = get_database(p["gpu"], p["backend"], p["version"])
    args = dict(batch_size=p["batch"], s=p["isl"], prefix=0)

    def kernel(source: str, split: int) -> ops.GDNKernel:
        return ops.GDNKernel(source, 1, source, "context", spec.hidden_size, la.num_key_heads // split,
                             la.key_head_dim, la.num_value_heads // split, la.value_head_dim, la.conv_kernel)

    excess, priced, own = 0.0, 0.0, 0.0
    for source in ("causal_conv1d_fn", "chunk_gated_delta_rule"):
        borrowed = float(kernel(source, tp)._engine_query(db, **args))
        scaled = float(kernel(source, 1)._engine_query(db, **args)) / tp
        excess += (borrowed - scaled) * spec.num_linear_layers
        priced, own = borrowed, scaled
    donor = next((engine for engine, version in (("sglang", "0.5.14"), ("vllm", "0.24.0"))
                  if abs(float(kernel("chunk_gated_delta_rule", tp)._engine_query(
                      get_database(p["gpu"], engine, version), **args)) - priced) < 1e-9 * priced), "another engine")
    return priced, own, excess, donor


def fallback_excess(price: float, floor: float, widest: float, n: int) -> float:
    """A projection's price over the tuned expectation: price - (floor + widest n / ``UNTUNED_GEMM_TOP_N``), at
    least 0, where ``widest`` is the row of the same M and K at the table's widest N (module docstring)."""
    return max(0.0, price - floor - widest * n / UNTUNED_GEMM_TOP_N)


def untuned_gemm_excess(p: dict, spec) -> tuple[float, float, int] | None:  # noqa: ANN001 - ModelSpec
    """(ms a decode step's NVFP4 projections cost in aiconfigurator over the tuned expectation, the price of the
    fused QKV projection / that of a 128-wide one of the same K, its N) for a TensorRT-LLM NVFP4 point of a dense
    transformer; None where the engine version has no gemm table on the GPU. Per projection (N x K at M = the
    batch, aiconfigurator's own interpolation of its rows): price(M, N, K) - [price(M, 128, 128) + price(M, N_top,
    K) N / N_top], N_top the table's widest rows (65,536, where the collector's fallback tile fills the GPU), at
    least 0, times the layers."""
    import logging

    import aiconfigurator_core
    from aiconfigurator_core.sdk import common
    from aiconfigurator_core.sdk import operations as ops
    from aiconfigurator_core.sdk.perf_database import get_database

    path = (Path(aiconfigurator_core.__file__).parent / "systems" / "data" / p["gpu"] / "gemm" / "trtllm"
            / p["version"])
    if not path.is_dir():
        return None
    logging.disable(logging.WARNING)
    db = get_database(p["gpu"], "trtllm", p["version"])
    tp, h, d = p["tp"], spec.hidden_size, spec.head_dim
    shapes = (((spec.num_attention_heads + 2 * spec.num_kv_heads) * d // tp, h),
              (h, spec.num_attention_heads * d // tp), (2 * spec.intermediate_size // tp, h),
              (h, spec.intermediate_size // tp))

    def price(n: int, k: int) -> float:
        return float(ops.GEMM("g", 1, n, k, common.GEMMQuantMode.nvfp4)._engine_query(db, x=p["batch"]))

    floor = price(128, 128)
    excess = sum(fallback_excess(price(n, k), floor, price(UNTUNED_GEMM_TOP_N, k), n) for n, k in shapes)
    qkv_n, qkv_k = shapes[0]
    return excess * spec.num_layers, price(qkv_n, qkv_k) / price(128, qkv_k), qkv_n


def _tagged(path: Path, p: dict, caveat: str, evidence: str) -> dict:
    """A caveats-file entry: the point keyed as validate.py keys it, its caveat and the evidence."""
    return {"source": path.name, "model": p["model"], "gpu": p["gpu"], "backend": p["backend"], "tp": p["tp"],
            "ep": p.get("ep", 1), "batch": p["batch"], "isl": p["isl"], "osl": p["osl"],
            "weights_dtype": p["weights_dtype"], "caveat": caveat, "evidence": evidence}


def caveats() -> list[dict]:
    """Every aiconfigurator point (validate.py's files) with a caveat, keyed as validate.py keys its points."""
    import aiconfigurator_core

    sys.path.insert(0, str(HERE))
    import aiconfigurator_points as collect
    import validate

    root = Path(aiconfigurator_core.__file__).parent / "systems" / "data"
    out = []
    for _, path in validate.SOURCES:
        if not path.exists() or not path.name.startswith("aiconfigurator"):
            continue
        for p in json.loads(path.read_text()):
            if "error" in p:
                continue
            spec = validate.load_spec(validate.model_file(p["model"]))
            la = spec.linear_attention
            if la is not None and la.kind == "mamba2" and (share := ssm_state_share(spec, p)) > SSM_STATE_SHARE:
                out.append(_tagged(path, p, "ssm_unmeasured",
                                   f"the SSM states are {share:.0%} of the decode step's bytes; aiconfigurator "
                                   "has no measured scan or state-update kernel"))
                continue
            if la is not None and la.kind == "kda":
                excess, own = kda_conv_excess(spec, p)
                if excess > KDA_CONV_SHARE * p["ttft_ms"]:
                    out.append(_tagged(path, p, "kda_conv",
                                       f"the KDA prefill conv rows time a host path: {excess:.1f} ms "
                                       f"({excess / p['ttft_ms']:.0%} of the TTFT) over the kernel's own rows "
                                       f"(sglang {KDA_KERNEL_VERSION})" + ("" if own or p["backend"] == "vllm"
                                       else f"; {p['backend']} {p['version']} has no KDA table, filled "
                                       "from vLLM's")))
                    continue
            if spec.compressed_attention is not None and p["tp"] > 1:
                out.append(_tagged(path, p, "unreduced",
                                   f"no all-reduce after attention at tp {p['tp']}: aiconfigurator's DeepSeek-V4 "
                                   "model adds none and its attention module is timed at world size 1, where "
                                   "the engines reduce wo_b's row-parallel output"))
                continue
            si = spec.sparse_indexer
            rows = (msa_context_rows(root, p, spec.num_attention_heads,
                                     collect.MODELS[next(k for k, v in collect.MODELS.items()
                                                         if v[0] == p["aic_model"] and v[1] == p["weights_dtype"])][2])
                    if si is not None and si.kind == "minimax_m3" else None)
            if rows is not None and len(rows):
                reason = evidence = None
                ratio, slow, fast = msa_disorder(rows)
                beyond = msa_beyond(rows, p["batch"], p["isl"])
                if ratio > MSA_DISORDER:
                    reason = "msa_disordered"
                    evidence = (f"msa_context_module rows: {slow[0]} x {slow[1]} tokens {slow[2]:.1f} ms, {fast[0]} x "
                                f"{fast[1]} tokens {fast[2]:.1f} ms ({p['backend']} {p['version']})")
                elif beyond is not None and beyond[2] > MSA_GROWTH:
                    reason = "msa_extrapolated"
                    evidence = (f"{p['batch']} prompts beyond the msa_context_module rows (at most {beyond[1]} of "
                                f"{beyond[0]:,} tokens, {beyond[2]:.0%} slower per prompt than one; {p['backend']} "
                                f"{p['version']})")
                if reason:
                    out.append(_tagged(path, p, reason, evidence))
                    continue
            if (la is not None and la.kind == "gated_deltanet" and p["backend"] == "trtllm"
                    and (gdn := gdn_tp_excess(root, p, spec)) and gdn[2] > GDN_TP_SHARE * p["ttft_ms"]):
                priced, own, excess, donor = gdn
                out.append(_tagged(path, p, "gdn_tp_table",
                                   f"no gdn rows at tp {p['tp']}'s heads: the scan priced from {donor}'s, "
                                   f"{priced:.2f} ms a layer against {own:.2f} from the engine's own "
                                   f"unsharded row / {p['tp']}; +{excess:.0f} ms "
                                   f"({excess / p['ttft_ms']:.0%} of the TTFT)"))
                continue
            if (p["model"] not in validate.MOE and p["backend"] == "trtllm" and p["weights_dtype"] == "nvfp4"
                    and la is None and (gemm := untuned_gemm_excess(p, spec))
                    and gemm[0] > UNTUNED_GEMM_SHARE * p["tpot_ms"]):
                excess, flat, qkv_n = gemm
                out.append(_tagged(path, p, "untuned_gemm",
                                   f"NVFP4 gemm rows timed on the CUTLASS fallback tactic: the {qkv_n}-wide QKV "
                                   f"projection priced {flat:.2f}x a 128-wide one ({qkv_n // 128}x the "
                                   f"weights); +{excess:.1f} ms "
                                   f"({excess / p['tpot_ms']:.0%} of the TPOT) over the rows' own "
                                   "full-GPU throughput"))
                continue
            if p["model"] not in validate.MOE:
                continue
            moe = spec.moe
            ep = p.get("ep", 1)
            si = spec.sparse_indexer
            dsa = (dsa_table_tokens(root, p["gpu"], p["backend"], p["version"], p["aic_model"], si.topk)
                   if si is not None and p["isl"] > si.topk else None)
            key = next(k for k, v in collect.MODELS.items() if v[0] == p["aic_model"] and v[1] == p["weights_dtype"])
            aic_moe = collect.MODELS[key][3]
            aic_moe = collect.ENGINE_MOE_QUANT.get((p["backend"], p["gpu"], aic_moe), aic_moe)
            reason = evidence = None
            if dsa is not None and p["batch"] * p["isl"] > DSA_EXTRAPOLATED * dsa:
                reason = "dsa_extrapolated"
                evidence = (f"prefill of {p['batch'] * p['isl']:,} tokens priced from dsa_context_module rows of at "
                            f"most {dsa:,} ({p['backend']} {p['version']})")
            elif (ep > 1 and p["backend"] in GROUPED_ROUTING_ENGINES and moe.expert_groups > 1
                    and moe.groups_per_token < moe.expert_groups):
                rows = timed_rank_rows(moe.num_experts, moe.experts_per_token, moe.expert_groups,
                                       moe.groups_per_token, ep)
                reason = "routing"
                evidence = (f"collector's timed rank gets {rows:g} rows per token at ep {ep} "
                            f"(fair: {moe.experts_per_token / ep:g})")
            else:
                table_key = (p["gpu"], p["backend"], p["version"])
                table = _tables(root, *table_key)
                alpha = validate.AIC_ROUTING_ALPHA.get(p["model"], 1.2)
                # the experts' input width: a latent MoE (Nemotron 3 Super) runs them on its projection of h
                shape = (moe.latent_size or spec.hidden_size, moe.expert_intermediate_size, moe.num_experts,
                         moe.experts_per_token)
                excess = sliced_excess(table, aic_moe, f"power_law_{alpha}", shape, p["tp"] // ep, ep)
                unsplit = unsplit_ratio(table, aic_moe, shape) if ep > 1 else None
                tuned = (autotuned_ratio(root, p["gpu"], aic_moe, shape, p["tp"] // ep, ep, table)
                         if p["backend"] in AUTOTUNING_ENGINES and table is not None
                         and flashinfer_cutlass_rows(table, aic_moe, shape) else None)
                if tuned is not None and tuned[1] > UNTUNED_EXCESS:
                    reason = "untuned"
                    evidence = (f"FlashInfer CUTLASS MoE rows timed without its autotuner, {tuned[1]:.1f}x "
                                f"TensorRT-LLM {tuned[0]}'s autotuned rows ({aic_moe}, {p['backend']} {p['version']})")
                elif excess is not None and excess > SLICED_EXCESS:
                    reason = "sliced"
                    evidence = (f"moe_tp {p['tp'] // ep} rows {excess:.2f}x the moe_tp {p['tp'] // ep // 2} rows "
                                f"({aic_moe}, {p['backend']} {p['version']})")
                elif unsplit is not None and unsplit >= UNSPLIT_RATIO:
                    reason = "unsplit"
                    evidence = (f"balanced moe_ep 2 rows {unsplit:.2f}x the moe_ep 1 rows at 4,096+ tokens "
                                f"({aic_moe}, {p['backend']} {p['version']})")
                elif (filled := older_fill(root, *table_key, aic_moe, f"power_law_{alpha}", shape, p["tp"] // ep,
                                           ep)) and abs(filled[2] - 1) > OLDER_DISAGREEMENT:
                    donor, (near_tp, near_ep), ratio = filled
                    reason = "older"
                    evidence = (f"no moe_tp {p['tp'] // ep} x moe_ep {ep} rows in {p['backend']} {p['version']}: "
                                f"filled from {donor}, whose moe_tp {near_tp} x moe_ep {near_ep} rows are {ratio:.2f}x "
                                f"{p['version']}'s ({aic_moe})")
                elif ((drop := extrapolation_drop(table, aic_moe, f"power_law_{alpha}", shape,
                                                  p["tp"] // ep, ep, p["batch"] * p["isl"]))
                      and drop > EXTRAPOLATED_DROP):
                    reason = "extrapolated"
                    evidence = (f"prefill of {p['batch'] * p['isl']:,} tokens scaled from the last row, whose time per "
                                f"token is {drop:.0%} below the row before it ({aic_moe}, {p['backend']} "
                                f"{p['version']})")
                else:
                    short = interpolation_shortfall(table, aic_moe, f"power_law_{alpha}", shape,
                                                    p["tp"] // ep, ep, p["batch"])
                    fast = (min_latency_ratio(table, shape, f"power_law_{alpha}", p["tp"] // ep, ep, p["batch"])
                            if p["backend"] == "trtllm" and aic_moe == "nvfp4" else None)
                    if short is not None and short >= INTERPOLATED_SHORTFALL:
                        reason = "interpolated"
                        evidence = (f"decode at {p['batch']} tokens interpolated across the power-law loads' switch, "
                                    f"up to {short:.0%} short ({aic_moe}, {p['backend']} {p['version']})")
                    elif fast is not None:
                        reason = "min_latency"
                        evidence = (f"decode at {p['batch']} tokens priced from the opt-in TRTLLM-gen min-latency MoE "
                                    f"rows, {fast:.2f}x the default CUTLASS rows up to 128 tokens ({p['backend']} "
                                    f"{p['version']})")
            if not reason and p["backend"] == "vllm" and p["tp"] > 1 and aic_family(p["aic_model"]) in DOUBLE_REDUCE:
                reason = "double_reduce"
                evidence = (f"four all-reduces of the hidden states per layer at tp {p['tp']} (tp_allreduce x 2 and "
                            "the MoE pre- / post-dispatch custom all-reduces), where vLLM runs two")
            if reason:
                out.append(_tagged(path, p, reason, evidence))
    return out


def show() -> None:
    """The routing caveat's rows per token next to the tables' latency by ep (DeepSeek-V3's shape, 8,192 tokens,
    balanced rows): latency / latency at ep 64 against rows / rows at ep 64."""
    import aiconfigurator_core

    root = Path(aiconfigurator_core.__file__).parent / "systems" / "data"
    eps = (2, 4, 8, 16, 32, 64, 128, 256)
    rows = {ep: timed_rank_rows(256, 8, 8, 4, ep) for ep in eps}
    print("rows per token on the timed rank: " + ", ".join(f"ep {ep} {r:g}" for ep, r in rows.items()))
    for system, engine, version in (("h100_sxm", "vllm", "0.24.0"), ("h200_sxm", "vllm", "0.24.0"),
                                    ("b200_sxm", "vllm", "0.24.0"), ("h200_sxm", "sglang", "0.5.14"),
                                    ("b200_sxm", "sglang", "0.5.14")):
        df = _tables(root, system, engine, version)
        sel = df[(df.hidden_size == 7168) & (df.inter_size == 2048) & (df.num_experts == 256) & (df.topk == 8)
                 & (df.moe_dtype == "fp8_block") & (df.distribution == "balanced") & (df.moe_tp_size == 1)
                 & (df.num_tokens == 8192)]
        lat = dict(zip(sel.moe_ep_size, sel.latency, strict=True))
        cells = ", ".join(f"ep {ep} {lat[ep] / lat[64]:.2f} ({rows[ep] / rows[64]:.2f})" for ep in eps if ep in lat)
        print(f"{system} {engine} {version}: latency / ep 64 (rows / ep 64): {cells}")
    for c in caveats():
        print(f"{c['source']:32s} {c['model']:16s} {c['gpu']:9s} {c['backend']:6s} tp {c['tp']} ep {c['ep']} "
              f"b {c['batch']}: {c['caveat']}: {c['evidence']}")


if __name__ == "__main__":
    if "--show" in sys.argv:
        show()
    else:
        found = caveats()
        OUT.write_text(json.dumps(found, indent=1) + "\n")
        print(f"{len(found)} points with a caveat -> {OUT.name}")
