"""Serve a local reward over HTTP for ``reward.name=remote`` (wire format: digenrl/rewards/remote.py,
docs/rewards.md "Remote reward")::

    python -m digenrl.rewards.serve --reward pickscore --weights-path /models/pickscore --port 8000
    python -m digenrl.rewards.serve --reward brightness --port 8000 --host 0.0.0.0 --token-file /secrets/t

Once listening it prints one line, ``serving REWARD on http://HOST:PORT``, and answers ``POST /score`` (a
batch) and ``GET /health``. It is meant to be exposed as a service, so every resource a client can tie up
is bounded (:class:`ServeLimits`, each a command-line flag):

* **body size**: a ``Content-Length`` above ``--max-body-mb`` is answered 413 before a byte of the body is
  read (a body without a length, 411); memory is bounded by ``workers × max body``;
* **time**: a connection must deliver its whole request within ``--read-timeout-s`` (a deadline for the
  request, not per read: a client sending a byte at a time is cut off too), else it is closed;
* **threads**: ``--workers`` connections are served at once by a fixed pool; one more is answered 503
  (``Retry-After: 1``) by the accepting thread and closed, so stalled connections never grow the server;
* **authentication**: with ``--token-file``, ``POST /score`` needs ``Authorization: Bearer <token>`` (401
  otherwise, compared in constant time); the token and request headers are never logged.

Scoring is one GPU job at a time, batched across connections: requests waiting while a batch is scored
are scored together next (up to ``--max-batch`` samples of one image size; a batch that fails is scored
request by request, so one bad request fails only itself). A malformed request gets HTTP 400 saying what
is wrong; a reward that fails gets 500 with its error. ``--port`` (1-65535, free) and ``--device`` (a
device this machine has) are checked before the reward is built. SIGTERM or Ctrl-C stops it.
"""

from __future__ import annotations

import argparse
import contextlib
import hmac
import json
import logging
import math
import queue
import signal
import socket
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import torch

from digenrl.dependency_logs import quiet_dependency_logs
from digenrl.rewards.base import RewardFunction
from digenrl.rewards.registry import REMOTE, available_rewards, build_reward
from digenrl.rewards.remote import HEALTH_PATH, SCORE_PATH, decode_images

log = logging.getLogger(__name__)

_MIB = 1 << 20


@dataclass(frozen=True)
class ServeLimits:
    """What one client can hold of the server (module docstring)."""

    max_body_bytes: int = 16 * _MIB  # a batch of 8 512x512 images is ~8 MiB on the wire
    read_timeout_s: float = 30.0
    workers: int = 8
    max_batch: int = 64
    token: str | None = None


def parse_request(body: bytes) -> tuple[torch.Tensor, list[str], list[dict[str, Any]]]:
    """A ``/score`` body as (images, prompts, metadata); ``ValueError`` naming the bad field."""
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"the body is not JSON ({exc})") from None
    if not isinstance(payload, dict):
        raise ValueError("the body must be a JSON object")
    images = decode_images(payload.get("images"))
    prompts = payload.get("prompts")
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise ValueError('"prompts" must be a list of strings')
    metadata = payload.get("metadata") or [{} for _ in prompts]
    if not isinstance(metadata, list) or not all(isinstance(m, dict) for m in metadata):
        raise ValueError('"metadata" must be a list of objects')
    if not len(prompts) == len(metadata) == images.shape[0]:
        raise ValueError(
            f"{images.shape[0]} images, {len(prompts)} prompts and {len(metadata)} metadata: give one each "
            "per sample"
        )
    return images, prompts, metadata


@dataclass
class _Request:
    images: torch.Tensor
    prompts: list[str]
    metadata: list[dict[str, Any]]
    result: Future


