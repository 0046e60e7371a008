"""Checkpoints: atomic publication (a crash leaves the previous checkpoint as latest) and bit-exact resume."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from digenrl.trainer import (
    PolicyTrainer,
    latest_checkpoint_dir,
    load_latest_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from digenrl.trainer.checkpoint import (
    CheckpointError,
    LatestInvalidError,
    LatestMissingError,
    NoCheckpointError,
    StepNotFoundError,
    checkpoint_steps,
    choose_checkpoint,
    load_checkpoint,
    nonfinite_entries,
    read_meta,
    verify_checkpoint,
)

from .fixtures import build_model, make_config, make_sampler, rollout_batch, select


class _Unpicklable:
    """Raises while torch.save is writing: a crash in the middle of the payload file."""

    def __reduce__(self):
        raise RuntimeError("simulated crash while writing")


def _save(tmp_path, step, payload):
    return save_checkpoint(tmp_path, step, payload, rank=0, is_writer=True)


def test_no_checkpoint_gives_none(tmp_path):
    assert load_latest_checkpoint(tmp_path) is None
    assert latest_checkpoint_dir(tmp_path) is None


def test_choose_checkpoint_by_step_or_latest_raises_a_typed_error_listing_the_steps(tmp_path):
    with pytest.raises(NoCheckpointError) as info:
        choose_checkpoint(tmp_path)
    assert info.value.steps == []
    for step in (2, 4):
        _save(tmp_path, step, {"x": torch.ones(1)})
    root = tmp_path / "checkpoints"
    assert choose_checkpoint(tmp_path) == root / "step_4"
    assert choose_checkpoint(tmp_path, 2) == root / "step_2"
    with pytest.raises(StepNotFoundError, match=r"step_3 is not a complete checkpoint") as info:
        choose_checkpoint(tmp_path, 3)
    assert (info.value.step, info.value.path, info.value.steps) == (3, root / "step_3", [2, 4])
    (root / "latest").write_text("step_9\n")
    with pytest.raises(LatestInvalidError, match=r"names step_9, which is not a complete checkpoint") as info:
        choose_checkpoint(tmp_path)
    assert info.value.steps == [2, 4]
    (root / "latest").unlink()
    with pytest.raises(LatestMissingError, match=r"latest is missing") as info:
        choose_checkpoint(tmp_path)
    assert (info.value.pointer, info.value.steps) == (root / "latest", [2, 4])


def test_crash_while_writing_keeps_the_previous_checkpoint(tmp_path):
    value = torch.randn(5)
    _save(tmp_path, 1, {"x": value, "config": {"seed": 3}})
    with pytest.raises(RuntimeError, match="simulated crash"):
        _save(tmp_path, 2, {"x": torch.randn(5), "bad": _Unpicklable()})
    loaded = load_latest_checkpoint(tmp_path)
    assert loaded["step"] == 1 and torch.equal(loaded["x"], value)
    assert not (tmp_path / "checkpoints" / "step_2").exists()
    assert (tmp_path / "checkpoints" / "step_1" / "config.yaml").read_text().strip() == "seed: 3"


def test_crash_before_the_rename_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    value = torch.randn(3)
    _save(tmp_path, 4, {"x": value})
    real_replace = os.replace

    def crash_on_directory_rename(src, dst):
        if os.path.isdir(src):
            raise OSError("simulated power loss before rename")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crash_on_directory_rename)
    with pytest.raises(OSError, match="power loss"):
        _save(tmp_path, 5, {"x": torch.randn(3)})
    monkeypatch.setattr(os, "replace", real_replace)
    assert latest_checkpoint_dir(tmp_path).name == "step_4"
    assert torch.equal(load_latest_checkpoint(tmp_path)["x"], value)
    # a stale temporary directory from a killed writer is ignored, then replaced by the next save
    stale = tmp_path / "checkpoints" / ".step_5.tmp"
    stale.mkdir()
    (stale / "trainer.pt").write_bytes(b"garbage")
    _save(tmp_path, 5, {"x": value * 2})
    assert latest_checkpoint_dir(tmp_path).name == "step_5" and not stale.exists()
    assert torch.equal(load_latest_checkpoint(tmp_path)["x"], value * 2)
    # re-saving an existing step replaces it whole
    _save(tmp_path, 5, {"x": value * 3})
    assert torch.equal(load_latest_checkpoint(tmp_path)["x"], value * 3)


def _new_trainer(cfg):
    model = build_model(seed=0)
    return PolicyTrainer(cfg, model, make_sampler(cfg, model), uncond=None, device="cpu")


def _iteration(trainer, iteration):
    """One iteration whose data depends on the global RNGs (so their restoration is tested too)."""
    seed = int(torch.randint(0, 2**31, ())) + random.randrange(1000) + int(np.random.randint(1000))
    batch = rollout_batch(trainer.flow_model, trainer.sampler, batch_size=3, num_train_steps=2, seed=seed)
    trainer.accumulate(select(batch, [0, 1]), 1.0 / batch.num_units)  # two fragments
    trainer.accumulate(select(batch, [2]), 1.0 / batch.num_units)
    trainer.step()


def _seed_everything(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@pytest.mark.parametrize("mode", ["lora", "full"])
def test_resume_is_bit_exact(tmp_path, mode):
    overrides = [f"trainer.mode={mode}", "trainer.lr=0.001"] + (
        ["algo.kl_beta=0.04"] if mode == "lora" else []
    )
    cfg = make_config(*overrides)

    straight = _new_trainer(cfg)
    _seed_everything(21)
    for it in range(4):
        _iteration(straight, it)

    first = _new_trainer(cfg)
    _seed_everything(21)
    for it in range(2):
        _iteration(first, it)
    payload = {"trainer": first.state_dict(), "iteration": 2, "config": cfg.to_dict()}
    save_checkpoint(tmp_path, 2, payload, rank=0, is_writer=True)
    _seed_everything(999)  # whatever happened in between must not matter
    del first

    resumed = _new_trainer(cfg)
    ckpt = load_latest_checkpoint(tmp_path)
    resumed.load_state_dict(ckpt["trainer"])
    restore_rng_state(ckpt["rng"])
    assert ckpt["iteration"] == 2 and resumed.steps == 2
    for it in range(ckpt["iteration"], 4):
        _iteration(resumed, it)

    assert resumed.steps == straight.steps == 4
    a, b = straight.state_dict(), resumed.state_dict()
    assert a["model"].keys() == b["model"].keys()
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]
    assert a["optimizer"]["state"].keys() == b["optimizer"]["state"].keys()
    for name, entry in a["optimizer"]["state"].items():
        for key, value in entry.items():
            assert torch.equal(value, b["optimizer"]["state"][name][key]), (name, key)


def test_retention_keeps_the_newest_complete_checkpoints(tmp_path):
    for step in range(1, 5):
        save_checkpoint(tmp_path, step, {"x": torch.full((2,), float(step))}, rank=0, is_writer=True, keep=2)
    assert checkpoint_steps(tmp_path) == [3, 4]
    assert latest_checkpoint_dir(tmp_path).name == "step_4"
    save_checkpoint(tmp_path, 5, {"x": torch.ones(1)}, rank=0, is_writer=True, keep=0)  # 0 keeps all
    assert checkpoint_steps(tmp_path) == [3, 4, 5]


def test_a_failed_save_deletes_no_older_checkpoint(tmp_path):
    for step in (1, 2):
        _save(tmp_path, step, {"x": torch.ones(1)})
    with pytest.raises(RuntimeError, match="simulated crash"):
        save_checkpoint(tmp_path, 3, {"bad": _Unpicklable()}, rank=0, is_writer=True, keep=1)
    assert checkpoint_steps(tmp_path) == [1, 2] and latest_checkpoint_dir(tmp_path).name == "step_2"


def test_a_payload_with_non_finite_weights_is_never_written(tmp_path):
    _save(tmp_path, 1, {"trainer": {"model": {"w": torch.ones(3)}}})
    bad = {"trainer": {"model": {"w": torch.tensor([1.0, float("nan")]), "b": torch.ones(1)}}, "step": 2}
    with pytest.raises(FloatingPointError, match=r"step_2: non-finite values in trainer\.model\.w"):
        _save(tmp_path, 2, bad)
    assert checkpoint_steps(tmp_path) == [1] and latest_checkpoint_dir(tmp_path).name == "step_1"
    assert nonfinite_entries({"a": [torch.tensor([float("inf")])], "n": torch.tensor([1]), "s": "x"}) == [
        "a.0"
    ]


def test_the_run_identity_is_readable_without_loading_tensors(tmp_path):
    _save(tmp_path, 3, {"x": torch.ones(1), "run_id": "abc", "config": {"seed": 1}})
    meta = read_meta(latest_checkpoint_dir(tmp_path))
    assert meta["run_id"] == "abc" and meta["config"] == {"seed": 1} and meta["step"] == 3


# ----------------------------------------------------------------- checked on load (issue 35, item 5)


@pytest.fixture(scope="module")
def stepped_lora_state():
    """A LoRA trainer after one optimizer step, and its full-format state."""
    cfg = make_config("trainer.lr=0.001")
    trainer = _new_trainer(cfg)
    _seed_everything(3)
    _iteration(trainer, 0)
    return cfg, trainer.state_dict()


def _damaged(state, damage):
    import copy

    state = copy.deepcopy(state)
    damage(state)
    return state


def _first(state):
    return next(iter(state["optimizer"]["state"]))


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (
            lambda s: s["optimizer"]["state"].clear(),
            r"'trainer\.optimizer\.state' has no entry for \d+ of the",
        ),
        (lambda s: s.update(optimizer=[]), r"'trainer\.optimizer' is not an optimizer state"),
        (
            lambda s: s["optimizer"]["state"][_first(s)].update(exp_avg=torch.zeros(3, 5)),
            r"'trainer\.optimizer\.state\[.*\]\.exp_avg' has shape \(3, 5\), the parameter",
        ),
        (
            lambda s: s["optimizer"]["state"].update(nope={"exp_avg": torch.zeros(1)}),
            r"holds 'nope', which this trainer does not train",
        ),
        (lambda s: s["model"].popitem(), r"trainable state does not match the model"),
    ],
    ids=["empty-optimizer", "not-a-state", "moment-shape", "unknown-name", "missing-weight"],
)
def test_a_trainer_state_that_does_not_fit_the_model_is_refused_naming_the_file_and_field(
    stepped_lora_state, tmp_path, damage, needle
):
    cfg, state = stepped_lora_state
    with pytest.raises(CheckpointError, match=needle) as info:
        _new_trainer(cfg).load_state_dict(_damaged(state, damage), checkpoint_dir=tmp_path / "step_1")
    assert str(tmp_path / "step_1" / "trainer.pt") in str(info.value)


def test_an_unstepped_trainer_state_without_moments_still_loads(tmp_path):
    cfg = make_config("trainer.lr=0.001")
    trainer = _new_trainer(cfg)
    _new_trainer(cfg).load_state_dict(trainer.state_dict(), checkpoint_dir=tmp_path)  # steps=0: no moments


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (lambda r: r.pop("numpy"), "lacks numpy"),
        (lambda r: r.update(python=(3, (1, 2), None)), "'python' is not random.getstate"),
        (lambda r: r.update(numpy=("MT19937", np.zeros(5, np.uint32), 0, 0, 0.0)), "'numpy' is not"),
        (
            lambda r: r.update(torch=torch.zeros(7, dtype=torch.uint8)),
            r"'torch' is .*expected a uint8 tensor",
        ),
        (lambda r: r.update(cuda=[torch.zeros(3)]), "'cuda' is not a list of uint8 tensors"),
    ],
)
def test_a_malformed_rng_state_is_refused_at_verify_and_load(tmp_path, damage, needle):
    _save(tmp_path, 4, {"x": torch.ones(2), "next_iteration": 4})
    path = tmp_path / "checkpoints" / "step_4"
    rng = torch.load(path / "rng" / "rank_0.pt", weights_only=False)
    damage(rng)
    torch.save(rng, path / "rng" / "rank_0.pt")
    for read in (verify_checkpoint, load_checkpoint):
        with pytest.raises(CheckpointError, match=needle) as info:
            read(path)
        assert "rank_0.pt: the RNG state" in str(info.value)
    with pytest.raises(CheckpointError, match=needle):
        restore_rng_state(rng)


def test_a_meta_step_that_disagrees_with_the_payload_is_refused(tmp_path):
    _save(tmp_path, 4, {"next_iteration": 3, "trainer": {"steps": 3}})
    path = tmp_path / "checkpoints" / "step_4"
    for read in (verify_checkpoint, load_checkpoint):
        with pytest.raises(
            CheckpointError, match=r"trainer\.pt: 'next_iteration' is 3 but .*meta\.json says step 4"
        ):
            read(path)
    _save(tmp_path, 5, {"next_iteration": 5, "trainer": {"steps": -1}})
    with pytest.raises(CheckpointError, match=r"'trainer\.steps' is -1"):
        verify_checkpoint(tmp_path / "checkpoints" / "step_5")
