"""metrics.jsonl: one line per iteration (a resume cuts back first), the progress line and the closing
summary in the metrics' own 0-based numbering (with the evaluation's numbers), and the optional TensorBoard
and Weights & Biases mirrors."""

from __future__ import annotations

import importlib.util
import io
import json
import logging

import pytest

from digenrl.runtime.observe.events import EventLogger
from digenrl.runtime.observe.metrics import (
    IMAGE_TAG,
    MetricsWriter,
    open_tensorboard,
    open_wandb,
    progress_line,
    read_metrics,
)
from digenrl.runtime.observe.run_report import closing_summary
from digenrl.runtime.observe.run_report import main as run_report_main


def _record(iteration: int, **extra) -> dict:
    return {
        "iteration": iteration,
        "iterations": 20,
        "policy_version": iteration + 1,
        "reward_mean": 0.5,
        "reward_std": 0.1,
        "loss": 0.0,
        "ratio_mean": 1.0,
        "update_norm": 0.25,
        "samples": 16,
        "samples_per_s": 8.0,
        "wall_s": 2.0,
        **extra,
    }


class FakeSummaryWriter:
    """Stands in for ``torch.utils.tensorboard.SummaryWriter``, which needs the ``tensorboard`` package
    this CPU image does not have: the test checks what MetricsWriter hands to the writer, not TensorBoard."""

    def __init__(self) -> None:
        self.scalars: list[tuple[str, float, int]] = []
        self.images: list[tuple[str, tuple[int, ...], int, str]] = []
        self.flushes = 0
        self.closed = False

    def add_scalar(self, tag: str, scalar_value: float, global_step: int) -> None:
        self.scalars.append((tag, scalar_value, global_step))

    def add_image(self, tag: str, img_tensor, global_step: int, *, dataformats: str) -> None:
        self.images.append((tag, tuple(img_tensor.shape), global_step, dataformats))

    def flush(self) -> None:
        self.flushes += 1

    def close(self) -> None:
        self.closed = True


def test_a_resumed_writer_cuts_the_file_back_to_its_start_iteration(tmp_path):
    writer = MetricsWriter(tmp_path, is_writer=True, stream=io.StringIO(), run_id="run-a")
    for k in range(4):
        writer.log(_record(k))
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"iteration": 4, "rew')  # the writer was killed mid-line
    assert [r["iteration"] for r in read_metrics(tmp_path)] == [0, 1, 2, 3]  # a torn last line is dropped

    resumed = MetricsWriter(tmp_path, is_writer=True, stream=io.StringIO(), start_iteration=2, run_id="run-a")
    assert [r["iteration"] for r in read_metrics(tmp_path)] == [0, 1]
    resumed.log(_record(2, reward_mean=0.75))
    records = read_metrics(tmp_path)
    assert [r["iteration"] for r in records] == [0, 1, 2]
    assert records[2]["reward_mean"] == 0.75 and {r["run_id"] for r in records} == {"run-a"}
    assert not list(tmp_path.glob(".*tmp"))  # the cut went through a temporary file that replaced it


def test_a_fresh_writer_empties_the_file_and_other_ranks_never_touch_it(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps(_record(0)) + "\n")
    MetricsWriter(tmp_path, is_writer=False, start_iteration=0).log(_record(5))
    assert len(read_metrics(tmp_path)) == 1
    MetricsWriter(tmp_path, is_writer=True, stream=io.StringIO())
    assert read_metrics(tmp_path) == []


def test_progress_line_and_summary_use_the_metrics_numbering(tmp_path):
    assert progress_line(_record(0)).startswith("[digenrl] iteration 0 (1/20) v1 reward +0.5000")
    assert progress_line({**_record(19), "iterations": None}).startswith("[digenrl] iteration 19 v20")
    assert progress_line(_record(3, nonfinite_skipped=1.0)).endswith("NON-FINITE STEP SKIPPED")
    with EventLogger(tmp_path, 0, "colocated", 0.0) as events:  # the summary's bound reads the logs
        for k in range(3, 8):
            events.record_span("optimizer", k, k + 1.0, iteration=k)
    records = [_record(k, busy_fraction={"colocated": 0.5}) for k in range(3, 6)]
    records[1]["nonfinite_skipped"] = 1.0
    summary = closing_summary(records, tmp_path)
    assert "done: 3 iteration(s) (iterations 3-5)" in summary
    assert "over iterations 4-5" in summary
    assert "non-finite updates skipped (trainer.nonfinite=skip) at iterations 4" in summary
    assert "over iteration 7" in closing_summary([_record(7)], tmp_path)


