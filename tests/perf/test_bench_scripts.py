"""The performance scripts run on the tiny CPU models and write valid, self-consistent JSON (no timing
assertions: timings on a shared CPU mean nothing)."""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path

import pytest
import torch

from digenrl.costs.cost_model import CostModel, cost_path
from digenrl.perf import backward_check, logprob_agreement, roofline

MODULES = {
    "bench_generator": "digenrl.perf.bench_generator",
    "bench_trainer": "digenrl.perf.bench_trainer",
    "emit_costs": "digenrl.perf.emit_costs",
}


def _load(name: str):
    """The benchmark modules behind ``experiments/measure.py generator|trainer|emit``."""
    return importlib.import_module(MODULES[name])


@pytest.fixture(scope="module")
def generator():
    return _load("bench_generator")


@pytest.fixture(scope="module")
def trainer():
    return _load("bench_trainer")


@pytest.mark.parametrize("name", ["bench_generator", "bench_trainer", "emit_costs"])
def test_help(name, capsys):
    with pytest.raises(SystemExit) as exit_:
        _load(name).main(["--help"])
    assert exit_.value.code == 0 and "usage" in capsys.readouterr().out


def test_backward_check_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        backward_check.main(["--help"])
    assert exit_.value.code == 0 and "--setting" in capsys.readouterr().out


@pytest.fixture(scope="module")
def bench_outputs(generator, trainer, tmp_path_factory):
    out = tmp_path_factory.mktemp("perf")
    common = ["--device", "cpu", "--iters", "1", "--warmup", "0", "--threads", "1", "--ceiling-size", "64"]
    assert generator.main(["--model", "tiny-sd3", "--batch-sizes", "1,2", *common, "--out", str(out)]) == 0
    trainer_args = [
        "--model", "tiny-sd3", "--modes", "lora", "--micro-batch-sizes", "1,2", "--samples", "2",
        "--train-steps", "1", "--cfg-grad", "cond,both", "--cfg-split-min-batch", "2",
    ]  # fmt: skip
    assert trainer.main([*trainer_args, *common, "--out", str(out)]) == 0
    return out


def test_generator_json_side_by_side(bench_outputs):
    report = json.loads((bench_outputs / "generator-tiny-sd3.json").read_text())
    rows = [r for r in report["results"] if "ms_per_step" in r]
    assert {(r["path"], r["batch_size"], r["cfg"]) for r in rows} == {
        (p, b, c) for p in ("eager", "optimized") for b in (1, 2) for c in (False, True)
    }
    by_key = {(r["path"], r["batch_size"], r["cfg"]): r for r in rows}
    for (_, batch, cfg), r in by_key.items():
        assert r["model_batch"] == (2 * batch if cfg else batch)
        assert r["flops_per_step"] == by_key[("eager", batch, cfg)]["flops_per_step"]
        assert math.isclose(r["tflops_per_s"], r["flops_per_step"] / r["ms_per_step"] * 1e3 / 1e12)
        assert math.isclose(r["fraction_of_ceiling"], r["tflops_per_s"] / report["ceiling"]["tflops"])
    flops = {(b, c): by_key[("eager", b, c)]["flops_per_step"] for b in (1, 2) for c in (False, True)}
    assert flops[(1, True)] == flops[(2, False)] and flops[(2, True)] == 2 * flops[(2, False)]  # CFG: 2B
    assert report["ceiling"]["n"] == 64 and report["ceiling"]["tflops"] > 0
    assert report["paths"]["optimized"]["attention"]["backend"] == "native"
    # no compile, same kernels: the optimised path recomputes the eager trajectory exactly
    agreement = report["agreement"]
    assert agreement["pass"] and agreement["max_abs_ratio_minus_1"] == 0.0 and agreement["cfg"]
    table = (bench_outputs / "generator-tiny-sd3.md").read_text()
    assert "| eager ms | opt ms |" in table and "log-prob agreement" in table


