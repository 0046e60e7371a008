"""CostModel: interpolation against a float64 reference, JSON round trip, scaling, per-type resolution."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import numpy as np
import pytest

from digenrl.costs.cost_model import CostModel, cost_path, interpolate, load_costs
from digenrl.costs.device_costs import DeviceCosts
from digenrl.runtime.hardware.profiles import load_profile
from tests.sim.toy_costs import toy_costs


def _random_points(rng: random.Random, n: int) -> dict[int, float]:
    batches = sorted(rng.sample(range(1, 64), n))
    return {b: rng.uniform(0.01, 2.0) for b in batches}


def test_interpolation_matches_numpy_between_points():
    rng = random.Random(2027)
    for _ in range(50):
        points = _random_points(rng, rng.randint(2, 6))
        xs = sorted(points)
        x = rng.uniform(xs[0], xs[-1])
        expected = float(np.interp(x, np.array(xs, dtype=np.float64), np.array([points[b] for b in xs])))
        assert interpolate(points, x) == pytest.approx(expected, rel=1e-12, abs=1e-15)
        assert interpolate(points, xs[1]) == pytest.approx(points[xs[1]], rel=1e-12)


def test_extrapolation_is_linear_with_throughput_floors():
    rng = random.Random(2028)
    for _ in range(50):
        points = _random_points(rng, rng.randint(2, 5))
        xs = sorted(points)
        (a, ya), (b, yb) = (xs[-2], points[xs[-2]]), (xs[-1], points[xs[-1]])
        x = xs[-1] + rng.uniform(0.5, 40)
        line = ya + (yb - ya) * (x - a) / (b - a)
        assert interpolate(points, x) == pytest.approx(max(line, yb), rel=1e-12)
        (a, ya), (b, yb) = (xs[0], points[xs[0]]), (xs[1], points[xs[1]])
        x = rng.uniform(0.01, xs[0])
        line = ya + (yb - ya) * (x - a) / (b - a)
        assert interpolate(points, x) == pytest.approx(max(line, ya * x / a), rel=1e-12)
    assert interpolate({4: 1.0}, 6) == pytest.approx(1.5)  # one point: constant throughput
    assert interpolate({4: 1.0, 8: 3.0}, 0) == 0.0


def test_train_units_use_full_then_partial_micro_batch():
    costs = toy_costs()
    costs.train_points = {"no_cfg": {1: 0.3, 4: 0.9, 8: 1.1}}
    for units in range(0, 30):
        full, rest = divmod(units, 4)
        expected = full * 0.9 + (0.3 + (0.9 - 0.3) * (rest - 1) / 3 if rest else 0.0)
        assert costs.train_units_s(units, 4, cfg=False) == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert costs.train_unit_s(8, cfg=False) == pytest.approx(1.1 / 8)
    with pytest.raises(ValueError, match=r"train_points\['cfg'\]"):
        costs.train_unit_s(4, cfg=True)


def test_json_round_trip(tmp_path):
    rng = random.Random(2029)
    costs = CostModel(
        device="h200",
        model="sd3.5-medium",
        generator_step_points={"cfg": _random_points(rng, 3), "no_cfg": _random_points(rng, 2)},
        vae_decode_points=_random_points(rng, 3),
        reward_points=_random_points(rng, 2),
        train_points={"cfg": _random_points(rng, 3)},
        optimizer_step_s=rng.uniform(0, 1),
        weight_sync_bytes=rng.randint(0, 10**9),
        grad_bytes=rng.randint(0, 10**9),
        fragment_bytes_per_sample=rng.randint(0, 10**7),
        unit_bytes=rng.randint(0, 10**7),
        cond_bytes_per_sample=rng.randint(0, 10**6),
        latent_bytes_per_sample=rng.randint(0, 10**6),
        param_bytes=rng.randint(0, 10**10),
        optimizer_bytes=rng.randint(0, 10**10),
        text_encoder_bytes=rng.randint(0, 10**10),
        vae_param_bytes=rng.randint(0, 10**9),
        switch_sync_s=rng.uniform(0, 1),
        message_latency_s=rng.uniform(0, 1e-3),
        weight_load_s=rng.uniform(0, 1e-2),
        path=rng.choice(["eager", "compiled", "compiled+autocast"]),
        activation_checkpointing=rng.choice([False, True]),
        train_peak_bytes={"cfg": {1: rng.randint(1, 10**11), 4: rng.randint(1, 10**11)}},
        generator_peak_bytes={"cfg": {2: rng.randint(1, 10**11)}},
        command="python experiments/measure.py costs --model sd3.5-medium",
        meta={"dtype": "bfloat16"},
    )
    path = costs.save(tmp_path / "h200-sd3.5-medium.json")
    loaded = CostModel.load(path)
    assert loaded == costs
    assert loaded.generator_step_s(5, cfg=True) == costs.generator_step_s(5, cfg=True)
    assert load_costs("h200", "sd3.5-medium", root=tmp_path) == costs
    assert cost_path("h200", "sd3.5-medium", tmp_path) == path
    data = json.loads(path.read_text())
    assert all(isinstance(k, str) for k in data["vae_decode_points"])  # JSON keys, converted back on load
    assert data["format"] == 2


def test_a_format_1_file_loads_with_its_switch_time_kept_apart():
    """Format 1 timed a TAG switch as a gradient-parking round trip; format 2 prices a switch by what it
    moves, so the old number is kept in meta, never charged to every switch."""
    data = toy_costs().to_dict()
    for key in ("switch_sync_s", "message_latency_s", "weight_load_s", "path", "text_encoder_bytes"):
        data.pop(key)
    seconds = random.uniform(0.01, 0.2)
    settings = {"compile": True, "autocast": True}
    v1 = {
        **data,
        "format": 1,
        "helper_switch_s": seconds,
        "meta": {"path": "optimized", "trainer_path_settings": str(settings)},
    }
    loaded = CostModel.from_dict(v1)
    assert loaded.switch_sync_s == 0.0 and loaded.meta["v1_helper_switch_s"] == seconds
    assert loaded.path == "compiled+autocast"
    assert CostModel.from_dict({**v1, "meta": {}}).path == "eager"
    with pytest.raises(ValueError, match="format"):
        CostModel.from_dict({**data, "format": 3})


def test_training_beyond_the_measured_micro_batches_follows_the_measured_forward():
    """Above the largest measured micro-batch m0 a training micro-batch costs (training/forward ratio at m0) x
    the measured forward at that size; activation checkpointing adds one forward of the micro-batch."""
    rng = random.Random(2030)
    costs = toy_costs()
    forward = {1: rng.uniform(0.01, 0.05), 4: rng.uniform(0.06, 0.1), 16: rng.uniform(0.2, 0.4)}
    costs.generator_step_points = {"no_cfg": forward}
    train = {1: rng.uniform(0.1, 0.2), 2: rng.uniform(0.2, 0.3)}
    costs.train_points = {"no_cfg": train}
    costs.forget()
    ratio = train[2] / interpolate(forward, 2)
    assert costs.train_forward_ratio(False) == pytest.approx(ratio)
    m = rng.randint(3, 16)
    assert costs.train_micro_batch_s(m, False) == pytest.approx(ratio * interpolate(forward, m))
    assert costs.train_micro_batch_s(2, False) == pytest.approx(train[2])  # measured: unchanged
    with_ckpt = costs.train_micro_batch_s(m, False, checkpointing=True)
    assert with_ckpt == pytest.approx(ratio * interpolate(forward, m) + interpolate(forward, m))
    measured_with = replace(costs, activation_checkpointing=True)
    assert measured_with.train_micro_batch_s(2, False, checkpointing=False) == pytest.approx(
        train[2] - interpolate(forward, 2)
    )


def test_memory_peaks_are_linear_in_the_batch():
    costs = toy_costs()
    costs.train_peak_bytes = {"no_cfg": {2: 10 * 2**30, 4: 14 * 2**30}}
    costs.generator_peak_bytes = {"no_cfg": {1: 5 * 2**30}}
    assert costs.has_memory(False) and not costs.has_memory(True)
    assert costs.train_peak(8, False) == pytest.approx(22 * 2**30)
    assert costs.train_peak(3, False) == pytest.approx(12 * 2**30)
    assert costs.generator_peak(16, False) == pytest.approx(5 * 2**30)  # one point: no slope known
    with pytest.raises(ValueError, match="bytes"):
        CostModel.from_dict({**costs.to_dict(), "train_peak_bytes": {"cfg": {"1": -5}}})


def test_bad_cost_files_name_the_problem(tmp_path):
    data = toy_costs().to_dict()
    with pytest.raises(ValueError, match="unknown key"):
        CostModel.from_dict({**data, "gpu": "x"})
    with pytest.raises(ValueError, match="missing key"):
        CostModel.from_dict({k: v for k, v in data.items() if k != "grad_bytes"})
    with pytest.raises(ValueError, match="optimizer_step_s"):
        CostModel.from_dict({**data, "optimizer_step_s": -1.0})
    with pytest.raises(ValueError, match="positive integer batch"):
        CostModel.from_dict({**data, "reward_points": {"0": 1.0}})
    with pytest.raises(ValueError, match="unknown key"):
        CostModel.from_dict({**data, "train_points": {"guided": {"1": 1.0}}})
    with pytest.raises(ValueError, match="available"):
        load_costs("nope", "toy", root=tmp_path)


def test_scale_to_uses_spec_ratios_and_marks_extrapolated():
    profile = load_profile("hetero-h100-a100-16")
    h100, a100 = profile.gpu_types["h100"], profile.gpu_types["a100"]
    rng = random.Random(2031)
    costs = toy_costs(step=rng.uniform(0.01, 1), unit=rng.uniform(0.01, 1), decode=0.5, reward=0.25)
    costs.optimizer_step_s, costs.switch_sync_s = rng.uniform(0.01, 1), rng.uniform(0.01, 1)
    costs.weight_load_s = rng.uniform(0.01, 1)
    costs.grad_bytes = 12345
    scaled = costs.scale_to(a100, h100)
    compute, memory = h100.bf16_tflops / a100.bf16_tflops, h100.hbm_gbps / a100.hbm_gbps
    assert scaled.source == "extrapolated from toy" and scaled.device == "a100"
    assert scaled.generator_step_s(3, cfg=True) == pytest.approx(
        costs.generator_step_s(3, cfg=True) * compute
    )
    assert scaled.train_unit_s(2, cfg=False) == pytest.approx(costs.train_unit_s(2, cfg=False) * compute)
    assert scaled.score_s(4) == pytest.approx(costs.score_s(4) * compute)
    assert scaled.optimizer_step_s == pytest.approx(costs.optimizer_step_s * memory)
    assert scaled.weight_load_s == pytest.approx(costs.weight_load_s * memory)
    assert scaled.switch_sync_s == costs.switch_sync_s  # a device synchronisation: not a GPU-speed cost
    assert scaled.grad_bytes == 12345
    assert scaled.scale_to(h100, a100).source == "extrapolated from toy"  # keeps the measured origin


def test_device_costs_per_type_and_relative_speed():
    profile = load_profile("hetero-h100-a100-16")
    costs = toy_costs(step=0.1, device="h100")
    by_speed = DeviceCosts(profile, costs, reference_type="h100")
    h100, a100 = profile.gpu_types["h100"], profile.gpu_types["a100"]
    assert by_speed.for_rank(0) is costs
    factor = h100.relative_speed / a100.relative_speed
    assert by_speed.for_rank(8).generator_step_s(2, cfg=False) == pytest.approx(0.2 * factor)
    assert by_speed.for_rank(15).source.startswith("extrapolated")
    explicit = toy_costs(step=0.7, device="a100")
    both = DeviceCosts(profile, {"h100": costs, "a100": explicit})
    assert both.for_rank(9) is explicit and both.for_rank(3) is costs
    with pytest.raises(ValueError, match="reference_type"):
        DeviceCosts(profile, toy_costs(device="cpu"))
    single = load_profile("cpu-2")
    assert DeviceCosts(single, toy_costs(device="cpu")).for_rank(1).device == "cpu"


def test_the_audit_flags_what_does_not_match_what_runs():
    """A file is stale for a workload when it timed another path, stops short of the workload's
    micro-batch, timed another CFG gradient, has no memory peaks, or was derived."""
    from digenrl.costs.audit import GPU_PATH, audit
    from digenrl.plan.workload import Workload

    work = Workload(
        prompts_per_iteration=4, group_size=2, num_steps=4, train_steps=2, cfg=True, micro_batch_size=4
    )
    costs = replace(
        toy_costs(),
        path=GPU_PATH,
        train_points={"cfg": {1: 0.1, 2: 0.2, 4: 0.3}, "no_cfg": {1: 0.1}},
        train_peak_bytes={"cfg": {1: 10**9}},
        generator_peak_bytes={"cfg": {1: 10**9}},
        meta={"cfg_grad": "cond"},
    )
    assert audit(costs, work) == []
    eager = audit(replace(costs, path="eager"), work)
    assert len(eager) == 1 and "eager" in eager[0]
    short = audit(replace(costs, train_points={"cfg": {1: 0.1, 2: 0.2}}), work)
    assert len(short) == 1 and "micro-batch 1, 2" in short[0] and "trains 4" in short[0]
    both = audit(replace(costs, meta={"cfg_grad": "both"}), work)
    assert len(both) == 1 and "cfg_grad=both" in both[0]
    assert "no measured memory peaks" in audit(replace(costs, train_peak_bytes={}), work)[0]
    derived = audit(
        replace(costs, meta={"cfg_grad": "cond", "derivation": ["reshape: 33 -> 81 frames"]}), work
    )
    assert derived == ["derived: reshape: 33 -> 81 frames"]
    mixed = audit(replace(costs, meta={"cfg_grad": "cond", "generator_path": "eager"}), work)
    assert len(mixed) == 1 and "generator points" in mixed[0]
    assert audit(replace(costs, meta={"cfg_grad": "cond", "generator_path": "compiled"}), work) == []
