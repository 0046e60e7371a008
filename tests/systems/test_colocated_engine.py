"""``colocated-engine`` end to end: colocated-sync's update on the same data and seed, the switch phases as
spans, and the start-up refusal of two copies that do not fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.systems.equivalence import assert_same_update
from tests.systems.launcher import run_train

ITER = 3


def _switch_spans(run: Path, rank: int) -> list[tuple[int, str, str]]:
    lines = (run / "events" / f"rank{rank}.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return [
        (r["iteration"], r["phase"], r["extra"]["what"])
        for r in records
        if r["type"] == "span" and r["phase"] in ("offload", "onload", "reshard")
    ]


#: one iteration's switch, trainer weights included (full fine-tuning); LoRA leaves those two out
FULL_SWITCH = [
    ("offload", "optimizer state and gradients"),
    ("reshard", "trainer weights into generation copy"),
    ("offload", "trainer weights"),
    ("offload", "generation copy"),
    ("onload", "trainer weights"),
    ("onload", "optimizer state and gradients"),
]
ONLOAD_COPY = ("onload", "generation copy")


def test_full_finetune_offloaded_and_resident_compute_colocated_syncs_update(tmp_path):
    """One process, full fine-tuning: the engine with its states offloaded and with both copies resident
    computes colocated-sync's update bit for bit (the generation copy holds the trainer's exact weights after
    every re-shard, and CPU kernels are deterministic), and every iteration's switch is in the trace."""
    base = ["profile=cpu-1", f"iterations={ITER}", "trainer.mode=full", "trainer.lr=0.001"]
    ref, off, res = tmp_path / "sync", tmp_path / "offload", tmp_path / "resident"
    run_train([*base, "system=colocated-sync", f"out_dir={ref}"])
    run_train([*base, "system=colocated-engine", f"out_dir={off}"])
    proc = run_train([*base, "system=colocated-engine", "engine.offload=false", f"out_dir={res}"])
    assert "colocated hybrid engine" in proc.stdout
    for run in (off, res):
        assert_same_update(ref, run, rel=0.0, reward_abs=0.0, first_rewards_exact=False, equal=("loss",))
    expected = [(0, *s) for s in FULL_SWITCH]
    for k in range(1, ITER):
        expected += [(k, *FULL_SWITCH[0]), (k, *ONLOAD_COPY), *((k, *s) for s in FULL_SWITCH[1:])]
    assert _switch_spans(off, 0) == expected
    # resident: only the re-shard, once per iteration
    assert _switch_spans(res, 0) == [
        (k, "reshard", "trainer weights into generation copy") for k in range(ITER)
    ]


def test_lora_offloaded_computes_colocated_syncs_update(tmp_path):
    """One process, LoRA: the adapter is re-sharded into the generation copy (base plus attached adapter) each
    iteration; the trainer's weights never move; the update is colocated-sync's bit for bit."""
    base = ["profile=cpu-1", f"iterations={ITER}"]
    ref, eng = tmp_path / "sync", tmp_path / "engine"
    run_train([*base, "system=colocated-sync", f"out_dir={ref}"])
    run_train([*base, "system=colocated-engine", f"out_dir={eng}"])
    assert_same_update(ref, eng, rel=0.0, reward_abs=0.0, equal=("loss", "policy_version"), samples=16)
    lora = [s for s in FULL_SWITCH if s[1] != "trainer weights"]
    expected = [(0, *s) for s in lora]
    for k in range(1, ITER):
        expected += [(k, *lora[0]), (k, *ONLOAD_COPY), *((k, *s) for s in lora[1:])]
    assert _switch_spans(eng, 0) == expected


def test_two_ranks_fsdp2_full_finetune_match_colocated_sync(tmp_path):
    """Two gloo ranks, full fine-tuning on FSDP2 (veRL's setting): each re-shard all-gathers the trainer's
    shards into every rank's full generation copy, the shards and the optimizer state are moved with
    ``module.to`` / state replacement (on the CPU the "host" is the same memory, so this checks the schedule
    and the update, not a GPU's copies), and the update is colocated-sync's on the same data and seed bit for
    bit: the all-gathered copy holds the trainer's exact weights and the same CPU kernels run on them."""
    base = ["profile=cpu-2", f"iterations={ITER}", "trainer.mode=full", "trainer.lr=0.001"]
    ref, eng = tmp_path / "sync", tmp_path / "engine"
    run_train([*base, "system=colocated-sync", f"out_dir={ref}"], nproc=2)
    run_train([*base, "system=colocated-engine", f"out_dir={eng}"], nproc=2)
    assert_same_update(ref, eng, rel=0.0, reward_abs=0.0, equal=("loss", "policy_version"), samples=16)
    expected = [(0, *s) for s in FULL_SWITCH]
    for k in range(1, ITER):
        expected += [(k, *FULL_SWITCH[0]), (k, *ONLOAD_COPY), *((k, *s) for s in FULL_SWITCH[1:])]
    for rank in (0, 1):
        assert _switch_spans(eng, rank) == expected


def test_two_copies_that_do_not_fit_are_refused_at_startup(tmp_path):
    """engine.offload=false with SD3.5-medium on a 4 GiB device: refused before any model is built, naming
    the key and the fix."""
    proc = run_train(
        [
            "profile=cpu-1",
            "system=colocated-engine",
            "engine.offload=false",
            "model.name=sd3.5-medium",
            f"out_dir={tmp_path}",
        ],
        check=False,
        timeout_s=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "engine.offload=false" in proc.stderr
    assert "set engine.offload=true" in proc.stderr


def test_deepspeed_is_refused_naming_the_key_and_the_fix():
    from digenrl.config import ConfigError, load_config
    from digenrl.plan import RunPlan
    from digenrl.runtime.hardware.profiles import load_profile
    from digenrl.systems.colocated_engine import ColocatedEngine

    cfg = load_config(None, ["system=colocated-engine", "profile=cpu-2", "trainer.backend=deepspeed"])
    with pytest.raises(ConfigError, match=r"trainer\.backend=deepspeed .* use trainer\.backend=fsdp2, ddp"):
        ColocatedEngine.check(cfg, RunPlan.from_config(cfg, load_profile("cpu-2")))