def test_generator_needs_backward_picks_attention_as_a_run_does(generator):
    """--needs-backward: the optimised path chooses attention as every rank of a run does (each shares its
    process with training, digenrl/systems/components.py), so the step times the kernels a rollout runs;
    without it the forward-only choice. The choice is in the report, which the cost file's meta keeps."""
    common = ["--model", "tiny-sd3", "--batch-sizes", "1", "--cfg", "off", "--paths", "optimized"]
    common += ["--device", "cpu", "--iters", "1", "--warmup", "0", "--no-flops", "--ceiling-size", "0"]
    for flag, needs_backward in (([], False), (["--needs-backward"], True)):
        report = generator.run(generator.parse_args([*common, *flag]))
        assert report["paths"]["optimized"]["attention"]["needs_backward"] is needs_backward
        assert [r["batch_size"] for r in report["results"] if "ms_per_step" in r] == [1]


def test_trainer_json_and_cost_file(bench_outputs, tmp_path):
    report = json.loads((bench_outputs / "trainer-tiny-sd3.json").read_text())
    rows = [r for r in report["results"] if "ms_per_unit" in r]
    assert {(r["path"], r["micro_batch_size"], r["cfg_grad"]) for r in rows} == {
        (p, m, g) for p in ("eager", "optimized") for m in (1, 2) for g in ("cond", "both")
    }
    for r in rows:
        assert r["cfg"] and r["units"] == 2
        assert math.isclose(r["micro_batch_ms"], r["accumulate_ms"] * r["micro_batch_size"] / 2)
        assert r["max_abs_ratio_minus_1"] < 1e-4  # on-policy, fp32: the recompute equals the rollout
        assert r["flops_per_batch"] > 0
        # --cfg-split-min-batch 2: cond splits the unconditional pass off at micro-batch 2, not at 1
        split = r["cfg_grad"] == "cond" and r["micro_batch_size"] == 2
        assert r["uncond_pass"] == ("separate" if split else "batched")
    flops = {(r["micro_batch_size"], r["cfg_grad"]): r["flops_per_batch"] for r in rows}
    assert flops[(1, "cond")] == flops[(1, "both")] == flops[(2, "both")]  # detaching saves no FLOPs
    assert flops[(2, "cond")] < 0.8 * flops[(2, "both")]  # no backward through the unconditional half
    table = (bench_outputs / "trainer-tiny-sd3.md").read_text()
    assert "| on, cond (separate) | 2 |" in table
    assert "cond (unconditional prediction detached) vs both" in table
    costs = report["costs"]["lora/optimized"]
    assert costs["weight_sync_bytes"] == costs["grad_bytes"] > 0
    assert costs["fragment_bytes_per_sample"] > costs["cond_bytes_per_sample"] > 0

    emit = _load("emit_costs")
    argv = [
        "--generator", str(bench_outputs / "generator-tiny-sd3.json"),
        "--trainer", str(bench_outputs / "trainer-tiny-sd3.json"),
        "--device-name", "cpu-test", "--device", "cpu", "--iters", "1", "--warmup", "0",
        "--out-dir", str(tmp_path),
    ]  # fmt: skip
    assert emit.main(argv) == 0
    model = CostModel.load(cost_path("cpu-test", "tiny-sd3", tmp_path))
    gen = {(r["batch_size"], r["cfg"]): r["ms_per_step"] for r in rows_of(bench_outputs, "optimized")}
    assert model.generator_step_points["cfg"][2] == pytest.approx(gen[(2, True)] / 1e3)
    assert model.meta["cfg_grad"] == "cond" and model.meta["cfg_split_min_batch"] == 2
    assert model.train_points["cfg"][2] == pytest.approx(
        next(
            r["micro_batch_ms"]
            for r in rows
            if r["path"] == "optimized" and r["micro_batch_size"] == 2 and r["cfg_grad"] == "cond"
        )
        / 1e3
    )
    assert model.weight_sync_bytes == costs["weight_sync_bytes"]
    assert model.path == "eager" and model.meta["generator_path"] == "eager"  # no --compile: nothing compiled
    assert model.text_encoder_bytes > 0 and model.vae_param_bytes > 0
    assert model.meta["grad_park_s"] > 0  # what tag.park_grads=true adds to a switch, kept apart
    # a path the benchmarks did not run is missing, never filled from another path
    with pytest.raises(ValueError, match="no timed rows"):
        emit.generator_points({"results": rows_of(bench_outputs, "eager")}, "optimized")


