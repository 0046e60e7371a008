"""Smoke test of the generator benchmark (``experiments/measure.py generator``) on the tiny CPU models (no
timing assertions)."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def bench():
    from digenrl.perf import bench_generator

    return bench_generator


def test_bench_writes_json_with_flops_linear_in_batch(bench, tmp_path, capsys):
    out = tmp_path / "bench.json"
    args = ["--batch-sizes", "1,2", "--iters", "1", "--warmup", "0", "--device", "cpu", "--out", str(out)]
    assert bench.main(args) == 0  # --device cpu: on a GPU machine "auto" would pick CUDA
    report = json.loads(out.read_text())
    assert report["model"] == "tiny-sd3" and report["device"] == "cpu"
    rows = {(r["batch_size"], r["cfg"]): r for r in report["results"]}
    assert set(rows) == {(1, False), (1, True), (2, False), (2, True)}
    assert rows[(1, True)]["model_batch"] == 2
    # same forward batch -> same FLOPs; FLOPs grow linearly with the forward batch
    assert rows[(1, True)]["flops_per_step"] == rows[(2, False)]["flops_per_step"]
    assert rows[(2, True)]["flops_per_step"] == 2 * rows[(2, False)]["flops_per_step"]
    assert all(r["ms_per_step"] > 0 and r["samples_per_s"] > 0 for r in rows.values())
    assert "ms/step" in capsys.readouterr().out


def test_bench_skips_cfg_for_guidance_embedded_models(bench):
    report = bench.run(
        bench.parse_args(["--model", "tiny-flux", "--batch-sizes", "1", "--iters", "1", "--no-flops"])
    )
    cfg_rows = [r for r in report["results"] if r["cfg"]]
    assert len(cfg_rows) == 1 and "skipped" in cfg_rows[0]


def test_bench_rejects_bad_batch_sizes(bench):
    with pytest.raises(SystemExit):
        bench.parse_args(["--batch-sizes", "0,2"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--batch-sizes", "a"])


@pytest.mark.needs("torchao")
def test_bench_fp8_path_reports_its_layers_and_its_agreement_with_the_16bit_model(bench, tmp_path):
    args = ["--fp8", "--batch-sizes", "1", "--cfg", "on", "--iters", "1", "--warmup", "0", "--no-flops"]
    report = bench.run(bench.parse_args([*args, "--device", "cpu", "--dtype", "bfloat16"]))
    assert report["paths"]["optimized"]["fp8_layers"] > 0
    agreement = report["agreement"]
    # FP8 changes the log-probs (the layers did convert) by far less than the check's tolerance
    assert 0 < agreement["max_abs_delta_logp"] < agreement["tolerance"], agreement
    assert "FP8 in" in bench.format_markdown(report)
