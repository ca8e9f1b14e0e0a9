#!/usr/bin/env bash
# The prepared GPU check (issues 5, 9 and 14): measured ceilings; `tfcalc profile` of a llama3-8b-shaped model in bf16
# at batch 1/8/64 and prompt 512/4096 (CUDA-graph decode through flex_attention over the live blocks); the same
# model swept over context with a plot of time per token beside the prediction; llama3-70b with FP8 weights
# (per-tensor and 128x128 blocks, 16 of its 80 layers: the ratio of bytes to time is what is measured); gemma2-9b
# (rolling-buffer sliding windows, soft-capping through flex's score_mod); DeepSeek-V3 with FP8 block weights
# (MLA, absorbed decode, MoE; as many layers as fit, the dense/MoE pattern kept); `tfcalc estimate` calibrated by
# the first profile; `tfcalc bench calibrate` and `tfcalc estimate` calibrated by it; the attention and moe component benchmarks; then the targets. Every table lands in one
# folder as CSV.
#
# Usage (repository root, a CUDA GPU, PyTorch installed):  bash benchmarks/gpu_check.sh [OUT_DIR]
# Runs without installing tfcalc (PYTHONPATH=.). Sized for about 12 minutes on an H100/H200, most of it compiling
# the captured decode steps. GPU_CHECK_SMOKE=1 runs the same steps on the CPU with tiny models, to check the script.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu_check}}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"
status=0

step() {  # step NAME SECONDS tfcalc-args...: run one tfcalc command into $out/NAME.csv, print it, keep going
  local name=$1 limit=$2
  shift 2
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
  echo "   ($((SECONDS - start)) s)"
}

{ date -u; nvidia-smi --query-gpu=name,memory.total,clocks.max.memory,clocks.max.sm,power.limit,driver_version \
    --format=csv 2>/dev/null; "$py" -c "import torch; print('torch', torch.__version__, torch.version.cuda)"; } \
  | tee "$out/device.txt"

if [ "${GPU_CHECK_SMOKE:-0}" = 1 ]; then
  dev=(--device cpu)
  tiny=(--hidden 128 --intermediate 256 --vocab 1024)
  model=(--device cpu --layers 1 "${tiny[@]}" --batch 1,8 --prompt-len 64)
  context=(--device cpu --layers 1 "${tiny[@]}" --context 64,256 --gen-len 8)
  fp8=(--device cpu --layers 1 "${tiny[@]}" --batch 1 --prompt-len 64 --gen-len 8)
  gemma=(--device cpu --layers 2 "${tiny[@]}" --batch 1 --prompt-len 64 --gen-len 8)
  deepseek=(--device cpu --layers 2 "${tiny[@]}" --experts 16 --batch 1 --prompt-len 64 --gen-len 4)
  quick=(--warmup 0 --repeats 1)  # last on each profile line: one timed run is enough to check the plumbing
else
  dev=(--device cuda)
  model=(--gpu 0 --batch 1,8,64 --prompt-len 512,4096)
  context=(--gpu 0 --batch 1 --context 1024,8192,32768 --gen-len 32 --warmup 1 --repeats 3)
  fp8=(--gpu 0 --layers 16 --batch 1,8 --prompt-len 512 --gen-len 64 --repeats 3)
  gemma=(--gpu 0 --batch 1,8 --prompt-len 512,4096 --gen-len 64 --repeats 3)
  deepseek=(--gpu 0 --batch 1,8 --prompt-len 512 --gen-len 32 --repeats 3)
  quick=()
fi
step ceilings 120 bench ceilings "${dev[@]}" --dtype bf16,fp16
step profile 300 profile "${model[@]}" --preset llama3-8b --dtype bf16 --gen-len 64 --repeats 3 \
  --save-calibration "$out/calibration.json" "${quick[@]}"
step profile_context 240 profile "${context[@]}" --preset llama3-8b --dtype bf16 --plot "$out/tpot_vs_context.png" \
  "${quick[@]}"
step profile_fp8 300 profile "${fp8[@]}" --preset llama3-70b --dtype bf16 --weights-dtype fp8,fp8_block "${quick[@]}"
step profile_gemma2 240 profile "${gemma[@]}" --preset gemma2-9b --dtype bf16 "${quick[@]}"
step profile_deepseek 300 profile "${deepseek[@]}" --preset deepseek-v3 --dtype bf16 --weights-dtype fp8_block \
  "${quick[@]}"
preset=$("$py" -c "import csv,sys; r=next(csv.DictReader(open(sys.argv[1]))); print(r['gpu_preset'] or 'h100-sxm')" \
  "$out/profile.csv" 2>/dev/null || echo h100-sxm)
step estimate_calibrated 60 estimate --preset llama3-8b --gpu "$preset" --batch 1,8,64 --prompt-len 64,512,4096 \
  --gen-len 64 --calibration "$out/calibration.json"
if [ "${GPU_CHECK_SMOKE:-0}" = 1 ]; then quick=(--quick); else quick=(); fi
step calibrate 180 bench calibrate "${dev[@]}" "${quick[@]}" --save "$out/latency_calibration.json"
step estimate_latency_calibrated 60 estimate --preset llama3-8b --gpu "$preset" --batch 1,8,64 \
  --prompt-len 64,512,4096 --gen-len 64 --calibration "$out/latency_calibration.json"
step estimate_preset 60 estimate --preset llama3-8b --gpu "$preset" --batch 1,8,64 --prompt-len 64,512,4096 \
  --gen-len 64
step attention 120 bench attention "${dev[@]}"
step moe 120 bench moe "${dev[@]}"

echo "== targets"
[ "${GPU_CHECK_SMOKE:-0}" = 1 ] && echo "(smoke run on the CPU against an H100 prediction: checks the plumbing, not the targets)"
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
for name in ("profile_gemma2", "profile_deepseek"):
    frame = table(name)
    if frame is None:
        print(f"{name}: missing")
        continue
    good = ok_rows(frame)
    print(f"{name}: {len(good)} of {len(frame)} rows ok; decode {sorted(set(frame.decode_attention.astype(str)))}; "
          f"compiled {sorted(set(frame.compiled.astype(str)))}; layers {sorted(set(frame.layer_pattern.astype(str)))}")
    if len(good):
        rows.append((f"{name}: decode batch 1, achieved / measured copy bandwidth",
                     good[good.batch == 1].mbu_measured.min()))
for label, value in rows:
    print(f"{label:90s} {value:8.3f}")
PY
exit $status
