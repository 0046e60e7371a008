"""A checkpoint is read without trusting it: no code runs from any of its files, no path leaves the run
folder, and a damaged file is an error naming it and what is wrong (digenrl/trainer/checkpoint_files.py)."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest
import torch

from digenrl.trainer.checkpoint import (
    CheckpointError,
    full_trainer_state,
    latest_checkpoint_dir,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)


class RunsCode:
    """Unpickling calls ``open(marker, "w")``: the marker file shows that code from the file ran."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _full(out: Path, step: int = 2) -> Path:
    payload = {
        "trainer": {"model": {"w": torch.ones(3)}, "steps": step},
        "run_id": "r",
        "config": {"seed": 0},
    }
    return save_checkpoint(out, step, payload, rank=0, is_writer=True)


def _sharded(out: Path, extra: dict | None = None) -> Path:
    shards = {
        "model": {"w": torch.arange(4.0)},
        "optimizer": {"param_groups": [{"lr": 0.1, **(extra or {})}]},
    }
    payload = {"trainer": {"steps": 1, "format": "sharded"}, "run_id": "r", "config": {"seed": 0}}
    return save_checkpoint(out, 1, payload, rank=0, is_writer=True, sharded=shards)


@pytest.mark.parametrize("name", ["trainer.pt", "rng/rank_0.pt"])
def test_a_checkpoint_file_that_would_run_code_is_refused_and_runs_nothing(tmp_path, name):
    step = _full(tmp_path / "run")
    marker = tmp_path / "marker"
    torch.save({"x": RunsCode(marker)}, step / name)
    for read in (verify_checkpoint, load_checkpoint):
        with pytest.raises(
            CheckpointError, match=r"holds objects other than tensors.*(io|builtins)\.open.*refused"
        ):
            read(step)
    assert not marker.exists()


def test_a_plain_pickle_in_place_of_a_checkpoint_file_is_refused(tmp_path):
    step = _full(tmp_path / "run")
    marker = tmp_path / "marker"
    (step / "trainer.pt").write_bytes(pickle.dumps(RunsCode(marker)))
    with pytest.raises(CheckpointError, match=r"trainer\.pt is not a complete torch\.save archive"):
        load_checkpoint(step)
    assert not marker.exists()


def test_a_sharded_index_that_would_run_code_is_refused(tmp_path):
    step = _sharded(tmp_path / "run")
    marker = tmp_path / "marker"
    (step / "trainer_dcp" / ".metadata").write_bytes(pickle.dumps(RunsCode(marker)))
    with pytest.raises(CheckpointError, match=r"\.metadata refers to (io|builtins)\.open.*refused"):
        verify_checkpoint(step)
    with pytest.raises(CheckpointError, match=r"\.metadata refers to (io|builtins)\.open"):
        full_trainer_state(load_checkpoint(step))
    assert not marker.exists()


def test_a_sharded_entry_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "marker"
    step = _sharded(tmp_path / "run", extra={"note": RunsCode(marker)})  # DCP pickles it into a .distcp
    assert not marker.exists()
    with pytest.raises(
        CheckpointError, match=r"entry 'optimizer\.param_groups\.0\.note' holds objects other"
    ):
        full_trainer_state(load_checkpoint(step))
    assert not marker.exists()


def test_a_sharded_checkpoint_converts_to_full_tensors(tmp_path):
    state = full_trainer_state(load_checkpoint(_sharded(tmp_path / "run")))
    assert torch.equal(state["model"]["w"], torch.arange(4.0))
    assert state["optimizer"]["param_groups"] == [{"lr": 0.1}] and state["steps"] == 1


def test_latest_naming_a_path_out_of_the_run_folder_is_refused(tmp_path):
    run = tmp_path / "run"
    _full(run)
    _full(tmp_path / "elsewhere", 8)  # a complete checkpoint outside, which the pointer tries to reach
    (run / "checkpoints" / "latest").write_text("step_8/../../../elsewhere/checkpoints/step_8\n")
    with pytest.raises(
        CheckpointError, match=r"names 'step_8/\.\./\.\./\.\./elsewhere.*not a step directory"
    ):
        latest_checkpoint_dir(run)


def test_a_symlink_out_of_the_run_folder_is_refused(tmp_path):
    run = tmp_path / "run"
    _full(run)
    outside = _full(tmp_path / "elsewhere", 8)
    (run / "checkpoints" / "step_8").symlink_to(outside, target_is_directory=True)
    (run / "checkpoints" / "latest").write_text("step_8\n")
    with pytest.raises(CheckpointError, match=r"step_8 leads to .*elsewhere.*outside the run folder"):
        latest_checkpoint_dir(run)
    own = run / "checkpoints" / "step_2"
    (own / "trainer.pt").unlink()
    (own / "trainer.pt").symlink_to(outside / "trainer.pt")
    for read in (verify_checkpoint, load_checkpoint):
        with pytest.raises(CheckpointError, match=r"trainer\.pt leads to .*outside the run folder"):
            read(own)


def _cut(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (lambda s: _cut(s / "trainer.pt", -10), r"trainer\.pt is not a complete torch\.save archive"),
        (lambda s: _cut(s / "trainer.pt", 0), r"trainer\.pt is empty"),
        (lambda s: (s / "trainer.pt").unlink(), r"trainer\.pt is missing"),
        (lambda s: _cut(s / "rng" / "rank_0.pt", 100), r"rank_0\.pt is not a complete torch\.save archive"),
        (lambda s: (s / "rng" / "rank_0.pt").unlink(), r"rank_0\.pt is missing"),
        (lambda s: shutil.rmtree(s / "rng"), r"rng is missing: the RNG states .*rank_0\.pt"),
        (lambda s: _cut(s / "meta.json", 20), r"meta\.json is not valid JSON"),
        (lambda s: (s / "meta.json").write_text("[1]"), r"meta\.json holds list, not a JSON object"),
        (lambda s: (s / "meta.json").write_text('{"step": 2}'), r"meta\.json: 'rng_files' is None"),
        (lambda s: (s / "meta.json").write_text('{"step": 3}'), r"meta\.json: 'step' is 3, expected 2"),
    ],
)
def test_a_damaged_checkpoint_names_the_file_and_what_is_wrong(tmp_path, damage, needle):
    step = _full(tmp_path)
    damage(step)
    with pytest.raises(CheckpointError, match=needle):
        verify_checkpoint(step)


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (lambda d: (d / ".metadata").unlink(), r"\.metadata is missing"),
        (lambda d: _cut(d / ".metadata", 30), r"\.metadata cannot be read, it is damaged"),
        (lambda d: (d / "__0_0.distcp").unlink(), r"__0_0\.distcp is missing \(a shard"),
    ],
)
def test_a_damaged_sharded_state_names_the_file(tmp_path, damage, needle):
    step = _sharded(tmp_path)
    damage(step / "trainer_dcp")
    with pytest.raises(CheckpointError, match=needle):
        verify_checkpoint(step)


def test_an_intact_checkpoint_passes_and_its_rng_state_loads(tmp_path):
    step = _full(tmp_path)
    assert verify_checkpoint(step)["step"] == 2
    loaded = load_checkpoint(step)
    assert (
        torch.equal(loaded["trainer"]["model"]["w"], torch.ones(3)) and loaded["rng"]["numpy"][0] == "MT19937"
    )
    assert verify_checkpoint(_sharded(tmp_path / "sharded"))["trainer_format"] == "sharded"
