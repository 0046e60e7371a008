"""A hung rank is named by every other rank — rank, role and phase — well before gloo's own timeout, and a
normally finishing run raises no false alarm (torch's elastic agent with ranks forked from the preloaded
server, tests/systems/preloaded_launch.py; tiny model, gloo; digenrl/runtime/faults/watchdog.py)."""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import threading
import time

import pytest

from digenrl.runtime.faults.watchdog import PHASE_BEAT_GAP_S, heartbeat_timing
from tests.systems.launcher import TINY, run_train, train_env
from tests.systems.preloaded_launch import run_preloaded, worker_log_lines

TIMEOUT_S = 15  # runtime.timeout_s: gloo's collective timeout, and the watchdog's threshold is a third
#: The stopped rank stays this long in its phase before it SIGSTOPs itself: a span change is published
#: within PHASE_BEAT_GAP_S, well before the next periodic heartbeat.
STOP_AFTER_S = 3 * PHASE_BEAT_GAP_S


@pytest.mark.parametrize(
    ("overrides", "nproc", "hung", "iteration", "phase", "role", "survivors", "timeout_s"),
    [
        # rank 0 then waits inside a gloo collective (C++): only the watchdog thread can end it
        (["system=colocated-sync", "profile=cpu-2"], 2, 1, 1, "train", "colocated", [0], TIMEOUT_S),
        # 1 trainer + 2 generators: the trainer and the other generator both name the stopped generator
        (
            ["profile=cpu-4", "pools.trainers=1", "pools.generators=2", "tag=false"],
            3,
            2,
            1,
            "generate",
            "generator",
            [0, 1],
            TIMEOUT_S,
        ),
        # the trainer of the default digenrl run, stopped after 3 iterations: with a 2 s heartbeat period it
        # was named "(unassigned)", last phase 'setup' (its role and phase waited for the next period)
        (["profile=cpu-2"], 2, 0, 3, "train", "trainer", [1], 30),
    ],
)
def test_a_stopped_rank_is_named_by_every_survivor(
    tmp_path, overrides, nproc, hung, iteration, phase, role, survivors, timeout_s
):
    _, threshold = heartbeat_timing(timeout_s)
    env = train_env()
    # The hung rank stays in the phase briefly (a heartbeat carries the phase change), then SIGSTOPs itself.
    env["DIGENRL_INJECT_FAULT"] = (
        f"rank={hung},iteration={iteration},kind=stop,phase={phase},seconds={STOP_AFTER_S}"
    )
    argv = ["--config", str(TINY), *overrides, f"iterations={iteration + 1}"]
    argv += [f"runtime.timeout_s={timeout_s}", f"out_dir={tmp_path / 'run'}"]
    log_dir = tmp_path / "logs"
    lines: list[tuple[float, str]] = []  # (unix time read, line) of the ranks' stderr
    job: dict = {}

    def launch() -> None:  # the ranks fork from the preloaded server (tests/systems/preloaded_launch.py)
        try:
            job["proc"] = run_preloaded(argv, nproc, env, timeout_s=240, log_dir=log_dir)
        except BaseException as error:  # a hung run: reported below
            job["error"] = error

    launcher = threading.Thread(target=launch)
    done = threading.Event()
    reader = threading.Thread(target=worker_log_lines, args=(log_dir, "stderr", lines, done))
    launcher.start()
    reader.start()
    stop = None
    try:
        stop = _wait_for_line(
            lines, rf"^\[rank {hung}\] injected stop: SIGSTOP of pid (\d+) .* unix time ([0-9.]+)", 180
        )
        failed = {
            rank: _wait_for_line(lines, rf"^\[rank {rank}\] FAILED: .*$", 4 * threshold) for rank in survivors
        }
        if stop is not None:
            # the agent SIGKILLs a stopped worker 30 s after its SIGTERM (a grace the failure path does not
            # shorten); end it now, and the job ends by itself with the survivors' exit status.
            os.kill(int(stop[1].group(1)), signal.SIGKILL)
        launcher.join(60)
    finally:
        if stop is None or launcher.is_alive():  # what this test started, left behind by a failure
            for child in multiprocessing.active_children():
                child.kill()
            launcher.join()
        done.set()
        reader.join(60)
    assert "error" not in job, job.get("error")
    code = job["proc"].returncode
    text = "".join(line for _, line in lines)
    assert stop is not None, text[-4000:]
    stopped_at = float(stop[1].group(2))
    for rank in survivors:
        assert failed[rank] is not None, (rank, text[-4000:])
        seen_at, match = failed[rank]
        line = match.group(0)
        assert seen_at - stopped_at < 2 * threshold, (rank, seen_at - stopped_at, threshold)
        # blocked in a collective, the rank's watchdog says it; polling the store, the wait raises with the
        # report the first watchdog published — either way the line names the hung rank, role and phase
        assert line.startswith(f"[rank {rank}] FAILED: "), line
        assert f"rank {hung} ({role})" in line and "no heartbeat for" in line, line
        assert f"last phase '{phase}' (iteration {iteration})" in line, line
        assert len(re.findall(rf"^\[rank {rank}\] FAILED", text, flags=re.MULTILINE)) == 1  # once per rank
    assert "Timed out waiting" not in text  # gloo's anonymous timeout never fired
    assert code != 0


def _wait_for_line(
    lines: list[tuple[float, str]], pattern: str, seconds: float
) -> tuple[float, re.Match] | None:
    """The first ``(time read, match)`` of ``pattern`` in the lines read so far; waits up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        for seen_at, line in list(lines):
            match = re.match(pattern, line.rstrip("\n"))
            if match:
                return seen_at, match
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def test_the_last_rank_to_finish_sees_no_dead_peers(tmp_path, monkeypatch):
    """Rank 1 finishes and exits while rank 0 still works for longer than the threshold: rank 1 marked its
    heartbeat done before leaving, so rank 0's watchdog stays quiet."""
    timeout_s = 10  # the floor (MIN_TIMEOUT_S)
    _, threshold = heartbeat_timing(timeout_s)
    monkeypatch.setenv("DIGENRL_INJECT_DELAY", f"rank=0,phase=exit,seconds={2.5 * threshold}")
    proc = run_train(
        [
            "system=colocated-sync",
            "profile=cpu-2",
            "iterations=2",
            f"runtime.timeout_s={timeout_s}",
            f"out_dir={tmp_path}",
        ],
        nproc=2,
        timeout_s=240,
    )
    assert "watchdog" not in proc.stderr and "FAILED" not in proc.stderr
