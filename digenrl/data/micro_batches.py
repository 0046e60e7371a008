"""How the training units of a trajectory batch are cut into micro-batches.

A unit is one (sample b, trained transition k). FlowGRPO's rollout runs all samples of a batch through
the transformer at the same timestep in one forward, and its training loop takes the samples in chunks
and, for each chunk, every trained timestep in turn (flow_grpo scripts/train_sd3.py: ``for i, sample in
enumerate(samples_batched): ... for j in train_timesteps: ... compute_log_prob(transformer, pipeline,
sample, j, ...)``). The plan keeps both: a micro-batch never mixes timesteps when the batch has at least
``micro_batch_size`` samples, and the micro-batches come chunk by chunk, each chunk's timesteps in order.
With ``micro_batch_size`` equal to the rollout's samples per forward, the training forward sees the same
batch composition as the rollout, which is what makes the first PPO ratio exactly 1 (docs/algorithm.md,
"Loss"); and a GAP fragment of ``micro_batch_size`` samples is trained in exactly the micro-batches, and
the order, in which a whole-batch schedule trains those samples, so the gradient sums round alike
(docs/operations.md, "Reproducible runs"). When the batch is smaller (e.g. a rank's share of a fragment),
whole timestep rows are packed together so that micro-batches stay full.

Units given one after another (a rank's shares of successive fragments) fall into micro-batches by one
rule, :func:`split_units`: GAP's packer trains them so (:class:`digenrl.gap.unit_packer.UnitPacker`), and
the simulator prices them so (:class:`digenrl.sim.training.SimPacker`,
:meth:`digenrl.costs.CostModel.train_units_s`).
"""

from __future__ import annotations


def plan_micro_batches(batch_size: int, num_steps: int, micro_batch_size: int) -> list[list[tuple[int, int]]]:
    """Micro-batches of ``(sample, step)`` index pairs covering every unit exactly once."""
    if micro_batch_size <= 0:
        raise ValueError(f"trainer.micro_batch_size must be > 0, got {micro_batch_size}")
    if batch_size < 0 or num_steps < 0:
        raise ValueError(f"batch_size and num_steps must be >= 0, got {batch_size}, {num_steps}")
    rows = [[(b, k) for b in range(batch_size)] for k in range(num_steps)]
    plan: list[list[tuple[int, int]]] = []
    if batch_size >= micro_batch_size:  # chunk by chunk, each chunk's timesteps in order (flow_grpo's loop)
        for i in range(0, batch_size, micro_batch_size):
            plan.extend(row[i : i + micro_batch_size] for row in rows)
        return plan
    rows_per_micro_batch = max(1, micro_batch_size // max(batch_size, 1))
    for i in range(0, len(rows), rows_per_micro_batch):
        units = [u for row in rows[i : i + rows_per_micro_batch] for u in row]
        if units:
            plan.append(units)
    return plan


def split_units(units: int, micro_batch_size: int) -> tuple[int, int]:
    """How ``units`` training units fall into micro-batches of ``micro_batch_size``: (full micro-batches,
    units left over) — the last, partial micro-batch, or what a packer carries to the next fragment."""
    if micro_batch_size <= 0:
        raise ValueError(f"trainer.micro_batch_size must be > 0, got {micro_batch_size}")
    if units < 0:
        raise ValueError(f"units must be >= 0, got {units}")
    return divmod(units, micro_batch_size)
