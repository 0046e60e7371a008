"""Config parsing and start-up validation: every bad value fails naming its key and the allowed values."""

from __future__ import annotations

from pathlib import Path

import pytest

from digenrl.config import Config, ConfigError, config_differences, load_config, parse_override
from digenrl.launch import ranks_to_start
from digenrl.validation import validate_config

TINY = Path(__file__).resolve().parents[2] / "experiments" / "configs" / "tiny.yaml"


def test_short_overrides_work_exactly_as_written(tmp_path):
    cfg = load_config(
        TINY,
        [
            "system=colocated-sync",
            "profile=cpu-2",
            "model=tiny-flux",
            "reward=jpeg-compressibility",
            "iterations=7",
            "seed=11",
            f"out_dir={tmp_path}/x",
        ],
    )
    assert (cfg.system, cfg.profile, cfg.model.name, cfg.reward.name) == (
        "colocated-sync",
        "cpu-2",
        "tiny-flux",
        "jpeg-compressibility",
    )
    assert (cfg.iterations, cfg.seed, cfg.out_dir) == (7, 11, f"{tmp_path}/x")
    validate_config(cfg, world_size=2)


def test_dotted_overrides_and_yaml_types():
    cfg = load_config(
        TINY, ["algo.group_size=8", "trainer.lr=1e-3", "trainer.betas=[0.8, 0.9]", "resume=true"]
    )
    assert cfg.algo.group_size == 8 and cfg.trainer.lr == pytest.approx(1e-3)
    assert cfg.trainer.betas == [0.8, 0.9] and cfg.resume.enabled is True
    # names stay strings even when they look like numbers
    assert parse_override("out_dir=2024") == ("out_dir", "2024")


def test_yaml_file_is_read():
    cfg = load_config(TINY)
    assert cfg.model.name == "tiny-sd3" and cfg.sampler.num_steps == 8 and cfg.trainer.mode == "lora"


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["algo.grop_size=4"], "algo.grop_size"),
        (["nonsense=1"], "nonsense"),
        (["algo.group_size=four"], "algo.group_size"),
        (["iterations=1.5"], "iterations"),
        (["model.name.x=1"], "model.name"),
        (["trainer=3"], "trainer"),
        (["justtext"], "key=value"),
    ],
)
def test_parse_errors_name_the_key(overrides, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        load_config(TINY, overrides)


@pytest.mark.parametrize(
    ("overrides", "world", "needles"),
    [
        (["system=warp-drive"], 1, ["system", "colocated-sync"]),
        (["model=sdxl"], 1, ["model.name", "tiny-sd3"]),
        (["reward=beauty"], 1, ["reward.name", "brightness"]),
        (["profile=tpu-9000"], 1, ["profile", "cpu-1"]),
        (["algo.group_size=1"], 1, ["algo.group_size=1", "[2, 1000000]", "advantages need a group"]),
        (["algo.timestep_fraction=0"], 1, ["algo.timestep_fraction", "(0, 1]"]),
        (["algo.timestep_fraction=1.5"], 1, ["algo.timestep_fraction"]),
        (["algo.timestep_selection=random"], 1, ["algo.timestep_selection", "fast-window"]),
        (["sampler.sde_type=ode"], 1, ["sampler.sde_type", "cps"]),
        (["trainer.mode=qlora"], 1, ["trainer.mode", "lora"]),
        (["trainer.backend=megatron"], 1, ["trainer.backend", "fsdp2"]),
        (["reward.nonfinite_policy=ignore"], 1, ["reward.nonfinite_policy", "drop-group"]),
        (["profile=cpu-2"], 4, ["4 ranks", "profile='cpu-2'", "2 devices"]),
        (
            ["system=colocated-sync", "profile=cpu-4", "algo.prompts_per_iteration=6", "algo.group_size=3"],
            4,
            ["algo.prompts_per_iteration=6", "algo.group_size=3", "do not divide evenly over 4 ranks"],
        ),
        (["trainer.lr=.nan"], 1, ["trainer.lr", "finite"]),
        (["trainer.weight_decay=-1"], 1, ["trainer.weight_decay=-1", "[0, 100]"]),
        (["trainer.eps=0"], 1, ["trainer.eps"]),
        (["trainer.lora_alpha=-1"], 1, ["trainer.lora_alpha"]),
        (
            ["trainer.backend=deepspeed", "trainer.deepspeed_stage=7"],
            1,
            ["trainer.deepspeed_stage=7", "0, 1, 2, 3"],
        ),
        (["trainer.deepspeed_stage=1"], 1, ["trainer.deepspeed_stage", "trainer.backend='auto'"]),
        (
            ["system=separate-sync", "trainer.backend=deepspeed"],
            2,
            ["trainer.backend=deepspeed", "every rank", "colocated-sync"],
        ),
        (["gap.assignment=contiguous"], 1, ["gap.assignment", "dynamic"]),
        (["tag.policy=sometimes"], 1, ["tag.policy", "auto"]),
        (["algo.kl_beta=0.1", "trainer.mode=full"], 1, ["algo.kl_beta", "lora"]),
        (["sampler.num_steps=1"], 1, ["sampler.num_steps"]),
        (["model.dtype=int8"], 1, ["model.dtype", "bfloat16"]),
        (["trainer.nonfinite=ignore"], 1, ["trainer.nonfinite", "stop, skip"]),
        (
            ["trainer.nonfinite=skip", "trainer.backend=deepspeed"],
            1,
            ["trainer.nonfinite=skip", "DeepSpeed", "trainer.nonfinite=stop"],
        ),
        (["trainer.lr=1e38"], 1, ["trainer.lr=1e+38", "(0, 1e+06]"]),
        (["checkpoint_keep=-1"], 1, ["checkpoint_keep=-1", "[0, 1000000]"]),
        (["resume=true", "overwrite=true"], 1, ["resume=true and overwrite=true"]),
    ],
)
def test_validation_errors_name_key_and_allowed_values(overrides, world, needles):
    cfg = load_config(TINY, overrides)
    with pytest.raises(ConfigError) as info:
        validate_config(cfg, world_size=world)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))


