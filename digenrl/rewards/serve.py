"""Serve a local reward over HTTP for ``reward.name=remote`` (wire format: digenrl/rewards/remote.py,
docs/rewards.md "Remote reward")::

    python -m digenrl.rewards.serve --reward pickscore --weights-path /models/pickscore --port 8000
    python -m digenrl.rewards.serve --reward tiny-clipscore --port 0      # any free port

Once listening it prints one line, ``serving REWARD on http://HOST:PORT`` (with the port it got), and
answers ``POST /score`` (a batch) and ``GET /health``. Requests are served one at a time against the one
reward (a lock around scoring; the HTTP threads only parse and encode). A malformed request gets HTTP 400
saying what is wrong; a reward that fails gets HTTP 500 with its error. SIGTERM or Ctrl-C stops it.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from digenrl.rewards.base import RewardFunction
from digenrl.rewards.registry import REMOTE, available_rewards, build_reward
from digenrl.rewards.remote import HEALTH_PATH, SCORE_PATH, decode_images

log = logging.getLogger(__name__)


def parse_request(body: bytes) -> tuple[torch.Tensor, list[str], list[dict[str, Any]]]:
    """A ``/score`` body as (images, prompts, metadata); ``ValueError`` naming the bad field."""
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ValueError(f"the body is not JSON ({exc.msg})") from None
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


def make_server(reward: RewardFunction, host: str, port: int) -> ThreadingHTTPServer:
    """An HTTP server scoring with ``reward`` (not started: call ``serve_forever``)."""
    lock = threading.Lock()
    device = reward.device

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path != HEALTH_PATH:
                self._answer(
                    404, {"error": f"unknown path {self.path}; use GET {HEALTH_PATH} or POST {SCORE_PATH}"}
                )
                return
            self._answer(200, {"status": "ok", "reward": reward.name})

        def do_POST(self) -> None:
            if self.path != SCORE_PATH:
                self._answer(404, {"error": f"unknown path {self.path}; POST batches to {SCORE_PATH}"})
                return
            try:
                length = int(self.headers.get("Content-Length", "0"))
                images, prompts, metadata = parse_request(self.rfile.read(length))
            except ValueError as exc:
                self._answer(400, {"error": str(exc)})
                return
            try:
                with lock:
                    scores = reward(images.to(device), prompts, metadata).tolist()
            except Exception as exc:  # the client gets the reward's error; the server keeps serving
                log.exception("scoring failed")
                self._answer(500, {"error": f"{type(exc).__name__}: {exc}"})
                return
            self._answer(
                200, {"scores": [s if math.isfinite(s) else None for s in scores], "reward": reward.name}
            )

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s - %s", self.address_string(), format % args)

    return ThreadingHTTPServer((host, port), Handler)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m digenrl.rewards.serve", description=__doc__.split("\n\n")[0])
    names = [n for n in available_rewards() if n != REMOTE]
    p.add_argument(
        "--reward", required=True, choices=names, metavar="NAME", help=f"one of: {', '.join(names)}"
    )
    p.add_argument(
        "--port", type=int, required=True, help="TCP port (0: any free port, printed when listening)"
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--weights-path", default=None, help="local weights directory (reward.weights_path)")
    p.add_argument("--device", default="cpu", help="torch device of the reward, e.g. cuda:0")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        reward = build_reward(args.reward, weights_path=args.weights_path, device=args.device)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    server = make_server(reward, args.host, args.port)
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
