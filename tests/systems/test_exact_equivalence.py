"""digenrl (GAP + TAG, TCSS off) computes colocated-sync's update bit for bit when both train the same
micro-batches in the same order (docs/operations.md, "Reproducible runs").

Both generate in batches of one prompt group (``sampler.samples_per_forward=4``, one-group GAP fragments),
so the trajectories are the same whoever generates them (a generator rank or the TAG trainer); both train
micro-batches of one group at one timestep (``trainer.micro_batch_size=4``) and, since the plan runs chunk by
chunk as flow_grpo's loop does (:func:`digenrl.data.micro_batches.plan_micro_batches`), in the same order:
fragment by fragment (``gap.train_order=index``), each fragment's timesteps in turn. The gradient sums
therefore round alike and every iteration — rollout, loss, update, weights — is equal, not just close; the
same configuration on an H200 with ``runtime.deterministic=true`` is experiments/gpu/h200_equivalence.sh.
"""

from __future__ import annotations

import pytest
import torch

from digenrl.runtime.metrics import read_metrics
from digenrl.trainer.checkpoint import full_trainer_state, load_latest_checkpoint
from tests.systems.launcher import run_train

COMMON = [
    "iterations=2",
    "checkpoint_every=2",
    "seed=3",
    "sampler.samples_per_forward=4",
    "trainer.micro_batch_size=4",
]
KEYS = ("samples", "reward_mean", "ratio_mean", "update_norm", "grad_norm")
#: statistics the two schedules only report, summed over other partitions (fragments vs the whole batch)
REPORTED = ("reward_std", "loss")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("exact")
    run_train([*COMMON, "system=colocated-sync", "profile=cpu-1", f"out_dir={root / 'colocated'}"])
    digenrl = ["system=digenrl", "gap.fragment_groups=1", "gap.train_order=index", "tag.policy=always"]
    run_train([*COMMON, *digenrl, f"out_dir={root / 'digenrl'}"], nproc=2)
    return root / "colocated", root / "digenrl"


def test_digenrl_equals_colocated_sync_bit_for_bit(pair):
    colocated, digenrl = (read_metrics(run) for run in pair)
    assert [r["iteration"] for r in digenrl] == [r["iteration"] for r in colocated] == [0, 1]
    assert sum(r["tag_fragments"] for r in digenrl) >= 1  # the trainer generated some of the fragments
    for a, b in zip(colocated, digenrl, strict=True):
        for key in KEYS:
            assert a[key] == b[key], (a["iteration"], key, a[key], b[key])
        for key in REPORTED:
            assert b[key] == pytest.approx(a[key], rel=1e-9, abs=1e-12), (a["iteration"], key)
    ta, tb = (full_trainer_state(load_latest_checkpoint(run)) for run in pair)
    assert ta["model"].keys() == tb["model"].keys() and len(ta["model"]) > 0
    for name, tensor in ta["model"].items():
        assert torch.equal(tensor, tb["model"][name]), name


def test_the_gpu_script_summary_reads_the_pair_as_exact(pair):
    """experiments/gpu/shared_summary.py's ``--exact`` check (what h200_equivalence.sh reports) holds on the
    pair, and the bf16 tolerance's check does too."""
    from experiments.gpu.shared_summary import equivalence

    colocated, digenrl = pair
    exact = equivalence(colocated, digenrl, 2, exact=True)
    assert exact["holds"] and exact["lora_max_abs_diff"] == 0.0 and exact["lora_tensors_compared"] > 0
    assert equivalence(colocated, digenrl, 2)["holds"]
