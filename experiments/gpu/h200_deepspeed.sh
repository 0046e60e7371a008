#!/usr/bin/env bash
# One device call on a lent H200 (issue 13 part 3): DeepSpeed ZeRO-2 and ZeRO-3 next to FSDP2 on SD3.5-medium
# at real size (random bf16 weights, 512x512, CFG 4.5, micro-batch 16: experiments/configs/sd35-medium-lora.yaml,
# compile off), full fine-tuning and LoRA, the same batch and weights for every backend (world size 1); then full
# fine-tuning of SD3.5-medium through the whole loop (rollout, train, step; colocated-sync: the generator is the
# trained model, so it is fresh every iteration), peak GPU memory and seconds per phase in its metrics.jsonl; then
# the same loop under DeepSpeed ZeRO-2 (fp32 master weights), and predicted vs measured phases of both runs.
#
#   device run (kind nvidia-h200, carry [".whl"], timeout 600):
#     bash experiments/gpu/h200_deepspeed.sh
#
# Needs .whl/ds/: the deepspeed wheel built from its sdist with its ops left to JIT compilation
# (DS_BUILD_OPS=0 pip wheel --no-deps --no-build-isolation deepspeed==0.19.8) and the dependencies the device image
# lacks (pydantic, pydantic-core, annotated-types, typing-inspection, typing-extensions, hjson; cp312 manylinux
# x86_64), installed beside .whl/models/ into /tmp/site.
#
# Results under $OUT: log.txt, summary.md (the backend table, both runs' per-iteration tables, the validation
# table), backends-sd3.5-medium.{json,md}, and results.tgz (everything under $WORK: the benchmark, both runs'
# config.yaml, metrics.jsonl, events/ and trace.json without their multi-GB checkpoints, validation/).
# Copy backends-* to experiments/results/gpu/deepspeed/ and the runs to experiments/results/gpu/runs/.
OUT=${OUT:-/tmp/h200_deepspeed_out} WORK=/tmp/h200_deepspeed DEADLINE_S=${DEADLINE_S:-560}
source experiments/gpu/steps.sh
gpu_setup
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/ds/*.whl || echo "## WARNING: deepspeed wheel install failed"
python3 -c "import deepspeed, pydantic; from deepspeed.accelerator import get_accelerator as a
print('deepspeed', deepspeed.__version__, 'accelerator', a()._name, 'pydantic', pydantic.VERSION)"
RUNS=/tmp/h200_deepspeed_runs  # out_dirs: their checkpoints (GBs) stay out of results.tgz

# keep_run NAME: copy a run's logs (not its checkpoints) to $WORK and tabulate its iterations
keep_run() {
    mkdir -p "$WORK/$1" && cp -r "$RUNS/$1"/{config.yaml,metrics.jsonl,trace.json,events} "$WORK/$1/" 2>/dev/null
    python3 - "$WORK/$1" >"$WORK/run-$1.md" <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(f"{sys.argv[1]}/metrics.jsonl")]
print(f"### run {sys.argv[1].rsplit('/', 1)[-1]}\n")
print("| iteration | wall s | rollout s | train s | generate s | score s | train (phase) s | optimizer s "
      "| peak GiB | samples/s | update norm |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    ph = r.get("phase_seconds", {}).get("colocated", {})
    cells = [r["iteration"], r["wall_s"], r.get("rollout_s"), r.get("train_s"), ph.get("generate"),
             ph.get("score"), ph.get("train"), ph.get("optimizer"), r.get("peak_mem_gib"),
             r["samples_per_s"], r.get("update_norm")]
    print("| " + " | ".join("-" if c is None else f"{c:.4g}" if isinstance(c, float) else str(c)
                            for c in cells) + " |")
EOF
}

# 1. FSDP2 (one-rank mesh) vs ZeRO-2 vs ZeRO-3: 16 samples x 1 trained step (one micro-batch of 16) per update,
#    full (lr 1e-5) and LoRA (rank 32); agreement of the first update, s/unit, peak memory (~30 s a row).
step backends 250 python3 experiments/measure.py backends --config experiments/configs/sd35-medium-lora.yaml \
    model.compile=false --backends fsdp2,deepspeed-2,deepspeed-3 --modes full,lora --warmup 1 --iters 3 \
    --time-budget-s 215 --out "$WORK"
cp "$WORK"/backends-* "$OUT/" 2>/dev/null

# 2. Full fine-tuning through the loop on one GPU (trainer.backend auto -> none: AdamW on the bf16 weights),
#    3 iterations of 2 prompts x 8 samples, 10 steps, 144 trained units each (~20 s an iteration).
step full-loop 150 python3 experiments/run_train.py --config experiments/configs/sd35-medium-lora.yaml \
    trainer.mode=full trainer.lr=1e-5 model.compile=false iterations=3 checkpoint_every=0 \
    out_dir="$RUNS/h200-1-sd35-full"
keep_run h200-1-sd35-full
rm -rf "$RUNS/h200-1-sd35-full/checkpoints"

# 3. The same loop under DeepSpeed ZeRO-2: fp32 master weights and Adam moments in the ZeRO optimizer.
step full-loop-zero2 110 python3 experiments/run_train.py --config experiments/configs/sd35-medium-lora.yaml \
    trainer.mode=full trainer.lr=1e-5 model.compile=false trainer.backend=deepspeed trainer.deepspeed_stage=2 \
    iterations=2 checkpoint_every=0 out_dir="$RUNS/h200-1-sd35-full-zero2"
keep_run h200-1-sd35-full-zero2
rm -rf "$RUNS"

# 4. Predicted vs measured seconds per phase (the cost model's full-fine-tuning rows against the runs).
step validate 30 python3 experiments/simulate.py validate "$WORK/h200-1-sd35-full" \
    "$WORK/h200-1-sd35-full-zero2" --warmup 1 --name gpu-h200-full --out "$WORK/validation"
cat "$WORK"/validation/*.md >"$WORK/validation.md" 2>/dev/null

finish
