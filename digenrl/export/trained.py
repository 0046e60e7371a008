"""The trained policy of a run folder: which checkpoint, its config, and its trainable weights (or their EMA).

Everything is read through the checkpoint loaders of digenrl/trainer/checkpoint.py (weights-only unpickling,
paths kept inside the run folder, :func:`~digenrl.trainer.checkpoint.verify_checkpoint` first); a bad
request — a folder without a checkpoint, a step that is not there, ``--ema`` on a run without an EMA, a
damaged file — is a :class:`~digenrl.config.ConfigError` naming the folder, file or flag.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from digenrl.config import Config, ConfigError, load_config
from digenrl.models.spec_types import ModelSpec
from digenrl.models.specs import get_model_spec
from digenrl.trainer.checkpoint import (
    CheckpointChoiceError,
    CheckpointError,
    LatestMissingError,
    StepNotFoundError,
    choose_checkpoint,
    full_trainer_state,
    load_checkpoint,
    step_dir_name,
    verify_checkpoint,
)


@dataclass(frozen=True)
class TrainedPolicy:
    """One checkpoint's policy: ``weights`` are the trainable tensors keyed by transformer parameter name
    (the LoRA adapter, or the whole transformer for ``trainer.mode=full``), the EMA's when ``ema``."""

    cfg: Config
    checkpoint: Path
    step: int
    run_id: str
    weights: dict[str, torch.Tensor]
    ema: bool

    @property
    def spec(self) -> ModelSpec:
        return get_model_spec(self.cfg.model.name)

    @property
    def lora(self) -> bool:
        return self.cfg.trainer.mode == "lora"

    def describe(self) -> str:
        what = "LoRA adapter" if self.lora else "transformer"
        return f"the {'EMA of the ' if self.ema else ''}{what} of run {self.run_id} at step {self.step}"


def find_checkpoint(run_dir: str | Path, step: int | None = None) -> Path:
    """The checkpoint directory of ``run_dir`` to export: ``step_<step>``, or the one ``latest`` names
    (:func:`~digenrl.trainer.checkpoint.choose_checkpoint`; its errors reworded for the command line)."""
    run = Path(run_dir)
    if not run.is_dir():
        raise ConfigError(f"RUN_DIR {str(run)!r} is not a directory; give the out_dir of a training run")
    try:
        return choose_checkpoint(run, step)
    except CheckpointChoiceError as error:
        if not error.steps:
            raise ConfigError(
                f"RUN_DIR {str(run)!r} holds no checkpoint ({error.root}/step_<n>/meta.json): the run "
                "stopped before its first checkpoint (one is written every checkpoint_every iterations and "
                "at the end), or this is not a run folder"
            ) from None
        listed = f"complete checkpoints there: {', '.join(map(step_dir_name, error.steps))}"
        if isinstance(error, StepNotFoundError):
            raise ConfigError(
                f"--step {error.step}: {error.path} is not a complete checkpoint; {listed}"
            ) from None
        if isinstance(error, LatestMissingError):
            raise ConfigError(
                f"{error.pointer} is missing, so which checkpoint is the run's newest is not recorded; "
                f"{listed}; choose one with --step N"
            ) from None
        raise ConfigError(f"{error}; {listed}; choose one with --step N") from None  # LatestInvalidError


def load_trained(run_dir: str | Path, step: int | None = None, *, ema: bool = False) -> TrainedPolicy:
    """The trained policy of ``run_dir`` at checkpoint ``step`` (default: ``latest``); ``ema``: its EMA
    weights (``trainer.ema_decay`` > 0), the ``--ema`` flag of ``experiments/export.py``."""
    path = find_checkpoint(run_dir, step)
    try:
        meta = verify_checkpoint(path)
        checkpoint = load_checkpoint(path)
        state = full_trainer_state(checkpoint)
    except CheckpointError as error:
        raise ConfigError(str(error)) from None
    if not isinstance(meta.get("config"), dict) or not isinstance(state, dict) or "model" not in state:
        raise ConfigError(
            f"{path} does not record the config and trainer state an export needs (a checkpoint written by "
            "an older version, or not by a training run)"
        )
    try:
        cfg = load_config(None, meta["config"])
    except ConfigError as error:
        raise ConfigError(
            f"{path / 'meta.json'}: its config does not load in this version: {error}"
        ) from None
    if ema:
        if "ema" not in state:
            raise ConfigError(
                f"--ema: {path} holds no EMA of the weights (the run had trainer.ema_decay="
                f"{cfg.trainer.ema_decay:g}); export without --ema, or train with trainer.ema_decay > 0"
            )
        weights = state["ema"]["weights"]
    else:
        weights = state["model"]
    policy = TrainedPolicy(
        cfg=cfg,
        checkpoint=path,
        step=int(checkpoint["step"]),
        run_id=str(meta.get("run_id", "?")),
        weights=weights,
        ema=ema,
    )
    if policy.lora:  # a full fine-tune's weights go through the trainer's loader, which checks them
        check_adapter_shapes(policy)
    return policy


def check_adapter_shapes(policy: TrainedPolicy) -> None:
    """Every tensor of a LoRA run's adapter has the name and shape of the adapter the run's config puts on
    its model (built on the ``meta`` device: no memory), so an export never writes an adapter that fails,
    or silently misbehaves, where it is loaded. A ConfigError names the checkpoint file and the tensor."""
    from digenrl.models.bundle import meta_transformer
    from digenrl.trainer.lora import ADAPTER_NAME
    from digenrl.trainer.lora_export import run_lora_config

    transformer = meta_transformer(policy.spec, policy.cfg.model.pretrained_path)
    transformer.add_adapter(run_lora_config(policy.cfg), adapter_name=ADAPTER_NAME)
    expected = {name: tuple(p.shape) for name, p in transformer.named_parameters() if "lora_" in name}
    where = f"{policy.checkpoint / 'trainer.pt'} ({'trainer.ema.weights' if policy.ema else 'trainer.model'})"
    missing, unknown = (
        sorted(set(expected) - set(policy.weights)),
        sorted(set(policy.weights) - set(expected)),
    )
    if missing or unknown:
        raise ConfigError(
            f"{where} does not match the adapter of the run's model ({policy.cfg.model.name}, "
            f"trainer.lora_rank={policy.cfg.trainer.lora_rank}): missing {missing[:4]}, "
            f"unexpected {unknown[:4]}"
        )
    for name, shape in expected.items():
        tensor = policy.weights[name]
        got = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        if got != shape:
            raise ConfigError(
                f"{where}: {name!r} has shape {got}, the run's model takes {shape} "
                f"({policy.cfg.model.name}, trainer.lora_rank={policy.cfg.trainer.lora_rank})"
            )
