#!/usr/bin/env bash
# One device call on a lent H200: the VLM-judge reward (digenrl/rewards/vlm_judge.py) at its real size,
# Qwen2.5-VL-7B (8.29 B parameters, random weights, bf16), scoring 512x512 images at batch 1, 4, 8 and 16
# (one forward per call: seconds per batch, peak GiB, FLOPs against the matmul ceiling, the vision tower's
# share), and its costs written into the 512x512 H200 cost files for the simulator.
#
#   device run (kind nvidia-h200, carry [".whl"], timeout 600):
#     bash experiments/gpu/h200_vlm_judge.sh
#
# Results under $OUT: log.txt, summary.md (the table and the cost-file fragment: reward_points in seconds
# per batch, reward_param_bytes), results.tgz, and costs/h200-{sd3.5-medium,flux.1-dev,qwen-image}.json =
# the committed cost files with the judge's reward_points / reward_param_bytes (meta.reward = vlm-judge,
# meta.reward_costs = how they were measured); copy them over experiments/results/costs/ to make the
# simulator score with the judge. Runs in about 2-3 minutes; the deadline keeps it under 9.
OUT=${OUT:-/tmp/h200_vlm_judge_out} WORK=/tmp/h200_vlm_judge DEADLINE_S=${DEADLINE_S:-530}
source experiments/gpu/steps.sh
mkdir -p "$OUT/costs"
gpu_setup

COST_FILES="experiments/results/costs/h200-sd3.5-medium.json experiments/results/costs/h200-flux.1-dev.json
experiments/results/costs/h200-qwen-image.json"

# 1. The judge with transformers' SDPA attention (its vision tower loops over the attention windows).
# shellcheck disable=SC2086
step vlm-judge-sdpa 300 python3 experiments/bench_reward.py --reward vlm-judge --batch-sizes 1,4,8,16 \
    --height 512 --width 512 --attn-implementation sdpa --warmup 2 --iters 5 --time-budget-s 270 \
    --out "$WORK" --apply-to $COST_FILES
cp "$WORK"/costs/*.json "$OUT/costs/" 2>/dev/null

# 2. The same with FlashAttention-2 varlen (one kernel for all windows), only if the image has flash_attn.
if python3 -c "import flash_attn" 2>/dev/null; then
    step vlm-judge-fa2 180 python3 experiments/bench_reward.py --reward vlm-judge --batch-sizes 1,4,8,16 \
        --height 512 --width 512 --attn-implementation flash_attention_2 --warmup 2 --iters 5 \
        --ceiling-size 0 --time-budget-s 160 --out "$WORK/fa2.json"
else
    echo "## flash_attn not installed: FlashAttention-2 row skipped"
fi

finish
