"""How a run starts in its out_dir: refuse to destroy or mix runs, overwrite on request, resume only a
checkpoint written with the same config (apart from the resumable keys), one decision for every rank."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from digenrl.config import RESUMABLE_KEYS, Config, ConfigError, apply_overrides, load_config
from digenrl.runtime.comm.distributed import DistContext
from digenrl.trainer.checkpoint import save_checkpoint
from digenrl.trainer.run_dir import RUN_FILES, agree_run_start, clear_run, existing_run, plan_run_start
from tests.runtime.spawn import spawn_workers


def _cfg(out_dir, *overrides: str) -> Config:
    return apply_overrides(Config(), [f"out_dir={out_dir}", *overrides])


def _checkpoint(cfg: Config, step: int, run_id: str = "r1") -> None:
    payload = {"next_iteration": step, "x": torch.ones(2), "run_id": run_id, "config": cfg.to_dict()}
    save_checkpoint(cfg.out_dir, step, payload, rank=0, is_writer=True)


def test_a_new_run_into_an_empty_out_dir_starts_at_iteration_zero_with_a_fresh_id(tmp_path):
    a, b = plan_run_start(_cfg(tmp_path)), plan_run_start(_cfg(tmp_path))
    assert a.start_iteration == 0 and not a.resumed and a.note == ""
    assert len(a.run_id) == 32 and a.run_id != b.run_id


@pytest.mark.parametrize("held", ["metrics.jsonl", "events/rank0.jsonl", "checkpoints"])
def test_a_new_run_into_an_out_dir_holding_a_run_is_refused(tmp_path, held):
    cfg = _cfg(tmp_path, "iterations=3")
    if held == "checkpoints":
        _checkpoint(cfg, 2)
    else:
        (tmp_path / held).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / held).write_text('{"iteration": 0}\n')
    with pytest.raises(ConfigError) as info:
        plan_run_start(cfg)
    message = str(info.value)
    assert held.split("/")[0] in message and "resume=true" in message and "overwrite=true" in message


def test_overwrite_deletes_exactly_the_run_files(tmp_path):
    cfg = _cfg(tmp_path, "overwrite=true")
    _checkpoint(cfg, 1)
    for name in ("metrics.jsonl", "trace.json", "config.yaml"):
        (tmp_path / name).write_text("{}\n")
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "rank0.jsonl").write_text("{}\n")
    (tmp_path / "notes.txt").write_text("mine")
    start = plan_run_start(cfg)
    assert "overwrite=true" in start.note and not start.resumed
    clear_run(tmp_path)
    assert existing_run(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    assert set(RUN_FILES) >= {"metrics.jsonl", "events", "checkpoints", "trace.json", "config.yaml"}


def test_resume_without_a_checkpoint_starts_fresh_in_an_empty_dir_and_refuses_over_a_run(tmp_path):
    start = plan_run_start(_cfg(tmp_path, "resume=true"))
    assert not start.resumed and start.start_iteration == 0
    assert "no checkpoint" in start.note and "iteration 0" in start.note
    (tmp_path / "metrics.jsonl").write_text('{"iteration": 0}\n{"iteration": 1}\n')
    with pytest.raises(ConfigError, match=r"without a checkpoint.*metrics\.jsonl \(2 iterations\)"):
        plan_run_start(_cfg(tmp_path, "resume=true"))


def test_resume_continues_the_checkpoints_run_when_only_resumable_keys_changed(tmp_path):
    _checkpoint(_cfg(tmp_path, "iterations=4"), 2, run_id="abc")
    changed = {
        "iterations": "9",
        "checkpoint_every": "3",
        "checkpoint_keep": "5",
        "runtime.timeout_s": "60",
        "resume": "true",
    }
    assert set(changed) <= set(RESUMABLE_KEYS)
    start = plan_run_start(_cfg(tmp_path, *(f"{k}={v}" for k, v in changed.items())))
    assert start.resumed and start.run_id == "abc" and start.start_iteration == 2
    assert start.checkpoint.endswith("step_2") and "at iteration 2" in start.note


def test_resume_with_a_changed_setting_is_refused_naming_every_key_and_both_values(tmp_path):
    _checkpoint(_cfg(tmp_path), 2)
    cfg = _cfg(tmp_path, "resume=true", "trainer.lr=0.001", "system=separate-sync", "algo.group_size=8")
    with pytest.raises(ConfigError) as info:
        plan_run_start(cfg)
    message = str(info.value)
    assert "trainer.lr: 0.0003 in the checkpoint, 0.001 now" in message
    assert "system: 'colocated-sync' in the checkpoint, 'separate-sync' now" in message
    assert "algo.group_size: 4 in the checkpoint, 8 now" in message
    assert "iterations" in message.split("may change:")[1]  # says what may change
    assert message.count(" in the checkpoint, ") == 3


def test_a_checkpoint_without_identity_is_not_resumed_blindly(tmp_path):
    save_checkpoint(tmp_path, 1, {"x": torch.ones(1)}, rank=0, is_writer=True)
    with pytest.raises(ConfigError, match="does not record the config and run_id"):
        plan_run_start(_cfg(tmp_path, "resume=true"))


def test_the_saved_config_names_the_run_and_loads_back_as_a_config(tmp_path):
    from digenrl.config import save_config

    cfg = _cfg(tmp_path, "trainer.lr=0.002")
    save_config(cfg, tmp_path / "config.yaml", run_id="feed")
    assert (tmp_path / "config.yaml").read_text().startswith("# run_id: feed\n")
    assert load_config(tmp_path / "config.yaml").to_dict() == cfg.to_dict()


def test_single_process_decision_clears_on_overwrite(tmp_path):
    ctx = DistContext(0, 1, 0, torch.device("cpu"), "none", is_distributed=False)
    (tmp_path / "metrics.jsonl").write_text('{"iteration": 0}\n')
    with pytest.raises(ConfigError, match="already holds a run"):
        agree_run_start(_cfg(tmp_path), ctx)
    assert (tmp_path / "metrics.jsonl").is_file()  # a refusal writes nothing
    start = agree_run_start(_cfg(tmp_path, "overwrite=true"), ctx)
    assert not (tmp_path / "metrics.jsonl").exists() and not start.resumed


def test_overwrite_works_over_damaged_logs(tmp_path):
    """Issue 35, item 4: garbage in metrics.jsonl and an event log never stops a start; overwrite clears."""
    ctx = DistContext(0, 1, 0, torch.device("cpu"), "none", is_distributed=False)
    (tmp_path / "metrics.jsonl").write_bytes(b'{"iteration": 0}\n\x00garbage\n[]\n{"iteration": 1}\n')
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "rank0.jsonl").write_text("not an event\n")
    with pytest.raises(ConfigError, match=r"metrics\.jsonl \(2 iterations\)"):
        agree_run_start(_cfg(tmp_path), ctx)
    agree_run_start(_cfg(tmp_path, "overwrite=true"), ctx)
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "events").exists()


def _agree_worker(rank: int, world: int, tmp: str, cases: dict[str, tuple[str, list[str]]]) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world, timeout=timedelta(seconds=30)
    )
    try:
        ctx = DistContext(rank, world, rank, torch.device("cpu"), "gloo", is_distributed=True)
        results = {}
        for name, (out_dir, overrides) in cases.items():
            try:
                results[name] = {"start": agree_run_start(_cfg(out_dir, *overrides), ctx).__dict__}
            except ConfigError as error:
                results[name] = {"error": str(error)}
        with open(os.path.join(tmp, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
    finally:
        dist.destroy_process_group()


def test_every_rank_gets_rank_zeros_decision(tmp_path):
    out = tmp_path / "run"
    _checkpoint(_cfg(out, "iterations=4"), 2, run_id="shared")
    cases = {"resume": (str(out), ["resume=true"]), "refuse": (str(out), ["trainer.lr=0.5", "resume=true"])}
    with tempfile.TemporaryDirectory() as tmp:
        spawn_workers(_agree_worker, 2, (tmp, cases), limit_s=60)
        results = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(2)]
    assert results[0] == results[1]
    assert results[0]["resume"]["start"]["run_id"] == "shared"
    assert results[0]["resume"]["start"]["start_iteration"] == 2
    assert "trainer.lr: 0.0003 in the checkpoint, 0.5 now" in results[0]["refuse"]["error"]


# ------------------------------------------------------------------ damaged, altered or ambiguous folders


def _resume(out, *overrides: str) -> Config:
    return _cfg(out, "resume=true", *overrides)


def test_resume_refuses_a_checkpoint_file_that_would_run_code_before_anything_loads_it(tmp_path):
    from tests.trainer.test_trainer_checkpoint_files import RunsCode

    _checkpoint(_cfg(tmp_path), 2)
    marker = tmp_path.parent / f"{tmp_path.name}-marker"
    torch.save({"x": RunsCode(marker)}, tmp_path / "checkpoints" / "step_2" / "trainer.pt")
    with pytest.raises(
        ConfigError, match=r"resume=true: .*step_2/trainer\.pt holds objects other than tensors"
    ):
        plan_run_start(_resume(tmp_path))
    assert not marker.exists()


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        ("trainer.pt", r"step_4/trainer\.pt is not a complete torch\.save archive"),
        ("meta.json", r"latest names step_4, which is not a complete checkpoint \(no meta\.json\)"),
        ("rng", r"step_4/rng is missing"),
    ],
)
def test_a_damaged_latest_checkpoint_is_refused_at_startup_offering_the_older_one(tmp_path, damage, needle):
    cfg = _cfg(tmp_path)
    _checkpoint(cfg, 2)
    _checkpoint(cfg, 4)
    step = tmp_path / "checkpoints" / "step_4"
    if damage == "trainer.pt":
        (step / damage).write_bytes((step / damage).read_bytes()[:-10])  # cut off, as by a full disk
    elif damage == "meta.json":
        (step / damage).unlink()
    else:
        shutil.rmtree(step / damage)
    with pytest.raises(ConfigError, match=needle) as info:
        plan_run_start(_resume(tmp_path))
    assert "complete checkpoints there: step_2. Resume one of them with resume=true resume.step=<n>" in str(
        info.value
    )
    assert "overwrite" not in str(info.value)
    assert plan_run_start(_resume(tmp_path, "resume.step=2")).start_iteration == 2


def test_a_missing_latest_beside_checkpoints_lists_them_and_never_advises_overwrite(tmp_path):
    cfg = _cfg(tmp_path)
    for step in (2, 4):
        _checkpoint(cfg, step)
    (tmp_path / "checkpoints" / "latest").unlink()
    with pytest.raises(ConfigError) as info:
        plan_run_start(_resume(tmp_path))
    message = str(info.value)
    assert "checkpoints/latest is missing" in message and "step_2, step_4" in message
    assert "resume.step=4" in message and "overwrite" not in message and "without a checkpoint" not in message


def test_resume_step_resumes_an_older_checkpoint_and_points_latest_at_it(tmp_path):
    ctx = DistContext(0, 1, 0, torch.device("cpu"), "none", is_distributed=False)
    cfg = _cfg(tmp_path)
    for step in (2, 4):
        _checkpoint(cfg, step, run_id="abc")
    start = agree_run_start(_resume(tmp_path, "resume.step=2"), ctx)
    assert start.resumed and start.start_iteration == 2 and start.checkpoint.endswith("step_2")
    assert start.run_id == "abc" and "at iteration 2" in start.note
    assert (
        tmp_path / "checkpoints" / "latest"
    ).read_text().strip() == "step_2"  # a later resume continues it
    assert (tmp_path / "checkpoints" / "step_4").is_dir()  # replaced only when the run gets there
    with pytest.raises(ConfigError, match=r"resume\.step=3: .* holds no complete checkpoint .*step_3; "):
        plan_run_start(_resume(tmp_path, "resume.step=3"))


def test_resume_step_needs_resume(tmp_path):
    from digenrl.validation import validate_config

    with pytest.raises(ConfigError, match=r"resume\.step=2 .* is not read: it applies only with resume"):
        validate_config(_cfg(tmp_path, "resume.step=2"))
    with pytest.raises(ConfigError, match=r"resume\.step=-1"):
        validate_config(_resume(tmp_path, "resume.step=-1"))


def test_a_checkpoint_of_before_resume_was_a_section_still_resumes(tmp_path):
    saved = _cfg(tmp_path).to_dict()
    saved["resume"] = False  # how an older version wrote it
    save_checkpoint(tmp_path, 2, {"x": torch.ones(1), "run_id": "r", "config": saved}, rank=0, is_writer=True)
    assert plan_run_start(_resume(tmp_path)).start_iteration == 2


@pytest.mark.parametrize("link", ["checkpoints/step_4", "metrics.jsonl", "events"])
def test_a_run_file_linking_out_of_out_dir_is_refused(tmp_path, link):
    out, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    _checkpoint(_cfg(elsewhere), 4)
    (elsewhere / "metrics.jsonl").write_text('{"iteration": 0}\n')
    (elsewhere / "events").mkdir()
    _checkpoint(_cfg(out), 2)
    (out / link).symlink_to(elsewhere / link)
    with pytest.raises(ConfigError, match=rf"{link} leads to .*elsewhere.* outside the run folder"):
        plan_run_start(_resume(out))


def test_latest_pointing_out_of_out_dir_is_refused(tmp_path):
    out = tmp_path / "run"
    _checkpoint(_cfg(out), 2)
    _checkpoint(_cfg(tmp_path / "elsewhere"), 8)
    (out / "checkpoints" / "latest").write_text("step_8/../../../elsewhere/checkpoints/step_8\n")
    with pytest.raises(
        ConfigError, match=r"not a step directory \(step_<n>\); complete checkpoints there: step_2"
    ):
        plan_run_start(_resume(out))


def test_resuming_with_other_prompts_under_the_same_path_is_refused_naming_both_hashes(tmp_path):
    from digenrl.runtime.run_folder.run_inputs import input_fingerprints

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red fox\na blue bird\n")
    cfg = _cfg(tmp_path / "run", f"data.prompts={prompts}")
    before = input_fingerprints(cfg)
    payload = {"x": torch.ones(1), "run_id": "r", "config": cfg.to_dict(), "inputs": before}
    save_checkpoint(cfg.out_dir, 2, payload, rank=0, is_writer=True)
    prompts.write_text("  a red fox\n\na blue bird  \n")  # the same prompt list as the reader reads it
    assert plan_run_start(_resume(cfg.out_dir, f"data.prompts={prompts}")).resumed
    prompts.write_text("a red fox\na green bird\n")
    with pytest.raises(ConfigError) as info:
        plan_run_start(_resume(cfg.out_dir, f"data.prompts={prompts}"))
    after = input_fingerprints(cfg)["data.prompts"]
    assert (
        f"data.prompts={str(prompts)!r}: its content is {after} now, {before['data.prompts']} in the"
        in str(info.value)
    )
    assert after.startswith("sha256:") and after != before["data.prompts"]


def test_a_weights_directory_fingerprint_sees_other_weights_but_not_a_copy(tmp_path):
    from digenrl.runtime.run_folder.run_inputs import _directory_fingerprint

    weights = tmp_path / "w"
    (weights / "transformer").mkdir(parents=True)
    blob = bytearray(range(256)) * 4096  # 1 MiB: three samples do not cover it
    (weights / "transformer" / "model.safetensors").write_bytes(blob)
    first = _directory_fingerprint(str(weights))
    shutil.copytree(weights, tmp_path / "copy")  # new modification times, same content
    assert _directory_fingerprint(str(tmp_path / "copy")) == first
    blob[10] ^= 1  # other weights of the same shapes: same names and sizes
    (weights / "transformer" / "model.safetensors").write_bytes(blob)
    assert _directory_fingerprint(str(weights)) != first


@pytest.mark.parametrize("value", ["", " "])
def test_an_empty_out_dir_is_refused_naming_the_key(value):
    from digenrl.validation import validate_config

    with pytest.raises(ConfigError, match=r"out_dir='\s*' must name a directory"):
        validate_config(apply_overrides(Config(), {"out_dir": value}))


def test_an_out_dir_that_is_a_file_is_refused_naming_the_key(tmp_path):
    from digenrl.validation import validate_config

    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigError, match=r"out_dir=.*/f' exists and is not a directory"):
        validate_config(_cfg(tmp_path / "f"))
