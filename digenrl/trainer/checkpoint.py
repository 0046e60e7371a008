"""Atomic, resumable checkpoints: ``out_dir/checkpoints/step_<n>/`` plus a ``latest`` pointer.

Layout of one checkpoint::

    step_<n>/trainer.pt        payload from the writer rank (trainer state, iteration, config, …)
    step_<n>/trainer_dcp/      sharded format only: weights and optimizer state, one ``__<r>_0.distcp`` file
                               per trainer rank plus DCP's ``.metadata`` (torch.distributed.checkpoint)
    step_<n>/rng/rank_<r>.pt   RNG states of every participating rank (python, numpy, torch, cuda)
    step_<n>/config.yaml       the resolved config, for humans (when the payload carries one)
    step_<n>/meta.json         step, file list, ``trainer_format`` (full | sharded) and the run's identity
                               (``run_id``, ``config``: read at startup without loading the tensors) —
                               written last inside the temporary dir
    step_<n>/lora_diffusers/   ``checkpoint.export_lora=true``: the adapter in diffusers' format
                               (digenrl/trainer/lora_export.py; ``lora_diffusers_ema/``: its EMA)
    latest                     text file naming the newest complete step directory

Atomicity: every rank writes into ``.step_<n>.tmp`` beside the final directory (its RNG state, and in the
sharded format its shards); after a barrier the writer rank fsyncs every file and the directory, renames
the directory with ``os.replace`` and replaces the ``latest`` file the same way (POSIX rename is atomic
within a file system). A crash at any point leaves either the previous ``latest`` or the new one, never a
half-written step directory under a ``step_<n>`` name; leftover ``.tmp`` directories are ignored by the
loader and removed by the next save of that step.

Two formats for the trainer state (``trainer.checkpoint_format``, docs/design.md §3):

* ``full``: full (unsharded) tensors keyed by parameter name in ``trainer.pt`` (see
  :meth:`PolicyTrainer.state_dict`), gathered to the writer rank. LoRA checkpoints (the adapter and its
  Adam moments: megabytes) and DDP / DeepSpeed runs use it.
* ``sharded``: FSDP2 full fine-tuning. Gathering 12B weights plus Adam state (~190 GB) to one rank cannot
  work, so every trainer rank writes its own shards with ``torch.distributed.checkpoint`` (as torchtitan
  does); ``trainer.pt`` keeps only the small rest (step count, mode). The keys are the same as the full
  format's (``model.<name>``, ``optimizer.state.<name>.exp_avg`` …, ``ema.<name>`` with an EMA), and DCP
  reshards on load, so a run saved by N FSDP2 ranks resumes under M ranks or in one process;
  :func:`full_trainer_state` converts one offline.

Reading trusts nothing in the folder (digenrl/trainer/checkpoint_files.py): every file is unpickled
weights-only, every path must stay inside the run folder, and :func:`verify_checkpoint` checks a checkpoint
whole (what a resume does at startup, before any model is built), naming the file and what is wrong.

Either way a run can resume under another process layout (e.g. 4 → 2 FSDP2 ranks): the loader reads the
format from ``meta.json``. RNG states are per rank: a resumed rank r restores ``rank_r.pt`` when it exists.

Retention: ``keep`` > 0 deletes all but the newest ``keep`` step directories, after the new one is
published, so a crash during a save never leaves fewer complete checkpoints than before. A payload holding
a non-finite floating-point tensor is refused before anything is written (each rank checks its own shards
and the ranks agree before anyone writes): a NaN checkpoint would make ``resume=true`` continue from
garbage.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import yaml

from digenrl.runtime.comm.errors import DistributedTimeoutError
from digenrl.runtime.run_folder.run_files import remove_tree, write_atomic
from digenrl.trainer.checkpoint_files import RNG_GLOBALS, CheckpointError, inside, load_tensors, read_json

CHECKPOINT_DIR = "checkpoints"
LATEST = "latest"
SHARDED_DIR = "trainer_dcp"  # the sharded format's torch.distributed.checkpoint directory
TRAINER_FILE = "trainer.pt"
META_FILE = "meta.json"
RNG_DIR = "rng"
_STEP_NAME = re.compile(r"step_(\d+)")
_RNG_NAME = re.compile(r"rank_\d+\.pt")


def capture_rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def rng_state_problem(state: Any) -> str:
    """Why ``state`` is not an RNG state :func:`capture_rng_state` wrote ("" if it is one): the field and
    what it holds. Python's ``random.getstate()`` is (3, 625 ints, None | float); numpy's legacy
    ``get_state()`` ('MT19937', 624 uint32, pos, has_gauss, cached_gaussian); torch's a uint8 tensor of
    ``torch.get_rng_state()``'s length; CUDA's (optional) a list of uint8 tensors."""
    if not isinstance(state, dict):
        return f"holds a {type(state).__name__}, not a dict of RNG states"
    missing = [key for key in ("python", "numpy", "torch") if key not in state]
    if missing:
        return f"lacks {', '.join(missing)}"
    py = state["python"]
    if not (
        isinstance(py, tuple)
        and len(py) == 3
        and isinstance(py[1], tuple)
        and len(py[1]) == 625
        and all(isinstance(x, int) for x in py[1])
        and (py[2] is None or isinstance(py[2], float))
    ):
        return "'python' is not random.getstate()'s (version, 625 ints, gauss)"
    npy = state["numpy"]
    if not (
        isinstance(npy, tuple)
        and len(npy) == 5
        and npy[0] == "MT19937"
        and isinstance(npy[1], np.ndarray)
        and npy[1].dtype == np.uint32
        and npy[1].shape == (624,)
        and isinstance(npy[2], int)
        and 0 <= npy[2] <= 624
    ):
        return "'numpy' is not numpy.random.get_state()'s ('MT19937', 624 uint32 words, pos ≤ 624, …)"
    expected = torch.get_rng_state().shape
    cpu = state["torch"]
    if not (isinstance(cpu, torch.Tensor) and cpu.dtype == torch.uint8 and cpu.shape == expected):
        shown = (cpu.dtype, tuple(cpu.shape)) if isinstance(cpu, torch.Tensor) else type(cpu).__name__
        return f"'torch' is {shown}, expected a uint8 tensor of shape {tuple(expected)}"
    cuda = state.get("cuda", [])
    if not (
        isinstance(cuda, list | tuple)
        and all(isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.dim() == 1 for t in cuda)
    ):
        return "'cuda' is not a list of uint8 tensors (torch.cuda.get_rng_state_all())"
    return ""


def restore_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`capture_rng_state` captured; a malformed state is a CheckpointError first
    (nothing restored)."""
    problem = rng_state_problem(state)
    if problem:
        raise CheckpointError(f"RNG state {problem}")
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _torch_save_synced(obj: Any, path: Path) -> None:
    torch.save(obj, path)
    _fsync_file(path)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _barrier(group: Any, what: str, timeout_s: float) -> None:
    """All ranks of ``group`` meet; fails after ``timeout_s`` naming this rank and ``what`` (gloo: a
    monitored barrier that lists the missing ranks; NCCL: a barrier whose wait has the timeout)."""
    if not _distributed():
        return
    try:
        if dist.get_backend(group) == "gloo":
            dist.monitored_barrier(group=group, timeout=timedelta(seconds=timeout_s), wait_all_ranks=True)
        else:
            work = dist.barrier(group=group, async_op=True)
            work.wait(timeout=timedelta(seconds=timeout_s))
    except RuntimeError as error:
        raise DistributedTimeoutError(
            f"rank {dist.get_rank()} failed or timed out after {timeout_s:g} s in checkpoint barrier "
            f"'{what}': {error}"
        ) from error


