"""The ``expert_all_to_all`` blocks of presets/interconnects/nvlink{4,5}.yaml, fitted to aiconfigurator's measured
MoE dispatch / combine tables, and tfcalc's error on those tables and on DeepEP's published InfiniBand figures.

aiconfigurator is *not* a tfcalc dependency: install it in a scratch environment (``pip install aiconfigurator``;
its tables ship in the package, pandas and pyarrow read them) and run

    python benchmarks/validation/expert_all_to_all_fit.py [--check]

The kernels (DeepEP's low-latency dispatch / combine, TensorRT-LLM's NVLink all-to-all on a GB200 NVL72) write every
peer at once: one launch, then the bytes bound for the other GPUs over the link (``tfcalc.calc.comm.
expert_all_to_all``). Each row moves tokens x top-k copies of the hidden vector: fp8 with one fp32 scale per 128
values in DeepEP's dispatch (SGLang's), bf16 in its combine and in TensorRT-LLM's bf16 rows. The fit, per fabric:
least squares of the relative error of launch + bytes x (n - 1) / n / beta -> launch and beta (its efficiency is
beta over the fabric's bandwidth). Rows:
- nvlink4: systems/data/h200_sxm/comm/sglang/0.5.12/wideep_deepep_ll_perf (8 x H200, DeepSeek-V3's shape);
- nvlink5: systems/data/gb200/comm/trtllm/1.3.0rc10/trtllm_alltoall_perf (NVLinkTwoSided, bf16, ep 8-64 across
  the NVL72's trays) and systems/data/gb200/comm/sglang/0.5.12/wideep_deepep_ll_perf (4 GPUs of a tray).
``--check`` prices every row with the presets as they are and prints median and worst |tfcalc / measured - 1|; the
TensorRT-LLM rows at ep 2-4, left out of the fit, priced both ways: its kernels send a token once to each rank that
holds any of its experts (the collector's balanced routing: every rank, min(ep, k) copies) or, as DeepEP's
low-latency kernels do, once per expert (k copies); and
DeepEP's published low-latency table (docs/legacy.md of deepseek-ai/DeepEP: H800 with one 400 Gb/s CX7 NIC each,
128 tokens a rank, hidden 7168, top-8, fp8 dispatch, bf16 combine; EP 16-256 over nodes of 8) against the
infiniband-ndr preset, whose link was not fitted to it.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

HIDDEN, TOP_K = 7168, 8
FP8_BYTES = 1 + 4 / 128                 # fp8 value + one fp32 scale per 128 (DeepEP's fp8 dispatch)
BF16_BYTES = 2.0
# deepseek-ai/DeepEP docs/legacy.md, "Low-latency kernels with pure RDMA": EP -> (dispatch us, combine us)
DEEPEP_PUBLISHED = {16: (118, 195), 32: (155, 273), 64: (173, 314), 128: (192, 369), 256: (194, 360)}
DEEPEP_TOKENS, DEEPEP_NODE = 128, 8

Row = tuple[str, int, float, float]   # (label, GPUs, bytes a GPU sends, seconds)


def _data() -> Path:
    import aiconfigurator_core

    return Path(aiconfigurator_core.__file__).parent / "systems" / "data"


def rows(fabric: str) -> list[Row]:
    import pandas as pd

    out: list[Row] = []
    gpu, ranks = ("h200_sxm", 8) if fabric == "nvlink4" else ("gb200", 4)
    ll = pd.read_parquet(_data() / gpu / "comm/sglang/0.5.12/wideep_deepep_ll_perf.parquet")
    ll = ll[(ll.hidden_size == HIDDEN) & (ll.num_topk == TOP_K) & (ll.num_experts == 256)]
    for r in ll.itertuples():
        copies = r.num_token * TOP_K * HIDDEN
        out.append((f"deepep-ll dispatch {r.num_token}", ranks, copies * FP8_BYTES, r.dispatch_avg_t_us * 1e-6))
        out.append((f"deepep-ll combine {r.num_token}", ranks, copies * BF16_BYTES, r.combine_avg_t_us * 1e-6))
    if fabric == "nvlink5":
        t = pd.read_parquet(_data() / "gb200/comm/trtllm/1.3.0rc10/trtllm_alltoall_perf.parquet")
        t = t[(t.kernel_source == "NVLinkTwoSided") & (t.moe_dtype == "bfloat16") & (t.moe_ep_size >= 8)
              & t.op_name.isin(["alltoall_dispatch", "alltoall_combine"])]
        for r in t.itertuples():
            out.append((f"trtllm {r.op_name[9:]} ep {r.moe_ep_size} {r.num_tokens}", int(r.moe_ep_size),
                        r.num_tokens * TOP_K * HIDDEN * BF16_BYTES, r.latency * 1e-3))
    return out


def fit(data: list[Row]) -> tuple[float, float]:
    """(launch s, beta bytes/s): least squares of (a + b x) / t ~ 1, x the bytes that leave the GPU."""
    sxx = sxy = syy = sx = sy = 0.0
    for _, n, send, t in data:
        u, v = 1 / t, send * (n - 1) / n / t
        sxx, sxy, syy, sx, sy = sxx + u * u, sxy + u * v, syy + v * v, sx + u, sy + v
    det = sxx * syy - sxy * sxy
    a, b = (sx * syy - sy * sxy) / det, (sxx * sy - sxy * sx) / det
    return a, 1 / b


def check(fabric: str, data: list[Row]) -> None:
    from tfcalc.calc.comm import expert_all_to_all
    from tfcalc.spec.interconnect import load_interconnect

    link = load_interconnect(fabric).expert_link
    errors = []
    for label, n, send, t in data:
        model = expert_all_to_all(send, n, n, link, link).seconds
        errors.append((abs(model / t - 1), label, model, t))
    errors.sort()
    print(f"  check {fabric}: {len(errors)} rows, median |error| {statistics.median(e[0] for e in errors):.1%}, "
          f"worst {errors[-1][0]:.1%} ({errors[-1][1]}: {errors[-1][2] * 1e6:.1f} us vs {errors[-1][3] * 1e6:.1f})")


def check_per_rank() -> None:
    import pandas as pd

    from tfcalc.calc.comm import expert_all_to_all
    from tfcalc.spec.interconnect import load_interconnect

    link = load_interconnect("nvlink5").expert_link
    t = pd.read_parquet(_data() / "gb200/comm/trtllm/1.3.0rc10/trtllm_alltoall_perf.parquet")
    t = t[(t.kernel_source == "NVLinkTwoSided") & (t.moe_dtype == "bfloat16") & (t.moe_ep_size < 8)
          & t.op_name.isin(["alltoall_dispatch", "alltoall_combine"])]
    print("TensorRT-LLM's all-to-all at ep 2-4 (not fitted), tfcalc / measured:")
    for ep, rows_ep in t.groupby("moe_ep_size"):
        ratios = {copies: [expert_all_to_all(r.num_tokens * copies * HIDDEN * BF16_BYTES, ep, ep, link, link).seconds
                           / (r.latency * 1e-3) for r in rows_ep.itertuples()] for copies in (min(ep, TOP_K), TOP_K)}
        print(f"  ep {ep}: {len(rows_ep)} rows; a copy per rank: median {statistics.median(ratios[min(ep, TOP_K)]):.2f}"
              f", a copy per expert: {statistics.median(ratios[TOP_K]):.2f}")


def check_published() -> None:
    from tfcalc.calc.comm import expert_all_to_all
    from tfcalc.spec.interconnect import load_interconnect

    nvlink, ib = load_interconnect("nvlink4").expert_link, load_interconnect("infiniband-ndr").expert_link
    print("DeepEP's published low-latency kernels (H800 + CX7, 128 tokens a rank), tfcalc against them:")
    for ep, (dispatch_us, combine_us) in DEEPEP_PUBLISHED.items():
        copies = DEEPEP_TOKENS * TOP_K * HIDDEN
        d = expert_all_to_all(copies * FP8_BYTES, ep, DEEPEP_NODE, nvlink, ib).seconds * 1e6
        c = expert_all_to_all(copies * BF16_BYTES, ep, DEEPEP_NODE, nvlink, ib).seconds * 1e6
        print(f"  EP {ep:3d}: dispatch {d:5.0f} us vs {dispatch_us} ({d / dispatch_us - 1:+.0%}), "
              f"combine {c:5.0f} us vs {combine_us} ({c / combine_us - 1:+.0%})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="price the rows with the presets as they are")
    args = parser.parse_args()
    from tfcalc.spec.interconnect import load_interconnect

    for fabric in ("nvlink4", "nvlink5"):
        data = rows(fabric)
        launch, beta = fit(data)
        bandwidth = load_interconnect(fabric).nccl.bandwidth_bytes_per_s
        print(f"{fabric}: {len(data)} rows -> launch {launch * 1e6:.1f} us, beta {beta / 1e9:.0f} GB/s = "
              f"{beta / bandwidth:.2f} of {bandwidth / 1e9:.0f}")
        if args.check:
            check(fabric, data)
    if args.check:
        check_per_rank()
        check_published()


if __name__ == "__main__":
    main()
