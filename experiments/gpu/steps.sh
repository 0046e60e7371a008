# Shared by the one-call device scripts (sourced, not run): set-up of a bare device machine and a step runner
# that gives each step min(its budget, time left before DEADLINE_S), kills it at that budget, and repacks the
# results after every step, so a step cut short loses only itself.
#
#   OUT=... WORK=... DEADLINE_S=530 source experiments/gpu/steps.sh
#   gpu_setup
#   step NAME BUDGET_S COMMAND...
#   train_step NAME BUDGET_S FILES OVERRIDES...   # with PY, COMMON, RUNS and ONLY set
#   finish
#
# Results: $OUT/log.txt (everything printed), $OUT/summary.md (every *.md a step wrote under $WORK) and
# $OUT/results.tgz (everything under $WORK).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/device_out}
WORK=${WORK:-/tmp/device_work}
DEADLINE_S=${DEADLINE_S:-530}  # seconds after start; a device call itself stops at 600
mkdir -p "$OUT" "$WORK"
exec > >(tee -a "$OUT/log.txt") 2>&1
START=$(date +%s)
elapsed() { echo $(($(date +%s) - START)); }

pack() {
    tar -C "$WORK" -czf "$OUT/results.tgz" . 2>/dev/null
    cat "$WORK"/*.md >"$OUT/summary.md" 2>/dev/null
}

# The wheels carried in .whl/models (diffusers is not on the device image), the offline tokenizer stand-in in
# .whl/pkg, one inductor cache per call, and the versions that every result is tied to.
gpu_setup() {
    echo "## $(basename "$0") $(date -u +%FT%TZ)"
    nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/models/*.whl || echo "## WARNING: wheel install failed"
    export PYTHONPATH=/tmp/site:$PWD/.whl/pkg:$PWD
    export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_cache
    python3 -c "import torch, diffusers, transformers, peft; print('torch', torch.__version__, 'cuda',
torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'diffusers', diffusers.__version__,
'transformers', transformers.__version__, 'peft', peft.__version__, torch.cuda.get_device_name())"
}

# gpu_kind: the kind of GPU 0 as the cost files name it (h100, h200, a100, ...; "unknown" without nvidia-smi).
gpu_kind() {
    local name
    name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
    case $name in
        *H200*) echo h200 ;;
        *H100*) echo h100 ;;
        *A100*) echo a100 ;;
        *H800*) echo h800 ;;
        *) echo unknown ;;
    esac
}

# require_device_kind KIND: stop the call before any step when GPU 0 is not KIND. The device tool may start an
# H100 for a call that asked for an H200 (and the other way round); a cost file named after the wrong kind would
# then be committed under the other kind's name (it happened once: 2026-12-07).
require_device_kind() {
    local found
    found=$(gpu_kind)
    if [[ $found != "$1" ]]; then
        echo "## ERROR: DEVICE=$1 but GPU 0 is '$found' ($(nvidia-smi --query-gpu=name --format=csv,noheader \
2>/dev/null | head -n 1)); rerun with DEVICE=$found, or on a machine of kind $1 (device tool: needs_h200)"
        finish
        exit 3
    fi
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

# wanted NAME: is NAME in $ONLY (the steps a call runs)?
wanted() { [[ " ${ONLY:-} " == *" $1 "* ]]; }

# train_step NAME BUDGET_S FILES OVERRIDES...: one `run_train.py $COMMON` run into $RUNS/NAME as a step (skipped
# unless wanted; RUN_TRAIN: another tree's run_train.py); FILES (space-separated names in the run folder) are
# copied under $WORK/runs/NAME
train_step() {
    local name=$1 budget=$2 files=$3
    shift 3
    wanted "$name" || return 0
    # shellcheck disable=SC2086
    step "$name" "$budget" $PY "${RUN_TRAIN:-experiments/run_train.py}" $COMMON out_dir="$RUNS/$name" overwrite=true "$@"
    mkdir -p "$WORK/runs/$name"
    # shellcheck disable=SC2086
    (cd "$RUNS/$name" 2>/dev/null && cp -r $files "$WORK/runs/$name/" 2>/dev/null)
}

finish() {
    echo "## done t=$(elapsed)s"
    nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader
    pack
    echo "================================ summary ================================"
    cat "$OUT/summary.md" 2>/dev/null
    ls -la "$OUT"
    sleep 1  # let tee flush the log before the call returns
}
