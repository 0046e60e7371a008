"""``experiments/measure.py switch`` on a CPU with the tiny model: the runtime's switch is timed and every
step's bytes are what the switch must move (docs/operations.md, "Measuring the hybrid engine's switch")."""

from __future__ import annotations

import json

from digenrl.models.flow_model import build_flow_model
from digenrl.models.specs import get_model_spec
from experiments import measure


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
