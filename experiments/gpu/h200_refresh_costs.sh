#!/usr/bin/env bash
# One device call on a lent H200: re-measure exactly the stale points of the committed H200 cost files
# (python experiments/measure.py missing lists them; digenrl/costs/audit.py): training on the GPU path
# (compile + autocast) at the micro-batches the table workloads use, and CFG training with the runtime's
# default gradient (algo.cfg_grad=cond); then the cost files, re-emitted from these benchmarks next to the
# committed ones, with the committed generator benchmarks and decode/reward points (--score-from: no other
# device work).
#
#   device run (kind nvidia-h200, carry [".whl"], timeout 600):
#     bash experiments/gpu/h200_refresh_costs.sh
#
# Results under $OUT: log.txt, summary.md, results.tgz (the benchmark JSON / md) and costs/h200-<model>.json
# — copy the JSONs to experiments/results/gpu/h200-refresh/ and the cost files to experiments/results/costs/,
# then python experiments/simulate.py throughput --regenerate (experiments/results/README.md).
OUT=${OUT:-/tmp/h200_refresh_out} WORK=/tmp/h200_refresh DEADLINE_S=${DEADLINE_S:-570}
source experiments/gpu/steps.sh
mkdir -p "$OUT/costs"
gpu_setup
C=experiments/results/costs
G=experiments/results/gpu

# 1. SD3.5-medium: micro-batch 4, the table workload's (8 and 16 are measured, call 4), with and without CFG.
step train-sd35 120 python3 experiments/measure.py trainer --model sd3.5-medium --micro-batch-sizes 4 \
    --samples 4 --train-steps 1 --cfg both --cfg-grad cond --modes lora --paths optimized --compile --autocast \
    --warmup 1 --iters 2 --time-budget-s 110 --out "$WORK"

# 2. FLUX.1-dev: micro-batch 4, the table workload's (1 and 2 are measured).
step train-flux 110 python3 experiments/measure.py trainer --model flux.1-dev --micro-batch-sizes 4 --samples 4 \
    --train-steps 1 --cfg off --cfg-grad cond --modes lora --paths optimized --compile --autocast --warmup 1 \
    --iters 2 --eager-sdpa safe --time-budget-s 100 --out "$WORK"

# 3. Qwen-Image: micro-batch 1, 2, 4 with CFG gradient cond (measured: 1, 2 with cfg_grad=both).
step train-qwen 200 python3 experiments/measure.py trainer --model qwen-image --micro-batch-sizes 1,2,4 \
    --samples 4 --train-steps 1 --cfg both --cfg-grad cond --modes lora --paths optimized --compile --autocast \
    --warmup 1 --iters 2 --eager-sdpa safe --time-budget-s 190 --out "$WORK"

# 4. The cost files: these trainer benchmarks next to the committed ones (a later file wins at the same
#    micro-batch), the committed generator benchmarks and decode/reward points.
step costs 60 bash -c "
python3 experiments/measure.py emit --generator $G/generator-sd3.5-medium.json \
    --trainer $G/h200-tests-cfg-call4/trainer-sd3.5-medium.json --trainer $WORK/trainer-sd3.5-medium.json \
    --device-name h200 --score-from $C/h200-sd3.5-medium.json --out-dir $OUT/costs
python3 experiments/measure.py emit --generator $G/generator-flux.1-dev.json \
    --trainer $G/h200-trainer-call2/trainer-flux.1-dev.json --trainer $WORK/trainer-flux.1-dev.json \
    --device-name h200 --score-from $C/h200-flux.1-dev.json --out-dir $OUT/costs
python3 experiments/measure.py emit --generator $G/generator-qwen-image.json \
    --trainer $WORK/trainer-qwen-image.json --device-name h200 --score-from $C/h200-qwen-image.json \
    --out-dir $OUT/costs"
cp "$OUT"/costs/*.json "$WORK"/ 2>/dev/null

finish
