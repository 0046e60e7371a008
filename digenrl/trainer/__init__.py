"""The policy update: LoRA / full fine-tune, data parallelism (DDP, FSDP2, DeepSpeed), checkpoints."""

from digenrl.data.micro_batches import plan_micro_batches
from digenrl.trainer.checkpoint import (
    capture_rng_state,
    full_trainer_state,
    latest_checkpoint_dir,
    load_latest_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from digenrl.trainer.lora import (
    apply_lora,
    default_lora_targets,
    enable_full_finetune,
    has_lora,
    reference_policy,
)
from digenrl.trainer.optim import build_optimizer
from digenrl.trainer.parallel import BACKENDS, ParallelBackend, resolve_backend, wrap_for_training
from digenrl.trainer.trainer import PolicyTrainer

__all__ = [
    "BACKENDS",
    "ParallelBackend",
    "PolicyTrainer",
    "apply_lora",
    "build_optimizer",
    "capture_rng_state",
    "default_lora_targets",
    "enable_full_finetune",
    "full_trainer_state",
    "has_lora",
    "latest_checkpoint_dir",
    "load_latest_checkpoint",
    "plan_micro_batches",
    "reference_policy",
    "resolve_backend",
    "restore_rng_state",
    "save_checkpoint",
    "wrap_for_training",
]
