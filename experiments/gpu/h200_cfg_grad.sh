#!/usr/bin/env bash
# One device call on a lent H200: the CFG training gradient, algo.cfg_grad=cond (unconditional prediction
# detached, its forward in a separate no-graph pass) next to cfg_grad=both (full gradient, one batched 2B
# forward with a graph), for the LoRA trainer at SD3.5-medium and Qwen-Image size on the project's optimised
# path. --cfg-split-min-batch 1 splits at every micro-batch size, so the cond-vs-both table shows where the
# split pays and checks CFG_SPLIT_MIN_BATCH (digenrl/rollout/sampler.py); the on-policy max |r - 1| columns
# show what the split's batch composition does to the first ratio.
#
#   device run (kind nvidia-h200, carry [".whl"], timeout 600):
#     bash experiments/gpu/h200_cfg_grad.sh
#
# Results under $OUT: log.txt, summary.md (the cond-vs-both tables) and results.tgz (experiments/gpu/steps.sh).
OUT=${OUT:-/tmp/h200_cfg_grad_out} WORK=/tmp/h200_cfg_grad DEADLINE_S=${DEADLINE_S:-565}
source experiments/gpu/steps.sh
gpu_setup

# 1. SD3.5-medium, 16 samples x 1 trained step, guidance 4.5, micro-batches 4, 8, 16 (the sizes measured
#    in eager for the threshold: 1.10x, 0.79x, 0.72x of the time of both branches in one graph).
step cfg-grad-sd35 260 python3 experiments/measure.py trainer --model sd3.5-medium --modes lora \
    --micro-batch-sizes 4,8,16 --samples 16 --train-steps 1 --cfg on --cfg-grad cond,both \
    --cfg-split-min-batch 1 --paths optimized --compile --autocast --warmup 1 --iters 3 \
    --time-budget-s 240 --out "$WORK"

# 2. Qwen-Image, 4 samples x 1 trained step, guidance 4.0, micro-batches 1, 2, 4 (both branches in one graph
#    took 69 GiB at micro-batch 2; 4 may only fit with cond: an out-of-memory row is recorded as skipped).
step cfg-grad-qwen 270 python3 experiments/measure.py trainer --model qwen-image --modes lora \
    --micro-batch-sizes 1,2,4 --samples 4 --train-steps 1 --cfg on --cfg-grad cond,both \
    --cfg-split-min-batch 1 --paths optimized --compile --autocast --warmup 1 --iters 2 \
    --time-budget-s 250 --out "$WORK"

finish
