"""``trainer.sharding=hybrid`` end to end: ``run_train.py`` on 4 ranks of ``profile=cpu-4-2node``
(2 nodes × 2) creates the HSDP groups on every rank, trains a full fine-tune sharded inside each node,
records the plan it ran, and writes a sharded checkpoint holding each shard once (the two replicas of a
shard are one chunk in DCP's metadata). That the hybrid update equals the flat one and resumes exactly is
checked on the trainer itself, tests/trainer/test_trainer_hybrid_sharding.py (one 4-rank launch each, not
three runs here)."""

from __future__ import annotations

import json
import math

import torch.distributed.checkpoint as dcp

from digenrl.runtime.observe.metrics import read_metrics
from digenrl.trainer.checkpoint import SHARDED_DIR, latest_checkpoint_dir, read_meta
from digenrl.trainer.run_dir import PLAN_FILE
from tests.systems.launcher import run_train

HYBRID = [
    "system=colocated-sync",
    "profile=cpu-4-2node",
    "trainer.mode=full",
    "trainer.sharding=hybrid",
    "iterations=2",
    "checkpoint_every=2",
]


def test_a_hybrid_run_trains_and_saves_each_shard_once(tmp_path):
    run_train([*HYBRID, f"out_dir={tmp_path}"], nproc=4)
    plan = json.loads((tmp_path / PLAN_FILE).read_text())
    assert plan["trainer_sharding"] == "hybrid" and plan["world_size"] == 4
    metrics = read_metrics(tmp_path)
    assert [r["iteration"] for r in metrics] == [0, 1]
    for record in metrics:
        for key in ("grad_norm", "update_norm"):
            assert math.isfinite(record[key]) and record[key] > 0, (record["iteration"], key, record[key])
    step = latest_checkpoint_dir(tmp_path)
    assert read_meta(step)["trainer_format"] == "sharded"
    metadata = dcp.FileSystemReader(str(step / SHARDED_DIR)).read_metadata().state_dict_metadata
    weights = {k: v for k, v in metadata.items() if k.startswith("model.")}
    assert weights
    for name, tensor in weights.items():
        # two half-shards per tensor (one per rank of a node), written once though two nodes hold them
        covered = sum(math.prod(chunk.sizes) for chunk in tensor.chunks)
        assert covered == math.prod(tensor.size), (name, [(c.offsets, c.sizes) for c in tensor.chunks])
        assert len(tensor.chunks) <= 2, name
