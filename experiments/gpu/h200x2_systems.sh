#!/usr/bin/env bash
# One device call on 2 H200s (kind nvidia-h200-x2, carry [".whl"]): the systems side by side with NCCL.
#   1. tiny model: colocated-sync, separate-sync, separate-async, digenrl gap — the NCCL code paths.
#   2. SD3.5-medium size (random weights, LoRA, bf16, model.autocast; no compile: its first-call cost would eat
#      the per-run budget): colocated-sync vs separate-sync vs digenrl gap,
#      same logical batch, iteration time and trace per system.
# Results under $OUT: log.txt, summary.md, runs.tgz (metrics.jsonl, trace.json of every run).
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/h200x2_out}
RUNS=/tmp/h200x2_runs
mkdir -p "$OUT" "$RUNS"
exec > >(tee -a "$OUT/log.txt") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/models/*.whl || echo "## WARNING: wheel install failed"
export PYTHONPATH=/tmp/site:$PWD/.whl/pkg:$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv
START=$(date +%s)
run() {  # run NAME BUDGET_S OVERRIDES...
    local name=$1 budget=$2
    shift 2
    echo "## RUN $name t=$(($(date +%s) - START))s"
    timeout -k 5 "$budget" torchrun --standalone --nproc_per_node=2 experiments/run_train.py \
        --config experiments/configs/tiny.yaml profile=h200-8 out_dir="$RUNS/$name" "$@" 2>&1 |
        grep -E 'digenrl\]|FAILED|Error|File "' | head -60
    echo "## END $name rc=${PIPESTATUS[0]}"
    tar -C "$RUNS" -czf "$OUT/runs.tgz" --exclude='checkpoints' . 2>/dev/null
}
TINY="iterations=4"
run tiny-colocated-sync 45 $TINY system=colocated-sync
run tiny-separate-sync 45 $TINY system=separate-sync pools.trainers=1 pools.generators=1
run tiny-separate-async 45 $TINY system=separate-async asynchrony.max_staleness=1 pools.trainers=1 pools.generators=1
run tiny-digenrl-gap 45 $TINY system=digenrl gap.fragment_groups=1 pools.trainers=1 pools.generators=1
SD="model=sd3.5-medium model.dtype=bfloat16 model.height=512 model.width=512 iterations=4 sampler.num_steps=10
    sampler.guidance_scale=4.5 sampler.noise_level=0.7 algo.prompts_per_iteration=4 algo.group_size=8
    trainer.micro_batch_size=8 model.autocast=true trainer.lora_rank=32 trainer.lora_alpha=64 trainer.lr=0.0003 algo.clip_range=0.0001
    reward=jpeg-compressibility checkpoint_every=100"
run sd35-colocated-sync 140 $SD system=colocated-sync
run sd35-separate-sync 140 $SD system=separate-sync pools.trainers=1 pools.generators=1
run sd35-digenrl-gap 140 $SD system=digenrl gap.fragment_groups=1 pools.trainers=1 pools.generators=1
python3 - <<'PY' | tee "$OUT/summary.md"
import json, pathlib, statistics
root = pathlib.Path("/tmp/h200x2_runs")
print("| run | iterations | median iteration s (after 1st) | samples/s | busy trainer | busy generator | sync s |")
print("|---|---|---|---|---|---|---|")
for d in sorted(root.iterdir()):
    m = d / "metrics.jsonl"
    if not m.is_file():
        print(f"| {d.name} | failed | | | | | |"); continue
    rs = [json.loads(l) for l in m.read_text().splitlines() if l]
    steady = rs[1:] or rs
    if not rs:
        print(f"| {d.name} | failed | | | | | |"); continue
    wall = statistics.median(r["wall_s"] for r in steady)
    busy = {k: statistics.median(r.get("busy_fraction", {}).get(k, float("nan")) for r in steady) for k in ("colocated", "trainer", "generator")}
    bt = busy["trainer"] if busy["trainer"] == busy["trainer"] else busy["colocated"]
    print(f"| {d.name} | {len(rs)} | {wall:.3f} | {rs[-1]['samples'] / wall:.2f} | {bt:.2f} | {busy['generator']:.2f} | {statistics.median(r.get('sync_s', 0.0) for r in steady):.3f} |")
PY
