#!/usr/bin/env bash
# GPU equivalence of digenrl (GAP + TAG, TCSS off) with colocated-sync on ONE H200 (shared-device mode,
# docs/operations.md "Shared-device mode" and "Reproducible runs"). SD3.5-medium size (random weights, LoRA
# rank 32, bf16 autocast, eager), 2 prompts x 4 samples, 6 steps, 4 iterations, seed 0. Both generate in
# batches of one prompt group (4 samples; digenrl: one-group fragments) and train micro-batches of one group
# at one timestep (trainer.micro_batch_size=4), in the same order (flow_grpo's: chunk by chunk, each chunk's
# timesteps in turn; GAP trains fragments in index order), so they run the same kernels on the same inputs.
#
#   det-colocated / det-digenrl   runtime.deterministic=true: the pair, compared bit for bit (--exact)
#   colocated-a / colocated-b     the default kernels, colocated-sync twice: how far the default path
#                                 reproduces itself (flash-attention's backward accumulates with atomics)
#   digenrl                       the default kernels, compared with colocated-a (bf16 tolerance)
#
#   device run (kind nvidia-h200, carry [".whl"], timeout 600): bash experiments/gpu/h200_equivalence.sh
#   ONLY="det-colocated det-digenrl exact" runs just those; EXTRA="..." adds overrides to every run
#   CPU dry run with the tiny model: DRY=1 bash experiments/gpu/h200_equivalence.sh
#
# Results under $OUT: log.txt, summary.md (the equivalence tables), results.tgz (each run's config.yaml,
# metrics.jsonl; exact/self/default .json and .md from experiments/gpu/shared_summary.py).
DRY=${DRY:-0}
OUT=${OUT:-/tmp/h200_equivalence_out} WORK=${WORK:-/tmp/h200_equivalence} DEADLINE_S=${DEADLINE_S:-560}
RUNS=${RUNS:-/tmp/h200_equivalence_runs}
source experiments/gpu/steps.sh
mkdir -p "$RUNS"
if [[ $DRY == 1 ]]; then
    export PYTHONPATH=$PWD
    PY=python
    COMMON="--config experiments/configs/tiny.yaml eval.every=0"
    ONE=cpu-1 TWO=cpu-2
else
    gpu_setup
    PY=python3
    COMMON="--config experiments/configs/sd35-medium-lora.yaml runtime.share_device=true model.compile=false
        sampler.num_steps=6 runtime.timeout_s=400 runtime.costs_dir=experiments/results/costs"
    ONE=h200-1 TWO=h200-8
fi
COMMON="$COMMON iterations=4 checkpoint_every=3 seed=0 algo.prompts_per_iteration=2 algo.group_size=4
    sampler.samples_per_forward=4 trainer.micro_batch_size=4 ${EXTRA:-}"

ONLY=${ONLY:-"det-colocated det-digenrl exact colocated-a colocated-b self digenrl default"}
# run NAME BUDGET_S OVERRIDES...: one training run into $RUNS/NAME; its config and metrics copied under $WORK
run() { train_step "$1" "$2" "config.yaml metrics.jsonl" "${@:3}"; }

# compare NAME REFERENCE CANDIDATE [--exact]: the equivalence table of two runs (after 3 iterations)
compare() {
    local name=$1 ref=$2 cand=$3
    shift 3
    wanted "$name" || return 0
    step "$name" 30 $PY experiments/gpu/shared_summary.py equivalence "$RUNS/$ref" "$RUNS/$cand" \
        --out "$WORK" --iterations 3 --name "$name" "$@"
}

COLOCATED="system=colocated-sync profile=$ONE"
DIGENRL="system=digenrl profile=$TWO pools.trainers=1 pools.generators=1 gap.fragment_groups=1
    gap.train_order=index tag.policy=always tcss=false"
# shellcheck disable=SC2086
{
    run det-colocated 100 $COLOCATED runtime.deterministic=true
    run det-digenrl 100 $DIGENRL runtime.deterministic=true
    compare exact det-colocated det-digenrl --exact
    run colocated-a 90 $COLOCATED
    run colocated-b 90 $COLOCATED
    compare self colocated-a colocated-b
    run digenrl 90 $DIGENRL
    compare default colocated-a digenrl
}
pack
finish
