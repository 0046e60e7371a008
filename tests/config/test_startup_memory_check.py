"""The startup memory check (digenrl/validation.py ``check_device_memory``, docs/operations.md "Memory check
at startup"): the planner's per-rank estimate from the committed cost files against the profile's device,
before any model is built. FLUX.1-dev at micro-batch 8 ran out of memory on an 80 GB H100 after loading and
compiling (experiments/results/gpu/loops/README.md, round 4); the check refuses it in well under a second."""

from __future__ import annotations

from pathlib import Path

import pytest

from digenrl.config import ConfigError, load_config
from digenrl.validation import check_device_memory

ROOT = Path(__file__).resolve().parents[2]
FLUX = str(ROOT / "experiments/configs/flux-dev-lora.yaml")
COSTS = f"runtime.costs_dir={ROOT / 'experiments/results/costs'}"


def flux(*overrides: str):
    return load_config(FLUX, ["profile=h100-1", COSTS, *overrides])


def test_a_run_that_cannot_fit_its_gpu_is_refused_naming_the_rank_the_parts_and_the_knobs():
    with pytest.raises(ConfigError) as err:
        check_device_memory(flux())  # the config's micro-batch 8: out of memory on the H100 in round 4
    text = str(err.value)
    assert "model.name='flux.1-dev' does not fit on profile 'h100-1'" in text
    assert "rank 0 (colocated) needs 84.2 GiB of 72.9 usable" in text and "activations 51.9" in text
    assert "the device's whole 79.2 GiB" in text
    assert "trainer.micro_batch_size (now 8)" in text and "trainer.activation_checkpointing=true" in text
    assert "runtime.memory_check=false" in text


def test_what_fits_passes_and_the_band_below_the_whole_memory_warns():
    assert check_device_memory(flux("trainer.micro_batch_size=4")) is None  # ran on an H100: 0.71 samples/s
    assert check_device_memory(flux("profile=h200-1")) is None  # micro-batch 8 ran on an H200 (86.3 GiB)
    note = check_device_memory(flux("trainer.micro_batch_size=7"))
    assert note is not None and note.startswith("WARNING: rank 0 (colocated) needs 77.8 GiB of 72.9 usable")
    assert "(now 7)" in note


def test_checkpointing_is_priced():
    assert check_device_memory(flux("trainer.activation_checkpointing=true")) is None


def test_off_or_without_costs_the_run_goes_on_and_says_what_was_not_checked():
    assert check_device_memory(flux("runtime.memory_check=false")) is None
    assert check_device_memory(load_config(FLUX, ["profile=h100-1", "runtime.costs_dir=null"])) is None
    note = check_device_memory(flux("model=qwen-image"))  # no H100 cost file for Qwen-Image
    assert note == (
        "memory not checked: runtime.costs_dir holds no cost file h100-qwen-image.json for this device"
    )


@pytest.mark.parametrize("name", ["flux-dev-lora.yaml", "sd35-medium-lora.yaml"])
def test_the_gpu_configs_name_the_committed_cost_files(name):
    cfg = load_config(str(ROOT / "experiments/configs" / name), [])
    assert cfg.runtime.costs_dir == "experiments/results/costs" and cfg.runtime.memory_check
    assert (ROOT / cfg.runtime.costs_dir).is_dir()
