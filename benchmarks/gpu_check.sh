#!/usr/bin/env bash
# The prepared GPU check (issues 5, 9 and 14): one script, the most valuable measurements first.
#
# Usage (repository root, a CUDA GPU, PyTorch installed):  bash benchmarks/gpu_check.sh [OUT_DIR]
# Runs without installing tfcalc (PYTHONPATH=.); every table lands in OUT_DIR as CSV, the targets in targets.txt.
#
# Time (H200; estimated, no GPU has run this script yet; torch.compile of the captured decode steps dominates):
#   default run, about 7 minutes, never more than GPU_CHECK_BUDGET_S (480 s) of steps: a step that would start
#   with less than 20 s left is skipped and named, a running step is cut at the budget.
#     ceilings                   copy and matmul ceilings (bf16, fp16)                                     ~20 s
#     profile                    llama3-8b bf16, batch 1/8/64 x prompt 512/4096, CUDA-graph decode through
#                                flex over the live blocks; writes the calibration                        ~150 s
#     estimate_calibrated        estimate calibrated by that profile, and estimate_preset (preset rates)   ~20 s
#     profile_fp8                llama3-70b, 16 of 80 layers, fp8 and fp8_block weights, batch 1          ~90 s
#     profile_context            llama3-8b batch 1 over context 1k/8k/32k, with the plot                   ~90 s
#     calibrate                  bench calibrate (GEMM curve, copy by size, launch floors, attention) and
#                                estimate calibrated by it                                                  ~60 s
#   GPU_CHECK_FULL=1 adds, after those (about 5 minutes more; raise GPU_CHECK_BUDGET_S to 900 for them):
#     profile_gemma2             gemma2-9b, rolling-buffer windows, soft caps through flex's score_mod      ~60 s
#     profile_deepseek           DeepSeek-V3, FP8 blocks, 4 layers (1 dense + 3 MoE: MLA, absorbed decode) ~90 s
#     profile_minimax            MiniMax-M2.5, FP8 blocks, 4 layers (QK-norm across heads, partial RoPE,
#                                256 sigmoid-routed experts)                                               ~90 s
#     profile_qwen3_next         Qwen3-Next-80B-A3B, bf16, 4 layers (3 Gated DeltaNet + 1 gated attention:
#                                chunked prefill and recurrent decode with per-sequence states, 512 experts) ~90 s
#     profile_llama4             Llama 4 Scout, bf16, 4 layers (3 chunked-attention + 1 NoPE, top-1 experts on the
#                                input + a shared expert), a 12k prompt crossing the 8192-token chunk       ~90 s
#     profile_gemma4             Gemma 4 26B-A4B, bf16, 4 layers (3 sliding of head 256 + 1 global of head 512
#                                with values from its keys; 128 experts beside a dense MLP), an 8k prompt   ~90 s
#     profile_dsa                DeepSeek-V3.2, FP8 blocks, 4 layers (1 dense + 3 MoE: MLA whose queries attend the
#                                top 2,048 keys of a lightning indexer), an 8k prompt                      ~90 s
#     profile_nemotron           Nemotron 3 Nano 30B-A3B, bf16, 6 layers (Mamba-2, attention without RoPE and MoE
#                                blocks: chunked SSD prefill, recurrent decode with fp32 states), a 4k prompt ~90 s
#     profile_fp8 at batch 8, the attention and moe component benchmarks                                   ~150 s
# With more than one GPU visible, a multi-GPU section (issue 10) follows, on its own budget GPU_CHECK_MULTI_BUDGET_S
# (300 s; estimated, no machine with several GPUs has run it), so the single-GPU steps keep theirs:
#     collectives                bench collectives on every visible GPU (NCCL, 1 KiB-1 GiB), saved as the
#                                calibration the tp rows are predicted with                               ~40 s
#     profile_tp2/4/8            llama3-70b on 40 of its 80 layers, bf16, tp 2, 4, 8 (as many GPUs as there are),
#                                batch 1/8, prompt 512, 32 tokens decoded eagerly, collectives timed     ~50 s each
#     profile_ep                 (GPU_CHECK_FULL=1) mixtral-8x7b on 8 layers, tp 2 x ep 2                   ~60 s
#     profile_tp2_fp8            (GPU_CHECK_FULL=1) profile_tp2 with fp8 weights, each rank its FP8 slice    ~50 s
# GPU_CHECK_SMOKE=1 runs every step (FULL and the multi-GPU section included) on the CPU with tiny models (the
# multi-GPU steps on 2 CPU ranks over gloo), to check the script itself; its targets mean nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu_check}}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"
smoke="${GPU_CHECK_SMOKE:-0}"
full="${GPU_CHECK_FULL:-$smoke}"
budget="${GPU_CHECK_BUDGET_S:-480}"
status=0
began=$SECONDS

