#!/usr/bin/env bash
# One device call on a lent H200: the LoRA trainer at Wan2.1-14B size (33-frame 480x832 clip, activation
# checkpointing) and Qwen-Image size, eager vs the project's optimised path (safe attention + 16-bit autocast +
# regional torch.compile), and both cost files for the simulator from the committed generator benchmarks.
#
#   device run (kind nvidia-h200, carry [".whl"], timeout 600):
#     bash experiments/gpu/h200_video_qwen.sh
#
# Results under $OUT: log.txt, summary.md, results.tgz and costs/h200-{wan2.1-14b,qwen-image}.json.
OUT=${OUT:-/tmp/h200_video_qwen_out} WORK=/tmp/h200_video_qwen DEADLINE_S=${DEADLINE_S:-570}
source experiments/gpu/steps.sh
mkdir -p "$OUT/costs"
gpu_setup

# 1. Wan2.1-14B LoRA trainer, one 33-frame clip (14040 video tokens), no CFG pass; activation checkpointing on
#    both paths (the counted FLOPs then include the recomputed forward). Eager keeps the safe attention.
step train-wan14b 200 python3 experiments/measure.py trainer --model wan2.1-14b --frames 33 --height 480 \
    --width 832 --modes lora --micro-batch-sizes 1 --samples 1 --train-steps 1 --cfg off \
    --paths optimized,eager --eager-sdpa safe --compile --autocast --activation-checkpointing --profile \
    --warmup 0 --iters 2 --time-budget-s 180 --out "$WORK"
step costs-wan14b 60 python3 experiments/measure.py emit \
    --generator experiments/results/gpu/h200-trainer-call1/generator-wan2.1-14b.json \
    --trainer "$WORK/trainer-wan2.1-14b.json" --device-name h200 --out-dir "$OUT/costs"

# 2. Qwen-Image LoRA trainer, 2 samples x 1 trained step, CFG off and on.
step train-qwen 200 python3 experiments/measure.py trainer --model qwen-image --modes lora \
    --micro-batch-sizes 1,2 --samples 2 --train-steps 1 --cfg both --paths optimized,eager --eager-sdpa safe \
    --compile --autocast --profile --warmup 1 --iters 2 --time-budget-s 180 --out "$WORK"
step costs-qwen 45 python3 experiments/measure.py emit \
    --generator experiments/results/gpu/generator-qwen-image.json \
    --trainer "$WORK/trainer-qwen-image.json" --device-name h200 --out-dir "$OUT/costs"
cp "$OUT"/costs/*.json "$WORK"/ 2>/dev/null

finish
