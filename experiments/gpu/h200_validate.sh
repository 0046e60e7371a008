#!/usr/bin/env bash
# One device call on a lent H200: the simulator against full FlowGRPO loops (docs/design.md §5: trusted only
# as far as it matches real runs). SD3.5-medium and FLUX.1-dev LoRA, colocated-sync, the GPU path
# (compile + autocast), several iterations each; then predicted vs measured seconds per phase for each run
# (python experiments/simulate.py validate), the error next to every predicted number. Goal: every phase
# within 10%. Compile happens in iteration 0, which the comparison leaves out (--warmup 1).
#
#   device run (kind nvidia-h200, carry [".whl"], timeout 600):
#     bash experiments/gpu/h200_validate.sh
#
# Results under $OUT: log.txt, summary.md, results.tgz (both runs' out_dir: config.yaml, metrics.jsonl,
# events/, trace.json) and validation/gpu-h200.{md,json} — copy that folder to experiments/results/validation/
# and the runs to experiments/results/gpu/runs/ (experiments/results/README.md).
OUT=${OUT:-/tmp/h200_validate_out} WORK=/tmp/h200_validate DEADLINE_S=${DEADLINE_S:-570}
source experiments/gpu/steps.sh
mkdir -p "$OUT/validation"
gpu_setup

# 1. SD3.5-medium: 2 prompts x 8 samples, 10 steps, CFG 4.5, micro-batch 16 (~6.6 s/iteration after compile).
step run-sd35 230 python3 experiments/run_train.py --config experiments/configs/sd35-medium-lora.yaml \
    iterations=7 out_dir="$WORK/h200-1-sd35-compiled"

# 2. FLUX.1-dev: 2 prompts x 8 samples, 10 steps, micro-batch 2 (~27 s/iteration).
step run-flux 230 python3 experiments/run_train.py --config experiments/configs/flux-dev-lora.yaml \
    iterations=5 out_dir="$WORK/h200-1-flux-compiled"

# 3. Predicted vs measured, per phase, from the committed H200 cost files (compiled+autocast path).
step validate 60 python3 experiments/simulate.py validate "$WORK/h200-1-sd35-compiled" \
    "$WORK/h200-1-flux-compiled" --warmup 1 --name gpu-h200 --out "$WORK/validation"
cp "$WORK"/validation/* "$OUT/validation/" 2>/dev/null

finish