def test_the_run_report_rebuilds_the_trace_of_a_crashed_run_and_leaves_the_metrics(tmp_path, capsys):
    """A run that died before its end merged nothing: ``python -m digenrl.runtime.observe.run_report OUT_DIR``
    rebuilds ``trace.json`` from the ranks' logs and prints the summary of every logged iteration."""
    writer = MetricsWriter(tmp_path, is_writer=True, stream=io.StringIO(), run_id="run-a")
    for rank, role in ((0, "trainer"), (1, "generator")):
        with EventLogger(tmp_path, rank, role, 0.0) as events:
            for k in range(3):
                events.record_span(("train", "generate")[rank], k, k + 0.5 / (rank + 1), iteration=k)
    for k in range(3):
        writer.log(_record(k))
    metrics = (tmp_path / "metrics.jsonl").read_text()
    assert not (tmp_path / "trace.json").exists()

    assert run_report_main([str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert (
        "done: 3 iteration(s) (iterations 0-2)" in printed
        and "busy fraction: generator 50%, trainer 100%" in printed
    )
    trace = json.loads((tmp_path / "trace.json").read_text())
    spans = [(e["pid"], e["args"]["iteration"]) for e in trace["traceEvents"] if e["ph"] == "X"]
    assert sorted(spans) == [(rank, k) for rank in (0, 1) for k in range(3)]
    assert (tmp_path / "metrics.jsonl").read_text() == metrics  # only read: a job may still append

    assert run_report_main([str(tmp_path / "nothing")]) == 2
    assert "holds no event logs" in capsys.readouterr().err


def test_records_are_mirrored_to_an_injected_tensorboard_writer(tmp_path):
    fake = FakeSummaryWriter()
    writer = MetricsWriter(tmp_path, is_writer=True, stream=io.StringIO(), tensorboard=fake)
    writer.log(_record(0))
    writer.log(_record(1, grad_norm=float("nan"), busy_fraction={"x": 1.0}, flag=True))
    by_tag = {(tag, step): value for tag, value, step in fake.scalars}
    assert by_tag[("reward_mean", 1)] == 0.5 and by_tag[("update_norm", 0)] == 0.25
    assert ("grad_norm", 1) not in by_tag  # non-finite values are dropped, as in metrics.jsonl (null)
    assert not any(tag in ("iteration", "busy_fraction", "flag") for tag, _, _ in fake.scalars)
    assert fake.flushes == 2
    writer.close()
    assert fake.closed
    assert not MetricsWriter(tmp_path, is_writer=False, tensorboard=FakeSummaryWriter()).tensorboard


def test_open_tensorboard_is_a_logged_no_op_without_the_package(tmp_path, caplog):
    installed = importlib.util.find_spec("tensorboard") is not None
    with caplog.at_level(logging.INFO, logger="digenrl.runtime.observe.metrics"):
        writer = open_tensorboard(tmp_path, start_iteration=3)
    if installed:  # a machine with TensorBoard gets a real writer on out_dir/tensorboard
        assert writer is not None and (tmp_path / "tensorboard").is_dir()
        writer.close()
        return
    assert writer is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "TensorBoard not installed" in lines[0]
    assert not (tmp_path / "tensorboard").exists()


def test_a_damaged_line_is_skipped_with_its_line_number(tmp_path, caplog):
    """Issue 35, item 4: a bad line costs that line, named by number, never the run."""
    (tmp_path / "metrics.jsonl").write_bytes(
        b'{"iteration": 0}\nnot json\n{"iteration": 1}\n\xff\xfe\n[1, 2]\n'
        b'{"iteration": "3"}\n{"iteration": 4}\n'
    )
    with caplog.at_level("WARNING"):
        assert [r["iteration"] for r in read_metrics(tmp_path)] == [0, 1, 4]
    (message,) = [r.getMessage() for r in caplog.records if "metrics.jsonl" in r.getMessage()]
    assert "skipped 4 damaged line(s), kept 3 records" in message
    for number in (2, 4, 5, 6):
        assert f"line {number}:" in message
    assert "iteration='3' is not an integer" in message


EVAL = {"eval_policy_version": 0, "eval_reward_mean": 0.25, "eval_reward_std": 0.125, "eval_samples": 4}


def _grid(tmp_path):
    import torch

    from digenrl.runtime.observe.sample_grid import grid_path, write_sample_grid

    images = torch.zeros(2, 3, 8, 8, dtype=torch.uint8)
    return write_sample_grid(grid_path(tmp_path, 0), images, ["a", "b"], [0.25, 0.25])


def test_an_evaluation_shows_in_the_progress_line_the_summary_and_tensorboard(tmp_path):
    assert progress_line(_record(0, **EVAL)).endswith(" | eval v0 +0.2500±0.1250")
    assert " | eval" not in progress_line(_record(1))
    assert progress_line(_record(2, **{**EVAL, "eval_reward_mean": None})).endswith("eval v0 non-finite")
    fake = FakeSummaryWriter()
    writer = MetricsWriter(tmp_path, is_writer=True, stream=io.StringIO(), tensorboard=fake)
    writer.log(_record(0, **EVAL), image=_grid(tmp_path))
    writer.log(_record(1))
    writer.log(_record(2, **{**EVAL, "eval_policy_version": 3, "eval_reward_mean": 0.5}))
    (tag, shape, step, formats) = fake.images[0]
    assert len(fake.images) == 1 and (tag, step, formats) == (IMAGE_TAG, 0, "HWC") and shape[2] == 3
    assert ("eval_reward_mean", 0.25, 0) in fake.scalars
    with EventLogger(tmp_path, 0, "colocated", 0.0) as events:  # the summary's bound reads the logs
        events.record_span("optimizer", 0.0, 1.0, iteration=0)
    summary = closing_summary(read_metrics(tmp_path), tmp_path)
    assert (
        "eval reward on held-out prompts: +0.2500 (policy v0) -> +0.5000 (policy v3) (2 evaluation(s)"
        in summary
    )


@pytest.mark.needs("wandb")
def test_wandb_offline_receives_the_metrics_and_the_grid(tmp_path, monkeypatch):
    from digenrl.config import LoggerConfig

    monkeypatch.setenv("WANDB_SILENT", "true")
    run = open_wandb(LoggerConfig(wandb=True, wandb_mode="offline"), tmp_path, "run-w", {"seed": 0})
    writer = MetricsWriter(tmp_path, is_writer=True, stream=io.StringIO(), wandb=run)
    writer.log(_record(0, **EVAL), image=_grid(tmp_path))
    writer.close()
    assert writer.wandb is None
    assert any((tmp_path / "wandb").glob("offline-run-*run-w*")), list((tmp_path / "wandb").iterdir())


def test_wandb_is_neither_imported_nor_opened_unless_asked(tmp_path):
    """In a fresh process (another test may have imported wandb here): a writer with the default logger
    settings logs without importing wandb or writing out_dir/wandb."""
    import subprocess
    import sys

    code = (
        "import io, sys\n"
        "from digenrl.config import LoggerConfig\n"
        "from digenrl.runtime.observe.metrics import MetricsWriter, open_wandb\n"
        f"out = {str(tmp_path)!r}\n"
        "run = open_wandb(LoggerConfig(), out, 'run-x', {})\n"
        "writer = MetricsWriter(out, is_writer=True, stream=io.StringIO(), wandb=run)\n"
        f"writer.log({_record(0, **EVAL)!r})\n"
        "writer.close()\n"
        "assert run is None and 'wandb' not in sys.modules, sorted(m for m in sys.modules if 'wandb' in m)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert (tmp_path / "metrics.jsonl").is_file() and not (tmp_path / "wandb").exists()
