"""Each model's rollout defaults that decide a workload, torch-free: denoising steps, guidance scale,
whether guidance is embedded (no second, unconditional forward) and a video model's frames.

The model specs (:data:`digenrl.models.specs.MODEL_SPECS`) are built in modules that import torch, so the
simulator and the planner, which must run without torch (``pip install -e .`` without CUDA, to plan a
cluster), read these for the built-in models; ``tests/plan/test_rollout_defaults.py`` checks that every
built-in spec agrees with its entry, so a new model or a changed default fails there until both say the
same. A family registered at run time is read from its spec.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RolloutDefaults:
    num_steps: int  # ModelSpec.default_num_steps
    guidance_scale: float  # ModelSpec.default_guidance_scale
    guidance_embedded: bool  # ModelSpec.guidance_embedded
    frames: int | None = None  # ModelSpec.default_frames (video models)


ROLLOUT_DEFAULTS: dict[str, RolloutDefaults] = {
    "sd3.5-medium": RolloutDefaults(10, 4.5, False),
    "tiny-sd3": RolloutDefaults(8, 4.5, False),
    "flux.1-dev": RolloutDefaults(6, 3.5, True),
    "tiny-flux": RolloutDefaults(6, 3.5, True),
    "qwen-image": RolloutDefaults(10, 4.0, False),
    "tiny-qwen-image": RolloutDefaults(8, 4.0, False),
    "wan2.1-1.3b": RolloutDefaults(20, 5.0, False, 81),
    "wan2.1-14b": RolloutDefaults(20, 5.0, False, 81),
    "tiny-wan": RolloutDefaults(8, 5.0, False, 5),
    "hunyuan-video": RolloutDefaults(20, 6.0, True, 129),
    "tiny-hunyuan-video": RolloutDefaults(8, 6.0, True, 5),
}


def rollout_defaults(model: str) -> RolloutDefaults:
    """``model``'s entry; a model of a family registered at run time (``digenrl.models.register_family``,
    which needs torch anyway) from its spec; a ValueError naming the known models otherwise."""
    if model in ROLLOUT_DEFAULTS:
        return ROLLOUT_DEFAULTS[model]
    try:
        from digenrl.models.specs import MODEL_SPECS  # imports torch: only for a model outside the table
    except ImportError:
        MODEL_SPECS = {}
    spec = MODEL_SPECS.get(model)
    if spec is None:
        known = ", ".join(sorted({*ROLLOUT_DEFAULTS, *MODEL_SPECS}))
        raise ValueError(f"model.name={model!r} is not a known model; choose one of: {known}")
    return RolloutDefaults(
        spec.default_num_steps, spec.default_guidance_scale, spec.guidance_embedded, spec.default_frames
    )
