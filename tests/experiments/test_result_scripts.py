"""The experiment scripts: ``--help`` works, and the simulated tables written in ``--quick`` mode are valid
paper_figures results tables whose every row says where its numbers come from."""

from __future__ import annotations

import importlib
import json
import random

import pytest

from paper_figures.logs import read_results_table

SCRIPTS = ("validate_sim", "run_throughput", "run_scaling", "run_split", "make_figures")


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_exits_cleanly(name, capsys):
    module = importlib.import_module(f"experiments.{name}")
    with pytest.raises(SystemExit) as exit_info:
        module.parse_args(["--help"])
    assert exit_info.value.code == 0
    assert "usage" in capsys.readouterr().out.lower()


def test_throughput_refuses_without_simulate(tmp_path):
    from experiments import run_throughput

    with pytest.raises(SystemExit, match="--simulate"):
        run_throughput.main(["--quick", "--out", str(tmp_path)])
    assert not (tmp_path / "table.csv").exists()


def _check_rows(path, experiment, systems):
    rows = read_results_table(path)
    assert rows, f"{path} has no rows"
    assert {r.experiment for r in rows} == {experiment}
    assert {r.system for r in rows} == set(systems)
    for r in rows:
        assert r.source == "simulated"
        assert r.throughput["samples_per_s"] > 0
        assert r.extra["cost_file"].endswith(".json")
        assert r.extra["cost_source"].startswith("simulated")
        assert r.extra["plan"]
    return rows


def test_throughput_quick_table(tmp_path):
    from experiments import run_throughput

    assert run_throughput.main(["--simulate", "--quick", "--out", str(tmp_path)]) == 0
    rows = _check_rows(
        tmp_path / "table.csv",
        "main",
        ("colocated-sync", "colocated-overlap", "separate-sync", "separate-async", "digenrl"),
    )
    by_system = {r.system: r for r in rows}
    assert float(by_system["colocated-sync"].extra["ratio_vs_colocated_sync"]) == pytest.approx(1.0)
    for r in rows:  # images/GPU/s is samples/s over the profile's GPUs
        assert r.throughput["images_per_gpu_s"] == pytest.approx(
            r.throughput["samples_per_s"] / r.gpus, rel=1e-3
        )
    assert (tmp_path / "table.md").read_text().count("\n") >= len(rows) + 2


def test_scaling_quick_table(tmp_path):
    from experiments import run_scaling

    assert run_scaling.main(["--quick", "--out", str(tmp_path)]) == 0
    rows = _check_rows(
        tmp_path / "scaling.csv",
        "scaling",
        ("colocated-sync", "colocated-overlap", "separate-sync", "separate-async", "digenrl"),
    )
    assert sorted({r.gpus for r in rows}) == [8, 16]


def test_split_quick_table(tmp_path):
    from experiments import run_split

    assert run_split.main(["--quick", "--out", str(tmp_path)]) == 0
    rows = _check_rows(tmp_path / "split.csv", "split", ("separate-sync", "digenrl"))
    splits = {(r.generators, r.trainers) for r in rows}
    assert splits == {(8 - t, t) for t in range(1, 8)}
    for r in rows:
        assert r.generators + r.trainers == r.gpus == 8


def test_trim_run_keeps_only_the_chosen_iterations(tmp_path):
    from experiments.make_figures import trim_run

    src = tmp_path / "run"
    (src / "events").mkdir(parents=True)
    iterations = [random.randint(-1, 9) for _ in range(40)]
    lines = [json.dumps({"type": "meta", "rank": 0, "role": "trainer"})]
    lines += [
        json.dumps(
            {
                "type": "span",
                "rank": 0,
                "role": "trainer",
                "phase": "train",
                "iteration": k,
                "fragment": None,
                "policy_version": 0,
                "t_start": float(i),
                "t_end": i + 0.5,
            }
        )
        for i, k in enumerate(iterations)
    ]
    (src / "events" / "rank0.jsonl").write_text("\n".join(lines) + "\n")
    (src / "metrics.jsonl").write_text(
        json.dumps({"iteration": 0, "reward_mean": 0.5, "big": [0] * 100}) + "\n"
    )
    dst = trim_run(src, tmp_path / "out", 2, 4)
    kept = [json.loads(line) for line in (dst / "events" / "rank0.jsonl").read_text().splitlines()]
    assert kept[0]["type"] == "meta"
    assert [r["iteration"] for r in kept[1:]] == [k for k in iterations if 2 <= k <= 4]
    assert json.loads((dst / "metrics.jsonl").read_text()) == {"iteration": 0, "reward_mean": 0.5}


