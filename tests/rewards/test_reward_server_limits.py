"""The reward server as a service people can expose (issue 35, item 2; digenrl/rewards/serve.py and the
client in remote.py): a body limit, a whole-request read deadline, a bounded worker pool answering 503
when full, bearer-token authentication that never logs the token, a client deadline a trickling server
cannot stretch, startup checks of port and device, and batching across connections. Loopback only; each
flood bounded in count and time (a few seconds in all)."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time

import pytest
import torch

from digenrl.rewards import build_reward
from digenrl.rewards.remote import RemoteRewardError, encode_images, post_json
from digenrl.rewards.serve import ServeLimits, check_device, check_port, main
from tests.rewards.reward_server import thread_server

TOKEN = "s3cret-token-0123456789abcdef"


def _raw(url: str, data: bytes, *, read: bool = True, timeout: float = 5.0) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as conn:
        conn.sendall(data)
        if not read:
            return b""
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def _payload(n: int = 2, size: int = 8) -> dict:
    return {"prompts": ["a"] * n, "metadata": [{}] * n, "images": encode_images(torch.rand(n, 3, size, size))}


def test_a_body_above_the_limit_is_refused_before_it_is_read():
    with thread_server(build_reward("brightness"), ServeLimits(max_body_bytes=1 << 20)) as url:
        start = time.monotonic()
        answer = _raw(url, b"POST /score HTTP/1.0\r\nContent-Length: 268435456\r\n\r\n" + b"x" * 1024)
        assert answer.startswith(b"HTTP/1.0 413") and b"above this server's limit of 1048576" in answer
        assert _raw(url, b"POST /score HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 411")
        assert time.monotonic() - start < 2.0


#: connections that send part of a request and stall (issue 35: 500 held 301 threads before the pool)
STALLED = 500


def test_stalled_connections_hold_a_bounded_pool_get_503_beyond_it_and_are_cut_off():
    limits = ServeLimits(workers=3, read_timeout_s=0.5)
    with thread_server(build_reward("brightness"), limits) as url:
        host, port = url.removeprefix("http://").split(":")
        before = threading.active_count()
        start = time.monotonic()
        stalled = [socket.create_connection((host, int(port)), timeout=5.0) for _ in range(STALLED)]
        try:
            for conn in stalled:
                conn.sendall(b"POST /score HTTP/1.0\r\nContent-Length: 100\r\n\r\nab")  # and nothing more
            time.sleep(0.2)
            assert threading.active_count() <= before + limits.workers  # the pool's threads, no more
            answers = [conn.recv(4096) for conn in stalled]  # 503 at once, or EOF at the deadline
            busy = sum(a.startswith(b"HTTP/1.0 503") for a in answers)
            # the rest held a worker until the read deadline cut them off: at most `workers` at a time,
            # each for read_timeout_s, over the seconds the connections took to open and stall
            held = limits.workers * ((time.monotonic() - start) / limits.read_timeout_s + 1)
            assert STALLED - busy <= held, (busy, held)
            assert all(a == b"" or a.startswith(b"HTTP/1.0 503") for a in answers)
        finally:
            for conn in stalled:
                conn.close()
        # a client that drips one byte at a time is cut off at the deadline too, not per read
        host_port = (host, int(port))
        with socket.create_connection(host_port, timeout=5.0) as drip:
            start = time.monotonic()
            with contextlib.suppress(OSError):
                for byte in b"POST /score HTTP/1.0\r\nContent-Length: 10\r\n\r\n0123456789":
                    drip.sendall(bytes([byte]))
                    time.sleep(0.1)
            assert time.monotonic() - start < 0.5 + 1.0
        assert post_json(url + "/score", _payload(), timeout_s=5.0, retries=0)["scores"]  # still serving


def test_the_token_is_required_and_never_logged(tmp_path, caplog):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-token-but-long-enough\n")
    with (
        caplog.at_level(logging.DEBUG),
        thread_server(build_reward("brightness"), ServeLimits(token=TOKEN)) as url,
    ):
        images = torch.rand(2, 3, 8, 8)
        for token in (None, str(wrong)):
            reward = build_reward("remote", url=url, timeout_s=5.0, retries=0, token_file=token)
            with pytest.raises(RemoteRewardError, match="HTTP 401") as info:
                reward(images, ["a", "b"])
            assert TOKEN not in str(info.value)
        good = build_reward("remote", url=url, timeout_s=5.0, retries=0, token_file=str(token_file))
        assert TOKEN not in repr(good)
        expected = build_reward("brightness")((images * 255).round() / 255, ["a", "b"])
        assert torch.allclose(good(images, ["a", "b"]), expected)
    assert all(TOKEN not in record.getMessage() for record in caplog.records)


def test_credentials_in_the_url_are_refused_without_echoing_them():
    with pytest.raises(ValueError, match=r"reward\.token_file") as info:
        build_reward("remote", url="http://user:hunter2@127.0.0.1:9")
    assert "hunter2" not in str(info.value)


def test_a_trickling_server_cannot_hold_the_client_past_its_deadline():
    """The server sends an answer one byte every 0.1 s: each read is quick, the whole is not."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        stop = threading.Event()

        def trickle() -> None:
            with contextlib.suppress(OSError):
                conn, _ = listener.accept()
                with conn:
                    for byte in b"HTTP/1.0 200 OK\r\nContent-Length: 1000000\r\n\r\n" + b" " * 1000:
                        if stop.is_set():
                            return
                        conn.sendall(bytes([byte]))
                        time.sleep(0.1)

        thread = threading.Thread(target=trickle, daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/score"
        start = time.monotonic()
        with pytest.raises(RemoteRewardError, match=r"within reward\.timeout_s=1 s"):
            post_json(url, _payload(), timeout_s=1.0, retries=0)
        assert time.monotonic() - start < 1.0 + 0.5
        stop.set()


def test_requests_from_several_connections_are_scored_in_one_reward_call():
    reward = build_reward("brightness")
    score_images = reward.score_images

    def slow(images, prompts):  # a GPU-sized pause, so requests queue up behind the batch in flight
        time.sleep(0.3)
        return score_images(images, prompts)

    reward.score_images = slow
    with thread_server(reward, ServeLimits(workers=8)) as url:
        payloads = [_payload(2) for _ in range(6)]
        answers: list = [None] * 6

        def client(i: int) -> None:
            answers[i] = post_json(url + "/score", payloads[i], timeout_s=10.0, retries=0)["scores"]

        threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(15)
        health = post_health(url)
    assert health["requests"] == 6 and health["batches"] < 6
    for payload, scores in zip(payloads, answers, strict=True):
        images = (
            torch.frombuffer(
                bytearray(__import__("base64").b64decode(payload["images"]["data"])), dtype=torch.uint8
            )
            .view(*payload["images"]["shape"])
            .float()
            / 255
        )
        assert scores == pytest.approx(score_images(images, payload["prompts"]).tolist())


def post_health(url: str) -> dict:
    import json

    answer = _raw(url, b"GET /health HTTP/1.0\r\n\r\n")
    return json.loads(answer.partition(b"\r\n\r\n")[2])


@pytest.mark.parametrize("port", [0, -1, 65536])
def test_a_port_clients_cannot_use_is_refused(port):
    with pytest.raises(ValueError, match=rf"--port {port}: give a TCP port in 1-65535"):
        check_port(port)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_a_device_this_machine_lacks_is_refused(capsys):
    with pytest.raises(ValueError, match=r"--device 'cuda:0': this machine has 0 CUDA device"):
        check_device("cuda:0")
    with pytest.raises(ValueError, match=r"--device 'gpu9' is not a torch device"):
        check_device("gpu9")
    assert main(["--reward", "brightness", "--port", "8000", "--device", "cuda:1"]) == 2
    assert "this machine has 0 CUDA device" in capsys.readouterr().err


def test_a_taken_port_and_bad_limits_are_clear_errors(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = str(taken.getsockname()[1])
        assert main(["--reward", "brightness", "--port", port]) == 2
        assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err
    assert main(["--reward", "brightness", "--port", "8000", "--workers", "0"]) == 2
    assert "--workers 0: must be > 0" in capsys.readouterr().err
