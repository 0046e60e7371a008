#!/usr/bin/env bash
# The full FlowGRPO loop on ONE H200 (issue 23): each model's colocated run on the GPU default path (compile +
# autocast, cuDNN SDPA where the safety table allows it for the model's attention shape) beside the same run
# with cuDNN SDPA off (the path before the shape-aware table) and the eager path (no compile, no autocast).
# Before the loops: the backward regression check that lets SD3.5-medium's shape (head dim 64, no mask) keep
# cuDNN SDPA (gradients of the cuDNN kernel against the flash kernel's, 512² and 1024²), and the rank-parity
# check of issue 21 (a generator rank and a trainer rank roll out the same trajectories).
#
#   device run (kind nvidia-h200, carry [".whl"], timeout 600):
#     bash experiments/gpu/h200_loops.sh                      # every step below, as far as 10 minutes go
#     ONLY="sd35 sd35-eager sd35-8x8 sd35-8x8-eager" bash experiments/gpu/h200_loops.sh   # then the rest,
#     ONLY="sd35-profile flux" ..., ONLY="flux-eager" ..., ONLY="qwen" ..., ONLY="qwen-eager" ...: one call
#     each (10 minutes a call; a cold compile cache costs ~130 s per model)
#     ONLY="fp8-agreement sd35-fp8 sd35" ..., ONLY="flux-fp8 flux-mb8" ...: FP8 beside 16-bit (torchao's wheel
#     in .whl/models, installed by gpu_setup)
#     ONLY="attention sd35-profile generator-graphs" ...: issue 37's round 2 (attention kernels per backend,
#     the H100 loop with its profile, the generator step with and without CUDA graphs); on any kind, the
#     rows carry the GPU's name (kind nvidia-h100-x1 for the H100 rows); ONLY="attention-masked regression-flux
#     generator-graphs" ... the follow-ups (Qwen-Image's masked shapes alone, ATTN_BUDGET_S seconds; cuDNN's
#     backward on FLUX.1-dev's blocks against flash, the check that could lift the table's FLUX row)
#     ONLY="qwen-text" ...: Qwen-Image's generator step with padded, masked text and with model.text_padding=split
#     (issue 37 item 1); ONLY="qwen" / ONLY="qwen-mask" ...: the loop on either path, one call each;
#     ONLY="sd35 sd35-vae-eager" ...: the SD3.5-medium loop with the compiled VAE decode (the config's, since
#     round 4) and with the eager one (item 2);
#     ONLY="sd35-overlap sd35-overlap-nostream" ...: colocated-overlap's scorer on a side stream or not (item 4)
#     ONLY="trainer-graphs" ...: SD3.5-medium's trainer unit compiled by blocks and whole with CUDA graphs (item 2);
#     ONLY="sd35 sd35-graphs" ...: the loop compiled by blocks and whole with CUDA graphs (model.compile_mode)
#   CPU dry run of the same commands with the tiny model: DRY=1 bash experiments/gpu/h200_loops.sh
#
# Results under $OUT: log.txt, summary.md, results.tgz (summary.json/md from experiments/gpu/loops_summary.py,
# each run's config.yaml and metrics.jsonl; regression JSON; rank_parity.json/md), summary.json also on its own.
DRY=${DRY:-0}
OUT=${OUT:-/tmp/h200_loops_out} WORK=${WORK:-/tmp/h200_loops} DEADLINE_S=${DEADLINE_S:-560}
RUNS=${RUNS:-/tmp/h200_loops_runs}
source experiments/gpu/steps.sh
mkdir -p "$RUNS"
if [[ $DRY == 1 ]]; then
    export PYTHONPATH=$PWD
    PY=python
    SD35="--config experiments/configs/tiny.yaml system=colocated-sync profile=cpu-1 model.dtype=bfloat16"
    FLUX=$SD35
    ITER="iterations=2"
    GEN_MODEL=tiny-sd3
    QWEN_MODEL=tiny-qwen-image
    QWEN_TEXT=10,3  # the tiny encoder's 16 tokens
    ATTN_DEVICE="--device cpu --cases tiny,tiny-masked --backends current,native,_native_math"