step() {  # step NAME SECONDS tfcalc-args...: run one tfcalc command into $out/NAME.csv, print it, keep going
  local name=$1 limit=$2
  shift 2
  local left=$((budget - (SECONDS - began)))
  if [ "$left" -lt 20 ]; then
    echo "== $name: skipped, ${left} s of GPU_CHECK_BUDGET_S=$budget left"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name: tfcalc $*"
  local start=$SECONDS
  if timeout "$limit" "$py" -m tfcalc "$@" --output "$out/$name.csv"; then
    "$py" - "$out/$name.csv" <<'PY'
import sys
import pandas as pd
pd.set_option("display.width", 250, "display.max_columns", 40)
print(pd.read_csv(sys.argv[1]).to_string(index=False))
PY
  else
    echo "!! $name failed or timed out (exit $?)"
    status=1
  fi
  echo "   ($((SECONDS - start)) s; $((SECONDS - began)) s so far)"
}

{ date -u; nvidia-smi --query-gpu=name,memory.total,clocks.max.memory,clocks.max.sm,power.limit,driver_version \
    --format=csv 2>/dev/null; "$py" -c "import torch; print('torch', torch.__version__, torch.version.cuda)"; } \
  | tee "$out/device.txt"

if [ "$smoke" = 1 ]; then
  dev=(--device cpu)
  tiny=(--hidden 128 --intermediate 256 --vocab 1024)
  model=(--device cpu --layers 1 "${tiny[@]}" --batch 1,8 --prompt-len 64)
  context=(--device cpu --layers 1 "${tiny[@]}" --context 64,256 --gen-len 8)
  fp8=(--device cpu --layers 1 "${tiny[@]}" --prompt-len 64 --gen-len 8)
  gemma=(--device cpu --layers 2 "${tiny[@]}" --batch 1 --prompt-len 64 --gen-len 8)
  deepseek=(--device cpu --layers 2 "${tiny[@]}" --experts 16 --batch 1 --prompt-len 64 --gen-len 4)
  minimax=(--device cpu --layers 2 "${tiny[@]}" --experts 16 --batch 1 --prompt-len 64 --gen-len 4)
  qwen_next=(--device cpu --layers 4 "${tiny[@]}" --experts 16 --batch 1 --prompt-len 64 --gen-len 4)
  llama4=(--device cpu --layers 4 "${tiny[@]}" --experts 16 --batch 1 --prompt-len 64 --gen-len 4)
  gemma4=(--device cpu --layers 4 "${tiny[@]}" --experts 16 --batch 1 --prompt-len 64 --gen-len 4)
  dsa=(--device cpu --layers 2 "${tiny[@]}" --experts 16 --batch 1 --prompt-len 64 --gen-len 4)
  nemotron=(--device cpu --layers 6 "${tiny[@]}" --experts 16 --batch 1 --prompt-len 64 --gen-len 4)
  quick=(--warmup 0 --repeats 1)  # last on each profile line: one timed run is enough to check the plumbing
  calibrate_quick=(--quick)
