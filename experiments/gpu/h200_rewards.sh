#!/usr/bin/env bash
# One device call on a lent H200: the rewards with a model at their real size (random weights, bf16, 512x512
# decoded images, batch 16: one forward per call), seconds per batch, peak memory and FLOPs against the matmul
# ceiling measured in the same run (issue 22: an H200 cost for every new reward).
#
#   device run (kind nvidia-h200, carry [".whl"], timeout 600):
#     bash experiments/gpu/h200_rewards.sh
#
# Results under $OUT: log.txt, summary.md (one table per reward), results.tgz (reward-<name>.json/.md);
# committed under experiments/results/gpu/rewards/. About 4 minutes; the deadline keeps it under 9.
OUT=${OUT:-/tmp/h200_rewards_out} WORK=/tmp/h200_rewards DEADLINE_S=${DEADLINE_S:-530}
source experiments/gpu/steps.sh
gpu_setup

for reward in clipscore hpsv2.1 imagereward ocr; do
    step "$reward" 90 python3 experiments/measure.py reward --reward "$reward" --batch-sizes 1,16 \
        --height 512 --width 512 --dtype bfloat16 --warmup 2 --iters 5 --time-budget-s 80 --out "$WORK"
done

finish
