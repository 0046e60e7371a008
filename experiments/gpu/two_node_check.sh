#!/usr/bin/env bash
# One device call on 2 GPUs of one host: DigenRL started as two torchrun "nodes" of one GPU each that meet
# through torchrun's c10d rendezvous over TCP — the launch a 16-32 GPU testbed (several machines) uses.
#
#   device run (kind nvidia-h200-x2, carry [".whl"], timeout 330):
#     bash experiments/gpu/two_node_check.sh
#
# 1. probe: two plain torchrun groups (CUDA_VISIBLE_DEVICES=0 and =1) run init_distributed with NCCL: each
#    rank must drive its own GPU as LOCAL_RANK 0, see NVLink multicast off when NCCL starts, and get the
#    right all_reduce / broadcast results across the node boundary.
# 2. training, tiny model, launch_torchrun(nnodes=2, nproc=1) vs one node x 2 GPUs: separate-sync (trainer on
#    node 0, generator on node 1; the weight sync crosses nodes) and digenrl GAP; per-iteration rewards
#    side by side, and each node's torchrun agent must report its own global rank.
# Results under $OUT: log.txt, summary.md (PASS/FAIL lines), results.tgz (probe JSON, node logs, metrics,
# traces). Both "nodes" share one host, so NCCL talks over NVLink/P2P here, not the network of a cluster.
OUT=${OUT:-/tmp/two_node_out} WORK=/tmp/two_node DEADLINE_S=300
source experiments/gpu/steps.sh
gpu_setup

cat >"$WORK/probe.py" <<'PY'
import json, os, sys
import torch
import torch.distributed as dist
from digenrl.runtime.comm.distributed import NVLINK_MULTICAST_OFF, init_distributed

exported = {name: os.environ.get(name) for name in NVLINK_MULTICAST_OFF}
ctx = init_distributed("nccl", timeout_s=60)
total = torch.tensor([float(ctx.rank + 1)], device=ctx.device)
dist.all_reduce(total)
sent = torch.tensor([10.0 * (ctx.rank + 1)], device=ctx.device)
dist.broadcast(sent, src=1)
record = {
    "rank": ctx.rank, "local_rank": ctx.local_rank, "node": int(os.environ["GROUP_RANK"]),
    "device": str(ctx.device), "gpu_uuid": str(torch.cuda.get_device_properties(ctx.device).uuid),
    "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "exported": exported,
    "at_nccl_init": {name: os.environ.get(name) for name in NVLINK_MULTICAST_OFF},
    "all_reduce": total.item(), "broadcast_from_1": sent.item(),
}
with open(os.path.join(sys.argv[1], f"rank{ctx.rank}.json"), "w") as handle:
    json.dump(record, handle)
dist.destroy_process_group()
PY

cat >"$WORK/probe_nodes.sh" <<'SH'
mkdir -p "$WORK/probe"
port=$((20000 + RANDOM % 20000))
for node in 0 1; do
    CUDA_VISIBLE_DEVICES=$node python3 -m torch.distributed.run --nnodes=2 --nproc_per_node=1 \
        --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:$port --rdzv-id=probe-$$ \
        --rdzv-conf=is_host=$((node == 0)) "$WORK/probe.py" "$WORK/probe" >"$WORK/probe/node$node.log" 2>&1 &
    pids[node]=$!
done
wait "${pids[0]}"; rc0=$?; wait "${pids[1]}"; rc1=$?
echo "probe nodes exit codes: $rc0 $rc1"
python3 - <<'PY'
import json, os, pathlib
work = pathlib.Path(os.environ["WORK"])
ranks = [json.loads(p.read_text()) for p in sorted((work / "probe").glob("rank*.json"))]
off = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
checks = {
    "2 ranks reported": len(ranks) == 2,
    "one rank per node, LOCAL_RANK 0 on cuda:0": sorted(r["node"] for r in ranks) == [0, 1]
    and all(r["local_rank"] == 0 and r["device"] == "cuda:0" for r in ranks),
    "different physical GPUs": len({r["gpu_uuid"] for r in ranks}) == 2,
    "NVLink multicast off at NCCL init": all(r["at_nccl_init"] == off for r in ranks),
    "all_reduce = 1 + 2": all(r["all_reduce"] == 3.0 for r in ranks),
    "broadcast from rank 1 = 20": all(r["broadcast_from_1"] == 20.0 for r in ranks),
}
lines = ["## probe: 2 torchrun nodes x 1 GPU, c10d rendezvous, NCCL", ""]
lines += [f"- {'PASS' if ok else 'FAIL'}: {name}" for name, ok in checks.items()]
lines += [f"- rank {r['rank']}: {json.dumps(r)}" for r in ranks]
(work / "probe.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
SH
export WORK
step probe 90 bash "$WORK/probe_nodes.sh"

cat >"$WORK/train_check.py" <<'PY'
import json, math, os, pathlib
from digenrl.launch import launch_torchrun

work = pathlib.Path(os.environ["WORK"])
os.environ["LOGLEVEL"] = "INFO"  # torchrun agents print their rendezvous result (group_rank, global_ranks)
common = ["iterations=3", "seed=7", "profile=h200-8", "pools.trainers=1", "pools.generators=1"]
runs = {
    "separate-sync 2x1": (2, 1, ["system=separate-sync"]),
    "separate-sync 1x2": (1, 2, ["system=separate-sync"]),
    "digenrl-gap 2x1": (2, 1, ["system=digenrl", "gap=true", "gap.fragment_groups=1"]),
}
rewards, lines = {}, ["## training: tiny model, 2 nodes x 1 GPU vs 1 node x 2 GPUs", ""]
for name, (nnodes, nproc, extra) in runs.items():
    out = work / name.replace(" ", "-")
    try:
        wall = launch_torchrun([*common, *extra, f"out_dir={out}"], nproc=nproc, nnodes=nnodes,
                               config="experiments/configs/tiny.yaml", timeout_s=75, label=name,
                               log_dir=out / "logs")
    except SystemExit as failure:
        lines.append(f"- FAIL: {name}: {str(failure)[:1500]}")
        continue
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line]
    rewards[name] = [m["reward_mean"] for m in metrics]
    ok = len(metrics) == 3 and all(math.isfinite(r) for r in rewards[name])
    lines.append(f"- {'PASS' if ok else 'FAIL'}: {name} ran {len(metrics)} iterations in {wall:.1f} s, "
                 f"rewards {rewards[name]}, sync_s {[round(m.get('sync_s', 0.0), 4) for m in metrics]}")
    if nnodes == 2:
        logs = [(out / "logs" / f"node{node}.log").read_text() for node in (0, 1)]
        own = all(f"global_ranks=[{node}]" in logs[node] for node in (0, 1))
        lines.append(f"- {'PASS' if own else 'FAIL'}: {name}: node 0 held rank 0, node 1 held rank 1")
a, b = rewards.get("separate-sync 2x1"), rewards.get("separate-sync 1x2")
if a and b:
    gap = max(abs(x - y) for x, y in zip(a, b))
    verdict = "PASS" if gap == 0 else ("PASS (not bit-identical)" if gap < 1e-4 else "FAIL")
    lines.append(f"- {verdict}: separate-sync rewards 2x1 vs 1x2, max |difference| {gap:.3e}")
(work / "train.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
step train 240 python3 "$WORK/train_check.py"
finish
