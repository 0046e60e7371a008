"""Start-up checks of the reward and prompt-set keys: ``reward.url`` / ``timeout_s`` / ``retries`` only with
the remote reward (named with where they were set), a remote reward needs a well-formed URL, the OCR reward
needs a target text in every training prompt, and ``data.eval_prompts`` is read at start-up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from digenrl.config import ConfigError, load_config
from digenrl.validation import validate_config
from tests.systems.launcher import TINY


def check(tmp_path: Path, *overrides: str) -> None:
    validate_config(load_config(TINY, [*overrides, f"out_dir={tmp_path / 'run'}"]), world_size=2)


@pytest.mark.parametrize(
    "key", ["reward.url=http://127.0.0.1:8000", "reward.timeout_s=5", "reward.retries=0"]
)
def test_remote_keys_are_rejected_for_another_reward(tmp_path: Path, key: str) -> None:
    name = key.split("=")[0]
    with pytest.raises(
        ConfigError, match=rf"{name}=.* \(set in the command line\) is not read: .* with reward=remote"
    ):
        check(tmp_path, "reward=brightness", key)


def test_remote_needs_a_url_with_host_and_port(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"reward=remote needs reward\.url=http://HOST:PORT"):
        check(tmp_path, "reward=remote")
    for bad in ("localhost:8000", "http://localhost", "ftp://h:1", "http://h:notaport"):
        with pytest.raises(ConfigError, match=rf"reward\.url='{bad}'"):
            check(tmp_path, "reward=remote", f"reward.url={bad}")
    with pytest.raises(
        ConfigError, match=r"reward\.timeout_s=0(\.0)? is outside its allowed range \(0, 86400\]"
    ):
        check(tmp_path, "reward=remote", "reward.url=http://h:1", "reward.timeout_s=0")
    with pytest.raises(ConfigError, match=r"reward\.retries=-1 is outside its allowed range \[0, 100\]"):
        check(tmp_path, "reward=remote", "reward.url=http://h:1", "reward.retries=-1")
    check(
        tmp_path,
        "reward=remote",
        "reward.url=http://127.0.0.1:8000/",
        "reward.timeout_s=5",
        "reward.retries=0",
    )
    check(tmp_path, "reward.weights={remote: 1.0, brightness: 0.5}", "reward.url=http://h:9")


def test_ocr_needs_a_text_in_every_training_prompt(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"data\.prompts: prompt 1 \('a red fox in fresh snow'\) gives the OCR"
    ):
        check(tmp_path, "reward=tiny-ocr")
    prompts = tmp_path / "ocr.jsonl"
    prompts.write_text(
        json.dumps({"prompt": "a shop sign", "text": "OPEN"})
        + "\n"
        + json.dumps({"prompt": 'a "SALE" banner'})
    )
    check(tmp_path, "reward=tiny-ocr", f"data.prompts={prompts}")


def test_eval_prompts_are_read_at_startup(tmp_path: Path) -> None:
    bad = tmp_path / "eval.jsonl"
    bad.write_text('{"prompt": "a"}\n{"text": "b"}\n')
    with pytest.raises(ConfigError, match=rf"data\.eval_prompts='{bad}', line 2: .*'prompt'"):
        check(tmp_path, f"data.eval_prompts={bad}")
    check(tmp_path, "data.eval_prompts=builtin:eval")


def test_an_incomplete_weights_directory_is_refused_at_startup(tmp_path: Path) -> None:
    from digenrl.rewards import build_reward

    directory = build_reward("tiny-clipscore").save_pretrained(tmp_path / "clip")
    check(tmp_path, "reward=clipscore", f"reward.weights_path={directory}")
    (directory / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match=r"not a complete 'clipscore' reward directory; missing: weights"):
        check(tmp_path, "reward=clipscore", f"reward.weights_path={directory}")
    with pytest.raises(ConfigError, match=r"'imagereward' reward directory; missing: .*imagereward_head"):
        check(tmp_path, "reward=imagereward", f"reward.weights_path={directory}")
