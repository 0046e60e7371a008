"""A reward server process for tests: ``python -m digenrl.rewards.serve --reward NAME --port P``."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator

from tests.systems.launcher import REPO, train_env


def free_port() -> int:
    """A loopback port free now (the server binds it a moment later)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def thread_server(reward, limits=None) -> Iterator[str]:
    """The server of ``python -m digenrl.rewards.serve`` on a thread of this process, scoring ``reward``
    (``limits``: its :class:`~digenrl.rewards.serve.ServeLimits`, default the command's)."""
    from digenrl.rewards.serve import make_server

    server = make_server(reward, "127.0.0.1", 0, limits)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def reward_server(reward: str, *extra: str, start_timeout_s: float = 120.0) -> Iterator[str]:
    """Run the server, yield the URL it prints once listening, then stop it with SIGTERM and check that it
    shut down cleanly. Its log goes to a temporary file (a long-running server never blocks on a pipe) and
    into the failure message."""
    with tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "digenrl.rewards.serve",
                "--reward",
                reward,
                "--port",
                str(free_port()),
                *extra,
            ],
            cwd=REPO,
            env=train_env(),
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(start_timeout_s)
        try:
            if not lines or not lines[0].startswith("serving "):
                raise AssertionError(f"the reward server did not start within {start_timeout_s} s")
            yield lines[0].split(" on ")[1].strip()
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdout.close()
            log.seek(0)
            output = log.read()
        assert proc.returncode == 0, f"the reward server exited {proc.returncode}:\n{output}"