def _on_any_rank(flag: bool, group: Any) -> bool:
    """Whether ``flag`` holds on any rank of ``group`` (one tiny all-reduce when distributed)."""
    if not _distributed():
        return flag
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else "cpu"
    value = torch.tensor([int(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return bool(value.item())


def step_dir_name(step: int) -> str:
    return f"step_{step}"


def nonfinite_entries(tree: Any, prefix: str = "") -> list[str]:
    """Dotted paths of the floating-point tensors in a nested payload that hold NaN or ±inf."""
    if isinstance(tree, torch.Tensor):
        tree = tree.to_local() if hasattr(tree, "to_local") else tree  # a DTensor: this rank's shard
        bad = tree.is_floating_point() and not bool(torch.isfinite(tree).all())
        return [prefix or "<payload>"] if bad else []
    if isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, list | tuple):
        items = enumerate(tree)
    else:
        return []
    return [path for key, value in items for path in nonfinite_entries(value, f"{prefix}.{key}".lstrip("."))]


def save_checkpoint(
    out_dir: str | Path,
    step: int,
    payload: dict[str, Any],
    *,
    rank: int,
    is_writer: bool,
    group: Any = None,
    keep: int = 0,
    sharded: dict[str, Any] | None = None,
    timeout_s: float = 300.0,
    write_extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write checkpoint ``step`` atomically; returns the final directory.

    Collective when torch.distributed is initialised: every rank of ``group`` (default: the world) calls
    it; each saves its RNG state, the single ``is_writer`` rank saves ``payload`` and publishes. Shared
    storage is assumed for multi-node runs. ``payload`` is whatever the caller needs to resume, typically
    ``{"trainer": trainer.state_dict(), "iteration": i, "policy_version": v, "config": cfg.to_dict()}``;
    ``PolicyTrainer.state_dict`` is complete only on the trainer group's first rank, so that rank writes.
    ``sharded``: the sharded format — this rank's shards of the trainer state
    (:meth:`PolicyTrainer.sharded_state_dict`), given by every rank of ``group`` (the trainer ranks),
    written into ``trainer_dcp/``; ``None`` on every rank: the full format.
    ``keep`` > 0: keep only the newest ``keep`` complete checkpoints (see the module docstring).
    ``timeout_s`` bounds each barrier of the save. ``write_extra`` (writer rank): writes further files into
    the step directory it is given (e.g. ``lora_diffusers/``, ``checkpoint.export_lora``) before it is
    published, so they appear atomically with the checkpoint.
    """
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {step}")
    bad = nonfinite_entries(payload) if is_writer else []
    if sharded is not None:
        bad += nonfinite_entries(sharded, SHARDED_DIR)
    if _on_any_rank(bool(bad), group):  # every rank refuses alike: nobody is left waiting in a barrier
        where = f"{', '.join(bad[:5])}{' …' if len(bad) > 5 else ''}" if bad else "another rank's state"
        raise FloatingPointError(
            f"rank {rank}: refusing to write checkpoint {step_dir_name(step)}: non-finite values in {where}"
        )
    root = Path(out_dir) / CHECKPOINT_DIR
    final = root / step_dir_name(step)
    tmp = root / f".{step_dir_name(step)}.tmp"
    if is_writer:
        root.mkdir(parents=True, exist_ok=True)
        remove_tree(tmp)  # a previous save of this step that crashed (a link there goes, its target stays)
        (tmp / "rng").mkdir(parents=True)
    _barrier(group, f"{tmp.name} created", timeout_s)
    _torch_save_synced(capture_rng_state(), tmp / "rng" / f"rank_{rank}.pt")
    if sharded is not None:
        _save_sharded(sharded, tmp / SHARDED_DIR, group)
    _barrier(group, f"every rank wrote into {tmp.name}", timeout_s)
    if is_writer:
        try:
            if write_extra is not None:
                write_extra(tmp)
            _publish(root, tmp, final, step, payload, "full" if sharded is None else "sharded")
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        if keep > 0:
            _prune(root, keep, newest=step)
    _barrier(group, f"{final.name} published", timeout_s)
    return final


def _save_sharded(state: dict[str, Any], directory: Path, group: Any) -> None:
    """Every rank writes its shards (one file each, fsync'ed as written); DCP's coordinator writes the
    ``.metadata`` that maps global tensors to the files once all ranks are done."""
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():  # one process without a process group is what no_dist means
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(
            state,
            storage_writer=dcp.FileSystemWriter(directory, sync_files=True),
            process_group=group,
            no_dist=not _distributed(),
        )


def load_sharded(path: str | Path, template: dict[str, Any], *, group: Any = None) -> None:
    """Fill ``template`` (this rank's state dict: DTensor shards or plain tensors, e.g. from
    :meth:`PolicyTrainer.sharded_state_dict`) in place from the sharded checkpoint directory ``path``.
    Collective over ``group`` when distributed; DCP reads each rank's part whatever layout wrote it."""
    import torch.distributed.checkpoint as dcp

    from digenrl.trainer.safe_dcp import SafeDcpPlanner, SafeDcpReader, own_errors

    directory = inside(Path(path).parent.parent, Path(path) / SHARDED_DIR)
    with warnings.catch_warnings(), own_errors():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(
            template,
            storage_reader=SafeDcpReader(directory),
            planner=SafeDcpPlanner(),
            process_group=group,
            no_dist=not _distributed(),
        )


def full_trainer_state(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The trainer state of a loaded checkpoint (:func:`load_checkpoint`) in the full format, whichever
    format it was saved in: a sharded one is read whole into this process (offline inspection, tests,
    conversion; a resume reshards instead, :meth:`PolicyTrainer.load_state_dict`)."""
    state = checkpoint["trainer"]
    if checkpoint.get("format", "full") == "full":
        return state
    # as torch's dcp_to_torch_save reads it (the whole state rebuilt from the index), minus the unsafe reads
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    from digenrl.trainer.safe_dcp import SafeDcpReader, SafeDcpWholePlanner, own_errors

    path = Path(checkpoint["path"])
    tensors: dict[str, Any] = {}
    reader = SafeDcpReader(inside(path.parent.parent, path / SHARDED_DIR))
    with own_errors():
        _load_state_dict(tensors, storage_reader=reader, planner=SafeDcpWholePlanner(), no_dist=True)
    full = {**state, "model": tensors["model"], "optimizer": tensors["optimizer"]}
    if "ema" in state:  # trainer.ema_decay > 0: its update count in trainer.pt, its tensors in the shards
        full["ema"] = {**state["ema"], "weights": tensors["ema"]}
    return full


def checkpoint_steps(out_dir: str | Path) -> list[int]:
    """Steps of the complete checkpoint directories in ``out_dir`` (a ``meta.json`` marks one, and the
    directory lies inside ``out_dir``), ascending; :func:`verify_checkpoint` checks one whole."""
    root = Path(out_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    base = Path(out_dir).resolve()
    steps = []
    for path in root.glob("step_*"):
        match = _STEP_NAME.fullmatch(path.name)
        if match and (path / META_FILE).is_file() and (path / META_FILE).resolve().is_relative_to(base):
            steps.append(int(match[1]))
    return sorted(steps)


def _prune(root: Path, keep: int, *, newest: int) -> None:
    """Delete complete checkpoints older than the newest ``keep`` up to ``newest`` (just published).
    Newer ones (left by an attempt that a resume superseded) are overwritten when the run gets there."""
    older = [step for step in checkpoint_steps(root.parent) if step <= newest]
    for step in older[:-keep]:
        shutil.rmtree(root / step_dir_name(step))


def _publish(
    root: Path, tmp: Path, final: Path, step: int, payload: dict[str, Any], trainer_format: str
) -> None:
    _torch_save_synced(payload, tmp / TRAINER_FILE)
    if isinstance(payload.get("config"), dict):
        (tmp / "config.yaml").write_text(yaml.safe_dump(payload["config"], sort_keys=False))
        _fsync_file(tmp / "config.yaml")
    rng_files = sorted(p.name for p in (tmp / RNG_DIR).iterdir())
    meta = {
        "step": step,
        "rng_files": rng_files,
        "payload_keys": sorted(payload),
        "trainer_format": trainer_format,
    }
    if trainer_format == "sharded":
        meta["sharded_files"] = sorted(p.name for p in (tmp / SHARDED_DIR).iterdir())
        _fsync_dir(tmp / SHARDED_DIR)
    meta.update({key: payload[key] for key in ("run_id", "config", "inputs") if key in payload})
    (tmp / META_FILE).write_text(json.dumps(meta, indent=1))
    _fsync_file(tmp / META_FILE)
    _fsync_dir(tmp / RNG_DIR)
    _fsync_dir(tmp)
    if final.exists():  # re-saving a step (e.g. after a resume): move the old one aside first
        old = root / f".{final.name}.old"
        remove_tree(old)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old)
    else:
        os.replace(tmp, final)
    _fsync_dir(root)
    point_latest(root.parent, step)


def point_latest(out_dir: str | Path, step: int) -> None:
    """Make ``latest`` name ``step_<step>`` (atomically: a crash leaves the old pointer or the new one)."""
    root = Path(out_dir) / CHECKPOINT_DIR
    write_atomic(root / LATEST, step_dir_name(step) + "\n", sync=True)
    _fsync_dir(root)


def latest_checkpoint_dir(out_dir: str | Path) -> Path | None:
    """The step directory ``latest`` names (``None``: no ``latest``); a CheckpointError when it names
    anything but a complete ``step_<n>`` directory inside ``out_dir``."""
    pointer = Path(out_dir) / CHECKPOINT_DIR / LATEST
    if not pointer.is_file():
        return None
    inside(out_dir, pointer)
    try:
        name = pointer.read_text().strip()
    except UnicodeDecodeError:
        raise CheckpointError(f"{pointer} is not text; it should name a step directory (step_<n>)") from None
    if not _STEP_NAME.fullmatch(name):
        raise CheckpointError(f"{pointer} names {name[:200]!r}, which is not a step directory (step_<n>)")
    path = pointer.parent / name
    inside(out_dir, path)
    if not (path / META_FILE).is_file():
        raise CheckpointError(f"{pointer} names {name}, which is not a complete checkpoint (no {META_FILE})")
    return path


class CheckpointChoiceError(CheckpointError):
    """Which checkpoint of a run folder to use cannot be decided (:func:`choose_checkpoint`); ``steps``: the
    complete checkpoints there (:func:`checkpoint_steps`), so a caller can list them in its own words."""

    def __init__(self, message: str, *, root: Path, steps: list[int]) -> None:
        super().__init__(message)
        self.root = root  # the run's checkpoints/ folder
        self.steps = steps


class NoCheckpointError(CheckpointChoiceError):
    """The run folder holds no checkpoint: no complete ``step_<n>`` and no ``latest``."""


class StepNotFoundError(CheckpointChoiceError):
    """The step asked for has no complete checkpoint directory (``path``)."""

    def __init__(self, message: str, *, root: Path, steps: list[int], step: int) -> None:
        super().__init__(message, root=root, steps=steps)
        self.step = step
        self.path = root / step_dir_name(step)


class LatestMissingError(CheckpointChoiceError):
    """``latest`` (``pointer``) is missing beside complete checkpoints, so which is newest is not recorded."""

    @property
    def pointer(self) -> Path:
        return self.root / LATEST


class LatestInvalidError(CheckpointChoiceError):
    """``latest`` names no complete step directory inside the run folder (the message says what it names)."""


def choose_checkpoint(out_dir: str | Path, step: int | None = None) -> Path:
    """The checkpoint directory of run folder ``out_dir`` that ``step`` names, or (``None``) the one
    ``latest`` names: what a resume (``resume.step``) and an export (``--step``) load. Raises a
    :class:`CheckpointChoiceError` subclass saying why none can be chosen; each caller words its message."""
    root = Path(out_dir) / CHECKPOINT_DIR
    steps = checkpoint_steps(out_dir)
    if step is not None:
        if step not in steps:
            raise StepNotFoundError(
                f"{root / step_dir_name(step)} is not a complete checkpoint",
                root=root,
                steps=steps,
                step=step,
            )
        return root / step_dir_name(step)
    try:
        latest = latest_checkpoint_dir(out_dir)
    except CheckpointError as error:
        raise LatestInvalidError(str(error), root=root, steps=steps) from None
    if latest is None:
        if steps:
            raise LatestMissingError(
                f"{root / LATEST} is missing, so which checkpoint is the newest is not recorded",
                root=root,
                steps=steps,
            )
        raise NoCheckpointError(
            f"{out_dir} holds no checkpoint ({root}/step_<n>/{META_FILE})", root=root, steps=[]
        )
    return latest


def read_meta(path: str | Path) -> dict[str, Any]:
    """``meta.json`` of the checkpoint directory ``path``: step, files, and the run identity when saved."""
    path = Path(path)
    return read_json(inside(path.parent.parent, path / META_FILE))


def verify_checkpoint(path: str | Path) -> dict[str, Any]:
    """Check the checkpoint in ``path`` whole, cheaply, before a resume builds anything; returns its meta.

    ``meta.json`` parses and has its fields; ``rng/`` holds every rank's file it lists; ``trainer.pt`` and
    the RNG files load weights-only (``trainer.pt`` memory-mapped: only its small pickle is read, so a big
    full-format file costs little); the sharded format's index loads and every shard it lists is there.
    Every file must lie inside the run folder. A problem is a CheckpointError naming the file."""
    path = Path(path)
    run = path.parent.parent
    meta = read_meta(path)
    meta_file = path / META_FILE
    step, rng_files, fmt = meta.get("step"), meta.get("rng_files"), meta.get("trainer_format", "full")
    if isinstance(step, bool) or not isinstance(step, int) or step_dir_name(step) != path.name:
        raise CheckpointError(f"{meta_file}: 'step' is {step!r}, expected {path.name.removeprefix('step_')}")
    if (
        not isinstance(rng_files, list)
        or not rng_files
        or not all(isinstance(name, str) and _RNG_NAME.fullmatch(name) for name in rng_files)
    ):
        raise CheckpointError(f"{meta_file}: 'rng_files' is {rng_files!r}, expected a list of rank_<r>.pt")
    if fmt not in ("full", "sharded"):
        raise CheckpointError(f"{meta_file}: 'trainer_format' is {fmt!r}, expected 'full' or 'sharded'")
    rng = inside(run, path / RNG_DIR)
    if not rng.is_dir():
        raise CheckpointError(
            f"{path / RNG_DIR} is missing: the RNG states of the ranks that saved the checkpoint "
            f"({', '.join(rng_files)}); without them a resumed run would not continue the run it resumes"
        )
    for name in rng_files:
        problem = rng_state_problem(load_tensors(inside(run, rng / name), allow=RNG_GLOBALS))
        if problem:
            raise CheckpointError(f"{rng / name}: the RNG state {problem}")
    check_payload(load_tensors(inside(run, path / TRAINER_FILE), mmap=True), path, step)
    if fmt == "sharded":
        from digenrl.trainer.safe_dcp import read_dcp_metadata

        directory = inside(run, path / SHARDED_DIR)
        index = read_dcp_metadata(directory)
        listed = set(meta.get("sharded_files") or []) | {
            str(info.relative_path) for info in (index.storage_data or {}).values()
        }
        for name in sorted(listed):
            if not inside(run, directory / name).is_file():
                raise CheckpointError(f"{directory / name} is missing (a shard of the sharded trainer state)")
    return meta


def check_payload(payload: Any, path: Path, step: int) -> None:
    """``trainer.pt`` of checkpoint ``path`` (step ``step`` in ``meta.json``) agrees with its meta: a dict
    whose ``next_iteration`` (when recorded) is the step, and whose trainer state's ``steps`` (when
    recorded) is a non-negative integer. A CheckpointError names the file and field."""
    where = path / TRAINER_FILE
    if not isinstance(payload, dict):
        raise CheckpointError(f"{where} holds a {type(payload).__name__}, not a payload dict")
    if "next_iteration" in payload and payload["next_iteration"] != step:
        raise CheckpointError(
            f"{where}: 'next_iteration' is {payload['next_iteration']!r} but {path / META_FILE} says step "
            f"{step}; the files come from different checkpoints, so resuming would mix two states"
        )
    trainer = payload.get("trainer")
    steps = trainer.get("steps") if isinstance(trainer, dict) else None
    if (
        isinstance(trainer, dict)
        and "steps" in trainer
        and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 0)
    ):
        raise CheckpointError(
            f"{where}: 'trainer.steps' is {steps!r}, expected the optimizer step count (≥ 0)"
        )


def load_latest_checkpoint(
    out_dir: str | Path, *, rank: int = 0, map_location: str | torch.device = "cpu"
) -> dict[str, Any] | None:
    """The newest complete checkpoint (:func:`load_checkpoint`), or ``None`` when there is none."""
    path = latest_checkpoint_dir(out_dir)
    return None if path is None else load_checkpoint(path, rank=rank, map_location=map_location)


def load_checkpoint(
    path: str | Path, *, rank: int = 0, map_location: str | torch.device = "cpu"
) -> dict[str, Any]:
    """The checkpoint in directory ``path``: the writer's payload plus ``step``, ``path``, ``format`` (of the
    trainer state: full | sharded; sharded tensors stay on disk until :meth:`PolicyTrainer.load_state_dict`
    or :func:`full_trainer_state` reads them) and ``rng`` (this rank's RNG state, or ``None`` when the
    checkpoint was written by fewer ranks); restore it with :func:`restore_rng_state`. Files are read
    weights-only and must lie inside the run folder (CheckpointError otherwise)."""
    path = Path(path)
    run = path.parent.parent
    meta = read_meta(path)
    payload = load_tensors(inside(run, path / TRAINER_FILE), map_location=map_location)
    check_payload(payload, path, int(meta["step"]))
    name = f"rank_{rank}.pt"
    rng = None
    if name in meta.get("rng_files", [name]):
        rng = load_tensors(inside(run, path / RNG_DIR / name), allow=RNG_GLOBALS)
        problem = rng_state_problem(rng)
        if problem:
            raise CheckpointError(f"{path / RNG_DIR / name}: the RNG state {problem}")
    fmt = meta.get("trainer_format", "full")  # checkpoints from before the sharded format are full
    return {**payload, "step": int(meta["step"]), "path": str(path), "format": fmt, "rng": rng}
