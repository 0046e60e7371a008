"""``run_train.py --help`` lists every config key with its default and one line; ``--print-config`` prints
the validated config; a resume needs only the run folder (digenrl/runtime/launch/knob_help.py,
digenrl/launch.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from digenrl.config import Config, ConfigError, declared_fields, load_config
from digenrl.launch import main, parse_args, run_folder_config
from digenrl.runtime.launch.knob_help import UNCOMMENTED, _comments, knob_lines

TINY = Path(__file__).resolve().parents[2] / "experiments" / "configs" / "tiny.yaml"


def test_help_lists_every_key_with_its_default_and_a_line(capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(["--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    lines = {line.split()[0]: line for line in knob_lines()}
    for key, default, _ in declared_fields(Config()):
        shown = repr(default) if isinstance(default, str) else str(default)
        assert key in lines and f"{key} = {shown}" in lines[key], key
        description = lines[key].split(f"{key} = {shown}", 1)[1].strip()
        assert len(description) >= 5, (key, description)
        assert lines[key] in text
    assert "--print-config" in text and "--resume RUN_DIR" in text


def test_the_fallback_table_names_only_existing_keys_without_a_comment():
    keys = {key for key, _, _ in declared_fields(Config())}
    comments = _comments()
    assert set(UNCOMMENTED) <= keys
    assert not set(UNCOMMENTED) & set(comments), "a commented key needs no fallback line"
    assert comments["algo.mix_window"].startswith("MixGRPO")


def test_print_config_prints_the_validated_config_and_exits(capsys):
    assert main(["--config", str(TINY), "--print-config", "algo=mixgrpo", "algo.mix_window=3"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed == load_config(TINY, ["algo=mixgrpo", "algo.mix_window=3"]).to_dict()
    assert printed["algo"]["name"] == "mixgrpo" and printed["algo"]["mix_window"] == 3
    # a GPU config prints on a machine without GPUs: validated against its own world, not this machine
    eight = ["profile=h200-8", "system=colocated-sync"]
    assert main(["--config", str(TINY), "--print-config", *eight]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == load_config(TINY, eight).to_dict()
    # a bad knob is the usual startup error, not a printed config
    assert main(["--config", str(TINY), "--print-config", "algo.mix_window=3"]) == 2
    assert "algo.mix_window=3" in capsys.readouterr().err


def test_a_resume_reads_the_run_folders_saved_config(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("# run_id: abc\nseed: 5\n")
    assert run_folder_config(None, ["iterations=9"], str(run)) == (
        str(run / "config.yaml"),
        [f"out_dir={run}", "resume=true", "iterations=9"],
    )
    assert run_folder_config(None, ["resume=true", f"out_dir={run}"], None)[0] == str(run / "config.yaml")
    assert run_folder_config(None, ["resume.enabled=true", f"out_dir={run}"], None)[0] == str(
        run / "config.yaml"
    )
    assert run_folder_config(None, [f"out_dir={run}"], None)[0] is None  # not a resume: the defaults
    assert run_folder_config("x.yaml", ["resume=true", f"out_dir={run}"], None)[0] == "x.yaml"
    with pytest.raises(SystemExit, match="drop --config"):
        run_folder_config("x.yaml", [], str(run))
    with pytest.raises(SystemExit, match="not a run folder"):
        run_folder_config(None, [], str(tmp_path / "missing"))
    cfg = load_config(*run_folder_config(None, [], str(run)))
    assert cfg.seed == 5 and cfg.resume.enabled and cfg.out_dir == str(run)
    with pytest.raises(ConfigError):
        load_config(*run_folder_config(None, ["algo.nope=1"], str(run)))
