"""Atomic, resumable checkpoints: ``out_dir/checkpoints/step_<n>/`` plus a ``latest`` pointer.

Layout of one checkpoint::

    step_<n>/trainer.pt        payload from the writer rank (trainer state, iteration, config, …)
    step_<n>/rng/rank_<r>.pt   RNG states of every participating rank (python, numpy, torch, cuda)
    step_<n>/config.yaml       the resolved config, for humans (when the payload carries one)
    step_<n>/meta.json         step, file list and the run's identity (``run_id``, ``config``: read at
                               startup without loading the tensors) — written last inside the temporary dir
    latest                     text file naming the newest complete step directory

Atomicity: everything is written into ``.step_<n>.tmp`` beside the final directory, every file and the
directory are fsync'ed, then the directory is renamed with ``os.replace`` and the ``latest`` file is
replaced the same way (POSIX rename is atomic within a file system). A crash at any point leaves either the
previous ``latest`` or the new one, never a half-written step directory under a ``step_<n>`` name;
leftover ``.tmp`` directories are ignored by the loader and removed by the next save of that step.

Trainer state is stored as full (unsharded) tensors keyed by parameter name (see
:meth:`PolicyTrainer.state_dict`), so a run can resume under another process layout (e.g. 4 → 2 FSDP2
ranks). RNG states are per rank: a resumed rank r restores ``rank_r.pt`` when it exists.

Retention: ``keep`` > 0 deletes all but the newest ``keep`` step directories, after the new one is
published, so a crash during a save never leaves fewer complete checkpoints than before. A payload holding
a non-finite floating-point tensor is refused before anything is written: a NaN checkpoint would make
``resume=true`` continue from garbage.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import yaml

CHECKPOINT_DIR = "checkpoints"
LATEST = "latest"


def capture_rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
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


def _barrier(group: Any) -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier(group=group)


def step_dir_name(step: int) -> str:
    return f"step_{step}"


def nonfinite_entries(tree: Any, prefix: str = "") -> list[str]:
    """Dotted paths of the floating-point tensors in a nested payload that hold NaN or ±inf."""
    if isinstance(tree, torch.Tensor):
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
) -> Path:
    """Write checkpoint ``step`` atomically; returns the final directory.

    Collective when torch.distributed is initialised: every rank of ``group`` (default: the world) calls
    it; each saves its RNG state, the single ``is_writer`` rank saves ``payload`` and publishes. Shared
    storage is assumed for multi-node runs. ``payload`` is whatever the caller needs to resume, typically
    ``{"trainer": trainer.state_dict(), "iteration": i, "policy_version": v, "config": cfg.to_dict()}``;
    ``PolicyTrainer.state_dict`` is complete only on the trainer group's first rank, so that rank writes.
    ``keep`` > 0: keep only the newest ``keep`` complete checkpoints (see the module docstring).
    """
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {step}")
    if is_writer:
        bad = nonfinite_entries(payload)
        if bad:
            raise FloatingPointError(
                f"refusing to write checkpoint {step_dir_name(step)}: non-finite values in "
                f"{', '.join(bad[:5])}{' …' if len(bad) > 5 else ''}"
            )
    root = Path(out_dir) / CHECKPOINT_DIR
    final = root / step_dir_name(step)
    tmp = root / f".{step_dir_name(step)}.tmp"
    if is_writer:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)  # a previous save of this step that crashed
        (tmp / "rng").mkdir(parents=True)
    _barrier(group)
    _torch_save_synced(capture_rng_state(), tmp / "rng" / f"rank_{rank}.pt")
    _barrier(group)
    if is_writer:
        try:
            _publish(root, tmp, final, step, payload)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        if keep > 0:
            _prune(root, keep, newest=step)
    _barrier(group)
    return final


def checkpoint_steps(out_dir: str | Path) -> list[int]:
    """Steps of the complete checkpoint directories in ``out_dir`` (a ``meta.json`` marks one), ascending."""
    root = Path(out_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    steps = []
    for path in root.glob("step_*"):
        digits = path.name.removeprefix("step_")
        if digits.isdigit() and (path / "meta.json").is_file():
            steps.append(int(digits))
    return sorted(steps)


def _prune(root: Path, keep: int, *, newest: int) -> None:
    """Delete complete checkpoints older than the newest ``keep`` up to ``newest`` (just published).
    Newer ones (left by an attempt that a resume superseded) are overwritten when the run gets there."""
    older = [step for step in checkpoint_steps(root.parent) if step <= newest]
    for step in older[:-keep]:
        shutil.rmtree(root / step_dir_name(step))


def _publish(root: Path, tmp: Path, final: Path, step: int, payload: dict[str, Any]) -> None:
    _torch_save_synced(payload, tmp / "trainer.pt")
    if isinstance(payload.get("config"), dict):
        (tmp / "config.yaml").write_text(yaml.safe_dump(payload["config"], sort_keys=False))
        _fsync_file(tmp / "config.yaml")
    rng_files = sorted(p.name for p in (tmp / "rng").iterdir())
    meta = {"step": step, "rng_files": rng_files, "payload_keys": sorted(payload)}
    meta.update({key: payload[key] for key in ("run_id", "config") if key in payload})
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    _fsync_file(tmp / "meta.json")
    _fsync_dir(tmp / "rng")
    _fsync_dir(tmp)
    if final.exists():  # re-saving a step (e.g. after a resume): move the old one aside first
        old = root / f".{final.name}.old"
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old)
    else:
        os.replace(tmp, final)
    _fsync_dir(root)
    pointer = root / f".{LATEST}.tmp"
    pointer.write_text(final.name + "\n")
    _fsync_file(pointer)
    os.replace(pointer, root / LATEST)
    _fsync_dir(root)


def latest_checkpoint_dir(out_dir: str | Path) -> Path | None:
    root = Path(out_dir) / CHECKPOINT_DIR
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    name = pointer.read_text().strip()
    path = root / name
    if not name.startswith("step_") or not (path / "meta.json").is_file():
        raise FileNotFoundError(f"{pointer} names {name!r}, which is not a complete checkpoint directory")
    return path


def read_meta(path: str | Path) -> dict[str, Any]:
    """``meta.json`` of the checkpoint directory ``path``: step, files, and the run identity when saved."""
    return json.loads((Path(path) / "meta.json").read_text())


def load_latest_checkpoint(
    out_dir: str | Path, *, rank: int = 0, map_location: str | torch.device = "cpu"
) -> dict[str, Any] | None:
    """The newest complete checkpoint (:func:`load_checkpoint`), or ``None`` when there is none."""
    path = latest_checkpoint_dir(out_dir)
    return None if path is None else load_checkpoint(path, rank=rank, map_location=map_location)


def load_checkpoint(
    path: str | Path, *, rank: int = 0, map_location: str | torch.device = "cpu"
) -> dict[str, Any]:
    """The checkpoint in directory ``path``: the writer's payload plus ``step``, ``path`` and ``rng`` (this
    rank's RNG state, or ``None`` when the checkpoint was written by fewer ranks); restore it with
    :func:`restore_rng_state`."""
    path = Path(path)
    meta = read_meta(path)
    payload = torch.load(path / "trainer.pt", map_location=map_location, weights_only=False)
    rng_path = path / "rng" / f"rank_{rank}.pt"
    rng = torch.load(rng_path, weights_only=False) if rng_path.is_file() else None
    return {**payload, "step": int(meta["step"]), "path": str(path), "rng": rng}
