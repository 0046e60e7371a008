"""TAG — trainer-assisted generation on one trainer rank (docs/design.md §3 "TAG").

While a trainer rank has no training unit ready — at the head of every iteration, before the first
fragment arrives, or at any gap in the stream — it claims an ungenerated fragment from the tail of the
iteration's queue (:meth:`digenrl.gap.stream.FragmentStream.claim`), generates it whole with its own
model, and hands it to the same scoring and shipping path a generator pipeline's last stage uses; its
own shard stays local and is trained like any other.

Rules, and how they hold here:

* a ready training unit always wins — the trainer loop asks :meth:`digenrl.tag.component.Tag.help` (and
  so :meth:`TagHelper.try_help`) only after the stream said the next fragment is not ready; helping is
  not pre-empted mid-fragment;
* the helper is bound to the exact policy version of what it generates — the trainer's own weights, which
  are θ_k until the optimizer step that ends iteration k, and the fragment's records carry that version;
  with TCSS's planned switch it claims only fragments the plan binds to θ_k (``head_only``: the ones
  below the switch are bound to θ_{k−1} and belong to the generators, :mod:`digenrl.async_policy.tcss`);
* it never commits an optimizer step and never disturbs a pending gradient accumulation: generation runs
  under ``torch.no_grad`` and touches no ``.grad``; with ``tag.park_grads`` the pending gradients move to
  host memory while generating and come back bit for bit (:class:`ParkedGradients`);
* the trainer's own model generates. With replicated weights (LoRA or full; backends ``none``/``ddp``)
  nothing moves. Under FSDP2 a forward is a collective, so the trainer ranks gather the full parameters
  *together* at the head of the iteration (:meth:`ParallelBackend.generation_weights`: one all-gather,
  then forwards without collectives, released after — the gradients stay on the shards) and each helps
  from there; the memory it needs is checked at startup (:func:`gathered_weights_fit`): ``tag.policy=always``
  is rejected and ``auto`` turns TAG off, with the numbers, when a trainer cannot hold it. DeepSpeed
  trains on every rank of the world, so it runs in colocated systems only and never meets TAG
  (:func:`tag_supported` says so all the same);
* the switch into and out of helping is its own span (``tag_switch``), measured and counted: parking or
  restoring gradients, gathering or releasing sharded weights, waiting for the device. Consecutive helper
  fragments switch once.
"""

from __future__ import annotations

import contextlib
import time

import torch

from digenrl.gap.fragments import FragmentPlan
from digenrl.gap.stream import FragmentStream
from digenrl.rollout.engine import RolloutEngine
from digenrl.runtime.faults.fault_injection import inject_fault
from digenrl.runtime.observe.events import EventLogger
from digenrl.runtime.observe.span_phases import Phase
from digenrl.trainer.parallel import ParallelBackend
from digenrl.tsp.stage_worker import InFlight

#: trainer backends a TAG helper can generate with (fsdp2: the ranks gather the weights together first)
TAG_BACKENDS = ("none", "ddp", "fsdp2")
#: headroom over the gathered weights for the generation's activations (the fragment's forward)
GATHER_HEADROOM = 1.25


def tag_supported(backend: str) -> str | None:
    """None if trainer ranks on ``backend`` can generate fragments, else the reason they cannot."""
    if backend in TAG_BACKENDS:
        return None
    return (
        f"trainer backend {backend!r}: DeepSpeed trains on every rank of the world (colocated systems "
        "only), so there are no trainer ranks beside generators to help them"
    )


def gathered_weights_fit(needed_bytes: int, free_bytes: int) -> str | None:
    """None if gathering ``needed_bytes`` of weights (plus headroom) fits in ``free_bytes``, else why not."""
    if needed_bytes * GATHER_HEADROOM <= free_bytes:
        return None
    gib, headroom = 1 << 30, GATHER_HEADROOM - 1
    return (
        f"generating on a trainer rank gathers {needed_bytes / gib:.2f} GiB of weights (+{headroom:.0%} "
        f"for activations) but only {free_bytes / gib:.2f} GiB are free on it"
    )