def test_sub_cluster_cuts_nodes_and_keeps_links():
    from digenrl.runtime.profiles import load_profile
    from experiments.run_scaling import sub_cluster

    base = load_profile("h800-32")
    n = random.randint(1, 4)
    cut = sub_cluster(base, n)
    assert cut.world_size == 8 * n and cut.name == f"h800-{8 * n}"
    assert cut.links == base.links and cut.gpu_types == base.gpu_types
    with pytest.raises(ValueError, match="nodes"):
        sub_cluster(base, 5)


def test_device_costs_scale_h200_costs_by_relative_speed():
    from dataclasses import replace

    from digenrl.runtime.profiles import load_profile
    from digenrl.sim.costs import CostModel
    from experiments.sim_tables import QUICK_COST_FILE, device_costs

    base = replace(CostModel.load(QUICK_COST_FILE), device="h200")
    profile = load_profile("hetero-h100-a100-16")
    costs = device_costs(profile, base)
    batch = random.choice([1, 2, 4])
    for rank in (0, 15):  # an H100 rank and an A100 rank
        speed = profile.device_type(rank).relative_speed
        expected = base.generator_step_points["no_cfg"][batch] / speed
        got = costs.for_rank(rank).generator_step_s(batch, False)
        assert got == pytest.approx(expected, rel=1e-12)


@pytest.mark.slow  # counts Wan2.1-14B's and its VAE's FLOPs on the meta device: ~18 s of CPU
def test_a_measured_cost_file_is_used_only_for_the_shape_and_guidance_it_was_measured_at(tmp_path):
    """A cost file prices one sample at its measured shape: another shape, or a guidance setting without
    points, falls back to the extrapolation (and says why); an explicit file that does not fit is an error."""
    from dataclasses import replace

    from digenrl.models import MODEL_SPECS
    from experiments.extrapolated_costs import extrapolated_cost_model
    from experiments.sim_tables import cost_mismatch, default_workload, model_costs

    model = "wan2.1-14b"
    spec = MODEL_SPECS[model]
    workload = default_workload(model)
    frames = random.choice([17, 33, 49])
    base = extrapolated_cost_model(model)
    fits = replace(
        base,
        source="measured",
        meta={"height": spec.default_height, "width": spec.default_width, "frames": spec.default_frames},
    )
    assert cost_mismatch(fits, workload) == "" and fits.has_cfg(workload.cfg)
    short_clip = replace(fits, meta={**fits.meta, "frames": frames})
    assert f"x{frames}f" in cost_mismatch(short_clip, workload)
    no_cfg_training = replace(fits, train_points={"no_cfg": fits.train_points["no_cfg"]})
    assert workload.cfg and "CFG" in cost_mismatch(no_cfg_training, workload)

    costs_dir = tmp_path / "costs"
    costs_dir.mkdir()
    short_clip.save(costs_dir / f"h200-{model}.json")
    chosen = model_costs(model, tmp_path / "extrapolated", costs_dir=costs_dir, workload=workload)
    assert chosen.cost_source.startswith("extrapolated") and f"x{frames}f" in chosen.cost_source
    with pytest.raises(ValueError, match="does not fit"):
        model_costs(model, tmp_path / "x", cost_file=costs_dir / f"h200-{model}.json", workload=workload)
    fits.save(costs_dir / f"h200-{model}.json")
    chosen = model_costs(model, tmp_path / "extrapolated", costs_dir=costs_dir, workload=workload)
    assert chosen.cost_source == "measured on h200"
