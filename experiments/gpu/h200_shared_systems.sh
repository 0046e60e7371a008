#!/usr/bin/env bash
# Every system on ONE H200 in shared-device mode (runtime.share_device=true, docs/operations.md "Shared-device
# mode"): several ranks of one job on the same GPU, collectives on gloo, every point-to-point transfer through
# pinned host memory. SD3.5-medium size (random weights, LoRA rank 32, bf16, the GPU default path: compile +
# autocast), each run >= 4 iterations; then the GPU equivalence of digenrl (TCSS off, TAG on) with
# colocated-sync on the same seed (bit for bit, deterministic kernels: experiments/gpu/h200_equivalence.sh).
# What this tests: every CUDA path of the schedules (fragments, TSP
# hand-offs, scorer latents and rewards, weight sync into a compiled generator, the trainer generating for
# TAG). What it does not: multi-GPU speed (the ranks share one GPU's compute; timings are not a multi-GPU
# result).
#
#   device run (kind nvidia-h200, carry [".wt21", ".whl"] or [".whl"] from the checkout, timeout 600):
#     PART=1 bash experiments/gpu/h200_shared_systems.sh   # colocated-sync, separate-sync, separate-async,
#                                                         # digenrl GAP+TAG, equivalence
#     PART=2 bash experiments/gpu/h200_shared_systems.sh   # digenrl TSP, digenrl TCSS, digenrl + VLM-judge scorer
#     PART=all ...                                         # both (needs more than one device call's 10 min)
#   ONLY="digenrl-tsp equivalence ..." runs just those (a second call re-running what failed);
#   SCORER_EXTRA="model.compile=false" adds overrides to the scorer run (a short call on a cold compile cache);
#   EXTRA="..." adds overrides to every run (e.g. model.compile=false)
#   CPU dry run of the same commands with the tiny model (profile cpu-4, no sharing): DRY=1 PART=all bash ...
#
# Results under $OUT: log.txt, summary.md, results.tgz (each run's config.yaml, metrics.jsonl, events/, trace.json;
# summary.json/md from experiments/gpu/shared_summary.py; equivalence/: h200_equivalence.sh's log, tables and
# runs); checkpoints stay on the device.
PART=${PART:-1}
DRY=${DRY:-0}
OUT=${OUT:-/tmp/h200_shared_out} WORK=${WORK:-/tmp/h200_shared} DEADLINE_S=${DEADLINE_S:-560}
RUNS=${RUNS:-/tmp/h200_shared_runs}
source experiments/gpu/steps.sh
mkdir -p "$RUNS"
if [[ $DRY == 1 ]]; then
    export PYTHONPATH=$PWD
    PY=python
    COMMON="--config experiments/configs/tiny.yaml profile=cpu-4 iterations=4 checkpoint_every=3 seed=0
        algo.prompts_per_iteration=2 algo.group_size=4 trainer.micro_batch_size=4 reward=jpeg-compressibility"
    JUDGE=tiny-vlm-judge
    ONE=cpu-1
else
    gpu_setup
    PY=python3
    # 2 prompts x 4 samples, 6 steps, CFG 4.5, micro-batch 8: SD3.5-medium size at a few seconds per iteration
    COMMON="--config experiments/configs/sd35-medium-lora.yaml profile=h200-8 runtime.share_device=true
        iterations=4 checkpoint_every=3 seed=0 sampler.num_steps=6 algo.prompts_per_iteration=2
        algo.group_size=4 trainer.micro_batch_size=8 runtime.timeout_s=400
        runtime.costs_dir=experiments/results/costs"
    JUDGE=vlm-judge
    ONE=h200-1  # one rank: a one-GPU profile (a colocated run starts one rank per device of its profile)
fi

COMMON="$COMMON ${EXTRA:-}"  # EXTRA="model.compile=false ...": overrides for every run of this call

PART1="colocated-sync separate-sync separate-async digenrl-gap-tag equivalence"
PART2="digenrl-tsp digenrl-tcss digenrl-scorer-vlm gpu-test"
case $PART in
1) ONLY=${ONLY:-$PART1} ;;
2) ONLY=${ONLY:-$PART2} ;;
*) ONLY=${ONLY:-"$PART1 $PART2"} ;;
esac
# run NAME BUDGET_S OVERRIDES...: one training run into $RUNS/NAME (skipped unless NAME is in $ONLY); its
# small files are copied under $WORK
run() { train_step "$1" "$2" "config.yaml metrics.jsonl events trace.json" "${@:3}"; }

# generation in batches of one prompt group (4 samples), as the digenrl fragments are made
run colocated-sync 130 system=colocated-sync sampler.samples_per_forward=4 profile=$ONE
run separate-sync 120 system=separate-sync pools.trainers=1 pools.generators=1
run separate-async 110 system=separate-async asynchrony.max_staleness=1 pools.trainers=1 pools.generators=1
# GAP fragments of one prompt group; TAG always: the trainer generates fragments itself
run digenrl-gap-tag 100 system=digenrl pools.trainers=1 pools.generators=1 gap.fragment_groups=1 \
    tag.policy=always tcss=false
# item 3, the equivalence: digenrl GAP+TAG against colocated-sync with deterministic kernels and micro-batches
# of one fragment, compared bit for bit (experiments/gpu/h200_equivalence.sh; its log and tables land in
# $WORK/equivalence). The runs above use the default kernels, with which colocated-sync does not reproduce
# itself past the first update (docs/operations.md, "Reproducible runs").
wanted equivalence && step equivalence 240 env ONLY="det-colocated det-digenrl exact" DEADLINE_S=230 DRY=$DRY \
    OUT="$WORK/equivalence" WORK="$WORK/equivalence-work" RUNS="$RUNS-equivalence" \
    bash experiments/gpu/h200_equivalence.sh
# TSP: one pipeline of 2 generator stages (3 ranks on the GPU)
run digenrl-tsp 120 system=digenrl pools.trainers=1 pools.generators=2 tsp_stages=2 gap.fragment_groups=1 tag=false
run digenrl-tcss 85 system=digenrl pools.trainers=1 pools.generators=1 gap.fragment_groups=1 tcss=true tag=false
# a scorer rank hosting the VLM judge at its real size (Qwen2.5-VL-7B configuration, random weights, bf16)
run digenrl-scorer-vlm 150 system=digenrl pools.trainers=1 pools.generators=1 pools.scorers=1 \
    gap.fragment_groups=1 tag=false reward=$JUDGE ${SCORER_EXTRA:-}
# the GPU side of the host staging (skipped on CPU in CI)
wanted gpu-test && step gpu-test 30 $PY -m pytest -q -p no:cacheprovider tests/runtime/test_shared_device.py -k pinned
summary  # not a step: it must run even when the steps used up the deadline (a few seconds)
pack
finish
