#!/usr/bin/env bash
# Issue 34, item 5, one device call: the per-sample cost distributions the simulator draws from
# (`simulate.py throughput --variance FILE`). The hybrid engine's switch at the tables' model sizes is
# experiments/gpu/switch_costs.sh's call.
#   1. judge   — the VLM judge (Qwen2.5-VL-7B size, random weights) answering 1..256 tokens
#                (`measure.py reward-latency`, digenrl/perf/measure_sample_costs.py);
#   2. frames  — Wan2.1-14B's denoising step at 33/49/65/81 frames (`measure.py sample-costs`);
#   3. server  — a PickScore reward server on this machine, 200 requests one at a time (queueing under load
#                is not included: the file says so).
# Results: $OUT/log.txt, $OUT/results.tgz (variance/*.json).
#
#   device run (kind nvidia-h200 or nvidia-h100-x1, carry [".whl"], timeout 600):
#     bash experiments/gpu/variance_costs.sh
#     ONLY="judge frames" bash experiments/gpu/variance_costs.sh
OUT=${OUT:-/tmp/device_out} WORK=${WORK:-/tmp/device_work} DEADLINE_S=${DEADLINE_S:-560}
# shellcheck source=experiments/gpu/steps.sh
source experiments/gpu/steps.sh
gpu_setup
ONLY=${ONLY:-judge frames server}
V="$WORK/variance"
if wanted judge; then
    step judge 150 python3 experiments/measure.py reward-latency --reward vlm-judge --lengths 1,16,64,128,256 \
        --warmup 1 --iters 3 --out "$V"
fi
if wanted frames; then
    step frames 140 python3 experiments/measure.py sample-costs --model wan2.1-14b --frames 33,49,65,81 \
        --warmup 1 --iters 3 --out "$V"
fi
if wanted server; then
    python3 -m digenrl.rewards.serve --reward pickscore --port 8765 --device cuda:0 >"$WORK/server.log" 2>&1 &
    server=$!
    # wait for /health (the model loads first), then time it
    step server 120 bash -c 'python3 -c "
import time, urllib.request
for _ in range(90):
    try:
        urllib.request.urlopen(\"http://127.0.0.1:8765/health\", timeout=2); break
    except OSError:
        time.sleep(1)
" && python3 experiments/measure.py reward-latency --url http://127.0.0.1:8765 --requests 200 --out "$0"' "$V"
    kill "$server" 2>/dev/null
fi
finish
