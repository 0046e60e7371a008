#!/usr/bin/env bash
# One device call on a lent H200: generator and trainer benchmarks (diffusers-eager vs the project's optimised
# path), the attention-backward regression check, and the simulator's cost file.
#
#   device run (kind nvidia-h200, carry [".whl"], timeout 600):
#     bash experiments/gpu/h200_perf.sh
#
# Results under $OUT (at most 4 files, all fetchable): log.txt (everything printed), summary.md (all tables),
# h200_perf.tgz (every JSON + markdown the steps wrote), costs/h200-sd3.5-medium.json (CostModel). The tarball
# and summary are rebuilt after every step, so a step cut short loses only itself. Steps run in order of value;
# each gets min(its budget, time left before DEADLINE_S) and is killed at its budget. Compile time counts.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/h200_perf_out}
WORK=/tmp/h200_perf
DEADLINE_S=${DEADLINE_S:-530}  # seconds after start; the device call itself stops at 600
mkdir -p "$OUT" "$WORK" "$OUT/costs"
exec > >(tee -a "$OUT/log.txt") 2>&1
START=$(date +%s)
elapsed() { echo $(($(date +%s) - START)); }

pack() {
    tar -C "$WORK" -czf "$OUT/h200_perf.tgz" . 2>/dev/null
    cat "$WORK"/*.md >"$OUT/summary.md" 2>/dev/null
}

# step NAME BUDGET_S COMMAND...: run COMMAND with a wall budget cut to what is left; never aborts the script.
step() {
    local name=$1 budget=$2
    shift 2
    local left=$((DEADLINE_S - $(elapsed)))
    if ((left < 25)); then
        echo "## SKIP $name: only ${left}s left"
        return
    fi
    ((budget > left)) && budget=$left
    echo "## STEP $name: budget ${budget}s, t=$(elapsed)s"
    timeout -k 5 "$budget" "$@"
    echo "## END $name: rc=$? t=$(elapsed)s"
    pack
}

echo "## H200 perf run $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/models/*.whl || echo "## WARNING: wheel install failed"
export PYTHONPATH=/tmp/site:$PWD
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_cache
python3 -c "import torch, diffusers, transformers, peft; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'cudnn', torch.backends.cudnn.version(), 'diffusers', diffusers.__version__, 'transformers', transformers.__version__,
'peft', peft.__version__, torch.cuda.get_device_name())"

# 1. Backward regression: LoRA forward+backward through 2 dual + 2 single FLUX blocks, one process per setting
#    (safe = the project's trainer choice; default = torch/diffusers defaults; cudnn = cuDNN SDPA forced).
step regression 110 python3 experiments/bench_trainer.py --regression-only --regression-model flux.1-dev \
    --regression-blocks 2,2 --regression-heights 512,1024 --regression-settings safe,default,cudnn \
    --regression-timeout-s 60 --out "$WORK/regression-flux.1-dev.json"

# 2. SD3.5-medium generator step, eager vs optimised (regional torch.compile, torch's automatic dynamic batch).
step gen-sd35 190 python3 experiments/bench_generator.py --model sd3.5-medium --batch-sizes 1,4,16 --cfg both \
    --compile --warmup 2 --iters 5 --time-budget-s 160 --out "$WORK"

# 3. SD3.5-medium LoRA trainer: optimised (safe attention) first, then the eager defaults.
step train-sd35 110 python3 experiments/bench_trainer.py --model sd3.5-medium --modes lora \
    --micro-batch-sizes 1,2,4 --samples 4 --train-steps 1 --cfg both --paths optimized,eager \
    --warmup 1 --iters 3 --time-budget-s 90 --out "$WORK"

# 4. Cost file for the simulator from steps 2 and 3 (+ VAE decode and reward timed here).
step costs 60 python3 experiments/emit_costs.py --generator "$WORK/generator-sd3.5-medium.json" \
    --trainer "$WORK/trainer-sd3.5-medium.json" --device-name h200 --out-dir "$OUT/costs"
cp "$OUT"/costs/*.json "$WORK"/ 2>/dev/null
pack

# 5. FLUX.1-dev generator step (guidance-distilled: no CFG pass), eager vs optimised.
step gen-flux 170 python3 experiments/bench_generator.py --model flux.1-dev --batch-sizes 1,4 --cfg off \
    --compile --warmup 2 --iters 5 --time-budget-s 140 --out "$WORK"

echo "## done t=$(elapsed)s"
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader
pack
echo "================================ summary ================================"
cat "$OUT/summary.md" 2>/dev/null
ls -la "$OUT" "$OUT/costs"
sleep 1  # let tee flush the log before the call returns