def test_defaults_validate():
    validate_config(Config(), world_size=1)


@pytest.mark.parametrize("path", sorted(TINY.parent.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_experiment_config_loads_and_validates(path):
    cfg = load_config(path, [])
    validate_config(cfg, world_size=ranks_to_start(cfg))
    assert cfg.model.name and cfg.iterations > 0


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        (["system=colocated-sync", "tag=true"], ["tag.enabled=true", "command line", "digenrl"]),
        (["system=separate-sync", "tcss=true"], ["tcss.enabled=true", "system='separate-sync'", "digenrl"]),
        (["system=separate-async", "tcss.switch=timing"], ["tcss.switch='timing'", "tcss.enabled=true"]),
        (["system=colocated-sync", "sync.bucket_mb=8"], ["sync.bucket_mb", "separate-async, separate-sync"]),
        (
            ["system=separate-sync", "asynchrony.max_staleness=1"],
            ["asynchrony.max_staleness", "separate-async"],
        ),
        (["system=digenrl", "residency.train_resident=false"], ["residency.train_resident", "colocated"]),
        (
            ["system=colocated-sync", "pools.scorers=1"],
            ["pools.scorers", "digenrl, separate-async, separate-sync"],
        ),
    ],
)
def test_a_knob_the_system_does_not_honour_is_rejected_naming_it(overrides, needles):
    cfg = load_config(TINY, ["profile=cpu-4", *overrides])
    with pytest.raises(ConfigError) as info:
        validate_config(cfg, world_size=4)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))


def test_a_knob_in_the_yaml_file_is_named_with_its_file(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("system: colocated-sync\nprofile: cpu-1\ntcss:\n  enabled: true\n")
    with pytest.raises(ConfigError, match=rf"tcss.enabled=true \(set in {path}\)"):
        validate_config(load_config(path), world_size=1)
    # the same knob at its default, or a section the system honours, is fine
    validate_config(load_config(path, ["tcss=false", "system=digenrl", "profile=cpu-2"]), world_size=2)


def test_malformed_yaml_names_file_and_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("system: digenrl\nalgo:\n  group_size: [4\n")
    with pytest.raises(ConfigError, match=rf"config file {path}, line \d+, column \d+: not valid YAML"):
        load_config(path)


def test_config_differences_name_every_changed_key_except_the_resumable_ones():
    saved = Config().to_dict()
    now = load_config(
        None,
        [
            "trainer.lr=0.5",
            "reward.weights={brightness: 1.0}",
            "iterations=99",
            "checkpoint_keep=7",
            "seed=3",
        ],
    ).to_dict()
    assert config_differences(saved, now) == [
        "reward.weights: None in the checkpoint, {'brightness': 1.0} now",
        "seed: 0 in the checkpoint, 3 now",
        "trainer.lr: 0.0003 in the checkpoint, 0.5 now",
    ]
    del saved["trainer"]["nonfinite"]  # a checkpoint written before a key existed: it ran the default
    assert config_differences(saved, Config().to_dict()) == []
    assert config_differences(saved, load_config(None, ["trainer.nonfinite=skip"]).to_dict()) == [
        "trainer.nonfinite: (absent, so its default 'stop') in the checkpoint, 'skip' now"
    ]