def test_emit_costs_times_the_compiled_decode_when_asked(bench_outputs, tmp_path, monkeypatch, capsys):
    """--compile-vae: the decode is timed with the decoder compiled (model.compile_vae=true's path), which
    meta.vae_decode records; dynamo alone (backend eager) here, inductor's compile being a device matter."""
    import digenrl.models.optimize as optimize

    compiled, real = [], optimize.compile_vae_decoder

    def compile_for_test(decoder, settings=None):
        compiled.append(decoder)
        return real(decoder, optimize.CompileSettings(backend="eager"))

    monkeypatch.setattr(optimize, "compile_vae_decoder", compile_for_test)
    emit = _load("emit_costs")
    argv = [
        "--generator", str(bench_outputs / "generator-tiny-sd3.json"),
        "--trainer", str(bench_outputs / "trainer-tiny-sd3.json"),
        "--device-name", "cpu-vae", "--device", "cpu", "--iters", "1", "--out-dir", str(tmp_path),
    ]  # fmt: skip
    assert emit.main([*argv, "--compile-vae", "--warmup", "1"]) == 0
    assert len(compiled) == 1 and compiled[0].vae.decoder._compiled_call_impl is not None
    model = CostModel.load(cost_path("cpu-vae", "tiny-sd3", tmp_path))
    assert model.meta["vae_decode"] == "compiled" and set(model.vae_decode_points) == {1, 2}
    for bad, message in [
        (["--compile-vae", "--warmup", "0"], "needs --warmup >= 1"),
        (["--compile-vae", "--score-from", str(cost_path("cpu-vae", "tiny-sd3", tmp_path))], "--score-from"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            emit.main([*argv, *bad])
        assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_emit_costs_takes_the_train_points_of_one_cfg_grad():
    emit = _load("emit_costs")

    def row(ms, mbs=1, **extra):
        return {"path": "optimized", "mode": "lora", "cfg": True, "micro_batch_size": mbs,
                "micro_batch_ms": ms, "optimizer_step_ms": 1.0, **extra}  # fmt: skip

    report = {"results": [row(10.0, cfg_grad="both"), row(7.0, cfg_grad="cond"), {**row(3.0), "cfg": False}]}
    assert emit.trainer_points(report, "lora", "optimized", "cond")[0] == {
        "cfg": {1: 0.007},
        "no_cfg": {1: 0.003},
    }
    assert emit.trainer_points(report, "lora", "optimized", "both")[0]["cfg"] == {1: 0.01}
    legacy = {"results": [row(10.0)]}  # a benchmark from before cfg_grad: the full gradient
    assert emit.trainer_points(legacy, "lora", "optimized", "both")[0] == {"cfg": {1: 0.01}}
    with pytest.raises(ValueError, match="--cfg-grad both"):
        emit.trainer_points(legacy, "lora", "optimized", "cond")


def test_regression_verdicts_read_the_known_bad_table(trainer):
    bad = {"torch": "2.11.0+cu130", "cudnn": 91900, "device": "cuda:0"}
    assert trainer.regression_verdict({**bad, "setting": "default", "passed": False}) == (
        "known-bad combination reproduces"
    )
    assert "stale" in trainer.regression_verdict({**bad, "setting": "cudnn", "passed": True})
    fine = {"torch": "2.9.1", "cudnn": 91002, "device": "cuda"}
    assert "NOT LISTED" in trainer.regression_verdict({**fine, "setting": "default", "passed": False})
    assert trainer.regression_verdict({**fine, "setting": "default", "passed": True}) == "not listed, passes"
    assert "FAILS" in trainer.regression_verdict({"setting": "safe", "passed": False})
    assert "not applicable" in trainer.regression_verdict({**fine, "device": "cpu", "setting": "cudnn"})
    # a verified shape (SD3.5-medium: head dim 64, no mask) is not listed; FLUX's shape still is
    sd35 = {**bad, "setting": "cudnn", "passed": True, "attention_shape": {"head_dim": 64, "masked": False}}
    assert trainer.regression_verdict(sd35) == "not listed, passes"
    flux = {**sd35, "attention_shape": {"head_dim": 128, "masked": False}}
    assert "stale" in trainer.regression_verdict(flux)
    assert "reference" in trainer.regression_verdict({**bad, "setting": "no-cudnn", "passed": True})


def rows_of(out: Path, path: str) -> list[dict]:
    report = json.loads((out / "generator-tiny-sd3.json").read_text())
    return [r for r in report["results"] if r["path"] == path and "ms_per_step" in r]


@pytest.mark.slow  # a fresh Python process imports torch + diffusers and runs a FLUX slice backward
def test_backward_check_in_a_subprocess_reports_pass_and_fail():
    ok = backward_check.run_in_subprocess(
        "tiny-flux", setting="safe", double=1, single=1, heights=(32,), device="cpu", dtype="float32",
        timeout_s=120,
    )  # fmt: skip
    assert ok["passed"] and ok["runs"][0]["finite"] and ok["blocks"] == {"double": 1, "single": 1}
    # cuDNN attention cannot run on a CPU: the failure is reported, not raised
    bad = backward_check.check_backward("tiny-flux", setting="cudnn", heights=(32,), device="cpu")
    assert not bad["passed"] and "error" in bad["runs"][0]


def test_sliced_spec_keeps_width_and_cuts_depth():
    spec = backward_check.sliced_spec("sd3.5-medium", double=2, single=2)
    cfg = spec.transformer_config
    assert cfg["num_layers"] == 2 and cfg["dual_attention_layers"] == [0, 1]
    assert cfg["num_attention_heads"] == 24 and cfg["attention_head_dim"] == 64
    flux = backward_check.sliced_spec("flux.1-dev", double=2, single=3).transformer_config
    assert (flux["num_layers"], flux["num_single_layers"]) == (2, 3)


def test_agreement_numbers_against_a_float64_reference():
    k, b = 3, 4
    latents = torch.randn(k + 1, b, 4, 8, 8)
    log_probs = torch.randn(k, b)
    delta = 1e-3 * torch.randn(k, b, dtype=torch.float64)
    reference = logprob_agreement.Trajectory(latents, log_probs)
    noisy = latents.clone()
    noisy[-1] += 1e-3 * torch.randn_like(noisy[-1])
    free = logprob_agreement.Trajectory(noisy, log_probs)
    report = logprob_agreement.compare(reference, free, (log_probs.double() + delta).float(), clip_range=1e-4)
    recomputed = (log_probs.double() + delta).float().double()
    expected_spread = float(((recomputed - log_probs.double()).exp() - 1).abs().max())
    assert report["max_abs_ratio_minus_1"] == pytest.approx(expected_spread, rel=1e-9)
    expected_err = float((noisy[-1].double() - latents[-1].double()).norm() / latents[-1].double().norm())
    assert report["final_latent_rel_l2"] == pytest.approx(expected_err, rel=1e-9)
    assert report["pass"] and not report["ratio_within_clip_range"]
    free.latents[-1, 0, 0, 0, 0] = float("nan")
    assert not logprob_agreement.compare(reference, free, log_probs, clip_range=1e-4)["pass"]


def test_flop_count_and_ceiling_of_a_matmul():
    m, n, k = (int(v) for v in torch.randint(3, 40, (3,)))
    a, b = torch.randn(m, k), torch.randn(k, n)
    assert roofline.count_flops(lambda: a @ b) == 2 * m * n * k
    ceiling = roofline.matmul_ceiling(torch.device("cpu"), torch.float32, n=32, warmup=0, iters=2, sets=2)
    assert ceiling["tflops"] == pytest.approx(2 * 32**3 / (ceiling["ms"] / 1e3) / 1e12)
    times = roofline.time_calls_ms(lambda: a @ b, torch.device("cpu"), warmup=1, iters=4)
    assert len(times) == 4 and min(times) >= 0


def test_emit_merges_trainer_benchmarks_a_later_one_winning():
    """A refresh measures only the missing micro-batches; emit takes the committed benchmark and the new one
    together, the newer point replacing the older at the same micro-batch."""
    emit = _load("emit_costs")

    def report(points, argv=()):
        rows = [
            {"path": "optimized", "mode": "lora", "cfg": False, "micro_batch_size": m, "micro_batch_ms": ms,
             "optimizer_step_ms": 1.0}
            for m, ms in points.items()
        ]  # fmt: skip
        return {
            "model": "tiny-sd3",
            "results": rows,
            "costs": {"lora/optimized": {"grad_bytes": 1}},
            "argv": list(argv),
        }

    old, new = report({4: 10.0, 8: 16.0}), report({2: 6.0, 4: 9.0}, ["--activation-checkpointing"])
    merged = emit.merge_trainer_reports([old, new])
    points = emit.trainer_points(merged, "lora", "optimized", "cond")[0]["no_cfg"]
    assert points == pytest.approx({2: 0.006, 4: 0.009, 8: 0.016})
    assert "--activation-checkpointing" in merged["argv"]
    with pytest.raises(ValueError, match="different models"):
        emit.merge_trainer_reports([old, {**new, "model": "tiny-flux"}])


def test_trainer_times_qwen_images_text_as_the_loop_feeds_it(trainer, tmp_path):
    """--text-tokens makes a masked encoder's prompts real for that many tokens (the rest padding), and
    --text-padding is model.text_padding on both paths: the Qwen-Image cost files can then be timed on the
    text the loop trains on (round 4 of issue 37: the split path trains 1.65x faster than the masked one)."""
    common = [
        "--model", "tiny-qwen-image", "--modes", "lora", "--micro-batch-sizes", "2", "--samples", "2",
        "--train-steps", "1", "--cfg", "on", "--device", "cpu", "--iters", "1", "--warmup", "0",
        "--threads", "1", "--no-flops", "--text-tokens", "10,3",
    ]  # fmt: skip
    reports = {}
    for mode in ("split", "mask"):
        out = tmp_path / mode
        assert trainer.main([*common, "--text-padding", mode, "--out", str(out)]) == 0
        reports[mode] = json.loads((out / "trainer-tiny-qwen-image.json").read_text())
    for mode, report in reports.items():
        assert report["real_text_tokens"] == [10, 3] and report["text_padding"] == mode
        assert report["paths"]["optimized"]["text_padding"] == mode
        rows = [r for r in report["results"] if "accumulate_ms" in r]
        assert {r["path"] for r in rows} == {"eager", "optimized"}
        # on-policy: the training forward of either text path reproduces the rollout's log-probs
        assert all(r["max_abs_ratio_minus_1"] < 1e-4 for r in rows), rows
    md = (tmp_path / "split" / "trainer-tiny-qwen-image.md").read_text()
    assert "text: 10 real tokens a prompt, 3 for the empty one, text padding split" in md


def test_text_tokens_must_be_two_positive_counts(trainer, capsys):
    with pytest.raises(SystemExit) as exit_:
        trainer.parse_args(["--text-tokens", "10"])
    assert exit_.value.code == 2 and "--text-tokens takes COND,UNCOND" in capsys.readouterr().err
