"""Whole multi-rank runs under torch's elastic agent with workers forked from a preloaded fork server.

``torchrun run_train.py`` starts every worker as a fresh interpreter, and each one spends ~5 s of CPU
importing torch, diffusers (which imports torch._dynamo and peft) and transformers before the tiny model's
first step, which takes well under a second: on CI's 2 cores a 4-rank run was ~20 s, ~1 s of it training.
Here the agent is the one torchrun runs (``torch.distributed.launcher.api.elastic_launch``, c10d
rendezvous on localhost, no restarts) and the workers run the same entry point as ``run_train.py``
(:func:`digenrl.launch.main`), but they are forked from one ``multiprocessing`` fork server per test
session that imported those packages once (``start_method="forkserver"`` with
``multiprocessing.set_forkserver_preload``). Nothing a run computes depends on how its processes started:
the same 4-rank run gives bit-identical metrics either way.

The forked processes see no GPU (``CUDA_VISIBLE_DEVICES=""`` in the server and in every worker): CUDA
cannot be used in a process forked after its parent touched it, and importing the preload list does on
a GPU machine. The runs here use the CPU profiles; a test that needs a GPU uses ``launcher="command"``.

A single-process run (``python run_train.py`` with no torchrun) is one process forked from the same
server, without an agent (:func:`run_preloaded_single`).

What this launcher does not show, the real command does (``run_train(..., launcher="command")``):
torchrun's own failure summary, a failing rank tearing the job down, config errors printed once per job.
Tests of those keep it. (The heartbeat watchdog runs in the ranks; tests/systems/test_watchdog.py reads
the ranks' log files while the run goes on, :func:`worker_log_lines`.)

Each worker's stdout and stderr go to files (the agent's ``DefaultLogsSpecs`` redirects) and come back
concatenated in rank order, as a ``subprocess.CompletedProcess`` like the subprocess launcher's.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from tests.systems.launcher import REPO, hung_run

#: What every worker imports before its first step (the fork server imports these once).
PRELOAD = (
    "torch.distributed",
    "diffusers.models.transformers",
    "peft",
    "transformers",
    "digenrl.launch",
    "digenrl.systems.components",
    "digenrl.models.bundle",
    "digenrl.trainer",
)
#: Variables the elastic agent sets for each worker (local_elastic_agent.py): they win over the test's.
AGENT_VARS = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "GROUP_RANK",
        "ROLE_RANK",
        "ROLE_NAME",
        "LOCAL_WORLD_SIZE",
        "WORLD_SIZE",
        "GROUP_WORLD_SIZE",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    }
)
#: The agent installs handlers for these in the calling (pytest's) main thread; they are put back after.
AGENT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)

_server_lock = threading.Lock()
_server_started = False


def _is_agent_var(name: str) -> bool:
    return name in AGENT_VARS or name.startswith(("TORCHELASTIC_", "TORCH_NCCL_"))


def worker_main(argv: list[str], env: dict[str, str]) -> None:
    """One rank: the test's environment (the fork server's is whatever it started with) plus the agent's
    per-worker variables, then ``run_train.py``'s entry point; a non-zero exit code leaves the process."""
    agent = {name: value for name, value in os.environ.items() if _is_agent_var(name)}
    os.environ.clear()
    os.environ.update({name: value for name, value in env.items() if not _is_agent_var(name)})
    os.environ.update(agent)
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # as in the server (module docstring)
    os.chdir(REPO)
    from digenrl.launch import main

    code = main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    if code:
        sys.exit(code)


def ensure_fork_server(env: dict[str, str]) -> None:
    """Start the session's fork server once, with the preload list and the base test environment (so the
    preloaded torch sees ``OMP_NUM_THREADS=1``, no GPU and no fault-injection variable a test set then).
    The gloo tests' workers fork from it too (tests/runtime/spawn.py)."""
    global _server_started
    with _server_lock:
        if _server_started:
            return
        multiprocessing.set_forkserver_preload(list(PRELOAD))
        base = {name: value for name, value in env.items() if not name.startswith("DIGENRL_INJECT")}
        base["CUDA_VISIBLE_DEVICES"] = ""
        saved = dict(os.environ)
        try:
            os.environ.clear()
            os.environ.update(base)
            multiprocessing.forkserver.ensure_running()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        _server_started = True


def ready_fork_server(env: dict[str, str]) -> None:
    """:func:`ensure_fork_server`, then wait until the server has imported the preload list (its first fork
    waits for that): a test that times a run from its first fork (a hang timeout) then starts its clock after
    those imports, however loaded the machine and whichever test ran first."""
    ensure_fork_server(env)
    process = multiprocessing.get_context("forkserver").Process(target=os.getpid)
    process.start()
    process.join()


