"""The remote reward: score batches on a reward server over HTTP (``reward.name=remote``).

A reward model can run as a service of its own (another machine, its own GPUs, a model this project does
not ship), as FlowGRPO's remote rewards do (flow_grpo/rewards.py ``deqa_score_remote``,
``unifiedreward_score_remote``: post image batches to a server, read the scores back).
``python -m digenrl.rewards.serve --reward NAME --port P`` serves any registered reward this way
(:mod:`digenrl.rewards.serve`); any server speaking the same JSON does too. Wire format
(docs/rewards.md, "Remote reward"):

* ``POST <url>/score`` with a JSON body ``{"prompts": [str], "metadata": [object], "images": {"encoding":
  "uint8", "shape": [N, 3, H, W], "data": base64}}``: the images (video frames flattened) as 8-bit RGB, in
  C order, ``round(255 · x)`` of the ``[0, 1]`` pixels (what any PNG or JPEG of them would hold);
* answer ``200`` with ``{"scores": [number | null]}`` (``null``: not finite), or an error status with
  ``{"error": str}``.

Each batch is one request. Connection errors, timeouts and 5xx answers (a 503: the server is busy) are
retried (``reward.retries`` more attempts, 0.5 s apart, doubling); the whole batch, retries included, must
finish within ``reward.timeout_s``, a true deadline: a timer closes the connection when it passes, so a
server that answers a byte at a time cannot hold the client longer (a socket timeout alone bounds each
read, not the request). Then :class:`RemoteRewardError` names the URL and the last error. A 4xx answer (a
request the server cannot score) is not retried. With ``reward.token_file`` every request carries
``Authorization: Bearer <token>`` (``serve --token-file``); credentials never appear in a message, and a
URL with a user or password in it is refused (it would be echoed in logs). Environment proxies are
bypassed: a reward server is an internal service.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import socket
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import torch
from torch import Tensor

from digenrl.rewards.base import PromptMetadata, RewardFunction
from digenrl.rewards.registry import REMOTE, register_reward

SCORE_PATH = "/score"
HEALTH_PATH = "/health"
FIRST_BACKOFF_S = 0.5


class RemoteRewardError(RuntimeError):
    """A reward server did not score a batch (unreachable, too slow, or it answered with an error)."""


def encode_images(images: Tensor) -> dict[str, Any]:
    """``[N, 3, H, W]`` images in ``[0, 1]`` as the wire format's ``images`` object (8-bit, base64)."""
    pixels = (images.detach().clamp(0.0, 1.0) * 255.0).round().to(torch.uint8).cpu().contiguous()
    return {
        "encoding": "uint8",
        "shape": list(pixels.shape),
        "data": base64.b64encode(pixels.numpy().tobytes()).decode("ascii"),
    }


def decode_images(payload: Any) -> Tensor:
    """The wire format's ``images`` object as float32 ``[N, 3, H, W]`` in ``[0, 1]``; ``ValueError`` saying
    what is wrong otherwise."""
    if not isinstance(payload, dict) or payload.get("encoding") != "uint8":
        raise ValueError('"images" must be an object with "encoding": "uint8", "shape" and "data"')
    shape = payload.get("shape")
    if not (
        isinstance(shape, list) and len(shape) == 4 and all(isinstance(d, int) and d >= 0 for d in shape)
    ):
        raise ValueError(f'"images.shape" must be [N, 3, H, W], got {shape!r}')
    if shape[1] != 3:
        raise ValueError(f'"images.shape" must have 3 channels, got {shape!r}')
    try:
        raw = base64.b64decode(payload.get("data", ""), validate=True)
    except (ValueError, TypeError) as exc:
        raise ValueError(f'"images.data" is not base64 ({exc})') from None
    expected = shape[0] * shape[1] * shape[2] * shape[3]
    if len(raw) != expected:
        raise ValueError(f'"images.data" holds {len(raw)} bytes, shape {shape} needs {expected}')
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(*shape).float() / 255.0


#: The largest answer read back (a server's scores for a batch are a few KiB).
MAX_ANSWER_BYTES = 16 << 20


