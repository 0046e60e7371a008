"""``colocated-engine`` (veRL-Omni's hybrid engine; the real one is ``digenrl/systems/colocated_engine.py``).

Per rank and iteration, the runtime's switch (``digenrl/systems/engine_switch.py``) around a colocated
iteration::

    offload optimizer state ─▶ re-shard θ_k into the generation copy ─▶ offload trainer weights (full FT)
        ─▶ generate (on the generation copy: full weights, no FSDP gathers) ─▶ offload generation copy
        ─▶ onload trainer weights + optimizer state ─▶ score ─▶ train ─▶ step (as colocated-sync)

(from the second iteration the generation copy is onloaded before the re-shard). With
``engine_offload=False`` only the re-shard runs. Each switch step is a span named as the runtime's
(``offload`` / ``onload`` / ``reshard``) with the runtime's ``extra`` (``what``, ``bytes``).

Costs — which are measured and which modelled:

* bytes: the cost file's (measured by ``experiments/measure.py costs``): the optimizer state
  (``optimizer_bytes``), the trainer's weights for full fine-tuning (``param_bytes`` / ranks, FSDP2 shards,
  as :mod:`digenrl.planning.memory` counts them), the generation copy (``param_bytes``), the re-shard
  (``weight_sync_bytes``: the adapter with LoRA, the full weights otherwise). Gradients are not moved: the
  optimizer step frees them (``zero_grad(set_to_none=True)``), so the runtime has none to park.
* offload / onload seconds: bytes over the measured switch bandwidths of the cost file's
  ``meta["engine_switch"][trainer_mode]`` (``offload_gbps`` / ``onload_gbps``, from
  ``experiments/measure.py switch``) when present, else modelled as bytes over the profile's
  ``links.host_device_gbps``.
* re-shard seconds: ``meta["engine_switch"][trainer_mode]["reshard_s"]`` when measured (one device's copy),
  else modelled as a device copy (read + write of the bytes over the device type's ``hbm_gbps``); plus, for
  a sharded full fine-tune, one ring all-gather of the weights over the ranks, modelled
  (:func:`digenrl.sim.training.fsdp_gather_s`).
"""

from __future__ import annotations

from digenrl.costs.cost_model import CostModel
from digenrl.data.rank_shares import RankShare
from digenrl.plan import RunPlan
from digenrl.runtime.observe.span_phases import Phase
from digenrl.sim.cluster import SimCluster
from digenrl.sim.des import Process
from digenrl.sim.network import GB
from digenrl.sim.phase_costs import generation_s, score_s
from digenrl.sim.schedules.colocated import train_share
from digenrl.sim.training import fsdp_gather_s, sharded

#: the cost file's ``meta`` key holding the measured switch costs (digenrl/perf/measure_switch.py)
SWITCH_META = "engine_switch"


def run_colocated_engine(cluster: SimCluster, plan: RunPlan) -> None:
    """Spawn one process per rank of the profile."""
    ranks = tuple(range(cluster.profile.world_size))
    shares = plan.colocated_shares(cluster.workload, cluster.profile.relative_speeds)
    for rank in ranks:
        cluster.spawn(_engine_rank(cluster, plan, rank, ranks, shares[rank]), f"engine rank {rank}")


def switch_costs(cluster: SimCluster, rank: int, ranks: tuple[int, ...]) -> dict[str, tuple[int, float]]:
    """(bytes, seconds) of each switch step of ``rank`` (module docstring): ``optimizer``, ``weights``
    (full fine-tuning, else 0 bytes), ``copy`` (the generation copy) and ``reshard``."""
    cost = cluster.cost(rank)
    measured = _measured(cost, cluster.workload.trainer_mode)
    host = cluster.profile.links.host_device_gbps
    offload_gbps = measured.get("offload_gbps", host)
    onload_gbps = measured.get("onload_gbps", host)
    full = cluster.workload.trainer_mode == "full"
    weights = cost.param_bytes // len(ranks) if full and sharded(cluster, ranks) else cost.param_bytes
    out: dict[str, tuple[int, float]] = {}
    for what, nbytes in (
        ("optimizer", cost.optimizer_bytes),
        ("weights", weights if full else 0),
        ("copy", cost.param_bytes),
    ):
        out[what] = (nbytes, nbytes / (offload_gbps * GB))
        out[f"{what} onload"] = (nbytes, nbytes / (onload_gbps * GB))
    reshard_bytes = cost.weight_sync_bytes
    if "reshard_s" in measured:  # measured on one device: the copy into the generation copy
        reshard_s = float(measured["reshard_s"])
    else:
        hbm = cluster.profile.device_type(rank).hbm_gbps
        reshard_s = 2 * reshard_bytes / (hbm * GB)
    if full and sharded(cluster, ranks):  # the shards are all-gathered first
        reshard_s += fsdp_gather_s(cluster, ranks, reshard_bytes)
    out["reshard"] = (reshard_bytes, reshard_s)
    return out


def _measured(cost: CostModel, trainer_mode: str) -> dict:
    """The cost file's measured switch costs for this trainer mode (``meta["engine_switch"][mode]``, the
    ``engine_switch`` summary of ``experiments/measure.py switch``), or {} where none were measured."""
    return dict((cost.meta.get(SWITCH_META) or {}).get(trainer_mode) or {})


def _engine_rank(
    cluster: SimCluster, plan: RunPlan, rank: int, ranks: tuple[int, ...], share: RankShare
) -> Process:
    w = cluster.workload
    costs = switch_costs(cluster, rank, ranks)
    offload = plan.engine_offload
    full = w.trainer_mode == "full"

    def step(phase: str, key: str, what: str, tags: dict) -> Process:
        nbytes, seconds = costs[key]
        yield from cluster.work(rank, phase, seconds, extra={"what": what, "bytes": nbytes}, **tags)

    for k in range(w.iterations):
        tags = {"iteration": k, "policy_version": k}
        if offload:
            yield from step(Phase.OFFLOAD, "optimizer", "optimizer state and gradients", tags)
            if k > 0:  # the copy starts on the device; later iterations parked it for training
                yield from step(Phase.ONLOAD, "copy onload", "generation copy", tags)
        yield from step(Phase.RESHARD, "reshard", "trainer weights into generation copy", tags)
        if offload and full:
            yield from step(Phase.OFFLOAD, "weights", "trainer weights", tags)
        # the generation copy holds full weights: no FSDP gathers per forward (one rank's own model)
        at = (k, share.start)
        yield from cluster.work(
            rank, Phase.GENERATE, generation_s(cluster, rank, share.samples, at=at), **tags
        )
        if offload:
            yield from step(Phase.OFFLOAD, "copy", "generation copy", tags)
            if full:
                yield from step(Phase.ONLOAD, "weights onload", "trainer weights", tags)
            yield from step(Phase.ONLOAD, "optimizer onload", "optimizer state and gradients", tags)
        seconds = score_s(cluster, rank, share.samples, at=at)
        yield from cluster.work(rank, Phase.SCORE, seconds, samples=share.samples, **tags)
        yield from train_share(cluster, plan, rank, ranks, share, tags)
        cluster.finish_iteration(k)
