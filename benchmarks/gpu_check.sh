#!/usr/bin/env bash
# The prepared GPU check (issues 5 and 9): measured ceilings; `tfcalc profile` of a llama3-8b-shaped model in bf16
# at batch 1/8/64 and prompt 512/4096 (with CUDA-graph decode); `tfcalc estimate` calibrated by that profile;
# `tfcalc bench calibrate` (GEMM curve, copy bandwidth by size, launch floor with/without CUDA graphs, attention by
# context) and `tfcalc estimate` calibrated by it; the attention and moe component benchmarks; then the targets.
# Every table lands in one folder as CSV.
#
# Usage (repository root, a CUDA GPU, PyTorch installed):  bash benchmarks/gpu_check.sh [OUT_DIR]
# Runs without installing tfcalc (PYTHONPATH=.). Sized to finish in under 8 minutes on an H100/H200.
# GPU_CHECK_SMOKE=1 runs the same steps on the CPU with a tiny model, to check the script itself in seconds.
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
  model=(--device cpu --layers 1 --hidden 128 --intermediate 256 --vocab 1024 --batch 1,8 --prompt-len 64)
else
  dev=(--device cuda)
  model=(--gpu 0 --batch 1,8,64 --prompt-len 512,4096)
fi
step ceilings 120 bench ceilings "${dev[@]}" --dtype bf16,fp16
step profile 300 profile "${model[@]}" --preset llama3-8b --dtype bf16 --gen-len 64 --repeats 3 \
  --save-calibration "$out/calibration.json"
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
import sys
import pandas as pd

out = sys.argv[1]
try:
    prof = pd.read_csv(f"{out}/profile.csv")
    est = pd.read_csv(f"{out}/estimate_calibrated.csv")
except FileNotFoundError as exc:
    sys.exit(f"missing table: {exc.filename}")
ok = prof[prof.status.astype(str).str.startswith("ok")]
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
    ("decode batch 1: achieved / measured copy bandwidth >= 0.75", b1.mbu_measured.min()),
    ("prefill, longest prompt: achieved / measured matmul FLOP/s >= 0.50", p4k.mfu_measured.max()),
    ("measured / calibrated prediction, decode tok/s, in 0.8-1.25 (min)", ratio.min()),
    ("measured / calibrated prediction, decode tok/s, in 0.8-1.25 (max)", ratio.max()),
]
for name, (decode, ttft) in ratios.items():
    rows += [(f"measured / {name}, decode tok/s, in 0.8-1.25 (min)", decode.min()),
             (f"measured / {name}, decode tok/s, in 0.8-1.25 (max)", decode.max()),
             (f"{name} TTFT / measured TTFT (median)", ttft.median())]
for label, value in rows:
    print(f"{label:70s} {value:8.3f}")
PY
exit $status