else
  dev=(--device cuda)
  model=(--gpu 0 --batch 1,8,64 --prompt-len 512,4096)
  context=(--gpu 0 --batch 1 --context 1024,8192,32768 --gen-len 32 --warmup 1 --repeats 3)
  fp8=(--gpu 0 --layers 16 --prompt-len 512 --gen-len 64 --repeats 3)
  gemma=(--gpu 0 --batch 1 --prompt-len 4096 --gen-len 64 --repeats 3)  # past the 4096 window: the ring turns
  deepseek=(--gpu 0 --layers 4 --batch 1 --prompt-len 512 --gen-len 32 --repeats 3)
  minimax=(--gpu 0 --layers 4 --batch 1,8 --prompt-len 512 --gen-len 32 --repeats 3)
  qwen_next=(--gpu 0 --layers 4 --batch 1,8 --prompt-len 2048 --gen-len 32 --repeats 3)
  llama4=(--gpu 0 --layers 4 --batch 1,4 --prompt-len 12288 --gen-len 32 --repeats 3)
  gemma4=(--gpu 0 --layers 4 --batch 1,8 --prompt-len 8192 --gen-len 32 --repeats 3)
  dsa=(--gpu 0 --layers 4 --batch 1,8 --prompt-len 8192 --gen-len 32 --repeats 3)  # past the top-2048
  nemotron=(--gpu 0 --layers 6 --batch 1,8 --prompt-len 4096 --gen-len 32 --repeats 3)
  quick=()
  calibrate_quick=()
fi
estimate=(--preset llama3-8b --batch 1,8,64 --prompt-len 64,512,4096 --gen-len 64)

# --- default: the most valuable measurements first ------------------------------------------------------------
step ceilings 90 bench ceilings "${dev[@]}" --dtype bf16,fp16
step profile 240 profile "${model[@]}" --preset llama3-8b --dtype bf16 --gen-len 64 --repeats 3 \
  --save-calibration "$out/calibration.json" "${quick[@]}"
preset=$("$py" -c "import csv,sys; r=next(csv.DictReader(open(sys.argv[1]))); print(r['gpu_preset'] or 'h100-sxm')" \
  "$out/profile.csv" 2>/dev/null || echo h100-sxm)
step estimate_calibrated 45 estimate "${estimate[@]}" --gpu "$preset" --calibration "$out/calibration.json"
step estimate_preset 45 estimate "${estimate[@]}" --gpu "$preset"
if [ "$full" = 1 ]; then fp8_batch=(--batch 1,8); else fp8_batch=(--batch 1); fi
step profile_fp8 180 profile "${fp8[@]}" "${fp8_batch[@]}" --preset llama3-70b --dtype bf16 \
  --weights-dtype fp8,fp8_block "${quick[@]}"
step profile_context 150 profile "${context[@]}" --preset llama3-8b --dtype bf16 --plot "$out/tpot_vs_context.png" \
  "${quick[@]}"
step calibrate 120 bench calibrate "${dev[@]}" "${calibrate_quick[@]}" --save "$out/latency_calibration.json"
step estimate_latency_calibrated 45 estimate "${estimate[@]}" --gpu "$preset" \
  --calibration "$out/latency_calibration.json"

# --- GPU_CHECK_FULL=1: the remaining new paths and the component benchmarks ---------------------------------------
if [ "$full" = 1 ]; then
  step profile_gemma2 150 profile "${gemma[@]}" --preset gemma2-9b --dtype bf16 "${quick[@]}"
  step profile_deepseek 180 profile "${deepseek[@]}" --preset deepseek-v3 --dtype bf16 --weights-dtype fp8_block \
    "${quick[@]}"
  step profile_minimax 180 profile "${minimax[@]}" --preset minimax-m2.5 --dtype bf16 --weights-dtype fp8_block \
    "${quick[@]}"
  step profile_qwen3_next 180 profile "${qwen_next[@]}" --preset qwen3-next-80b-a3b --dtype bf16 "${quick[@]}"
  step profile_llama4 180 profile "${llama4[@]}" --preset llama4-scout-17b-16e --dtype bf16 "${quick[@]}"
  step profile_gemma4 180 profile "${gemma4[@]}" --preset gemma4-26b-a4b --dtype bf16 "${quick[@]}"
  step profile_dsa 180 profile "${dsa[@]}" --preset deepseek-v3.2 --dtype bf16 --weights-dtype fp8_block "${quick[@]}"
  step profile_nemotron 180 profile "${nemotron[@]}" --preset nemotron-3-nano-30b-a3b --dtype bf16 "${quick[@]}"
  step attention 90 bench attention "${dev[@]}"
  step moe 90 bench moe "${dev[@]}"
