"""One model for what a phase switch moves and what it costs: colocated residency transitions and TAG
switches alike (docs/design.md §2 "Layouts and residency", §3 (TAG)).

A switch is charged only for what actually moves, over the host↔device link of the rank's profile, plus
one device synchronisation (``CostModel.switch_sync_s``) when the runtime issues one:

* colocated (``digenrl/systems/residency.py``): the optimizer state moves only when
  ``residency.train_resident=false`` (parked when generation starts, back before the optimizer step), the
  reward model only when ``residency.reward_resident=false`` (on for scoring, off after). With the runtime
  defaults nothing moves and a phase change costs nothing;
* TAG (``digenrl/tag/helper.py``): every switch synchronises the device; the pending gradients move only
  with ``tag.park_grads=true`` *and* when there are pending gradients (none at the head of an iteration,
  before the first micro-batch of it was trained).

Byte counts come from the cost model; seconds = bytes / ``links.host_device_gbps``
(:meth:`digenrl.sim.network.Network.host_copy_s`), the same for every GPU type of a profile.
"""

from __future__ import annotations

from dataclasses import dataclass

from digenrl.costs.cost_model import CostModel
from digenrl.runtime.observe.span_phases import Phase
from digenrl.sim.network import Network


@dataclass(frozen=True)
class Move:
    """One transfer of a switch: ``what`` moves, ``nbytes`` of it, ``park`` (device → host) or not."""

    what: str
    nbytes: int
    park: bool


def move_s(net: Network, cost: CostModel, moves: list[Move], sync: bool) -> float:
    """Seconds of a switch that issues ``moves`` (and a device synchronisation when ``sync``)."""
    seconds = sum(net.host_copy_s(m.nbytes) for m in moves)
    return seconds + (cost.switch_sync_s if sync or moves else 0.0)


def tag_switch_moves(cost: CostModel, park_grads: bool, grads_pending: bool, entering: bool) -> list[Move]:
    """What a TAG switch moves: the pending gradients, only with ``tag.park_grads`` and only if any."""
    if not (park_grads and grads_pending) or not cost.grad_bytes:
        return []
    return [Move("gradients", cost.grad_bytes, park=entering)]


def colocated_moves(cost: CostModel, phase: str, train_resident: bool, reward_resident: bool) -> list[Move]:
    """What a colocated rank moves before ``phase`` (the runtime's ResidencyPlanner sequence):
    ``generate`` parks the optimizer state, ``score`` onloads the reward, ``after_score`` parks it again,
    ``optimizer`` brings the optimizer state back (``after_score`` is a point between phases, not a span)."""
    moves: list[Move] = []
    if not train_resident and cost.optimizer_bytes and phase in (Phase.GENERATE, Phase.OPTIMIZER):
        moves.append(Move("optimizer", cost.optimizer_bytes, park=phase == Phase.GENERATE))
    if not reward_resident and cost.reward_param_bytes and phase in (Phase.SCORE, "after_score"):
        moves.append(Move("reward", cost.reward_param_bytes, park=phase == "after_score"))
    return moves
