"""One run per ``out_dir``: a lock held for the whole job, so a second job into the same folder is refused.

The lock is ``fcntl.flock`` on ``out_dir/.lock``, taken before anything is written, by the process that
decides how the run starts: the launcher of a plain ``python run_train.py`` that starts its workers (it
lives as long as they do; they find its token in ``DIGENRL_RUN_LOCK`` and do not lock again), else rank
0. The file records the holder (host, pid, run id, since when, a token), which a refused job names. The
kernel drops a flock when its holder dies, however it dies, so a lock file left by a killed run does not
block: the next run takes it over and says whose it was. A clean exit (or a refused start) empties the
file, so only a holder that did not end cleanly is reported. The file itself stays (deleting it would let
two runs lock two different files under one name). flock works on local file systems and on NFS (Linux
emulates it with NFS byte-range locks), as multi-node runs need (``launch._require_shared_out_dir``).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import socket
import struct
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from digenrl.config import ConfigError
from digenrl.runtime.run_folder.run_files import ensure_dir, open_regular

LOCK_FILE = ".lock"
#: Every worker a launcher starts holds a shared POSIX record lock on this file while it lives (a file of
#: its own: on NFS, flock is emulated with record locks, which would conflict with the launcher's flock).
WORKERS_FILE = ".lock-workers"
#: The environment variable that hands the launcher's lock token to the workers it starts.
TOKEN_ENV = "DIGENRL_RUN_LOCK"


@dataclass
class RunLock:
    """This process's hold on ``out_dir``'s lock (``fd`` None: held by the launcher that started us)."""

    path: Path
    fd: int | None
    info: dict = field(default_factory=dict)

    def record(self, run_id: str) -> None:
        """Write the run id into the lock file (known only once the run's start is decided)."""
        self.info["run_id"] = run_id
        if self.fd is not None:
            _write(self.fd, self.info)
        else:  # the launcher holds the lock and waits for us; its record gets the id
            fd = open_regular(self.path, os.O_WRONLY)
            try:
                _write(fd, self.info)
            finally:
                os.close(fd)

    def release(self) -> None:
        """Empty the record (a clean end) and unlock; idempotent."""
        _HELD.pop(self.path, None)
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing the last descriptor releases the flock


_HELD: dict[Path, RunLock] = {}


def _write(fd: int, info: dict) -> None:
    data = (json.dumps(info) + "\n").encode()
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))
    os.fsync(fd)


def _read(path: Path) -> dict:
    try:
        fd = open_regular(path, os.O_RDONLY)
    except (OSError, ConfigError):
        return {}
    with os.fdopen(fd, "rb") as stream:
        raw = stream.read(1 << 16)
    try:
        info = json.loads(raw.decode() or "{}")
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return info if isinstance(info, dict) else {}


def describe_holder(info: dict) -> str:
    if not info.get("pid"):
        return "a process that has not recorded itself yet"
    run = info.get("run_id") or "(run id not decided yet)"
    return f"pid {info['pid']} on host {info.get('host', '?')}, run {run}, since {info.get('since', '?')}"


def acquire_run_lock(out_dir: str | Path) -> tuple[RunLock, str]:
    """Lock ``out_dir`` for this job (creating the folder); returns the lock and a note ("" or what stale
    record it took over). A ConfigError names the holder when another job holds it. Held locks are reused:
    a second call in the holding process, or a worker of the launcher that holds it, gets it back."""
    path = Path(out_dir).resolve() / LOCK_FILE
    if path in _HELD:
        return _HELD[path], ""
    ensure_dir(path.parent)
    fd = open_regular(path, os.O_RDWR | os.O_CREAT)  # a link, FIFO or folder there is refused
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        info = _read(path)
        token = os.environ.get(TOKEN_ENV)
        if token and info.get("token") == token:
            lock = _HELD[path] = RunLock(path, None, info)
            return lock, ""
        raise ConfigError(
            f"out_dir={str(out_dir)!r} is in use by another run: {describe_holder(info)} (it holds {path}). "
            "Two runs in one folder would mix their logs and checkpoints; wait for it to end, or choose "
            "another out_dir"
        ) from None
    worker = live_worker(path.parent)
    if worker is not None:
        os.close(fd)
        raise ConfigError(
            f"out_dir={str(out_dir)!r}: worker pid {worker} of an earlier job of this run is still alive "
            f"(it holds {path.parent / WORKERS_FILE}; its launcher ended without stopping it). A new job "
            f"would race it: wait a few seconds for it to exit, or end it (kill {worker}), then start again"
        )
    stale = _read(path)
    info = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "run_id": None,
        "since": datetime.now(UTC).isoformat(timespec="seconds"),
        "token": uuid.uuid4().hex,
    }
    _write(fd, info)
    if not _HELD:
        atexit.register(release_run_locks)  # a normal exit ends cleanly; os._exit / a kill leaves the record
    lock = _HELD[path] = RunLock(path, fd, info)
    note = ""
    if stale.get("pid"):
        note = (
            f"took over {path}: its record names {describe_holder(stale)}, which no longer holds the lock "
            "(it ended without releasing it: killed or crashed)"
        )
    return lock, note


_WORKER_FDS: list[int] = []


def register_worker(out_dir: str | Path) -> None:
    """Mark this process as a live worker of the run in ``out_dir`` until it exits: a shared record lock
    on :data:`WORKERS_FILE` (the kernel drops it when the process dies, however it dies)."""
    fd = open_regular(ensure_dir(out_dir) / WORKERS_FILE, os.O_RDWR | os.O_CREAT)
    fcntl.lockf(fd, fcntl.LOCK_SH)
    _WORKER_FDS.append(fd)  # kept open: closing any descriptor of the file would drop the lock


#: ``struct flock`` (fcntl(2)): l_type, l_whence, l_start, l_len, l_pid, natively aligned and padded.
_FLOCK = "hhqqi4x"


def live_worker(out_dir: str | Path) -> int | None:
    """The pid of a live worker registered in ``out_dir`` (:func:`register_worker`), None if none: the
    holder of a record lock that an exclusive one would conflict with (``F_GETLK``)."""
    path = Path(out_dir) / WORKERS_FILE
    if not path.is_file():
        return None
    fd = open_regular(path, os.O_RDWR)
    try:
        query = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        kind, _, _, _, pid = struct.unpack(_FLOCK, fcntl.fcntl(fd, fcntl.F_GETLK, query))
    finally:
        os.close(fd)
    return None if kind == fcntl.F_UNLCK else pid


def holds_run_lock(out_dir: str | Path) -> bool:
    """Whether this process holds (or inherited) the lock of ``out_dir``."""
    return Path(out_dir).resolve() / LOCK_FILE in _HELD


def release_run_locks() -> None:
    """Release every lock this process holds (the end of ``launch.main``; process exit releases too)."""
    for lock in list(_HELD.values()):
        lock.release()
