"""The device scripts' summaries (experiments/gpu/loops_summary.py) read the committed H200 runs as the
results READMEs quote them."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest

from experiments.gpu import loops_summary

LOOPS = Path(__file__).resolve().parents[2] / "experiments" / "results" / "gpu" / "loops"


def test_a_profiled_iteration_is_left_out_of_the_medians_and_its_profile_kept():
    run = LOOPS / "runs" / "flux"  # 4 iterations, iteration 3 under the kernel profiler
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("profiled", False) for r in records] == [False, False, False, True]
    row = loops_summary.summarise_run(run)
    assert row["samples_per_s"] == pytest.approx(
        statistics.median(r["samples_per_s"] for r in records[1:3]), abs=1e-4
    )
    assert row["samples_per_s"] > records[3]["samples_per_s"]  # the profiled one was slower
    train = row["profile"]["phases"]["train"]
    assert train["wall_s"] > train["device_busy_s"] > 0 and "matmul" in train["busy_by_kind_s"]


def test_the_summary_table_carries_each_profiled_runs_kernel_tables(tmp_path):
    runs = tmp_path / "runs"
    for name in ("flux", "flux-mb8"):
        shutil.copytree(LOOPS / "runs" / name, runs / name)
    assert loops_summary.main([str(runs), "--out", str(tmp_path / "out")]) == 0
    rows = {r["run"]: r for r in json.loads((tmp_path / "out" / "summary.json").read_text())}
    assert rows["flux-mb8"]["profile"] is None and rows["flux"]["profile"] is not None
    assert rows["flux-mb8"]["samples_per_s"] > rows["flux"]["samples_per_s"]  # micro-batch 8 vs 2
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "## flux: kernel profile" in md and "| train |" in md and "## flux-mb8: kernel profile" not in md


def test_every_row_names_the_hardware_command_and_date_of_its_call(tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(LOOPS / "h100-round2" / "runs" / "sd35-profile", runs / "sd35-profile")
    argv = [str(runs), "--out", str(tmp_path / "out"), "--hardware", "NVIDIA H100 80GB HBM3"]
    assert loops_summary.main([*argv, "--command", "ONLY=x bash s.sh", "--date", "2026-12-07"]) == 0
    (row,) = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (row["hardware"], row["command"], row["date"]) == (
        "NVIDIA H100 80GB HBM3",
        "ONLY=x bash s.sh",
        "2026-12-07",
    )
    assert row["samples_per_s"] == pytest.approx(2.9418, abs=1e-4)  # the H100 row the README quotes


def test_a_run_keeps_the_command_of_its_own_call_in_a_later_calls_summary(tmp_path):
    # a warm device keeps earlier calls' runs: the later call's summary must not stamp its command on them
    runs = tmp_path / "runs"
    for name in ("qwen-mb8-ckpt", "qwen-mb8-ckpt-mask"):
        shutil.copytree(LOOPS / "h100-round4" / "runs" / name, runs / name)
    (runs / "qwen-mb8-ckpt-mask" / "loop.json").write_text('{"config": "c.yaml"}')  # a run from before
    out = str(tmp_path / "out")
    argv = [str(runs), "--out", out, "--hardware", "GPU of the call", "--date", "2027-01-01"]
    assert loops_summary.main([*argv, "--command", "ONLY=later bash s.sh"]) == 0
    rows = {r["run"]: r for r in json.loads((tmp_path / "out" / "summary.json").read_text())}
    own = rows["qwen-mb8-ckpt"]
    assert own["command"].startswith('ONLY="qwen-mb8-ckpt" DEADLINE_S=565 bash experiments/gpu/h200_loops.sh')
    assert (own["hardware"], own["date"]) == ("NVIDIA H100 80GB HBM3", "2026-12-07")
    before = rows["qwen-mb8-ckpt-mask"]
    assert (before["command"], before["hardware"], before["date"]) == (
        "ONLY=later bash s.sh",
        "GPU of the call",
        "2027-01-01",
    )
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "Command: `ONLY=later bash s.sh` (GPU of the call, 2027-01-01): qwen-mb8-ckpt-mask\n" in md
    assert ": qwen-mb8-ckpt\n" in md and own["command"] in md


def test_a_run_that_finished_no_iteration_says_so_and_rows_count_their_steady_iterations(tmp_path):
    # round 4's FLUX.1-dev run ran out of memory in iteration 0; the Qwen row's median is one iteration
    runs = tmp_path / "runs"
    for name in ("flux", "qwen-mb8-ckpt"):
        shutil.copytree(LOOPS / "h100-round4" / "runs" / name, runs / name)
    assert loops_summary.main([str(runs), "--out", str(tmp_path / "out")]) == 0
    rows = {r["run"]: r for r in json.loads((tmp_path / "out" / "summary.json").read_text())}
    assert (
        rows["flux"]["status"].startswith("no iteration finished") and rows["flux"]["samples_per_s"] is None
    )
    assert (rows["qwen-mb8-ckpt"]["status"], rows["qwen-mb8-ckpt"]["steady_iterations"]) == ("ok", 1)
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "| no iteration finished (the call's log says why) |" in md and "| 3 (1) |" in md


@pytest.mark.parametrize(
    ("cfg", "path"),
    [
        ({"model": {"dtype": "bfloat16"}}, "compiled+autocast"),
        ({"model": {"dtype": "bfloat16", "compile_vae": True}}, "compiled+autocast, VAE compiled"),
        (
            {"system": "colocated-overlap", "model": {"dtype": "bfloat16"}},
            "colocated-overlap: compiled+autocast",
        ),
        (
            {
                "system": "colocated-overlap",
                "model": {"dtype": "bfloat16"},
                "runtime": {"score_stream": False},
            },
            "colocated-overlap: compiled+autocast, scored on the default stream",
        ),
        (
            {"model": {"name": "qwen-image", "text_padding": "mask", "compile": False}},
            "eager, text padded + masked",
        ),
    ],
)
def test_the_path_names_what_separates_two_rows_of_one_call(cfg, path):
    """The rows of issue 37's pairs (sd35 / sd35-vae, sd35-overlap / -nostream, qwen / qwen-mask) must
    differ in their path, or the table cannot tell them apart."""
    assert loops_summary.code_path(cfg) == path


def test_a_profile_with_idle_gaps_carries_their_causes_into_the_summary(tmp_path):
    # profiles written since the idle-gap table (digenrl/runtime/observe/idle_gaps.py) name the idle's causes
    run = tmp_path / "runs" / "flux"
    shutil.copytree(LOOPS / "runs" / "flux", run)
    profile = json.loads((run / "profile" / "rank0.json").read_text())
    profile["phases"]["train"] |= {
        "idle_gaps": {
            "count": 3,
            "seconds": 0.5,
            "min_gap_us": 20.0,
            "short_gaps_seconds": 0.01,
            "causes": [
                {
                    "name": "after cudaStreamSynchronize in aten::_local_scalar_dense",
                    "seconds": 0.4,
                    "count": 2,
                },
                {"name": "python (between operators)", "seconds": 0.1, "count": 1},
            ],
        },
        "host_syncs": {"count": 2, "seconds": 0.3, "where": []},
    }
    (run / "profile" / "rank0.json").write_text(json.dumps(profile))
    phases = loops_summary.summarise_run(run)["profile"]["phases"]
    assert phases["train"]["idle_causes_s"] == {
        "after cudaStreamSynchronize in aten::_local_scalar_dense": 0.4,
        "python (between operators)": 0.1,
    }
    assert phases["train"]["host_syncs"] == 2
    assert "idle_causes_s" not in phases["generate"]  # a profile from before the table: no such keys
