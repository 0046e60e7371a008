#!/usr/bin/env bash
# One device call on a lent H200: the LoRA trainer at SD3.5-medium and FLUX.1 size, eager vs the project's
# optimised path (safe attention + regional torch.compile) with a kernel profile of every configuration, the
# FLUX cost file, and the Wan2.1-14B generator at a short clip.
#
#   device run (kind nvidia-h200, carry [".whl"], timeout 600):
#     bash experiments/gpu/h200_trainer.sh
#
# Results under $OUT: log.txt, summary.md, results.tgz and costs/h200-flux.1-dev.json (experiments/gpu/steps.sh).
OUT=${OUT:-/tmp/h200_trainer_out} WORK=/tmp/h200_trainer
source experiments/gpu/steps.sh
mkdir -p "$OUT/costs"
gpu_setup

# 1. SD3.5-medium LoRA trainer, 8 samples x 2 trained steps = 16 units per logical batch, CFG off and on.
step train-sd35 250 python3 experiments/bench_trainer.py --model sd3.5-medium --modes lora \
    --micro-batch-sizes 1,4,8 --samples 8 --train-steps 2 --cfg both --paths optimized,eager --compile \
    --profile --warmup 1 --iters 3 --time-budget-s 230 --out "$WORK"

# 2. FLUX.1-dev-size LoRA trainer on one GPU (guidance-distilled: no CFG pass). Its eager path keeps the safe
#    attention: torch's default (cuDNN) SDPA backward fails at this size on torch 2.11 + cuDNN 9.19.
step train-flux 170 python3 experiments/bench_trainer.py --model flux.1-dev --modes lora \
    --micro-batch-sizes 1,2 --samples 2 --train-steps 1 --cfg off --paths optimized,eager --eager-sdpa safe \
    --compile --profile --warmup 1 --iters 3 --time-budget-s 150 --out "$WORK"

# 3. FLUX cost file: the committed generator benchmark plus the trainer benchmark of step 2.
step costs-flux 50 python3 experiments/emit_costs.py \
    --generator experiments/results/gpu/generator-flux.1-dev.json \
    --trainer "$WORK/trainer-flux.1-dev.json" --device-name h200 --out-dir "$OUT/costs"
cp "$OUT"/costs/*.json "$WORK"/ 2>/dev/null

# 4. Wan2.1-14B generator step at a short clip (33 frames, 480x832: 9 latent frames, 14040 video tokens).
step gen-wan14b 160 python3 experiments/bench_generator.py --model wan2.1-14b --frames 33 --height 480 \
    --width 832 --batch-sizes 1 --cfg both --compile --warmup 1 --iters 3 --time-budget-s 140 --out "$WORK"

finish
