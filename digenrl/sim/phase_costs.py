"""A rank's seconds for its rollout phases — generating and scoring given samples — nominal (the cost
file's) or with per-sample variance (:mod:`digenrl.sim.sample_draws`).

Every schedule prices its ``generate`` and ``score`` spans here, so one rule holds everywhere:

* :func:`generation_s`: ``steps`` denoising steps in forwards of at most ``samples_per_forward``; each
  forward costs the cost file's step time for its size times the combined factor of its members (a padded
  forward waits for its slowest sample). A colocated rank of a sharded full fine-tune generates with the
  sharded model, so every forward gathers the weights once (the gather of FSDP shards for generation that
  a colocated system pays and a dedicated generator, holding whole weights, does not): a forward takes the
  longer of its compute and the gather. With Ulysses sequence parallelism a rank computes 1/N of each
  forward of its group's samples plus one forward's all-to-alls of both CFG halves per step
  (:func:`digenrl.sim.training.sequence_exchange_s`).
* :func:`score_s`: the VAE decode (nominal) plus the reward call over the samples, times the combined
  reward factor of its members (a batched judge decode ends with its longest output; concurrent requests
  to a server with their slowest answer).

``at`` = (iteration, first sample index) places the samples in the iteration's numbering; without
variance (``workload.variance`` None) or without ``at`` the seconds are exactly the cost file's.
"""

from __future__ import annotations

from collections.abc import Sequence

from digenrl.sim.cluster import SimCluster
from digenrl.sim.sample_draws import At
from digenrl.sim.training import fsdp_gather_s, sequence_exchange_s, sharded


def generation_s(
    cluster: SimCluster,
    rank: int,
    samples: int,
    steps: int | None = None,
    *,
    at: At | None = None,
    group: Sequence[int] = (),
) -> float:
    """``steps`` (default all) denoising steps of ``samples`` on ``rank`` (module docstring); ``group``:
    the trainer group over which a colocated full fine-tune shards the model (empty: whole weights)."""
    w = cluster.workload
    cost = cluster.cost(rank)
    if samples <= 0:
        return 0.0
    chunk = w.samples_per_forward or samples
    draws = None if at is None else cluster.draws
    calls = None if draws is None else draws.call_factors("generate", at, samples, chunk)
    gather = fsdp_gather_s(cluster, group, cost.param_bytes, rank) if sharded(cluster, group) else 0.0
    if calls is not None:
        step = sum(max(w.step_s(cost, size) * factor, gather) for size, factor in calls)
    elif not sharded(cluster, group):
        step = w.step_s(cost, samples)
    else:
        full, rest = divmod(samples, chunk)
        step = full * max(w.step_s(cost, chunk), gather) + (
            max(w.step_s(cost, rest), gather) if rest else 0.0
        )
    n = cluster.sequence_degree(rank)
    if n > 1:  # LoRA only (no gather): 1/N of the compute plus the all-to-alls of both CFG halves
        step = step / n + sequence_exchange_s(cluster, rank, samples * (2 if w.cfg else 1), 1)
    return (w.num_steps if steps is None else steps) * step


def score_s(cluster: SimCluster, rank: int, samples: int, *, at: At | None = None) -> float:
    """Decode and reward of ``samples`` finished samples on ``rank`` (the ``score`` phase)."""
    cost = cluster.cost(rank)
    draws = None if at is None else cluster.draws
    calls = None if draws is None else draws.call_factors("reward", at, samples, samples)
    if calls is None:
        return cost.score_s(samples)
    ((_, factor),) = calls
    return cost.vae_decode_s(samples) + cost.reward_s(samples) * factor
