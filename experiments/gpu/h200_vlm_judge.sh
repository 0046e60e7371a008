#!/usr/bin/env bash
# One device call on a lent H200: the VLM-judge reward (digenrl/rewards/vlm_judge.py) at its real size,
# Qwen2.5-VL-7B (8.29 B parameters, random weights, bf16), scoring 512x512 images at batch 1, 4, 8 and 16
# (one forward per call: seconds per batch, peak GiB, FLOPs against the matmul ceiling, the vision tower's
# share), and its costs written into the 512x512 H200 cost files for the simulator.
#
#   device run (kind nvidia-h200, carry [".whl"], timeout 600):
#     bash experiments/gpu/h200_vlm_judge.sh
#
# Results under $OUT: log.txt, summary.md (the tables and the cost-file fragment: reward_points in seconds
# per batch, reward_param_bytes), results.tgz, and costs/h200-{sd3.5-medium,flux.1-dev,qwen-image}.json =
# the committed cost files with the judge's reward_points / reward_param_bytes (meta.reward = vlm-judge,
# meta.reward_costs = how they were measured); copy them over experiments/results/costs/ to make the
# simulator score with the judge. About 3 minutes; the deadline keeps it under 9.
OUT=${OUT:-/tmp/h200_vlm_judge_out} WORK=/tmp/h200_vlm_judge DEADLINE_S=${DEADLINE_S:-530}
source experiments/gpu/steps.sh
mkdir -p "$OUT/costs"
gpu_setup

COST_FILES="experiments/results/costs/h200-sd3.5-medium.json experiments/results/costs/h200-flux.1-dev.json
experiments/results/costs/h200-qwen-image.json"

# 1. The judge as the reward runs it on a GPU: the vision tower's attention windows packed into one varlen
#    flash call per block (vision_attention=auto -> varlen), the language model on SDPA. Its numbers go into
#    the cost files. Each row also compares the packed vision tower with transformers' per-window loop.
# shellcheck disable=SC2086
step vlm-judge 240 python3 experiments/measure.py reward --reward vlm-judge --batch-sizes 1,4,8,16 \
    --height 512 --width 512 --vision-attention auto --warmup 2 --iters 5 --time-budget-s 220 \
    --out "$WORK" --apply-to $COST_FILES
cp "$WORK"/costs/*.json "$OUT/costs/" 2>/dev/null

# 2. For comparison, transformers' own vision path: one SDPA call per attention window (launch-bound).
#    (FlashAttention-2 is not installed on this image, so attn_implementation=flash_attention_2 is not timed.)
step vlm-judge-loop 200 python3 experiments/measure.py reward --reward vlm-judge --batch-sizes 1,4,8,16 \
    --height 512 --width 512 --vision-attention loop --warmup 2 --iters 5 --ceiling-size 0 --no-flops \
    --time-budget-s 180 --out "$WORK/loop.json"

finish
