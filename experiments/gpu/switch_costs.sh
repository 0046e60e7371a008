#!/usr/bin/env bash
# Issue 34, item 2: the hybrid engine's switch (system=colocated-engine) measured on one GPU at the tables'
# model sizes, random weights: offload / onload of the optimizer state, the trainer's weights (full) and the
# generation copy, and the re-shard (`python experiments/measure.py switch`, digenrl/perf/measure_switch.py).
# Each model is one step (expected: build ~20-60 s, switches ~10-40 s); a mode whose copies do not fit the
# GPU's free memory is skipped with the reason in its JSON (LoRA needs two copies of the transformer, full
# fine-tuning two copies and AdamW's two moments: FLUX.1-dev and larger full fine-tunes need an H200).
# Where a committed cost file of the kind exists (experiments/results/costs/<DEVICE>-<model>.json), the
# summary goes into its meta.engine_switch and the updated file comes back under costs/ in results.tgz.
#
#   device run (kind nvidia-h100-x1 with DEVICE=h100, or nvidia-h200; carry [".whl"], timeout 600):
#     DEVICE=h100 bash experiments/gpu/switch_costs.sh
#     DEVICE=h200 ONLY="qwen-image wan2.1-14b" bash experiments/gpu/switch_costs.sh
OUT=${OUT:-/tmp/device_out} WORK=${WORK:-/tmp/device_work} DEADLINE_S=${DEADLINE_S:-560}
# shellcheck source=experiments/gpu/steps.sh
source experiments/gpu/steps.sh
gpu_setup
DEVICE=${DEVICE:-h200}
require_device_kind "$DEVICE"  # its summary goes into $DEVICE's cost files
ONLY=${ONLY:-sd3.5-medium flux.1-dev qwen-image wan2.1-14b}
for model in sd3.5-medium flux.1-dev qwen-image wan2.1-14b; do
    wanted "$model" || continue
    cost=experiments/results/costs/$DEVICE-$model.json
    record=()
    [[ -f $cost ]] && record=(--cost-file "$cost")
    step "switch-$model" 150 python3 experiments/measure.py switch --model "$model" --modes lora,full \
        --out "$WORK/switch" "${record[@]}"
    if [[ -f $cost ]]; then
        mkdir -p "$WORK/costs"
        cp "$cost" "$WORK/costs/"
    fi
done
finish