fi

# --- several GPUs: only when more than one is visible (issue 10) ------------------------------------------------
gpus=$("$py" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null \
  || echo 0)
if [ "$smoke" = 1 ] || [ "$gpus" -gt 1 ]; then
  began=$SECONDS
  budget="${GPU_CHECK_MULTI_BUDGET_S:-300}"
  if [ "$smoke" = 1 ]; then
    collect=(--device cpu --ranks 2 --max-size 64k --repeats 2)
    tps=(2)
    seventy=(--device cpu --layers 2 "${tiny[@]}" --batch 1,2 --prompt-len 32 --gen-len 8 --dtype fp32 "${quick[@]}")
    mixtral=(--device cpu --layers 2 "${tiny[@]}" --experts 4 --batch 2 --prompt-len 32 --gen-len 8 --dtype fp32
             "${quick[@]}")
  else
    collect=(--device cuda)
    tps=()
    for tp in 2 4 8; do [ "$tp" -le "$gpus" ] && tps+=("$tp"); done
    seventy=(--layers 40 --batch 1,8 --prompt-len 512 --gen-len 32 --repeats 3 --dtype bf16)
    mixtral=(--layers 8 --batch 2,16 --prompt-len 512 --gen-len 32 --repeats 3 --dtype bf16)
  fi
  step collectives 180 bench collectives "${collect[@]}" --save "$out/collectives.json"
  for tp in "${tps[@]}"; do
    step "profile_tp$tp" 240 profile "${seventy[@]}" --preset llama3-70b --tp "$tp" \
      --calibration "$out/collectives.json"
  done
  if [ "$full" = 1 ]; then
    step profile_ep 240 profile "${mixtral[@]}" --preset mixtral-8x7b --tp 2 --ep 2 --calibration "$out/collectives.json"
    step profile_tp2_fp8 240 profile "${seventy[@]}" --preset llama3-70b --tp 2 --weights-dtype fp8 \
      --calibration "$out/collectives.json"
  fi
fi

echo "== targets"
[ "$smoke" = 1 ] && echo "(smoke run on the CPU against an H100 prediction: checks the plumbing, not the targets)"
"$py" - "$out" <<'PY' | tee "$out/targets.txt"
import os
import sys
import pandas as pd

out = sys.argv[1]


def table(name):
    path = f"{out}/{name}.csv"
    return pd.read_csv(path) if os.path.exists(path) else None


def ok_rows(frame):
    return frame[frame.status.astype(str).str.startswith("ok")] if frame is not None else None


prof, est = table("profile"), table("estimate_calibrated")
if prof is None or est is None:
    sys.exit("missing table: profile.csv or estimate_calibrated.csv")
ok = ok_rows(prof)
b1 = ok[ok.batch == 1]
p4k = ok[ok.prompt_len == ok.prompt_len.max()]
merged = ok.merge(est, on=["batch", "prompt_len", "gen_len"], suffixes=("", "_est"))
ratio = merged.decode_tokens_per_s / merged.decode_tokens_per_s_est
ratios = {}
for name in ("estimate_latency_calibrated", "estimate_preset"):
    try:
        other = pd.read_csv(f"{out}/{name}.csv")
    except FileNotFoundError:
        continue
    m = ok.merge(other, on=["batch", "prompt_len", "gen_len"], suffixes=("", "_est"))
    ratios[name] = (m.decode_tokens_per_s / m.decode_tokens_per_s_est, m.ttft_s_est / m.ttft_s)