else
    gpu_setup
    PY=python3
    SD35="--config experiments/configs/sd35-medium-lora.yaml"
    FLUX="--config experiments/configs/flux-dev-lora.yaml"
    ITER="iterations=4"
    GEN_MODEL=sd3.5-medium
    QWEN_MODEL=qwen-image
    QWEN_TEXT=40,5
    ATTN_DEVICE=""
fi
ONLY=${ONLY:-"regression parity sd35 sd35-nocudnn sd35-eager"}

# loop NAME BUDGET_S CONFIG_ARGS OVERRIDES...: one colocated run into $RUNS/NAME (skipped unless NAME is in $ONLY).
# BASELINE=DIR, an earlier commit's tree (see "A code change beside the code before it" in
# experiments/results/gpu/loops/README.md): NAME-baseline in $ONLY runs NAME's command on that tree, so a change on
# a measured path is timed beside the code before it in one call
loop() {
    one_loop "$@"
    if [[ -n ${BASELINE:-} ]] && wanted "$1-baseline"; then
        local name=$1
        shift
        PYTHONPATH="$BASELINE:$PYTHONPATH" RUN_TRAIN="$BASELINE/experiments/run_train.py" \
            LOOP_CODE="baseline $(cat "$BASELINE/COMMIT")" one_loop "$name-baseline" "$@"
    fi
}

