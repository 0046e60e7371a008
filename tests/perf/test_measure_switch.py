"""``experiments/measure.py switch`` on a CPU with the tiny model: the runtime's switch is timed and every
step's bytes are what the switch must move (docs/operations.md, "Measuring the hybrid engine's switch")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from digenrl.models.flow_model import build_flow_model
from digenrl.models.specs import get_model_spec
from experiments import measure

REPO = Path(__file__).resolve().parents[2]


def test_switch_measures_offload_onload_and_reshard_bytes(tmp_path):
    assert measure.main(["switch", "--model", "tiny-sd3", "--iters", "1", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("switch-*-tiny-sd3.json")
    result = json.loads(path.read_text())
    assert result["skipped"] == {} and set(result["modes"]) == {"lora", "full"}
    transformer = build_flow_model(get_model_spec("tiny-sd3")).transformer
    tensors = list(transformer.parameters())
    weights = sum(p.numel() * 4 for p in tensors)
    buffers = sum(b.numel() * 4 for b in transformer.buffers())  # positional tables move with the module
    full, lora = result["modes"]["full"]["steps"], result["modes"]["lora"]["steps"]
    # full fine-tuning: the copy and the trainer's weights are the whole transformer (fp32 here), AdamW's
    # two moments twice that plus a 4-byte step count per tensor (on the CPU, so it moves too), gradients
    # freed by the step; the re-shard writes every weight
    assert full["offload generation copy"]["bytes"] == weights + buffers
    assert full["onload trainer weights"]["bytes"] == weights + buffers
    assert full["offload optimizer state and gradients"]["bytes"] == 2 * weights + 4 * len(tensors)
    assert full["reshard trainer weights into generation copy"]["bytes"] == weights
    # LoRA: the copy is still the whole transformer (its base plus the adapter), the re-shard only the adapter
    adapter = lora["reshard trainer weights into generation copy"]["bytes"]
    assert 0 < adapter < weights
    assert lora["offload generation copy"]["bytes"] == weights + buffers + adapter
    assert (
        2 * adapter < lora["offload optimizer state and gradients"]["bytes"] < 2 * adapter + 4 * len(tensors)
    )
    assert "onload trainer weights" not in lora
    for mode in ("lora", "full"):
        summary = result["modes"][mode]["engine_switch"]
        assert summary["offload_gbps"] > 0 and summary["onload_gbps"] > 0 and summary["reshard_s"] > 0


def test_switch_costs_enter_a_cost_file_and_price_the_engine(tmp_path):
    """--cost-file records the measured summary in the cost file's meta; the simulator's colocated-engine
    schedule then prices its offloads, onloads and re-shard from it, not from the profile's link."""
    from digenrl.costs.cost_model import CostModel
    from digenrl.plan import RunPlan, Workload
    from digenrl.sim.simulator import simulate

    cost_file = tmp_path / "cpu-tiny-sd3.json"
    cost_file.write_text((REPO / "experiments/results/costs/cpu-tiny-sd3.json").read_text())
    argv = [
        "switch",
        "--modes",
        "lora",
        "--iters",
        "1",
        "--out",
        str(tmp_path),
        "--cost-file",
        str(cost_file),
    ]
    assert measure.main(argv) == 0
    costs = CostModel.load(cost_file)
    measured = costs.meta["engine_switch"]["lora"]
    assert measured["command"].startswith("python experiments/measure.py switch")
    w = Workload(prompts_per_iteration=2, group_size=2, num_steps=2, train_steps=1, cfg=False, iterations=3)
    result = simulate("cpu-1", costs, w, RunPlan("colocated-engine"))
    reshards = [s for s in result.spans if s["phase"] == "reshard"]
    assert [s["t_end"] - s["t_start"] for s in reshards] == pytest.approx(
        [measured["reshard_s"]] * 3, rel=1e-9
    )
    copy = [s for s in result.spans if s["phase"] == "offload" and s["extra"]["what"] == "generation copy"]
    seconds = costs.param_bytes / (measured["offload_gbps"] * 1e9)
    assert copy[0]["t_end"] - copy[0]["t_start"] == pytest.approx(seconds, rel=1e-9)


def test_a_scaled_cost_model_keeps_only_the_measured_reshard():
    """Carried to another device (CostModel.scaled) the re-shard, a device copy, scales with memory; the host
    copies, which belong to the measured machine's link, are dropped (the profile's link prices them)."""
    from digenrl.costs.cost_model import CostModel

    costs = CostModel.load(REPO / "experiments/results/costs/cpu-tiny-sd3.json")
    meta = {"engine_switch": {"lora": {"offload_gbps": 20.0, "onload_gbps": 25.0, "reshard_s": 0.5}}}
    scaled = CostModel.from_dict({**costs.to_dict(), "meta": meta}).scaled(2.0, 3.0, "other")
    assert scaled.meta["engine_switch"] == {"lora": {"reshard_s": 1.5}}


def test_a_switch_is_recorded_only_in_its_own_kinds_cost_file(tmp_path):
    """A device call named for one kind may run on the other (an H200 call served by an H100): the
    measurement must not price the wrong kind."""
    import shutil

    from digenrl.perf.measure_switch import record_in_cost_file

    repo = Path(__file__).resolve().parents[2]
    target = tmp_path / "h200-sd3.5-medium.json"
    shutil.copy(repo / "experiments/results/costs/h200-sd3.5-medium.json", target)
    measured = json.loads(
        (repo / "experiments/results/gpu/h100-refresh/switch/switch-h100-sd3.5-medium.json").read_text()
    )
    with pytest.raises(SystemExit, match="measured on a NVIDIA H100"):
        record_in_cost_file(target, measured)
