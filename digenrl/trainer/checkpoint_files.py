"""Reading a checkpoint's files without trusting them: no code runs, no path leaves the run folder, and a
damaged file is an error naming it and what is wrong.

A checkpoint is data that may come from elsewhere (a copied run folder, a shared disk), and Python's
pickle runs whatever a file asks it to. So every file is read with ``torch.load(weights_only=True)``
(tensors and plain containers only, docs.pytorch.org/docs/stable/notes/serialization.html), plus the
numpy classes the RNG state holds (:data:`RNG_GLOBALS`); the sharded format's DCP files are read by
:mod:`digenrl.trainer.safe_dcp`. Every path is resolved (``..`` and symlinks) and must stay inside
the run folder (:func:`inside`).
"""

from __future__ import annotations

import json
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or resumed; the message names the file and what is wrong."""


#: What ``numpy.random.get_state()`` pickles to (an ndarray of uint32), beyond weights_only's defaults.
RNG_GLOBALS = [np.ndarray((0,), np.uint32).__reduce__()[0], np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def inside(root: str | Path, path: str | Path) -> Path:
    """``path`` resolved (``..`` and symlinks); a CheckpointError when that leaves ``root`` resolved."""
    base = Path(root).resolve()
    resolved = Path(path).resolve()
    if not resolved.is_relative_to(base):
        raise CheckpointError(
            f"{path} leads to {resolved}, outside the run folder {base}; a run folder must hold its own "
            "files (a path with '..' or a symlink out of it is refused)"
        )
    return resolved


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file, or a CheckpointError saying that it is missing, not JSON or not an object."""
    if not path.is_file():
        raise CheckpointError(f"{path} is missing")
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc}); the file is damaged") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} holds {type(data).__name__}, not a JSON object; the file is damaged")
    return data


def load_tensors(
    path: Path, *, allow: list | None = None, map_location: Any = "cpu", mmap: bool = False
) -> Any:
    """``torch.load(path, weights_only=True)`` (with ``allow``: those globals too), each failure a
    CheckpointError naming the file: missing, empty, truncated / not written by ``torch.save`` (its zip
    directory is checked first: a cut-off file otherwise fails as ``OSError: Invalid argument``), or holding
    objects other than tensors and plain data (named; loading those could run code). ``mmap``: tensors stay
    on disk, so a check reads only the small pickle part."""
    if not path.is_file():
        raise CheckpointError(f"{path} is missing")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path} is empty (0 bytes)")
    if not zipfile.is_zipfile(path):
        raise CheckpointError(
            f"{path} is not a complete torch.save archive ({path.stat().st_size} bytes, no zip directory at "
            "its end): it was cut off or is not a checkpoint file"
        )
    try:
        with torch.serialization.safe_globals(allow or []):
            return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError:
        unsafe = ", ".join(torch.serialization.get_unsafe_globals_in_checkpoint(path)) or "unknown"
        raise CheckpointError(
            f"{path} holds objects other than tensors and plain data ({unsafe}); DigenRL never writes such "
            "a file, so it was altered or comes from elsewhere, and loading it could run code: refused"
        ) from None
    except (RuntimeError, OSError, EOFError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"{path} cannot be read, it is damaged ({first})") from None
