"""digenrl (GAP + TAG, TCSS off) computes colocated-sync's update bit for bit when both train the same
micro-batches in the same order (docs/operations.md, "Reproducible runs").

Both generate in batches of one prompt group (``sampler.samples_per_forward=4``, one-group GAP fragments),
and decode in the rollout's forward batches (``digenrl/systems/components.py``), so the trajectories and
their rewards are the same whoever generates them (a generator rank or the TAG trainer); both train
micro-batches of one group at one timestep (``trainer.micro_batch_size=4``) and, since the plan runs chunk by
chunk as flow_grpo's loop does (:func:`digenrl.data.micro_batches.plan_micro_batches`), in the same order:
fragment by fragment (``gap.train_order=index``), each fragment's timesteps in turn. The gradient sums
therefore round alike and every iteration — rollout, loss, update, weights — is equal, not just close; the
same configuration on an H200 with ``runtime.deterministic=true`` is experiments/gpu/h200_equivalence.sh.

Bit equality of two code paths holds on a given CPU only when they compute the same operations on the same
shapes in the same order; whether different shapes happen to round alike depends on the CPU's kernels (a
VAE decode of 16 samples at once against 4 at a time matched on one machine and not on another). So the
pair also records its batch ledgers (``runtime.record_batches``) and
:func:`test_both_systems_compute_on_the_same_batches` checks the shapes themselves, which fails on every
machine when a schedule changes a batch.
"""

from __future__ import annotations

import pytest
import torch

from digenrl.runtime.observe.metrics import read_metrics
from digenrl.trainer.checkpoint import full_trainer_state, load_latest_checkpoint
from tests.systems.equivalence import assert_same_batches, assert_same_update, ledger_batches
from tests.systems.launcher import run_train

COMMON = [
    "iterations=2",
    "checkpoint_every=2",
    "seed=3",
    "sampler.samples_per_forward=4",
    "trainer.micro_batch_size=4",
    "runtime.record_batches=true",
]
#: bit for bit: the trajectories (reward mean), the update and its inputs
EXACT = ("samples", "reward_mean", "ratio_mean", "update_norm", "grad_norm")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("exact")
    run_train([*COMMON, "system=colocated-sync", "profile=cpu-1", f"out_dir={root / 'colocated'}"])
    digenrl = ["system=digenrl", "gap.fragment_groups=1", "gap.train_order=index", "tag.policy=always"]
    run_train([*COMMON, *digenrl, f"out_dir={root / 'digenrl'}"], nproc=2)
    return root / "colocated", root / "digenrl"


def test_digenrl_equals_colocated_sync_bit_for_bit(pair):
    colocated, digenrl = pair
    # reward_std and the loss are only reported, summed over other partitions (fragments vs the whole batch)
    assert_same_update(colocated, digenrl, rel=1e-9, reward_abs=1e-12, iterations=2, equal=EXACT)
    assert sum(r["tag_fragments"] for r in read_metrics(digenrl)) >= 1  # the trainer generated fragments
    for a, b in zip(read_metrics(colocated), read_metrics(digenrl), strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-9, abs=1e-12), a["iteration"]
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


def test_both_systems_compute_on_the_same_batches(pair):
    """What makes the pair equal bit for bit, checked as shapes: every transformer forward, VAE decode and
    micro-batch holds the same samples in both runs, and the micro-batches accumulate in the same order on
    the one training rank of each."""
    assert_same_batches(*pair, ops=("rollout", "decode", "train"))
    colocated = ledger_batches(pair[0])
    assert len(colocated["train"]) == 1 and len(ledger_batches(pair[1])["train"]) == 1
    # the configuration's shapes: forwards and decodes of one group (4 samples), micro-batches of 4 units
    assert {len(samples) for _, _, samples in colocated["rollout"]} == {4}
    assert {len(samples) for _, samples in colocated["decode"]} == {4}
    assert {len(units) for units_ in colocated["train"].values() for _, units in units_} == {4}
