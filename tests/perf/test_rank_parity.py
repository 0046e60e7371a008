"""Rank parity (digenrl/perf/rank_parity.py): a generator rank and a trainer rank built from one config, each
in its own process, roll out the same trajectories; and the comparison names the first field that differs."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from digenrl.perf import rank_parity

TINY = [
    "--config",
    str(Path(__file__).parents[2] / "experiments/configs/tiny.yaml"),
    "system=colocated-sync",
    "profile=cpu-1",
]


def test_generator_and_trainer_roles_roll_out_the_same_trajectories(tmp_path):
    overrides = ["model.dtype=bfloat16", "model.autocast=true"]
    code = rank_parity.main(
        [*TINY, "--out", str(tmp_path), "--roles", "trainer,generator,generator-eval", *overrides]
    )
    result = json.loads((tmp_path / "rank_parity.json").read_text())
    assert code == 0 and result["identical"]
    generator, in_eval = result["comparisons"]
    assert generator["candidate"] == "generator-1" and generator["first_difference"] is None
    assert all(v in (0.0, None) for v in generator["max_abs_diff"].values())
    assert generator["settings_differ"] == {}  # built like the trainer: same mode, adapter, autocast
    # the eval-mode variant differs in its mode only, which changes nothing on a CPU
    assert in_eval["settings_differ"] == {"transformer_training": [True, False]} and in_eval["identical"]
    settings = result["snapshots"][1]["settings"]
    assert settings["autocast_dtype"] == "torch.bfloat16" and settings["lora_input_cast_on"] == 0


def _snap(digest: str) -> dict:
    return {"settings": {"sdp_cudnn": True}, "digests": {"transformer_base": digest, "vae": "v"}}


def test_compare_names_the_first_difference_in_data_flow_order():
    same = {name: torch.ones(2) for name in rank_parity.TENSOR_FIELDS}
    later = {**same, "velocity": torch.tensor([1.0, 1.5]), "final": torch.zeros(2)}
    result = rank_parity.compare(_snap("a"), _snap("a"), same, later)
    assert not result["identical"] and result["first_difference"] == "tensor.velocity"
    assert result["max_abs_diff"]["velocity"] == 0.5 and result["max_abs_diff"]["final"] == 1.0
    weights = rank_parity.compare(_snap("a"), _snap("b"), same, later)
    assert weights["first_difference"] == "digest.transformer_base"
    assert rank_parity.compare(_snap("a"), _snap("a"), same, dict(same))["identical"]
