#!/usr/bin/env bash
# One device call on a lent H200: the LoRA trainer at SD3.5-medium and FLUX.1 size, eager vs the project's
# optimised path (safe attention + 16-bit autocast for the LoRA matmuls + regional torch.compile), with a
# kernel profile of every configuration, then the FLUX cost file for the simulator.
#
#   device run (kind nvidia-h200, carry [".whl"], timeout 600):
#     bash experiments/gpu/h200_trainer.sh
#
# Results under $OUT: log.txt, summary.md, results.tgz and costs/h200-flux.1-dev.json (experiments/gpu/steps.sh).
OUT=${OUT:-/tmp/h200_trainer_out} WORK=/tmp/h200_trainer DEADLINE_S=${DEADLINE_S:-565}
source experiments/gpu/steps.sh
mkdir -p "$OUT/costs"
gpu_setup

# 1. SD3.5-medium LoRA trainer, 16 samples x 1 trained step = 16 units per logical batch, CFG off and on.
step train-sd35 255 python3 experiments/measure.py trainer --model sd3.5-medium --modes lora \
    --micro-batch-sizes 4,8,16 --samples 16 --train-steps 1 --cfg both --paths optimized,eager --compile \
    --autocast --profile --warmup 1 --iters 3 --time-budget-s 235 --out "$WORK"

# 2. FLUX.1-dev-size LoRA trainer on one GPU (guidance-distilled: no CFG pass). Its eager path keeps the safe
#    attention: torch's default (cuDNN) SDPA backward fails at this size on torch 2.11 + cuDNN 9.19.
step train-flux 205 python3 experiments/measure.py trainer --model flux.1-dev --modes lora \
    --micro-batch-sizes 1,2 --samples 2 --train-steps 1 --cfg off --paths optimized,eager --eager-sdpa safe \
    --compile --autocast --profile --warmup 1 --iters 3 --time-budget-s 185 --out "$WORK"

# 3. FLUX cost file: the committed generator benchmark plus the trainer benchmark of step 2.
step costs-flux 45 python3 experiments/measure.py emit \
    --generator experiments/results/gpu/generator-flux.1-dev.json \
    --trainer "$WORK/trainer-flux.1-dev.json" --device-name h200 --out-dir "$OUT/costs"
cp "$OUT"/costs/*.json "$WORK"/ 2>/dev/null

finish
