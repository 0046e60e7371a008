"""The remote reward against a real server: ``python -m digenrl.rewards.serve`` started as a process (slow:
it imports transformers and builds its reward) and the same server code on a thread, a client scoring
through it exactly as the reward does locally on the 8-bit pixels the wire carries, and the failures a run
must see quickly: a URL nobody answers, a server that never replies (both within ``reward.timeout_s``,
naming the URL), a request the server refuses, a reward the server cannot build."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import torch

from digenrl.rewards import CompositeReward, build_reward
from digenrl.rewards.registry import build_configured_reward
from digenrl.rewards.remote import RemoteReward, RemoteRewardError, decode_images, encode_images, post_json
from tests.rewards.reward_server import thread_server
from tests.systems.launcher import REPO, train_env

PROMPTS = ["a cat on a mat", "a red car", "a cat on a mat"]


@pytest.fixture(scope="module")
def brightness_server() -> Iterator[str]:
    with thread_server(build_reward("brightness")) as url:
        yield url


@pytest.fixture(scope="module")
def clip_server(tiny_clipscore_server: str) -> str:
    return tiny_clipscore_server  # tests/conftest.py: one server for the session, and SIGTERM shuts it down


def quantized(batch: int) -> torch.Tensor:
    """Images whose pixels are exact k/255: what the wire carries, so remote and local see the same."""
    return torch.randint(0, 256, (batch, 3, 32, 32), dtype=torch.uint8).float() / 255.0


@pytest.mark.slow
def test_remote_scores_equal_local_scores(clip_server: str) -> None:
    images = quantized(3)
    remote = build_reward("remote", url=clip_server, timeout_s=60.0)
    assert isinstance(remote, RemoteReward) and remote.needs_weights is False and remote.modules() == []
    local = build_reward("tiny-clipscore")
    torch.testing.assert_close(remote(images, PROMPTS), local(images, PROMPTS), atol=1e-6, rtol=0)
    video = quantized(6).view(2, 3, 3, 32, 32).permute(0, 2, 1, 3, 4)  # [B, 3, F, H, W]: frames flattened
    torch.testing.assert_close(remote(video, PROMPTS[:2]), local(video, PROMPTS[:2]), atol=1e-6, rtol=0)


def test_remote_part_of_a_weighted_sum(brightness_server: str) -> None:
    images = quantized(3)
    settings = {"url": brightness_server, "timeout_s": 60.0, "retries": 0}
    reward = build_configured_reward("x", {"remote": 2.0, "colorfulness": 0.5}, None, "cpu", remote=settings)
    assert isinstance(reward, CompositeReward) and reward.parts[0][0].url == brightness_server
    expected = 2.0 * build_reward("brightness")(images, PROMPTS) + 0.5 * build_reward("colorfulness")(
        images, PROMPTS
    )
    torch.testing.assert_close(reward(images, PROMPTS), expected, atol=1e-5, rtol=0)


def test_a_request_the_server_refuses_is_not_retried_and_names_the_url(brightness_server: str) -> None:
    payload = {"prompts": ["a"], "metadata": [{}], "images": encode_images(torch.rand(2, 3, 8, 8))}
    with pytest.raises(
        RemoteRewardError, match=rf"{brightness_server}/score refused the batch \(HTTP 400\).*2 images, 1"
    ):
        post_json(brightness_server + "/score", payload, timeout_s=30.0, retries=3)


def test_wire_images_round_trip_as_8_bit() -> None:
    images = torch.rand(2, 3, 5, 7)
    decoded = decode_images(encode_images(images))
    assert decoded.shape == images.shape and (decoded - images).abs().max() <= 0.5 / 255 + 1e-7
    with pytest.raises(ValueError, match=r"holds 3 bytes, shape \[1, 3, 2, 1\] needs 6"):
        decode_images({"encoding": "uint8", "shape": [1, 3, 2, 1], "data": "AAAA"})


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_url_nobody_answers_fails_within_the_timeout_naming_it() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # closed: every attempt is refused at once
    reward = build_reward("remote", url=url, timeout_s=3.0, retries=2)
    start = time.monotonic()
    with pytest.raises(
        RemoteRewardError, match=rf"reward server {url}/score did not score the batch within "
    ):
        reward(torch.rand(1, 3, 8, 8), ["a"])
    assert time.monotonic() - start < 3.0 + 2.0
    with pytest.raises(
        RemoteRewardError, match=r"3 attempt\(s\), reward\.retries=2; last error: .*Connection"
    ):
        reward(torch.rand(1, 3, 8, 8), ["a"])


def test_a_server_that_never_replies_fails_within_the_timeout() -> None:
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        reward = build_reward("remote", url=url, timeout_s=1.5, retries=5)
        start = time.monotonic()
        with pytest.raises(
            RemoteRewardError, match=rf"{url}/score did not score the batch within reward\.timeout_s=1\.5"
        ):
            reward(torch.rand(1, 3, 8, 8), ["a"])
        assert time.monotonic() - start < 1.5 + 2.0


def test_metadata_travels_to_the_served_reward() -> None:
    """The OCR reward served on a thread: the target text of the metadata decides the score."""
    ocr = build_reward("tiny-ocr", max_new_tokens=4)
    with thread_server(ocr) as url:
        images = quantized(2)
        read = ocr.read_text(images)
        remote = build_reward("remote", url=url)
        prompts = ['a sign that says "zzzzqqqq"'] * 2
        metadata = [{"text": read[0].replace(" ", "")[:5]}, {}]
        scores = remote(images, prompts, metadata)
        assert float(scores[0]) == 1.0
        assert scores.tolist() == ocr(images, prompts, metadata).tolist()


@pytest.mark.slow
def test_serve_refuses_a_reward_it_cannot_build() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "digenrl.rewards.serve", "--reward", "pickscore", "--port", str(free_port())],
        cwd=REPO,
        env=train_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "reward.weights_path" in proc.stderr
