"""experiments/configs/recipes/: FlowGRPO's published SD3.5-medium recipes (PickScore, GenEval, OCR) load and
validate with their prompt sets and rewards, carry the published hyper-parameters (flow_grpo config/grpo.py
``pickscore_sd3`` / ``geneval_sd3`` / ``general_ocr_sd3``), and the OCR recipe, whose training prompts are
not shipped, stops at start-up saying where to get them."""

from __future__ import annotations

from pathlib import Path

import pytest

from digenrl.config import ConfigError, load_config
from digenrl.launch import planned_ranks
from digenrl.validation import validate_config

RECIPES = Path(__file__).resolve().parents[2] / "experiments" / "configs" / "recipes"
#: recipe → (reward, KL beta, training set, evaluation set and its size)
PUBLISHED = {
    "flowgrpo-pickscore-sd35m.yaml": ("pickscore", 0.01, "pickscore:train", "pickscore:eval", 2048),
    "flowgrpo-geneval-sd35m.yaml": ("geneval", 0.04, "geneval:train", "geneval:eval", 553),
    "flowgrpo-ocr-sd35m.yaml": ("ocr", 0.04, "ocr", "ocr:eval", 1018),
}


@pytest.fixture(scope="module")
def pickscore_dir(tmp_path_factory) -> Path:
    """A CLIP directory in PickScore's layout (the tiny CLIPScore's save_pretrained)."""
    from digenrl.rewards import build_reward

    return build_reward("tiny-clipscore").save_pretrained(tmp_path_factory.mktemp("pickscore"))


def test_the_recipes_are_the_ones_listed() -> None:
    assert sorted(p.name for p in RECIPES.glob("*.yaml")) == sorted(PUBLISHED)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_a_recipe_validates_with_the_published_hyper_parameters(name, pickscore_dir, tmp_path) -> None:
    reward, beta, train, evaluation, eval_size = PUBLISHED[name]
    overrides = [f"out_dir={tmp_path / 'run'}"]
    if reward == "pickscore":
        overrides.append(f"reward.weights_path={pickscore_dir}")
    if reward == "ocr":
        prompts = tmp_path / "train.txt"
        prompts.write_text('a shop sign that reads "OPEN"\na poster with the title "Flow"\n')
        overrides.append(f"data.prompts={prompts}")
    cfg = load_config(RECIPES / name, overrides)
    validate_config(cfg, world_size=planned_ranks(cfg))
    assert planned_ranks(cfg) == 32 and cfg.seed == 42 and cfg.system == "colocated-sync"
    assert (cfg.model.name, cfg.model.height, cfg.model.width) == ("sd3.5-medium", 512, 512)
    s, a, t = cfg.sampler, cfg.algo, cfg.trainer
    assert (s.num_steps, s.noise_level, s.guidance_scale, s.sde_type) == (10, 0.7, 4.5, "sde")
    assert (a.group_size, a.prompts_per_iteration, a.timestep_fraction, a.clip_range) == (24, 48, 0.99, 1e-4)
    assert (a.kl_beta, a.adv_std, a.adv_clamp) == (beta, "global", 5.0)
    assert (t.lora_rank, t.lora_alpha, t.lr, t.weight_decay, t.grad_clip, t.ema_decay) == (
        32,
        64,
        3e-4,
        1e-4,
        1.0,
        0.9,
    )
    assert (cfg.eval.every, cfg.eval.num_steps, cfg.eval.use_ema, cfg.checkpoint_every) == (60, 40, True, 60)
    assert cfg.reward.name == reward and cfg.data.eval_prompts == evaluation
    assert cfg.eval.num_prompts == eval_size
    assert load_config(RECIPES / name, []).data.prompts == train


def test_the_ocr_recipe_names_where_its_training_prompts_are(tmp_path) -> None:
    cfg = load_config(RECIPES / "flowgrpo-ocr-sd35m.yaml", [f"out_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match=r"data\.prompts='ocr': FlowGRPO's OCR training prompts .*download"):
        validate_config(cfg, world_size=planned_ranks(cfg))
