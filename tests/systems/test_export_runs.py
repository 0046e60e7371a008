"""Real runs: the checkpoint of a short training run exports into diffusers and peft with the velocity of
the run's trained model (resumed from that checkpoint), bit for bit; ``checkpoint.export_lora`` leaves the
same adapter inside the checkpoint; and the EMA (``trainer.ema_decay``) of a run resumed after a crash
equals the uninterrupted run's, bit for bit (one process with LoRA, two FSDP2 ranks with sharded
checkpoints)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file

from digenrl.export import main
from digenrl.models import build_model_bundle
from digenrl.trainer import full_trainer_state, load_latest_checkpoint
from digenrl.trainer.lora_export import CHECKPOINT_LORA_DIR, CHECKPOINT_LORA_EMA_DIR, DIFFUSERS_LORA_FILE
from tests.export.helpers import REPO, base_pipeline, inputs, resumed_trainer, trained_velocity, velocity
from tests.systems.launcher import assert_resumed_exactly, resume_from_copy, run_train

LORA_RUN = [
    "system=colocated-sync",
    "profile=cpu-1",
    "iterations=2",
    "checkpoint_every=1",
    "trainer.ema_decay=0.9",
    "checkpoint.export_lora=true",
]


@pytest.fixture(scope="module", params=["tiny-sd3", "tiny-flux"])
def lora_run(request, tmp_path_factory):
    run = tmp_path_factory.mktemp(request.param) / "run"
    overrides = [f"model={request.param}", *LORA_RUN]
    run_train([*overrides, f"out_dir={run}"])
    return run, overrides


def test_a_real_runs_lora_exports_into_diffusers_and_peft(lora_run, tmp_path):
    run, _ = lora_run
    trainer, bundle = resumed_trainer(run)  # the project's trained model, from the run's checkpoint
    cfg = trainer.cfg
    given = inputs(bundle)
    for ema in (False, True):
        out = tmp_path / f"diffusers-{ema}"
        argv = [str(run), "--format", "diffusers", "--out", str(out), *(["--ema"] if ema else [])]
        if cfg.model.name == "tiny-sd3" and not ema:  # the user's command line, once
            proc = subprocess.run(
                [sys.executable, str(REPO / "experiments" / "export.py"), *argv],
                capture_output=True,
                text=True,
                timeout=300,
                env={
                    **os.environ,
                    "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH")))),
                },
            )
            assert proc.returncode == 0, proc.stderr
            assert "pipe.load_lora_weights(" in proc.stdout
        else:
            assert main(argv) == 0
        pipe = base_pipeline(cfg)
        pipe.load_lora_weights(out)
        expected = trained_velocity(trainer, given, ema=ema)
        assert torch.equal(velocity(bundle.spec, pipe.transformer, given), expected)

        peft_out = tmp_path / f"peft-{ema}"
        assert main([str(run), "--format", "peft", "--out", str(peft_out), *(["--ema"] if ema else [])]) == 0
        base = build_model_bundle(cfg.model.name, device="cpu", seed=cfg.seed).flow_model.transformer
        model = PeftModel.from_pretrained(base, peft_out)
        assert torch.equal(velocity(bundle.spec, model.get_base_model(), given), expected)

        # checkpoint.export_lora wrote the same adapter into the checkpoint
        inside = run / "checkpoints" / "step_2" / (CHECKPOINT_LORA_EMA_DIR if ema else CHECKPOINT_LORA_DIR)
        a, b = load_file(inside / DIFFUSERS_LORA_FILE), load_file(out / DIFFUSERS_LORA_FILE)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert trainer.ema.updates == 2


@pytest.mark.parametrize("lora_run", ["tiny-sd3"], indirect=True)
def test_a_resumed_lora_run_continues_its_ema_exactly(lora_run, tmp_path):
    run, overrides = lora_run
    resume_from_copy(run, tmp_path / "resumed", 1, overrides)
    assert "ema" in full_trainer_state(load_latest_checkpoint(run))
    assert_resumed_exactly(run, tmp_path / "resumed")  # compares the EMA too


def test_a_two_rank_fsdp2_run_resumes_its_sharded_ema_exactly(fsdp2_full_ema_runs):
    full, resumed = fsdp2_full_ema_runs  # tests/systems/conftest.py: FSDP2 full fine-tuning, ema_decay=0.9
    checkpoint = load_latest_checkpoint(full)
    assert checkpoint["format"] == "sharded" and full_trainer_state(checkpoint)["ema"]["updates"] == 3
    assert_resumed_exactly(full, resumed)  # compares the EMA too