def post_json(
    url: str, payload: dict[str, Any], *, timeout_s: float, retries: int, token: str | None = None
) -> dict[str, Any]:
    """POST ``payload`` to ``url`` and return the JSON answer, with the retry and deadline rules of the
    module docstring; errors name ``url`` (never the token)."""
    body = json.dumps(payload).encode()
    headers = {"Content-Type": "application/json", "Content-Length": str(len(body)), "Connection": "close"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    deadline = time.monotonic() + timeout_s
    backoff, attempts, last_error = FIRST_BACKOFF_S, 0, "no attempt was made"
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        attempts += 1
        try:
            status, answer = _post_once(url, body, headers, deadline)
            if status < 400:
                return json.loads(answer)
            detail = _error_detail(answer, status)
            if status < 500:
                raise RemoteRewardError(f"reward server {url} refused the batch (HTTP {status}): {detail}")
            last_error = f"HTTP {status}: {detail}"
        except (OSError, http.client.HTTPException, ValueError) as exc:
            late = time.monotonic() >= deadline
            last_error = "the deadline passed mid-request" if late else f"{type(exc).__name__}: {exc}"
        if attempts > retries:
            break
        time.sleep(max(0.0, min(backoff, deadline - time.monotonic())))
        backoff *= 2
    raise RemoteRewardError(
        f"reward server {url} did not score the batch within reward.timeout_s={timeout_s:g} s "
        f"({attempts} attempt(s), reward.retries={retries}; last error: {last_error})"
    )


def _post_once(url: str, body: bytes, headers: dict[str, str], deadline: float) -> tuple[int, bytes]:
    """One POST, cut off at ``deadline`` (monotonic): (status, answer body)."""
    parts = urlsplit(url)
    connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    remaining = max(deadline - time.monotonic(), 1e-3)
    conn = connection_class(parts.hostname, parts.port, timeout=remaining)

    def cut_off() -> None:  # wakes a read blocked on a server that trickles bytes
        if conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(remaining, cut_off)
    timer.daemon = True
    timer.start()
    try:
        conn.request("POST", parts.path or "/", body=body, headers=headers)
        response = conn.getresponse()
        answer = response.read(MAX_ANSWER_BYTES + 1)
        if len(answer) > MAX_ANSWER_BYTES:
            raise ValueError(f"the answer is larger than {MAX_ANSWER_BYTES} bytes")
        if time.monotonic() >= deadline:
            raise TimeoutError("the deadline passed mid-request")
        return response.status, answer
    finally:
        timer.cancel()
        conn.close()


def _error_detail(answer: bytes, status: int) -> str:
    try:
        return str(json.loads(answer).get("error", f"HTTP {status}"))[:500]
    except (ValueError, AttributeError):
        return f"HTTP {status}"


def read_token_file(path: str, key: str = "reward.token_file") -> str:
    """The bearer token in ``path`` (one line); a ValueError naming ``key`` and the file, never its
    content."""
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{key}={path!r} cannot be read ({type(exc).__name__})") from None
    if not token or "\n" in token or not token.isprintable():
        raise ValueError(f"{key}={path!r} must hold the server's token on one line (serve --token-file)")
    return token


def url_credentials_problem(url: str) -> str:
    """Why ``url`` may not be used as a reward server address ("" if it may): a user or password in it
    would be echoed wherever the URL is (errors, logs)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return ""
    if parts.username is not None or parts.password is not None:
        return (
            "holds a user name or password, which would be echoed in logs and errors; give the address "
            "alone (http://HOST:PORT) and the token in reward.token_file"
        )
    return ""


@register_reward(REMOTE)
class RemoteReward(RewardFunction):
    """Scores from a reward server at ``url`` (``http://HOST:PORT``); holds no model of its own."""

    def __init__(
        self,
        url: str | None = None,
        device: torch.device | str = "cpu",
        *,
        timeout_s: float = 60.0,
        retries: int = 2,
        token_file: str | None = None,
    ) -> None:
        super().__init__(device)
        if not url:
            raise ValueError("the remote reward needs reward.url=http://HOST:PORT")
        problem = url_credentials_problem(url)
        if problem:
            raise ValueError(f"reward.url {problem}")
        if not timeout_s > 0:
            raise ValueError(f"reward.timeout_s must be > 0, got {timeout_s!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"reward.retries must be an integer >= 0, got {retries!r}")
        self.url = url.rstrip("/")
        self.timeout_s = float(timeout_s)
        self.retries = retries
        self._token = read_token_file(token_file) if token_file else None

    def score_images(self, images: Tensor, prompts: list[str]) -> Tensor:
        return self.score_batch(images, prompts, [{} for _ in prompts])

    def score_batch(self, images: Tensor, prompts: list[str], metadata: list[PromptMetadata]) -> Tensor:
        payload = {
            "prompts": list(prompts),
            "metadata": [dict(m) for m in metadata],
            "images": encode_images(images),
        }
        url = self.url + SCORE_PATH
        answer = post_json(url, payload, timeout_s=self.timeout_s, retries=self.retries, token=self._token)
        scores = answer.get("scores") if isinstance(answer, dict) else None
        if not isinstance(scores, list) or len(scores) != len(prompts):
            raise RemoteRewardError(
                f"reward server {url} answered without {len(prompts)} scores: {json.dumps(answer)[:200]}"
            )
        if not all(s is None or (isinstance(s, int | float) and not isinstance(s, bool)) for s in scores):
            raise RemoteRewardError(f"reward server {url} answered non-numeric scores: {scores[:8]}")
        values = [float("nan") if s is None else float(s) for s in scores]
        return torch.tensor(values, dtype=torch.float32, device=images.device)

    def __repr__(self) -> str:
        return f"RemoteReward(url={self.url!r}, timeout_s={self.timeout_s:g}, retries={self.retries})"