rows = [
    ("decode batch 1, llama3-8b bf16: achieved / measured copy bandwidth >= 0.75", b1.mbu_measured.min()),
    ("profile rows: measured / predicted (latency model, preset rates), decode tok/s (min)",
     ok.measured_over_predicted.min()),
    ("profile rows: measured / predicted (latency model, preset rates), decode tok/s (max)",
     ok.measured_over_predicted.max()),
    ("prefill, longest prompt: achieved / measured matmul FLOP/s >= 0.50", p4k.mfu_measured.max()),
    ("measured / calibrated prediction, decode tok/s, in 0.8-1.25 (min)", ratio.min()),
    ("measured / calibrated prediction, decode tok/s, in 0.8-1.25 (max)", ratio.max()),
]
for name, (decode, ttft) in ratios.items():
    rows += [(f"measured / {name}, decode tok/s, in 0.8-1.25 (min)", decode.min()),
             (f"measured / {name}, decode tok/s, in 0.8-1.25 (max)", decode.max()),
             (f"{name} TTFT / measured TTFT (median)", ttft.median())]
fp8 = ok_rows(table("profile_fp8"))
if fp8 is not None and len(fp8):
    for weights, group in fp8.groupby("weights_dtype"):
        rows.append((f"decode batch 1, llama3-70b {weights}: achieved / measured copy bandwidth >= 0.75",
                     group[group.batch == 1].mbu_measured.min()))
        rows.append((f"llama3-70b {weights}: measured / predicted decode tok/s (median)",
                     group.measured_over_predicted.median()))
        print(f"llama3-70b {weights}: GEMM {sorted(set(group.fp8_gemm.astype(str)))} "
              f"(scaled_mm expected on H100/H200), decode {sorted(set(group.decode_attention.astype(str)))}, "
              f"compiled {sorted(set(group.compiled.astype(str)))}")
ctx = ok_rows(table("profile_context"))
if ctx is not None and len(ctx) >= 2:
    ctx = ctx.sort_values("decode_context_mean")
    first, last = ctx.iloc[0], ctx.iloc[-1]
    rows.append(("context sweep: KV bytes read per step, longest / shortest context (grows with live length)",
                 last.kv_bytes_read_per_step / first.kv_bytes_read_per_step))
    rows.append(("context sweep: TPOT longest / shortest, measured", last.tpot_s / first.tpot_s))
    rows.append(("context sweep: TPOT longest / shortest, predicted", last.predicted_tpot_s / first.predicted_tpot_s))
for name in ("profile_gemma2", "profile_deepseek", "profile_minimax", "profile_qwen3_next", "profile_llama4",
             "profile_gemma4", "profile_dsa", "profile_nemotron"):
    frame = table(name)
    if frame is None:
        print(f"{name}: not run (GPU_CHECK_FULL=1)")
        continue
    good = ok_rows(frame)
    print(f"{name}: {len(good)} of {len(frame)} rows ok; decode {sorted(set(frame.decode_attention.astype(str)))}; "
          f"compiled {sorted(set(frame.compiled.astype(str)))}; layers {sorted(set(frame.layer_pattern.astype(str)))}")
    if len(good):
        rows.append((f"{name}: decode batch 1, achieved / measured copy bandwidth",
                     good[good.batch == 1].mbu_measured.min()))
coll = table("collectives")
if coll is not None:
    for op, group in coll.groupby("op"):
        print(f"collectives {op}: largest busbw {group.busbw_bytes_per_s.max() / 1e9:.1f} GB/s at "
              f"{int(group.loc[group.busbw_bytes_per_s.idxmax(), 'bytes']):,} B, smallest time "
              f"{group.time_s.min() * 1e6:.1f} us; fit residuals rms "
              f"{(group.fit_residual ** 2).mean() ** 0.5:.1%}")
for name in sorted(f[:-4] for f in os.listdir(out) if f.startswith(("profile_tp", "profile_ep")) and f.endswith(".csv")):
    good = ok_rows(table(name))
    for _, r in good.iterrows():
        rows.append((f"{name} batch {r.batch}: decode comm measured / predicted (calibrated link)",
                     r.decode_comm_s / r.predicted_decode_comm_s))
        rows.append((f"{name} batch {r.batch}: decode comm share of TPOT, measured", r.decode_comm_fraction))
        rows.append((f"{name} batch {r.batch}: measured / predicted decode tok/s", r.measured_over_predicted))
for label, value in rows:
    print(f"{label:90s} {value:8.3f}")
PY
exit $status
