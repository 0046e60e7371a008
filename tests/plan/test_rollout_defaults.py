"""The torch-free rollout defaults the simulator and the planner read (digenrl/plan/rollout_defaults.py)
say what every model spec says."""

from __future__ import annotations

import pytest

from digenrl.models.specs import MODEL_SPECS
from digenrl.plan.rollout_defaults import ROLLOUT_DEFAULTS, RolloutDefaults, rollout_defaults


def test_every_model_spec_has_its_rollout_defaults():
    assert set(ROLLOUT_DEFAULTS) == set(MODEL_SPECS)
    for name, spec in MODEL_SPECS.items():
        expected = RolloutDefaults(
            spec.default_num_steps, spec.default_guidance_scale, spec.guidance_embedded, spec.default_frames
        )
        assert ROLLOUT_DEFAULTS[name] == expected, name


def test_an_unknown_model_is_named():
    with pytest.raises(ValueError, match=r"model.name='sd9'.*tiny-sd3"):
        rollout_defaults("sd9")