class ParkedGradients:
    """Pending gradients moved to host memory and back, unchanged (a copy, not a recomputation)."""

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        self.params = params
        self._host: list[torch.Tensor | None] | None = None

    @property
    def parked(self) -> bool:
        return self._host is not None

    def park(self) -> int:
        """Move every pending ``.grad`` to host memory; returns the bytes moved."""
        self._host = [None if p.grad is None else p.grad.to("cpu", copy=True) for p in self.params]
        for p in self.params:
            p.grad = None
        return sum(g.numel() * g.element_size() for g in self._host if g is not None)

    def restore(self) -> None:
        if self._host is None:
            return
        for p, g in zip(self.params, self._host, strict=True):
            p.grad = None if g is None else g.to(p.device)
        self._host = None


class TagHelper:
    """A trainer rank's helper mode (see the module docstring)."""

    def __init__(
        self,
        engine: RolloutEngine,
        stream: FragmentStream,
        plan: FragmentPlan,
        events: EventLogger,
        *,
        backend: ParallelBackend,
        park_grads: bool,
        device: torch.device,
    ) -> None:
        self.engine = engine
        self.stream = stream
        self.plan = plan
        self.events = events
        self.backend = backend
        self.device = device
        self.parking = ParkedGradients(backend.trainable_parameters()) if park_grads else None
        self.generating = False
        self.switches = 0
        self.switch_s = 0.0
        self._weights = contextlib.ExitStack()

    @property
    def joint(self) -> bool:
        """Whether the trainer ranks must start helping together (sharded weights are gathered jointly):
        then they help only at the head of an iteration (:meth:`digenrl.tag.component.Tag.begin`)."""
        return self.backend.joint_generation

    def try_help(
        self, iteration: int, version: int, prompts: list[str], *, head_only: int = 0
    ) -> InFlight | None:
        """Claim a fragment from the tail (at or above ``head_only``) and generate it with this rank's
        model (policy ``version``); None when nothing is left to claim. ``prompts`` are the iteration's
        prompts (index = prompt id)."""
        fragment = self.stream.claim(iteration, tail=True, head_only=head_only)
        if fragment is None:
            return None
        inject_fault(self.stream.plane.rank, iteration, phase="tag")  # robustness tests only
        self.enter(iteration, version)
        ids = list(self.plan.prompt_ids(fragment))
        tags = {"iteration": iteration, "fragment": fragment, "policy_version": version}
        start = time.perf_counter()
        with self.events.span(
            Phase.GENERATE,
            iteration=iteration,
            fragment=fragment,
            policy_version=version,
            samples=self.plan.fragment_samples(self.engine.group_size),
            extra={"helper": True},
        ):
            texts = [prompts[i] for i in ids]
            rows = self.plan.rows(fragment) if self.plan.splits_groups else None  # a fragment below a group
            batch = self.engine.generate_rows(texts, ids, rows, iteration=iteration, policy_version=version)
        tags["steps_s"] = time.perf_counter() - start
        return InFlight(batch, tags)

    def enter(self, iteration: int, version: int) -> None:
        """Switch from training to generating (once for consecutive helper fragments)."""
        if not self.generating:
            self._switch("in", iteration, version)
            self.generating = True

    def leave(self, iteration: int, version: int) -> None:
        """Switch back before receiving or training anything."""
        if self.generating:
            self._switch("out", iteration, version)
            self.generating = False

    def _switch(self, direction: str, iteration: int, version: int) -> None:
        start = time.perf_counter()
        with self.events.span(
            Phase.TAG_SWITCH, iteration=iteration, policy_version=version, extra={"direction": direction}
        ) as span:
            moved = 0
            if direction == "in":
                moved += self.parking.park() if self.parking is not None else 0
                moved += self._weights.enter_context(self.backend.generation_weights())
            else:
                self._weights.close()
                if self.parking is not None:
                    self.parking.restore()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            span["bytes"] = moved
        self.switches += 1
        self.switch_s += time.perf_counter() - start
