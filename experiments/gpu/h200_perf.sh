#!/usr/bin/env bash
# One device call on a lent H200: generator and trainer benchmarks (diffusers-eager vs the project's optimised
# path), the attention-backward regression check, and the simulator's cost file.
#
#   device run (kind nvidia-h200, carry [".whl"], timeout 600):
#     bash experiments/gpu/h200_perf.sh
#
# Results under $OUT: log.txt, summary.md, results.tgz (every JSON + markdown the steps wrote) and
# costs/h200-sd3.5-medium.json (CostModel); experiments/gpu/steps.sh runs the steps. Steps run in order of
# value. Compile time counts.
OUT=${OUT:-/tmp/h200_perf_out} WORK=/tmp/h200_perf
source experiments/gpu/steps.sh
mkdir -p "$OUT/costs"
gpu_setup

# 1. Backward regression: LoRA forward+backward through 2 dual + 2 single FLUX blocks, one process per setting
#    (safe = the project's trainer choice; default = torch/diffusers defaults; cudnn = cuDNN SDPA forced).
step regression 110 python3 experiments/measure.py trainer --regression-only --regression-model flux.1-dev \
    --regression-blocks 2,2 --regression-heights 512,1024 --regression-settings safe,default,cudnn \
    --regression-timeout-s 60 --out "$WORK/regression-flux.1-dev.json"

# 2. SD3.5-medium generator step, eager vs optimised (regional torch.compile, torch's automatic dynamic batch).
step gen-sd35 190 python3 experiments/measure.py generator --model sd3.5-medium --batch-sizes 1,4,16 --cfg both \
    --compile --warmup 2 --iters 5 --time-budget-s 160 --out "$WORK"

# 3. SD3.5-medium LoRA trainer: optimised (safe attention) first, then the eager defaults.
step train-sd35 110 python3 experiments/measure.py trainer --model sd3.5-medium --modes lora \
    --micro-batch-sizes 1,2,4 --samples 4 --train-steps 1 --cfg both --paths optimized,eager \
    --warmup 1 --iters 3 --time-budget-s 90 --out "$WORK"

# 4. Cost file for the simulator from steps 2 and 3 (+ VAE decode and reward timed here).
step costs 60 python3 experiments/measure.py emit --generator "$WORK/generator-sd3.5-medium.json" \
    --trainer "$WORK/trainer-sd3.5-medium.json" --device-name h200 --out-dir "$OUT/costs"
cp "$OUT"/costs/*.json "$WORK"/ 2>/dev/null
pack

# 5. FLUX.1-dev generator step (guidance-distilled: no CFG pass), eager vs optimised.
step gen-flux 170 python3 experiments/measure.py generator --model flux.1-dev --batch-sizes 1,4 --cfg off \
    --compile --warmup 2 --iters 5 --time-budget-s 140 --out "$WORK"

finish