one_loop() {
    local name=$1 budget=$2 config=$3
    shift 3
    wanted "$name" || return 0
    # traces stay on the device (tens of MB each: the device call brings back less); the event logs come back
    # (a few KB an iteration) for the simulator's validation (experiments/simulate.py validate)
    COMMON="$config $ITER checkpoint_every=0 eval.every=0" train_step "$name" "$budget" "config.yaml metrics.jsonl events" "$@"
    mkdir -p "$RUNS/$name"
    local file=${config#--config }
    # the run's own provenance: a warm machine keeps $RUNS between calls, so one call's summary holds rows
    # of earlier calls, each with the command, GPU and date of the call that ran it (loops_summary.py)
    $PY -c 'import datetime, json, sys
path, config, command, hardware, code = sys.argv[1:]
date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
row = {"config": config, "command": command, "hardware": hardware, "date": date}
json.dump(row | ({"code": code} if code else {}), open(path, "w"))' \
        "$RUNS/$name/loop.json" "${file%% *}" \
        "${BASELINE:+BASELINE=$BASELINE }ONLY=\"$ONLY\" DEADLINE_S=$DEADLINE_S bash experiments/gpu/h200_loops.sh" \
        "$(hardware)" "${LOOP_CODE:-}"
    cp "$RUNS/$name/loop.json" "$WORK/runs/$name/loop.json"
    # the kernel profile's summary of a profiled run (runtime.profile_iteration), not its trace
    if [[ -d "$RUNS/$name/profile" ]]; then
        mkdir -p "$WORK/runs/$name/profile"
        cp "$RUNS/$name"/profile/rank*.json "$RUNS/$name"/profile/rank*.md "$WORK/runs/$name/profile/" 2>/dev/null
        rm -f "$WORK/runs/$name"/profile/*.trace.json
    fi
    $PY experiments/gpu/loops_summary.py "$RUNS" --out "$WORK" --hardware "$(hardware)" \
        --command "ONLY=\"$ONLY\" bash experiments/gpu/h200_loops.sh" >/dev/null
}
hardware() { nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep . || echo cpu; }

# 1. cuDNN SDPA backward on SD3.5-medium's blocks (4 joint blocks at the real width): flash reference, cuDNN forced,
#    and the project's choice, each in its own process; the gradient norms must agree
if wanted regression && [[ $DRY != 1 ]]; then
    step regression 100 $PY experiments/measure.py trainer --regression-only --regression-model sd3.5-medium \
        --regression-blocks 4,1 --regression-heights 512,1024 --regression-settings no-cudnn,cudnn,safe \
        --regression-timeout-s 60 --out "$WORK/regression-sd3.5-medium.json"
fi
# 1b. issue 37: every attention backend at the models' joint-attention shapes, forward and forward + backward,
#     with its numerics against float32 math attention (digenrl/perf/bench_attention.py; flex compiles last)
if wanted attention; then
    # shellcheck disable=SC2086
    step attention 110 $PY experiments/measure.py attention $ATTN_DEVICE --time-budget-s 80 --out "$WORK/attention"
fi
# 1c. the masked Qwen-Image shapes alone (padded to 512 text tokens, and cut to the longest prompt), and the
#     cuDNN SDPA backward on FLUX.1-dev's blocks (2 + 2 at the real width, 512²) against the flash kernel's: the
#     safety table's FLUX row is what keeps training off cuDNN for head dim 128
if wanted attention-masked; then
    # shellcheck disable=SC2086
    step attention-masked $((${ATTN_BUDGET_S:-75} + 25)) $PY experiments/measure.py attention $ATTN_DEVICE \
        --cases qwen-padded,qwen-bucketed --backends current,native,_native_cudnn,_native_efficient,flex \
        --time-budget-s "${ATTN_BUDGET_S:-75}" --out "$WORK/attention-masked"
fi
if wanted regression-flux && [[ $DRY != 1 ]]; then
    step regression-flux 130 $PY experiments/measure.py trainer --regression-only --regression-model flux.1-dev \
        --regression-heights 512 --regression-settings no-cudnn,cudnn --regression-timeout-s 60 \
        --out "$WORK/regression-flux.1-dev.json"
fi
# 2. issue 21: does a generator rank roll out what a trainer rank does (same seed, policy v0)?
if wanted parity; then
    # shellcheck disable=SC2086
    step parity 150 $PY -m digenrl.perf.rank_parity $SD35 --out "$WORK/parity" --roles trainer,generator,trainer sampler.num_steps=6 \
        algo.group_size=4 trainer.micro_batch_size=8
fi
# 3. where the trainer's time goes: one accumulate of 16 units (micro-batch 16, CFG, cfg_grad=cond) on the
#    optimised path under the profiler (top kernels, device-busy fraction)
if wanted trainer-profile && [[ $DRY != 1 ]]; then
    step trainer-profile 120 $PY experiments/measure.py trainer --model sd3.5-medium --modes lora \
        --micro-batch-sizes 16 --samples 16 --train-steps 1 --cfg on --paths optimized --compile --autocast \
        --warmup 1 --iters 2 --profile --out "$WORK/trainer-profile"
fi
# 3b. FP8 (model.fp8, issue 23 item 3): the generator step of SD3.5-medium (B=16, CFG) with the blocks' linears
#    in FP8 (torchao rowwise) and compiled, against the 16-bit eager model: log-prob agreement (the trainer's
#    ratio recomputing the 16-bit model's transitions, 3 steps of 4 samples) and the step's speed
if wanted fp8-agreement; then
    MODEL=sd3.5-medium
    [[ $DRY == 1 ]] && MODEL=tiny-sd3
    step fp8-agreement 150 $PY experiments/measure.py generator --model $MODEL --fp8 --paths eager,optimized \
        --batch-sizes 16 --cfg on --compile --warmup 2 --iters 5 --agreement-steps 3 --agreement-samples 4 \
        --dtype bfloat16 --out "$WORK/fp8-generator"
fi
# 4. the loops: SD3.5-medium 2 x 8 (the config as committed), then 8 x 8; FLUX.1-dev. A profiled run has one
#    iteration under the kernel profiler (runtime.profile_iteration), left out of the medians: its device
#    time per phase and kernel kind is the row's explanation
loop sd35 180 "$SD35"
# issue 37 item 2: the same loop with the VAE's decoder eager (sd35-medium-lora.yaml compiles it since round 4,
# whose row sd35-vae measured the compiled decode beside the eager sd35), beside sd35 in one call
loop sd35-vae-eager 180 "$SD35" model.compile_vae=false
# issue 37 item 2: the loop with the whole transformer compiled and replayed as CUDA graphs, the rollout's
# steps and the trainer's micro-batches alike (model.compile_mode=reduce-overhead), beside sd35 in one call
loop sd35-graphs 260 "$SD35" model.compile_mode=reduce-overhead
# issue 37 item 4: colocated-overlap (each group's sub-batch decoded and scored by a worker thread while the
# next generates) with the scorer on its own CUDA stream (runtime.score_stream, the default) and on the
# default stream (the path before); the two rows' reward_mean must be identical
loop sd35-overlap 180 "$SD35" system=colocated-overlap
loop sd35-overlap-nostream 180 "$SD35" system=colocated-overlap runtime.score_stream=false
# the kernel profile of the same loop on its own (a cold compile cache takes ~130 s of a call): iteration 2
loop sd35-profile 230 "$SD35" iterations=3 runtime.profile_iteration=2
# issue 37 item 2: the generator step of SD3.5-medium (B = 16, CFG) compiled by blocks (the loops' path) and
# compiled whole with mode reduce-overhead (CUDA graphs of the fixed-shape step), each in its own process
# (GEN_MODES picks a subset)
if wanted generator-graphs; then
    for mode in ${GEN_MODES:-default reduce-overhead}; do
        step "generator-$mode" 150 $PY experiments/measure.py generator --model $GEN_MODEL --paths optimized \
            --compile --compile-mode $mode --batch-sizes 16 --cfg on --warmup 3 --iters 10 \
            --out "$WORK/generator-$mode"
    done
fi
# issue 37 item 2, the training side: SD3.5-medium's trainer unit (LoRA, micro-batch 16, CFG with
# cfg_grad=cond, autocast) compiled by blocks (the loops' path) and compiled whole with mode reduce-overhead
# (CUDA-graph trees record the forward and the backward), each in its own process (TRAIN_MODES picks a
# subset); the row's max|r-1| is the on-policy ratio of the graphed path against the rollout's log-probs
if wanted trainer-graphs; then
    AUTOCAST=--autocast
    [[ $DRY == 1 ]] && AUTOCAST=""
    for mode in ${TRAIN_MODES:-default reduce-overhead}; do
        step "trainer-$mode" 170 $PY experiments/measure.py trainer --model $GEN_MODEL --modes lora \
            --micro-batch-sizes 16 --samples 16 --train-steps 1 --cfg on --paths optimized --compile \
            --compile-mode $mode $AUTOCAST --warmup 2 --iters 5 --out "$WORK/trainer-$mode"
    done
fi
# issue 37 item 1: Qwen-Image's generator step (B = 8, CFG) with the text padded to 512 tokens and masked
# (model.text_padding=mask, the path before) and with rows grouped by real text length, padding cut, no mask
# (split, the default now), each compiled in its own process; 40 real tokens a prompt and 5 for the empty
# one (the chat template's suffix), as Qwen2.5-VL encodes a short prompt. The split process also runs the
# eager model on the padded, masked text first: its log-prob agreement (2 samples x 2 steps) is split's
# numerics against the path before. TEXT_MODES picks a subset
if wanted qwen-text; then
    for mode in ${TEXT_MODES:-mask split}; do
        paths=optimized budget=170
        [[ $mode == split ]] && paths=eager,optimized budget=260
        step "qwen-text-$mode" $budget $PY experiments/measure.py generator --model $QWEN_MODEL --paths $paths \
            --compile --needs-backward --batch-sizes 8 --cfg on --text-tokens $QWEN_TEXT --text-padding $mode \
            --warmup 2 --iters 5 --agreement-steps 2 --agreement-samples 2 --out "$WORK/qwen-text-$mode"
    done
fi
loop sd35-nocudnn 140 "$SD35" model.cudnn_sdpa=disabled
loop sd35-eager 90 "$SD35" model.compile=false model.autocast=false
# FP8 base linears (model.fp8=true), beside the sd35 row of the same call
loop sd35-fp8 220 "$SD35" model.fp8=true
loop sd35-8x8 170 "$SD35" algo.prompts_per_iteration=8 iterations=3
loop sd35-8x8-nocudnn 170 "$SD35" algo.prompts_per_iteration=8 iterations=3 model.cudnn_sdpa=disabled
loop sd35-8x8-eager 200 "$SD35" algo.prompts_per_iteration=8 iterations=3 model.compile=false model.autocast=false
loop flux 300 "$FLUX" iterations=4 runtime.profile_iteration=3
loop flux-eager 150 "$FLUX" iterations=2 model.compile=false model.autocast=false
# FLUX's training idles between small kernels at micro-batch 2 (the profile of the flux row): micro-batch 8
loop flux-mb8 240 "$FLUX" iterations=3 trainer.micro_batch_size=8
# an 80 GB GPU (H100): micro-batch 8, the config's, does not fit (round 4: out of memory; the startup memory
# check now refuses it), 4 does
loop flux-mb4 240 "$FLUX" iterations=3 trainer.micro_batch_size=4
loop flux-fp8 260 "$FLUX" iterations=3 trainer.micro_batch_size=8 model.fp8=true
# round 6 (issue 37 item 2): the micro-batch-8 loop below unprofiled, three iterations (two steady), to time a
# change beside BASELINE's tree (ONLY="qwen-mb8-ckpt qwen-mb8-ckpt-3-baseline": the baseline first, so a call
# that runs short cuts the profiled iteration, not a steady one) and the caching allocator's expandable
# segments (round 5's profile: ~20 ms host stalls in aten::contiguous at 68.5 GiB of 80; metrics' alloc_retries)
loop qwen-mb8-ckpt-3 260 "$SD35" model=$QWEN_MODEL trainer.micro_batch_size=8 \
    trainer.activation_checkpointing=true iterations=3
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True loop qwen-mb8-ckpt-3-expandable 260 "$SD35" \
    model=$QWEN_MODEL trainer.micro_batch_size=8 trainer.activation_checkpointing=true iterations=3
# what FLUX's profile suggests for Qwen-Image (micro-batch 2 idles between small kernels): a larger
# micro-batch, with activation checkpointing to fit; iteration 2 under the kernel profiler
# four iterations, the last profiled: two steady ones for the median; TORCH_LOGS=recompiles says whether a
# later iteration's new text lengths recompile (round 4's profiled iteration trained 12 s slower than the one before)
TORCH_LOGS=recompiles loop qwen-mb8-ckpt 340 "$SD35" model=$QWEN_MODEL trainer.micro_batch_size=8 \
    trainer.activation_checkpointing=true iterations=4 runtime.profile_iteration=3
# Qwen-Image: the SD3.5-medium settings (2 x 8, 10 steps, CFG 4.5) at micro-batch 2, as issue 23's table
loop qwen 330 "$SD35" model=$QWEN_MODEL trainer.micro_batch_size=2 iterations=3
loop qwen-eager 330 "$SD35" model=qwen-image trainer.micro_batch_size=2 iterations=2 model.compile=false \
    model.autocast=false
# issue 37 item 1: the two Qwen-Image loops above run model.text_padding=split (the default); these are the
# same runs on the padded, masked text (the path of the rows before it), one call each beside its partner
loop qwen-mask 330 "$SD35" model=$QWEN_MODEL trainer.micro_batch_size=2 iterations=3 model.text_padding=mask
TORCH_LOGS=recompiles loop qwen-mb8-ckpt-mask 340 "$SD35" model=$QWEN_MODEL trainer.micro_batch_size=8 \
    trainer.activation_checkpointing=true iterations=4 runtime.profile_iteration=3 model.text_padding=mask
$PY experiments/gpu/loops_summary.py "$RUNS" --out "$WORK" --hardware "$(hardware)" \
    --command "ONLY=\"$ONLY\" bash experiments/gpu/h200_loops.sh"
cp "$WORK/summary.json" "$OUT/" 2>/dev/null
pack
finish
