"""Backend selection, the DeepSpeed extra's error, and activation checkpointing leaving gradients intact."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from digenrl.trainer import PolicyTrainer, resolve_backend

from .fixtures import build_model, grads_by_name, make_config, make_sampler, perturb_adapter, rollout_batch

REPO = Path(__file__).resolve().parents[2]


def test_resolve_backend():
    assert resolve_backend("auto", world_size=1, mode="full") == "none"
    assert resolve_backend("auto", world_size=4, mode="full") == "fsdp2"
    assert resolve_backend("auto", world_size=4, mode="lora") == "ddp"
    assert resolve_backend("fsdp2", world_size=1, mode="full") == "none"
    assert resolve_backend("fsdp2", world_size=1, mode="full", exact=True) == "fsdp2"  # backend benchmarks
    assert resolve_backend("auto", world_size=1, mode="full", exact=True) == "none"
    assert resolve_backend("deepspeed", world_size=2, mode="full") == "deepspeed"
    with pytest.raises(ValueError, match="single-process"):
        resolve_backend("none", world_size=2, mode="lora")
    with pytest.raises(ValueError, match="choose one of"):
        resolve_backend("megatron", world_size=2, mode="lora")
    with pytest.raises(ValueError, match=r"trainer\.mode"):
        resolve_backend("auto", world_size=2, mode="qlora")


def test_deepspeed_without_the_extra_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # import deepspeed now raises ImportError
    cfg = make_config("trainer.backend=deepspeed")
    model = build_model()
    with pytest.raises(ImportError, match=r"pip install digenrl\[deepspeed\]"):
        PolicyTrainer(cfg, model, make_sampler(cfg, model), uncond=None, device="cpu")


@pytest.mark.needs("deepspeed")
def test_a_cpu_run_gets_deepspeeds_cpu_accelerator():
    """On a GPU machine DeepSpeed would pick CUDA and move a CPU run's model there (the backend benchmark's
    CPU test failed so on an H200): a CPU device asks for the CPU accelerator before deepspeed is imported.
    In a fresh process: an earlier test in this one may have imported deepspeed with its accelerator fixed."""
    code = (
        "import os, torch; from digenrl.trainer.parallel import import_deepspeed; "
        "ds = import_deepspeed(torch.device('cpu')); from deepspeed.accelerator import get_accelerator; "
        "print(ds.__name__, get_accelerator().device_name(), os.environ['DS_ACCELERATOR'])"
    )
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["deepspeed", "cpu", "cpu"]


def test_activation_checkpointing_gives_the_same_gradient():
    grads = []
    for flag in ("false", "true"):
        cfg = make_config(f"trainer.activation_checkpointing={flag}", "algo.kl_beta=0.04")
        model = build_model()
        trainer = PolicyTrainer(cfg, model, make_sampler(cfg, model), uncond=None, device="cpu")
        perturb_adapter(model)
        assert model.transformer.gradient_checkpointing == (flag == "true")
        batch = rollout_batch(model, trainer.sampler, batch_size=2, num_train_steps=2, seed=9)
        trainer.accumulate(batch, 1.0 / batch.num_units)
        grads.append(grads_by_name(trainer))
    assert grads[0].keys() == grads[1].keys()
    assert max(float(g.abs().max()) for g in grads[0].values()) > 1e-4
    for name, g in grads[0].items():
        assert (g - grads[1][name]).abs().max() <= 1e-6, name
