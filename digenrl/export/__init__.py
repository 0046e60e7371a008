"""Exporting a run's trained policy for use outside the project: the LoRA adapter in diffusers' or peft's
format, a full fine-tune's transformer, or a whole diffusers pipeline (docs/export.md).

It sits above the trainer and the models and reads checkpoints through digenrl/trainer/checkpoint.py;
nothing of the training runtime imports it (the in-checkpoint copy that ``checkpoint.export_lora`` writes
comes from digenrl/trainer/lora_export.py, below it).
"""

from digenrl.export.cli import main
from digenrl.export.formats import write_adapter, write_pipeline, write_transformer
from digenrl.export.trained import TrainedPolicy, find_checkpoint, load_trained

__all__ = [
    "TrainedPolicy",
    "find_checkpoint",
    "load_trained",
    "main",
    "write_adapter",
    "write_pipeline",
    "write_transformer",
]