@contextlib.contextmanager
def _signal_handlers_restored() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():  # the agent installs none there
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in AGENT_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _single_main(argv: list[str], env: dict[str, str], stdout: str, stderr: str) -> None:
    """The forked single process: its own session (a timeout kills whatever it started, e.g. the torchrun
    that ``run_train.py`` starts for a multi-rank profile), output to files, then :func:`worker_main`."""
    os.setsid()
    for fd, path in ((1, stdout), (2, stderr)):
        with open(path, "w") as file:
            os.dup2(file.fileno(), fd)
    worker_main(argv, env)


def run_preloaded_single(
    argv: list[str], env: dict[str, str], timeout_s: float
) -> subprocess.CompletedProcess:
    """``python run_train.py argv`` as one process forked from the preloaded server."""
    ensure_fork_server(env)
    cmd = ["forkserver", "run_train.py", *argv]
    with tempfile.TemporaryDirectory(prefix="preloaded_single_") as tmp:
        out, err = Path(tmp, "stdout.log"), Path(tmp, "stderr.log")
        process = multiprocessing.get_context("forkserver").Process(
            target=_single_main, args=(argv, env, str(out), str(err))
        )
        process.start()
        process.join(timeout_s)
        hung = process.exitcode is None
        if hung:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.join()
        stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
    if hung:
        raise hung_run(cmd, timeout_s, stdout, stderr)
    return subprocess.CompletedProcess(cmd, process.exitcode, stdout, stderr)


def _read_logs(log_dir: Path, nproc: int, stream: str) -> str:
    parts = []
    for rank in range(nproc):
        for path in sorted(log_dir.glob(f"*/attempt_*/{rank}/{stream}.log")):
            parts.append(path.read_text(errors="replace"))
    return "".join(parts)


def run_preloaded(
    argv: list[str], nproc: int, env: dict[str, str], timeout_s: float, log_dir: Path | None = None
) -> subprocess.CompletedProcess:
    """Run ``run_train.py argv`` on ``nproc`` forked ranks to the end. A run still going after
    ``timeout_s`` has its workers killed and fails the test as hung, with what they printed. The ranks'
    output goes to files under ``log_dir`` (``*/attempt_0/<rank>/stderr.log``; a temporary folder when
    None), which a test can read while the run goes on (:func:`worker_log_lines`)."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    ensure_fork_server(env)
    cmd = ["elastic_launch(forkserver)", f"--nproc_per_node={nproc}", "run_train.py", *argv]
    with contextlib.ExitStack() as stack:
        if log_dir is None:
            log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="preloaded_launch_")))
        config = LaunchConfig(
            min_nodes=1,
            max_nodes=1,
            nproc_per_node=nproc,
            run_id=uuid.uuid4().hex,
            rdzv_backend="c10d",
            rdzv_endpoint="localhost:0",
            max_restarts=0,
            monitor_interval=0.05,
            start_method="forkserver",
            logs_specs=DefaultLogsSpecs(log_dir=str(log_dir), redirects=Std.ALL, tee=Std.NONE),
        )
        hung = threading.Event()

        def kill_workers() -> None:
            hung.set()
            for child in multiprocessing.active_children():  # this run's workers
                child.kill()

        timer = threading.Timer(timeout_s, kill_workers)
        timer.start()
        returncode, failure = 0, ""
        try:
            with _signal_handlers_restored():
                elastic_launch(config, worker_main)(argv, env)
        except ChildFailedError as exc:
            returncode, failure = 1, exc.format_msg()
        finally:
            timer.cancel()
        stdout = _read_logs(log_dir, nproc, "stdout")
        stderr = _read_logs(log_dir, nproc, "stderr") + failure
    if hung.is_set():
        raise hung_run(cmd, timeout_s, stdout, stderr)
    return subprocess.CompletedProcess(cmd, returncode, stdout, stderr)


def worker_log_lines(
    log_dir: Path, stream: str, lines: list[tuple[float, str]], stop: threading.Event
) -> None:
    """Until ``stop`` is set (then once more), append every new complete line the ranks of a
    :func:`run_preloaded` run wrote to ``stream`` under ``log_dir`` to ``lines``, as ``(unix time read,
    line)``, polling every 50 ms: what reading a subprocess's pipe line by line gives."""
    read: dict[Path, int] = {}
    while True:
        last = stop.is_set()
        for path in sorted(log_dir.glob(f"*/attempt_*/*/{stream}.log")):
            with path.open("rb") as file:
                file.seek(read.get(path, 0))
                data = file.read()
            end = data.rfind(b"\n") + 1
            if end:
                read[path] = read.get(path, 0) + end
                now = time.time()
                text = data[:end].decode(errors="replace")
                lines.extend((now, line) for line in text.splitlines(keepends=True))
        if last:
            return
        time.sleep(0.05)
