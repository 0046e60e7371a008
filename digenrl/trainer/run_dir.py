"""What an ``out_dir`` holds and the rules for starting a run in it, so a run never loses or mixes data.

A run directory holds one run: ``config.yaml``, ``plan.json``, ``metrics.jsonl``, ``events/``, ``trace.json``,
``checkpoints/``, ``tensorboard/``, ``samples/`` and ``wandb/`` (:data:`RUN_FILES`). Every run has an
identity, a ``run_id`` (uuid4) that its checkpoints, ``config.yaml``, ``metrics.jsonl`` and event logs
carry. At startup, before anything is written, rank 0 decides how this run uses ``out_dir``
(:func:`plan_run_start`):

* ``resume=false`` into a directory that holds a run → refused, unless ``overwrite=true``, which deletes
  that run's files (and nothing else) first; a new ``run_id``.
* ``resume=true`` with a checkpoint (the one ``latest`` names, or ``resume.step=N``'s) → the checkpoint is
  checked whole (:func:`digenrl.trainer.checkpoint.verify_checkpoint`: a damaged or altered file is refused
  naming it); its config must equal this run's in every key but :data:`digenrl.config.RESUMABLE_KEYS`,
  and the input files it records must have the same content (:mod:`digenrl.runtime.run_folder.run_inputs`),
  else refused naming every differing key with both values; the run keeps the checkpoint's ``run_id`` and
  starts at its iteration. ``resume.step=N`` also points ``latest`` at ``step_N``, so a later plain resume
  continues this branch; newer checkpoints are replaced as the run reaches their steps.
* ``resume=true`` without a checkpoint → a new run with a line saying so, if the directory holds no run
  (a first launch of a job script that always passes ``resume=true``); refused if it holds a run that
  never reached a checkpoint, since starting over would delete what that run logged, and refused listing
  the complete checkpoints when ``latest`` is missing beside them.

Every run file must lie inside ``out_dir`` (a symlink out of it is refused), and one job at a time uses
``out_dir`` (:mod:`digenrl.runtime.run_folder.run_lock`). :func:`agree_run_start` locks ``out_dir`` and runs
the decision on rank 0 and hands it to every rank through torchrun's store, so the error is printed once (by
``launch.main``) and every rank stops with it.

These rules live in ``trainer/`` beside :mod:`digenrl.trainer.checkpoint` because starting a run is
deciding which checkpoint it continues; the runtime below knows nothing of checkpoints.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from digenrl.config import RESUMABLE_KEYS, Config, ConfigError, config_differences
from digenrl.runtime.observe.event_records import EVENTS_SUBDIR
from digenrl.runtime.observe.metrics import METRICS_FILE, TENSORBOARD_DIR, WANDB_DIR, read_metrics
from digenrl.runtime.observe.sample_grid import SAMPLES_DIR
from digenrl.runtime.run_folder.run_inputs import input_differences, input_fingerprints
from digenrl.runtime.run_folder.run_lock import acquire_run_lock, holds_run_lock
from digenrl.trainer.checkpoint import (
    CHECKPOINT_DIR,
    CheckpointError,
    LatestInvalidError,
    LatestMissingError,
    NoCheckpointError,
    StepNotFoundError,
    checkpoint_steps,
    choose_checkpoint,
    inside,
    point_latest,
    step_dir_name,
    verify_checkpoint,
)

if TYPE_CHECKING:
    from digenrl.runtime.comm.distributed import DistContext
    from digenrl.runtime.hardware.profiles import HardwareProfile

CONFIG_FILE = "config.yaml"
#: the schedule the run executes (:class:`digenrl.plan.RunPlan`, written by rank 0 next to config.yaml)
PLAN_FILE = "plan.json"
#: the hardware profile ``profile=auto`` resolved to on the run's machine (written only then)
PROFILE_FILE = "profile.yaml"
TRACE_FILE = "trace.json"
RUN_FILES = (
    CONFIG_FILE,
    PLAN_FILE,
    PROFILE_FILE,
    METRICS_FILE,
    TRACE_FILE,
    EVENTS_SUBDIR,
    CHECKPOINT_DIR,
    TENSORBOARD_DIR,
    SAMPLES_DIR,
    WANDB_DIR,
)
"""The files and folders a run writes into ``out_dir``; ``overwrite=true`` deletes exactly these."""

_DECISIONS = itertools.count()


@dataclass(frozen=True)
class RunStart:
    """How this run starts in ``out_dir`` (decided once, on rank 0, by :func:`plan_run_start`)."""

    run_id: str
    start_iteration: int = 0  # the checkpoint's next iteration; 0 for a new run
    checkpoint: str | None = None  # the checkpoint directory a resumed run loads; None = a new run
    note: str = ""  # what rank 0 prints about it
    inputs: dict = field(default_factory=dict)  # input file fingerprints (run_inputs.py), for checkpoints

    @property
    def resumed(self) -> bool:
        return self.checkpoint is not None


def existing_run(out_dir: str | Path) -> list[str]:
    """What of a run ``out_dir`` holds, for a message ("metrics.jsonl (12 iterations)", …); [] = none."""
    out = Path(out_dir)
    found = []
    if (out / METRICS_FILE).is_file():
        found.append(f"{METRICS_FILE} ({len(read_metrics(out))} iterations)")
    logs = sorted((out / EVENTS_SUBDIR).glob("rank*.jsonl"))
    if logs:
        found.append(f"{EVENTS_SUBDIR}/ ({len(logs)} rank logs)")
    steps = checkpoint_steps(out)
    if steps:
        found.append(f"{CHECKPOINT_DIR}/ (steps {', '.join(map(str, steps))})")
    elif (out / CHECKPOINT_DIR).is_dir() and any((out / CHECKPOINT_DIR).iterdir()):
        found.append(f"{CHECKPOINT_DIR}/ (incomplete)")
    found += [
        name
        for name in (
            CONFIG_FILE,
            PLAN_FILE,
            PROFILE_FILE,
            TRACE_FILE,
            TENSORBOARD_DIR,
            SAMPLES_DIR,
            WANDB_DIR,
        )
        if (out / name).exists()
    ]
    return found


def plan_run_start(cfg: Config) -> RunStart:
    """Decide how ``cfg`` starts in ``cfg.out_dir`` (see the module docstring); reads only. Raises
    ConfigError naming what would be lost or mixed, or what is wrong, and how to proceed."""
    out = cfg.out_dir
    check_run_files_inside(out)
    inputs = input_fingerprints(cfg)
    if not cfg.resume.enabled:
        held = existing_run(out)
        if held and not cfg.overwrite:
            raise ConfigError(
                f"out_dir={out!r} already holds a run ({'; '.join(held)}); a new run there would destroy or "
                "mix with it. Continue it with resume=true, delete it with overwrite=true, or choose "
                "another out_dir"
            )
        note = f"overwrite=true: deleted the previous run in {out} ({'; '.join(held)})" if held else ""
        return RunStart(run_id=new_run_id(), note=note, inputs=inputs)
    checkpoint = _checkpoint_to_resume(cfg)
    if checkpoint is None:
        held = existing_run(out)
        if held:
            raise ConfigError(
                f"resume=true but out_dir={out!r} holds a run without a checkpoint to resume from "
                f"({'; '.join(held)}); start over with resume=false overwrite=true, or choose another out_dir"
            )
        return RunStart(
            run_id=new_run_id(),
            note=f"resume=true: no checkpoint in {out}, starting a new run at iteration 0",
            inputs=inputs,
        )
    try:
        meta = verify_checkpoint(checkpoint)
    except CheckpointError as error:
        raise ConfigError(f"resume=true: {error}{_other_checkpoints(out, but=checkpoint)}") from None
    if "config" not in meta or "run_id" not in meta:
        raise ConfigError(
            f"resume=true: checkpoint {checkpoint} does not record the config and run_id it was written "
            "with (an older format), so resuming it cannot be checked; start a new run in another out_dir"
        )
    differences = config_differences(meta["config"], cfg.to_dict())
    differences += input_differences(meta.get("inputs") or {}, inputs, cfg)
    if differences:
        listed = "\n  ".join(differences)
        raise ConfigError(
            f"resume=true: this config differs from the one checkpoint {checkpoint} was written with, "
            f"in keys a resumed run may not change:\n  {listed}\n"
            "Resume with the checkpoint's values, or start a new run in another out_dir. Keys a resume may "
            f"change: {', '.join(RESUMABLE_KEYS)}"
        )
    step = int(meta["step"])
    return RunStart(
        run_id=str(meta["run_id"]),
        start_iteration=step,
        checkpoint=str(checkpoint),
        note=f"resuming run {meta['run_id']} at iteration {step} from {checkpoint}",
        inputs=inputs,
    )


def _checkpoint_to_resume(cfg: Config) -> Path | None:
    """The step directory ``resume.step`` or ``latest`` names (:func:`choose_checkpoint`, its errors worded
    for the config keys); None when there is no checkpoint at all."""
    out = cfg.out_dir
    try:
        return choose_checkpoint(out, cfg.resume.step)
    except NoCheckpointError:
        return None
    except StepNotFoundError as error:
        raise ConfigError(
            f"resume.step={error.step}: out_dir={out!r} holds no complete checkpoint {error.path}"
            f"{_other_checkpoints(out)}"
        ) from None
    except LatestMissingError as error:
        raise ConfigError(
            f"resume=true: {error.pointer} is missing, so which checkpoint continues the run is not recorded"
            f"{_other_checkpoints(out)}"
        ) from None
    except LatestInvalidError as error:
        raise ConfigError(f"resume=true: {error}{_other_checkpoints(out)}") from None


def _other_checkpoints(out_dir: str, but: Path | None = None) -> str:
    """The end of a message: the checkpoints that pass :func:`verify_checkpoint` and how to resume one."""
    root = Path(out_dir) / CHECKPOINT_DIR
    valid = []
    for step in checkpoint_steps(out_dir):
        path = root / step_dir_name(step)
        if but is None or path.resolve() != Path(but).resolve():
            try:
                verify_checkpoint(path)
                valid.append(step)
            except CheckpointError:
                pass
    if not valid:
        return "; no other complete checkpoint is there"
    return (
        f"; complete checkpoints there: {', '.join(map(step_dir_name, valid))}. Resume one of them with "
        f"resume=true resume.step=<n> (the newest: resume.step={valid[-1]})"
    )


def check_run_files_inside(out_dir: str | Path) -> None:
    """Every run file and folder in ``out_dir`` (:data:`RUN_FILES`, walked without following links)
    resolves inside ``out_dir``: a symlink out of it would make a resume read, cut back or delete files
    elsewhere. Raises ConfigError naming the link."""
    out = Path(out_dir)
    for name in RUN_FILES:
        top = out / name
        if not (top.exists() or top.is_symlink()):
            continue
        paths = [top]
        if top.is_dir() and not top.is_symlink():
            for folder, dirs, files in os.walk(top):
                paths += [Path(folder) / entry for entry in (*dirs, *files)]
        for path in paths:
            try:
                inside(out, path)
            except CheckpointError as error:
                raise ConfigError(f"out_dir={str(out_dir)!r}: {error}") from None


def clear_run(out_dir: str | Path) -> None:
    """Delete the files of the run in ``out_dir`` (``overwrite=true``); other files stay."""
    out = Path(out_dir)
    for name in RUN_FILES:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def new_run_id() -> str:
    return uuid.uuid4().hex


def agree_run_start(cfg: Config, ctx: DistContext) -> RunStart:
    """Every rank: rank 0 locks ``out_dir`` for the job (:mod:`digenrl.runtime.run_folder.run_lock`), plans
    the start (:func:`plan_run_start`) and carries it out (``overwrite`` clears the old run, ``resume.step``
    points ``latest`` at its checkpoint); the other ranks read its decision from torchrun's store. A refusal
    raises ConfigError on every rank (its text travels with the decision), so all stop with it and
    ``launch.main`` prints it once."""
    decision: dict
    if ctx.rank == 0:
        lock = None
        try:
            fresh = not holds_run_lock(cfg.out_dir)
            lock, lock_note = acquire_run_lock(cfg.out_dir)
            start = plan_run_start(cfg)
            if cfg.overwrite:
                clear_run(cfg.out_dir)
            if start.resumed and cfg.resume.step is not None:
                point_latest(cfg.out_dir, start.start_iteration)
            lock.record(start.run_id)
            decision = {"start": {**asdict(start), "note": "; ".join(filter(None, (lock_note, start.note)))}}
        except ConfigError as error:
            if lock is not None and fresh:
                lock.release()  # a refused start wrote nothing and leaves no holder behind
            decision = {"error": str(error)}
    if ctx.is_distributed:
        from digenrl.runtime.comm.control_plane import ControlPlane

        plane = ControlPlane.from_default_group("startup", cfg.runtime.timeout_s)
        # one key per torchrun attempt and call: an elastic restart reuses the store and must not read an
        # old decision (every rank calls this equally often, so the counters agree)
        key = f"run-start/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{next(_DECISIONS)}"
        if ctx.rank == 0:
            plane.publish(key, json.dumps(decision))
        else:
            raw = plane.wait_for(key, peer=0, what="rank 0's decision on how the run starts in out_dir")
            decision = json.loads(raw.decode())
    if "error" in decision:
        raise ConfigError(decision["error"])
    return RunStart(**decision["start"])


def run_profile(run_dir: str | Path, profile: str) -> HardwareProfile:
    """The hardware profile a finished run ran on: the one ``profile=auto`` recorded in the run folder
    (:data:`PROFILE_FILE`), else the named profile."""
    from digenrl.runtime.hardware.profiles import AUTO, load_profile

    recorded = Path(run_dir) / PROFILE_FILE
    if profile == AUTO and recorded.is_file():
        return load_profile(recorded)
    return load_profile(profile)
