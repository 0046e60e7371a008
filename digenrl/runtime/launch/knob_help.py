"""``run_train.py --help``: every config key with its default and one line, read from ``digenrl/config.py``.

The line is the comment the key carries in ``digenrl/config.py`` (on its line or the lines just above), so
the help cannot drift from the code; a key without one is described by :data:`UNCOMMENTED` (checked to name
only keys that exist and lack a comment, ``tests/runtime/test_knob_help.py``), else by what its metadata
declares (the choices, the range).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import tokenize
import typing
from functools import cache

from digenrl import config as config_module
from digenrl.config import Config, declared_fields

UNCOMMENTED: dict[str, str] = {
    "system": (
        "the schedule: colocated-sync, colocated-overlap, colocated-engine, separate-sync, separate-async or "
        "digenrl"
    ),
    "iterations": "training iterations (policy updates) of the run",
    "seed": "run seed: every noise draw, prompt order and trained-step choice derives from it",
    "out_dir": "run folder: config.yaml, metrics.jsonl, events, trace, samples and checkpoints",
    "model.name": "the generator: a key of digenrl/models/specs.py (tiny-sd3, sd3.5-medium, flux.1-dev, …)",
    "model.width": "image width in pixels; None = the model's default",
    "sampler.num_steps": "denoising steps of a training rollout; None = the model's default",
    "sampler.sde_type": "the stochastic step: sde (FlowGRPO), cps (coefficients-preserving), dance",
    "algo.timestep_fraction": "fraction K/T of the denoising steps that are trained (FlowGRPO, DiffusionNFT)",
    "algo.timestep_selection": "which steps are trained: first (FlowGRPO), shuffled (DanceGRPO), fast-window",
    "algo.clip_range": "PPO clip ε of the likelihood ratio (FlowGRPO 1e-4)",
    "algo.kl_beta": "weight of the KL to the adapter-disabled reference policy (0 = off)",
    "algo.adv_std": "advantage normalisation: by the group's std or the whole batch's",
    "algo.adv_clamp": "advantages clamped to ±this (5); DiffusionNFT's A_max",
    "algo.num_updates_per_batch": "optimizer steps per logical batch (1 = on-policy)",
    "algo.mix_schedule": "how MixGRPO's window moves: progressive (the paper's) or random",
    "trainer.mode": "lora (adapter only) or full fine-tuning",
    "trainer.lora_rank": "LoRA rank r",
    "trainer.lora_alpha": "LoRA α (scale α/r)",
    "trainer.weight_decay": "AdamW weight decay",
    "trainer.betas": "AdamW (β1, β2)",
    "trainer.eps": "AdamW ε",
    "trainer.grad_clip": "gradient-norm clip",
    "trainer.backend": "data-parallel wrapper: auto, none, ddp, fsdp2, deepspeed",
    "trainer.activation_checkpointing": "recompute block activations in backward to save memory",
    "reward.name": "the reward (a key of the reward registry)",
    "reward.nonfinite_policy": "a non-finite reward drops its group (drop-group) or stops the run (abort)",
    "pools.trainers": "trainer ranks of a separate layout (0 with generators 0 = colocated)",
    "pools.generators": "generator ranks of a separate layout",
    "tag.enabled": "TAG: trainer ranks generate fragments while they have nothing to train",
    "tcss.enabled": "TCSS: generators start the next iteration with the previous policy (one version stale)",
    "residency.train_resident": "colocated: the optimizer state stays on the device during generation",
    "residency.reward_resident": "colocated: the reward model stays on the device during training",
    "colocated.split": "colocated: equal samples per rank, or in proportion to the profile's speeds",
    "resume.enabled": "continue the run in out_dir from its latest (or resume.step's) checkpoint",
    "logger.wandb": "also log to Weights & Biases",
    "logger.wandb_project": "the W&B project",
}
"""Lines for the keys whose definition in ``digenrl/config.py`` carries no comment."""


@cache
def _comments() -> dict[str, str]:
    """``{dotted key: comment}`` from the source of ``digenrl/config.py``."""
    source = inspect.getsource(config_module)
    lines = source.splitlines()
    by_line: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            by_line[token.start[0]] = token.string.lstrip("#").strip()
    hints = typing.get_type_hints(Config)
    sections = {
        hints[f.name].__name__: f.name
        for f in dataclasses.fields(Config)
        if dataclasses.is_dataclass(hints[f.name])
    }
    out: dict[str, str] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef) or not (node.name == "Config" or node.name in sections):
            continue
        prefix = "" if node.name == "Config" else f"{sections[node.name]}."
        for statement in node.body:
            if not isinstance(statement, ast.AnnAssign) or not isinstance(statement.target, ast.Name):
                continue
            above: list[str] = []
            line = statement.lineno - 1
            while line >= 1 and lines[line - 1].strip().startswith("#"):
                above.insert(0, by_line.get(line, ""))
                line -= 1
            trailing = [by_line[n] for n in range(statement.lineno, statement.end_lineno + 1) if n in by_line]
            text = " ".join(above + trailing).strip()
            if text:
                out[prefix + statement.target.id] = text
    return out


def _declared(metadata: object) -> str:
    choices = getattr(metadata, "get", lambda _k: None)("choices")
    if choices:
        return "one of: " + ", ".join(str(c) for c in choices)
    limits = getattr(metadata, "get", lambda _k: None)("range")
    return f"a number in {limits}" if limits else ""


def knob_lines() -> list[str]:
    """One line per leaf key: ``key = default   description`` (a section-valued key is its keys)."""
    comments = _comments()
    rows = []
    for key, default, metadata in declared_fields(Config()):
        text = comments.get(key) or UNCOMMENTED.get(key) or _declared(metadata)
        rows.append((key, repr(default) if isinstance(default, str) else str(default), text))
    width = max(len(k) + len(d) for k, d, _ in rows) + 3
    return [f"  {f'{k} = {d}':<{width}} {t}" for k, d, t in rows]


def knob_help() -> str:
    """The ``--help`` epilog: every key, its default and one line."""
    return (
        "config keys (set as key=value; a section's name alone sets its name, e.g. algo=mixgrpo):\n"
        + "\n".join(knob_lines())
    )
