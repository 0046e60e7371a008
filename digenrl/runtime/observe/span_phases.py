"""The names of the spans a run and the simulator write, declared once (docs/design.md §5).

A span's ``phase`` is what the event summary, the Chrome trace, TAG's measured costs, the validation report
and the figures group time by, so a run and its simulation must spell every phase alike. Every emitter —
``EventLogger.span`` / ``record_span`` of the runtime, ``SpanLog.add`` of the simulator — writes through
:func:`digenrl.runtime.observe.event_records.span_record`, which refuses a phase not declared here: a new
phase is added to :class:`Phase` first, and then every reader can name it.

Torch-free (the simulator and the planner import it without torch).

Conventions the summaries rely on: ``wait_*`` phases are idle time (a bubble, :func:`is_idle_phase`);
``iteration`` marks the extent of one iteration on a rank and is not work either (:func:`is_work_phase`).
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    """Every span phase. Values are the strings the event logs hold (``rank<r>.jsonl``), unchanged."""

    # -- work: the device is busy
    GENERATE = "generate"  # denoising a batch or fragment (a TAG helper's too, with ``extra.helper``)
    SCORE = "score"  # the reward model on a batch (on the producer, or on a scorer rank)
    TRAIN = "train"  # forward + backward over a rank's units
    OPTIMIZER = "optimizer"  # the optimizer step; the lead trainer's carries the committed samples
    EVAL = "eval"  # held-out evaluation (``eval.every``)
    SYNC = "sync"  # trainer → generator weight sync
    TRANSFER = "transfer"  # a batch or fragment sent point to point
    ALLREDUCE = "allreduce"  # the gradient all-reduce among trainer replicas (simulator)
    ADVANTAGES = "advantages"  # the colocated advantages barrier (simulator)
    RESIDENCY = "residency"  # a colocated rank parks or fetches optimizer state / reward model
    TAG_SWITCH = "tag_switch"  # a TAG helper switching between training and generation
    OFFLOAD = "offload"  # hybrid engine switch (colocated-engine): state moved off the device
    ONLOAD = "onload"  # hybrid engine switch: state moved back onto the device
    RESHARD = "reshard"  # hybrid engine switch: trainer weights copied into the generation copy

    # -- idle: the device waits (a bubble)
    WAIT_SCORE = "wait_score"  # a producer waits for its scorer
    WAIT_SYNC = "wait_sync"  # a generator waits for the next policy
    WAIT_TRANSFER = "wait_transfer"  # a trainer waits for a generator's batch
    WAIT_FRAGMENT = "wait_fragment"  # a GAP trainer waits for its next fragment
    WAIT_STAGE = "wait_stage"  # a TSP stage waits for the stage before it
    WAIT_PIPELINE = "wait_pipeline"  # a TSP head waits for room in the pipeline (simulator)
    WAIT_REQUEST = "wait_request"  # a scorer rank waits for work
    WAIT_COMMAND = "wait_command"  # a separate-async generator waits for its next command (simulator)
    WAIT_GENERATION = "wait_generation"  # the async lead trainer waits for a batch still generating
    WAIT_DRAIN = "wait_drain"  # the async lead trainer drains the batches in flight at the end
    WAIT_ADVANTAGES = "wait_advantages"  # ranks meeting at the advantages barrier (simulator)
    WAIT_ALLREDUCE = "wait_allreduce"  # replicas meeting at the gradient all-reduce (simulator)

    # -- marker: not work, not idle
    ITERATION = "iteration"  # the extent of one iteration on one rank


def waiting_for(phase: Phase) -> Phase:
    """The idle phase of ranks waiting for the others at ``phase`` (a collective): ``wait_<phase>``."""
    return declared_phase(f"wait_{phase}")


def declared_phase(phase: str) -> Phase:
    """``phase`` as a :class:`Phase`; a clear error naming this module when it is not declared."""
    try:
        return Phase(phase)
    except ValueError:
        raise ValueError(
            f"span phase {phase!r} is not declared in digenrl/runtime/observe/span_phases.py (Phase); "
            "declare it there so the summaries, TAG, the validation report and the figures can name it"
        ) from None


def is_idle_phase(phase: str) -> bool:
    """Idle phases are waiting, not work: ``wait*``, and ``idle`` / ``idle_*`` of logs written before the
    names were declared."""
    return phase.startswith(("wait", "idle"))


def is_work_phase(phase: str) -> bool:
    """Spans that make a device busy: everything except idle phases and the ``iteration`` marker."""
    return phase != Phase.ITERATION and not is_idle_phase(phase)