class Batcher:
    """One scoring thread: takes every request waiting (up to ``max_batch`` samples of the first one's
    image size), scores them in one call of the reward and hands each its scores. ``batches`` and
    ``requests`` count what it did (``GET /health`` shows them)."""

    def __init__(self, reward: RewardFunction, max_batch: int) -> None:
        self.reward = reward
        self.max_batch = max_batch
        self.batches = 0
        self.requests = 0
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._held: list[_Request] = []  # taken from the queue, of another image size: first next time
        self._thread = threading.Thread(target=self._run, name="digenrl-reward-batcher", daemon=True)
        self._thread.start()

    def score(self, images: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> list[float]:
        request = _Request(images, prompts, metadata, Future())
        self._queue.put(request)
        return request.result.result()

    def stop(self) -> None:
        self._queue.put(None)

    def _next(self, block: bool) -> _Request | None:
        if self._held:
            return self._held.pop(0)
        return self._queue.get() if block else self._queue.get_nowait()

    def _run(self) -> None:
        while True:
            first = self._next(block=True)
            if first is None:
                return
            batch, size = [first], len(first.prompts)
            while size < self.max_batch:
                try:
                    more = self._next(block=False)
                except queue.Empty:
                    break
                if more is None:
                    self._queue.put(None)  # stop after this batch
                    break
                if (
                    more.images.shape[1:] != first.images.shape[1:]
                    or size + len(more.prompts) > self.max_batch
                ):
                    self._held.append(more)
                    break
                batch.append(more)
                size += len(more.prompts)
            self._score(batch)

    def _score(self, batch: list[_Request]) -> None:
        self.batches += 1
        self.requests += len(batch)
        try:
            scores = self.reward(
                torch.cat([r.images for r in batch]).to(self.reward.device),
                [p for r in batch for p in r.prompts],
                [m for r in batch for m in r.metadata],
            ).tolist()
        except Exception as exc:
            if len(batch) > 1:  # score alone: only the request that fails gets the error
                for request in batch:
                    self._score([request])
                return
            log.exception("scoring failed")
            batch[0].result.set_exception(exc)
            return
        start = 0
        for request in batch:
            request.result.set_result(scores[start : start + len(request.prompts)])
            start += len(request.prompts)


class _Deadlines:
    """Connections that must finish sending their request by a deadline; one thread closes the late ones
    (``shutdown`` wakes the handler's blocked read), so a deadline costs no thread of its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._due: dict[socket.socket, float] = {}
        self._stopped = threading.Event()
        threading.Thread(target=self._run, name="digenrl-reward-deadlines", daemon=True).start()

    def add(self, conn: socket.socket, seconds: float) -> None:
        with self._lock:
            self._due[conn] = time.monotonic() + seconds

    def remove(self, conn: socket.socket) -> None:
        with self._lock:
            self._due.pop(conn, None)

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.wait(0.05):
            now = time.monotonic()
            with self._lock:
                late = [conn for conn, due in self._due.items() if due <= now]
                for conn in late:
                    del self._due[conn]
            for conn in late:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)


_BUSY_BODY = json.dumps({"error": "the reward server is busy; retry in a second"}).encode()
_BUSY = (
    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(_BUSY_BODY)
) + _BUSY_BODY


class RewardServer(HTTPServer):
    """An HTTP server with a fixed pool of ``limits.workers`` connection threads and a batching scorer."""

    request_queue_size = 128  # the listen backlog: a burst is accepted (and answered 503) at once

    def __init__(self, address: tuple[str, int], reward: RewardFunction, limits: ServeLimits) -> None:
        self.reward = reward
        self.limits = limits
        self.batcher = Batcher(reward, limits.max_batch)
        self.deadlines = _Deadlines()
        self._slots = threading.BoundedSemaphore(limits.workers)
        self._pool = ThreadPoolExecutor(limits.workers, thread_name_prefix="digenrl-reward-conn")
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):  # every worker busy: say so at once, hold nothing
            with contextlib.suppress(OSError):
                request.settimeout(1.0)
                request.sendall(_BUSY)
            self.shutdown_request(request)
            return
        self._pool.submit(self._serve, request, client_address)

    def _serve(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            log.debug("connection from %s failed", client_address[0], exc_info=True)
        finally:
            self.deadlines.remove(request)
            self.shutdown_request(request)
            self._slots.release()

    def server_close(self) -> None:
        super().server_close()
        self.deadlines.stop()
        self.batcher.stop()
        self._pool.shutdown(wait=False, cancel_futures=True)


class _Handler(BaseHTTPRequestHandler):
    server: RewardServer

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.limits.read_timeout_s)
        self.server.deadlines.add(self.connection, self.server.limits.read_timeout_s)

    def _answer(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        self.server.deadlines.remove(self.connection)  # the answer is ours to send, whatever the time
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path != HEALTH_PATH:
            self._answer(404, {"error": f"unknown path; use GET {HEALTH_PATH} or POST {SCORE_PATH}"})
            return
        batcher = self.server.batcher
        self._answer(
            200,
            {
                "status": "ok",
                "reward": self.server.reward.name,
                "batches": batcher.batches,
                "requests": batcher.requests,
            },
        )

    def _authorized(self) -> bool:
        token = self.server.limits.token
        if token is None:
            return True
        given = self.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())

    def do_POST(self) -> None:
        if self.path != SCORE_PATH:
            self._answer(404, {"error": f"unknown path; POST batches to {SCORE_PATH}"})
            return
        if not self._authorized():
            self._answer(
                401,
                {"error": "missing or wrong bearer token (Authorization: Bearer <token>; reward.token_file)"},
                {"WWW-Authenticate": "Bearer"},
            )
            return
        limit = self.server.limits.max_body_bytes
        length_text = self.headers.get("Content-Length")
        if length_text is None or not length_text.strip().isdigit():
            self._answer(411, {"error": "a request body needs a Content-Length header"})
            return
        length = int(length_text)
        if length > limit:
            self._answer(
                413,
                {
                    "error": f"the body is {length} bytes, above this server's limit of {limit} "
                    "(--max-body-mb)"
                },
            )
            return
        try:
            body = self.rfile.read(length)
            if len(body) != length:
                return  # the client went away, or its deadline closed the connection: nobody to answer
            images, prompts, metadata = parse_request(body)
        except (OSError, TimeoutError):
            return
        except ValueError as exc:
            self._answer(400, {"error": str(exc)})
            return
        self.server.deadlines.remove(self.connection)
        try:
            scores = self.server.batcher.score(images, prompts, metadata)
        except Exception as exc:
            self._answer(500, {"error": f"{type(exc).__name__}: {exc}"})
            return
        self._answer(
            200,
            {"scores": [s if math.isfinite(s) else None for s in scores], "reward": self.server.reward.name},
        )

    def log_message(self, format: str, *args: Any) -> None:
        # the request line only (method, path, status): never headers, where the token travels
        log.debug("%s - %s", self.address_string(), format % args)


def make_server(
    reward: RewardFunction, host: str, port: int, limits: ServeLimits | None = None
) -> RewardServer:
    """An HTTP server scoring with ``reward`` (not started: call ``serve_forever``)."""
    return RewardServer((host, port), reward, limits or ServeLimits())


def check_port(port: int) -> None:
    """``--port`` is a port number clients can be told (1-65535)."""
    if not 1 <= port <= 65535:
        raise ValueError(
            f"--port {port}: give a TCP port in 1-65535 (the port clients put in reward.url=http://HOST:PORT)"
        )


def check_device(device: str) -> None:
    """``--device`` names a device this machine has (a GPU index below the GPU count)."""
    try:
        parsed = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"--device {device!r} is not a torch device ({exc}); e.g. cpu or cuda:0") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = parsed.index if parsed.index is not None else 0
        if index >= count:
            raise ValueError(
                f"--device {device!r}: this machine has {count} CUDA device(s)"
                + (f" (cuda:0 … cuda:{count - 1})" if count else "; use --device cpu")
            )
    elif parsed.type != "cpu":
        raise ValueError(f"--device {device!r}: the reward server runs on cpu or cuda:<i>")


def read_token(path: str) -> str:
    """The bearer token in ``path``: one line of printable text, at least 16 characters; a ValueError
    naming the file (never its content) otherwise."""
    file = Path(path)
    try:
        token = file.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"token file {path!r} cannot be read ({type(exc).__name__})") from None
    if len(token) < 16 or not token.isprintable() or any(c.isspace() for c in token):
        raise ValueError(
            f"token file {path!r} must hold one token of at least 16 printable characters without spaces "
            "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))' > FILE)"
        )
    return token


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m digenrl.rewards.serve", description=__doc__.split("\n\n")[0])
    names = [n for n in available_rewards() if n != REMOTE]
    p.add_argument(
        "--reward", required=True, choices=names, metavar="NAME", help=f"one of: {', '.join(names)}"
    )
    p.add_argument("--port", type=int, required=True, help="TCP port, 1-65535")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--weights-path", default=None, help="local weights directory (reward.weights_path)")
    p.add_argument("--device", default="cpu", help="torch device of the reward, e.g. cuda:0")
    d = ServeLimits()
    p.add_argument("--token-file", default=None, help="file holding the bearer token clients must send")
    p.add_argument("--max-body-mb", type=float, default=d.max_body_bytes / _MIB, help="largest request body")
    p.add_argument("--read-timeout-s", type=float, default=d.read_timeout_s, help="time to send one request")
    p.add_argument("--workers", type=int, default=d.workers, help="connections served at once (more: 503)")
    p.add_argument("--max-batch", type=int, default=d.max_batch, help="samples scored in one reward call")
    return p.parse_args(argv)


def limits_from_args(args: argparse.Namespace) -> ServeLimits:
    """The :class:`ServeLimits` of the command line; a ValueError naming the flag when one is out of range."""
    for flag, value, low in (
        ("--max-body-mb", args.max_body_mb, 0.0),
        ("--read-timeout-s", args.read_timeout_s, 0.0),
        ("--workers", args.workers, 0),
        ("--max-batch", args.max_batch, 0),
    ):
        if not (math.isfinite(value) and value > low):
            raise ValueError(f"{flag} {value}: must be > {low:g}")
    return ServeLimits(
        max_body_bytes=int(args.max_body_mb * _MIB),
        read_timeout_s=args.read_timeout_s,
        workers=args.workers,
        max_batch=args.max_batch,
        token=read_token(args.token_file) if args.token_file else None,
    )


def main(argv: list[str] | None = None) -> int:
    quiet_dependency_logs()
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        check_port(args.port)
        check_device(args.device)
        limits = limits_from_args(args)
        reward = build_reward(args.reward, weights_path=args.weights_path, device=args.device)
        server = make_server(reward, args.host, args.port, limits)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the port is taken, or the address is not this machine's
        print(
            f"error: cannot listen on {args.host}:{args.port} ({exc.strerror or exc}); choose another --port "
            "or --host",
            file=sys.stderr,
        )
        return 2
    host, port = server.server_address[:2]
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    print(f"serving {reward.name} on http://{host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
