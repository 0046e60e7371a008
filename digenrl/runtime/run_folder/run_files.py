"""Files a run creates in ``out_dir``, opened so that nothing outside ``out_dir`` is ever written.

A symlink or a FIFO planted where the run writes (``out_dir/.lock``, ``.config.yaml.tmp``, ``profile/``, …)
must not redirect a write elsewhere, empty a file outside the run, or hang the start. The rule, written
once here and used by every writer of a run file:

* a new file (a temporary file that then replaces the real one, :func:`write_atomic`, :func:`open_new`)
  is created with ``O_CREAT | O_EXCL | O_NOFOLLOW``: whatever stood at its name (a link, a stale temporary
  file) is unlinked first, which removes a link and never touches its target, and the rename that
  publishes it replaces a link at the final name instead of writing through it;
* an existing file the run keeps writing (``metrics.jsonl``, an event log, the lock) is opened with
  ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO opens without waiting for a reader) and checked with ``fstat`` to be
  a regular file (:func:`open_regular`);
* a folder the run creates (``profile/``, ``events/``) is refused when it is a link (:func:`ensure_dir`);
  ``out_dir`` itself and the run folders that exist at start-up are checked to resolve inside ``out_dir``
  by :func:`digenrl.trainer.run_dir.check_run_files_inside`.

Each refusal is a :class:`UnsafeRunFile` (a ConfigError: ``launch.main`` prints it as one line) naming
the path and what to do. Linux/POSIX ``open(2)`` semantics (``O_NOFOLLOW``: ELOOP on a final symlink).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from pathlib import Path
from typing import BinaryIO

from digenrl.config import ConfigError


class UnsafeRunFile(ConfigError):
    """A path the run would write is a link, a FIFO, a device or a folder where a file belongs."""


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _refuse(path: Path, what: str) -> UnsafeRunFile:
    return UnsafeRunFile(
        f"{path} is {what}, where the run writes a regular file; the run never writes through links or into "
        "special files (that could change a file outside out_dir or hang). Remove it and start again"
    )


def open_regular(path: str | Path, flags: int, mode: int = 0o644) -> int:
    """``os.open(path, flags)`` that refuses a symlink, FIFO, device or directory at ``path`` (returns the
    descriptor, blocking mode restored)."""
    path = Path(path)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.ENOTDIR):
            try:
                kind = _kind(os.lstat(path).st_mode)
            except OSError:
                kind = "not a regular file"
            raise _refuse(path, kind) from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise _refuse(path, _kind(info.st_mode))
    os.set_blocking(fd, True)
    return fd


def open_append(path: str | Path, *, truncate: bool = False) -> BinaryIO:
    """``path`` opened for appending (created if missing; emptied first with ``truncate``), refusing what
    :func:`open_regular` refuses. Binary, unbuffered writes of whole lines."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_TRUNC if truncate else 0)
    return os.fdopen(open_regular(path, flags), "ab", buffering=0)


def _clear_name(path: Path) -> None:
    """Unlink whatever non-folder stands at ``path`` (a link goes, its target stays); a folder is refused."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        raise _refuse(path, "a directory")
    os.unlink(path)


def open_new(path: str | Path) -> BinaryIO:
    """A new, empty regular file at ``path`` (what stood there removed, never written through)."""
    path = Path(path)
    _clear_name(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    return os.fdopen(fd, "wb")


def temporary_name(path: str | Path) -> Path:
    """The hidden name beside ``path`` that a new version is written under before it replaces ``path``."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp")


def publish(tmp: str | Path, path: str | Path) -> None:
    """Rename ``tmp`` over ``path`` (atomic; a link at ``path`` is replaced, not followed); a folder at
    ``path`` is refused."""
    path = Path(path)
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(os.lstat(path).st_mode):
            os.unlink(tmp)
            raise _refuse(path, "a directory")
    os.replace(tmp, path)


def write_atomic(path: str | Path, data: str | bytes, *, sync: bool = False) -> Path:
    """Replace ``path`` with ``data`` atomically (a reader sees the old file or the new one), through a new
    temporary file (:func:`open_new`); ``sync`` fsyncs it before the rename."""
    path = Path(path)
    tmp = temporary_name(path)
    with open_new(tmp) as stream:
        stream.write(data.encode() if isinstance(data, str) else data)
        if sync:
            stream.flush()
            os.fsync(stream.fileno())
    publish(tmp, path)
    return path


def ensure_dir(path: str | Path) -> Path:
    """Create the folder ``path`` (and missing parents); refuse a link or a non-folder at ``path``."""
    path = Path(path)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        path.mkdir(parents=True, exist_ok=True)
        info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeRunFile(
            f"{path} is {_kind(info.st_mode)}, where the run keeps a folder; the run never writes through "
            "links (that could change files outside out_dir). Remove it and start again"
        )
    return path


def remove_tree(path: str | Path) -> None:
    """Delete ``path``: a folder with its contents (links inside are removed, not followed), or a link /
    file at its name (a link's target stays). Nothing there: nothing done."""
    path = Path(path)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(path)  # rmtree does not follow links inside the tree (os.scandir, lstat)
    else:
        os.unlink(path)
