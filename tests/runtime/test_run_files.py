"""Nothing outside the run folder is written (issue 35, item 1; digenrl/runtime/run_folder/run_files.py): a
symlink, FIFO or folder planted at a file the run writes is refused or replaced, never written through, and
``out_dir`` values that point outside a folder of the run's own are refused at start-up naming the key."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from digenrl.config import ConfigError, load_config
from digenrl.runtime.observe.chrome_trace import merge_chrome_trace
from digenrl.runtime.observe.events import EventLogger
from digenrl.runtime.observe.metrics import METRICS_FILE, MetricsWriter
from digenrl.runtime.observe.sample_grid import write_sample_grid
from digenrl.runtime.run_folder.run_files import UnsafeRunFile, ensure_dir, open_append, write_atomic
from digenrl.runtime.run_folder.run_lock import LOCK_FILE, acquire_run_lock, release_run_locks
from digenrl.trainer.checkpoint import point_latest
from digenrl.validation import check_out_dir, validate_config

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "experiments" / "configs" / "tiny.yaml"


@pytest.fixture
def victim(tmp_path) -> Path:
    """A file outside the run folder that a link planted in it points at."""
    path = tmp_path / "outside" / "precious.txt"
    path.parent.mkdir()
    path.write_text("keep me\n")
    return path


def _plant(where: Path, kind: str, victim: Path) -> None:
    where.parent.mkdir(parents=True, exist_ok=True)
    if kind == "symlink":
        where.symlink_to(victim)
    elif kind == "fifo":
        os.mkfifo(where)
    else:
        where.mkdir()


@pytest.mark.parametrize("kind", ["symlink", "fifo", "dir"])
def test_the_lock_refuses_anything_but_a_regular_file(tmp_path, victim, kind):
    run = tmp_path / "run"
    _plant(run / LOCK_FILE, kind, victim)
    try:
        with pytest.raises(ConfigError, match=r"\.lock is a (symbolic link|FIFO|directory).*Remove it"):
            acquire_run_lock(run)
    finally:
        release_run_locks()
    assert victim.read_text() == "keep me\n"


@pytest.mark.parametrize("planted", [".config.yaml.tmp", "config.yaml"])
def test_atomic_writes_replace_a_planted_link_instead_of_following_it(tmp_path, victim, planted):
    run = tmp_path / "run"
    _plant(run / planted, "symlink", victim)
    write_atomic(run / "config.yaml", "seed: 1\n")
    assert victim.read_text() == "keep me\n"
    assert not (run / "config.yaml").is_symlink()
    assert (run / "config.yaml").read_text() == "seed: 1\n"
    assert not (run / ".config.yaml.tmp").exists()


def test_run_writers_never_write_through_links(tmp_path, victim):
    run = tmp_path / "run"
    run.mkdir()
    for name in (".metrics.jsonl.tmp", ".trace.json.tmp", ".config.yaml.tmp", "trace.json"):
        (run / name).symlink_to(victim)
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / ".latest.tmp").symlink_to(victim)
    (run / METRICS_FILE).write_text('{"iteration": 0}\n{"iteration": 1}\n')
    MetricsWriter(run, is_writer=True, start_iteration=1)  # cuts metrics.jsonl back through its .tmp
    with EventLogger(run, 0, "trainer", clock_origin=0.0) as log, log.span("train", iteration=0):
        pass
    merge_chrome_trace(run)
    point_latest(run, 3)
    assert victim.read_text() == "keep me\n"
    assert json.loads((run / "trace.json").read_text())["traceEvents"]
    assert (run / METRICS_FILE).read_text() == '{"iteration": 0}\n'
    assert (run / "checkpoints" / "latest").read_text() == "step_3\n"


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_appended_logs_refuse_links_and_fifos(tmp_path, victim, kind):
    run = tmp_path / "run"
    _plant(run / METRICS_FILE, kind, victim)
    with pytest.raises(UnsafeRunFile, match=r"metrics\.jsonl is a"):
        open_append(run / METRICS_FILE)
    _plant(run / "events" / "rank0.jsonl", kind, victim)
    with pytest.raises(UnsafeRunFile, match=r"rank0\.jsonl is a"):
        EventLogger(run, 0, "trainer", clock_origin=0.0)
    assert victim.read_text() == "keep me\n"


def test_a_linked_folder_is_refused(tmp_path, victim):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "profile").symlink_to(victim.parent)
    with pytest.raises(UnsafeRunFile, match="profile is a symbolic link"):
        ensure_dir(tmp_path / "run" / "profile")
    (tmp_path / "run" / "samples").symlink_to(victim.parent)
    with pytest.raises(UnsafeRunFile, match="samples is a symbolic link"):
        write_sample_grid(
            tmp_path / "run" / "samples" / "g.png", torch.zeros(1, 3, 8, 8, dtype=torch.uint8), ["p"], [0.0]
        )
    assert sorted(p.name for p in victim.parent.iterdir()) == ["precious.txt"]


@pytest.mark.parametrize(
    ("out_dir", "expected"),
    [
        ("/", "is the file system root"),
        ("~/digenrl-run", "starts with a literal '~'"),
        ("~", "starts with a literal '~'"),
    ],
)
def test_out_dir_outside_a_folder_of_its_own_is_refused(out_dir, expected):
    with pytest.raises(ConfigError, match=f"out_dir=.*{expected}"):
        check_out_dir(out_dir)


def test_out_dir_inside_another_run_is_refused(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("# run_id: abc\nseed: 0\n")
    check_out_dir(str(run / "sub"))  # a resolved config alone may be a copy to start runs from
    (run / "checkpoints").mkdir()
    with pytest.raises(ConfigError, match=r"out_dir=.*another run.*config\.yaml and checkp"):
        validate_config(load_config(TINY, [f"out_dir={run / 'checkpoints' / 'nested'}"]), world_size=2)
    other = tmp_path / "other"
    other.mkdir()
    (other / LOCK_FILE).write_text("")
    check_out_dir(str(other / "sub"))  # a lock alone (pytest's own folders hold one) does not make a run
    (other / METRICS_FILE).write_text("")
    with pytest.raises(ConfigError, match=r"inside the folder of another run.*\.lock and metrics\.jsonl"):
        check_out_dir(str(other / "sub" / "deeper"))
    check_out_dir(str(tmp_path / "fresh"))  # beside them: fine
    check_out_dir(str(run))  # the run folder itself (a resume): fine
