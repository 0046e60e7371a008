"""Bad inputs fail at startup with a ConfigError naming the key (issue 19, "Bad inputs"): generated from the
declarations for every numeric key (NaN, ±inf, out of range) and every enumeration key, plus tables of knobs
that a configuration would not read, of files that are missing, binary, in another encoding or malformed,
and of the cases the audit listed. Unit level (``load_config`` + ``validate_config``), and two runs of the
real command that must exit 2 before any worker starts."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
import types
import typing
from pathlib import Path

import pytest

from digenrl.config import Config, ConfigError, Range, declared_fields, load_config
from digenrl.validation import check_range, validate_config

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "experiments" / "configs" / "tiny.yaml"  # system=digenrl, profile=cpu-2, tiny-sd3


def _error(overrides: list[str], config: Path | None = TINY, world: int = 2) -> str:
    with pytest.raises(ConfigError) as info:
        validate_config(load_config(config, overrides), world_size=world)
    return str(info.value)


def _valid(overrides: list[str], tmp_path: Path, config: Path | None = TINY, world: int = 2) -> None:
    validate_config(load_config(config, [*overrides, f"out_dir={tmp_path / 'run'}"]), world_size=world)


# ------------------------------------------------------------------------------------- declarations


def _leaf_type(key: str) -> typing.Any:
    """The annotated type of a dotted key, Optional unwrapped."""
    cls: type = Config
    *sections, name = key.split(".")
    for section in sections:
        cls = typing.get_type_hints(cls)[section]
    tp = typing.get_type_hints(cls)[name]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        (tp,) = [a for a in typing.get_args(tp) if a is not type(None)]
    return tp


def _number_type(tp: typing.Any) -> type | None:
    """int or float for a numeric key, a list of numbers or a mapping to numbers; None otherwise."""
    origin = typing.get_origin(tp)
    inner = typing.get_args(tp)[-1] if origin in (list, dict) else tp
    return inner if inner in (int, float) else None


#: String keys that are names checked against a registry, paths checked as files, or module names.
FREE_FORM = {
    "system",
    "profile",
    "out_dir",
    "model.name",
    "model.pretrained_path",
    "model.attention_backend",
    "trainer.lora_targets",
    "reward.name",
    "reward.weights_path",
    "reward.url",
    "reward.token_file",
    "data.prompts",
    "data.eval_prompts",
    "runtime.costs_dir",
    "tcss.switch",  # auto | timing | a fragment index: checked against the plan's fragments (DigenRL.check)
    "logger.wandb_project",  # Weights & Biases names, free text
    "logger.wandb_run_name",
}

DECLARED = list(declared_fields(Config()))


@pytest.mark.parametrize(
    ("key", "declared"), [(k, d) for k, _, d in DECLARED], ids=[k for k, _, _ in DECLARED]
)
def test_every_numeric_key_declares_a_finite_range_and_every_string_key_its_values(key, declared):
    """The rule, not the listed cases: a new numeric key without a range (or a new string key without its
    allowed values or a registry) fails here."""
    tp = _leaf_type(key)
    if _number_type(tp) is not None and "choices" not in declared:  # a numeric enumeration: its values
        limits = declared.get("range")
        assert isinstance(limits, Range), f"{key}: add metadata=within(low, high) in digenrl/config.py"
        assert math.isfinite(limits.low) and math.isfinite(limits.high) and limits.low < limits.high
    elif tp is str or typing.get_origin(tp) is list:
        assert "choices" in declared or key in FREE_FORM, (
            f"{key}: add metadata=among(...) in digenrl/config.py"
        )


def _cli(value: float) -> str:
    """A number as typed after ``key=`` (YAML spellings for NaN and the infinities)."""
    if math.isnan(value):
        return ".nan"
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    return repr(value)


def _out_of_range(limits: Range, number: type) -> list[float]:
    below = limits.low if limits.low_open else limits.low - 1
    above = limits.high if limits.high_open else limits.high * 2 + 1
    values = [below, above, limits.high * 1e24]
    if number is float:
        values += [math.nan, math.inf, -math.inf]
    return [number(v) if math.isfinite(v) else v for v in values]


def _range_cases() -> list[tuple[str, str, str]]:
    """(override, the key the error must name, the range it must state, whether the value is finite) for
    every numeric key; a list's first number is valid, its second is not."""
    cases = []
    for key, _, declared in DECLARED:
        number = _number_type(_leaf_type(key))
        if number is None or "range" not in declared:
            continue
        limits = declared["range"]
        for value in _out_of_range(limits, number):
            origin = typing.get_origin(_leaf_type(key))
            if origin is list:
                valid = number((limits.low + limits.high) / 2)
                override, named = f"{key}=[{_cli(valid)}, {_cli(value)}]", f"{key}[1]"
            elif origin is dict:
                override, named = f"{key}={{brightness: {_cli(value)}}}", f"{key}.brightness"
            else:
                override, named = f"{key}={_cli(value)}", key
            cases.append((override, named, str(limits), math.isfinite(value)))
    return cases


@pytest.mark.parametrize(("override", "key", "allowed", "finite"), _range_cases(), ids=lambda v: str(v)[:60])
def test_a_number_outside_its_range_is_refused_naming_key_value_and_range(override, key, allowed, finite):
    message = _error([override])
    assert message.startswith(f"{key}=") and f"allowed range {allowed}" in message, message
    assert ("not a finite number" in message) == (not finite), message


def test_a_range_admits_its_closed_bounds_and_refuses_its_open_ones():
    check_range("k", 0, Range(0, 1))
    check_range("k", 1.0, Range(0, 1))
    with pytest.raises(ConfigError, match=r"k=0 is outside its allowed range \(0, 1\]"):
        check_range("k", 0, Range(0, 1, low_open=True))
    with pytest.raises(ConfigError, match=r"k\[1\]=1.0 is outside its allowed range \[0, 1\)"):
        check_range("k", [0.5, 1.0], Range(0, 1, high_open=True))


ENUMS = [(k, d["choices"]) for k, _, d in DECLARED if "choices" in d]


@pytest.mark.parametrize(("key", "choices"), ENUMS, ids=[k for k, _ in ENUMS])
def test_an_enumeration_key_with_a_bogus_value_lists_its_values(key, choices):
    bogus = "7" if isinstance(choices[0], int) else "bogus"
    message = _error([f"{key}={bogus}"])
    assert message.startswith(f"{key}=") and all(str(c) in message for c in choices), message


def test_enumerations_are_the_tuples_the_runtime_checks():
    """One declaration: the modules acting on a value use the tuple the config field declares."""
    from digenrl.algo import STD_MODES, TRAIN_STEP_MODES
    from digenrl.gap.fragments import ASSIGNMENTS
    from digenrl.plan import run_plan
    from digenrl.rewards import NONFINITE_POLICIES
    from digenrl.rollout.sampler import CFG_GRAD_MODES
    from digenrl.runtime.comm.distributed import RUNTIME_BACKENDS
    from digenrl.trainer import BACKENDS

    declared = dict(ENUMS)
    assert declared["algo.timestep_selection"] is TRAIN_STEP_MODES
    assert declared["algo.adv_std"] is STD_MODES
    assert declared["gap.assignment"] is ASSIGNMENTS
    assert declared["reward.nonfinite_policy"] is NONFINITE_POLICIES
    assert declared["algo.cfg_grad"] is CFG_GRAD_MODES
    assert declared["runtime.backend"] is RUNTIME_BACKENDS
    assert declared["trainer.backend"] is BACKENDS
    # the run's and the simulator's plans take the same values (digenrl/plan/run_plan.py)
    assert declared["system"] is run_plan.SYSTEMS
    assert declared["gap.assignment"] is run_plan.GAP_ASSIGNMENTS
    assert declared["gap.train_order"] is run_plan.TRAIN_ORDERS


# ------------------------------------------------------------------------------------- the audit's cases


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        (["sampler.guidance_scale=.nan"], ["sampler.guidance_scale=nan", "[0, 100]"]),
        (["sampler.guidance_scale=.inf"], ["sampler.guidance_scale=inf", "[0, 100]"]),
        (["sampler.noise_level=1e30"], ["sampler.noise_level=1e+30", "[0, 10]"]),
        (["sampler.noise_level=1" + "0" * 400], ["sampler.noise_level=inf", "not a finite number"]),
        (["sampler.shift=0"], ["sampler.shift=0.0", "(0, 100]"]),
        (["sampler.shift=-2"], ["sampler.shift=-2.0"]),
        (["sampler.shift=.nan"], ["sampler.shift=nan"]),
        (["sync.bucket_mb=.inf"], ["sync.bucket_mb=inf"]),
        (["sync.bucket_mb=.nan"], ["sync.bucket_mb=nan"]),
        (["sync.bucket_mb=0"], ["sync.bucket_mb=0.0", "(0, 65536]"]),
        (["sync.mode=bogus"], ["sync.mode='bogus'", "auto, lora, full"]),
        (["seed=99999999999999999999999"], ["seed=99999999999999999999999", "[0, 4294967295]", "numpy"]),
        (["seed=4294967296"], ["seed=4294967296"]),
        (["seed=-1"], ["seed=-1"]),
        (["reward.weights={brightness: .nan}"], ["reward.weights.brightness=nan"]),
        (
            ["reward.weights={brightness: 1, jpeg-compressibility: -.inf}"],
            ["reward.weights.jpeg-compressibility"],
        ),
        (["profile=cpu-3"], ["profile='cpu-3'", "cpu-1, cpu-2, cpu-2-hetero, cpu-4", "h200-8"]),
        (["trainer.betas=[0.9]"], ["trainer.betas", "two numbers"]),
        # cross-key checks that used to fail inside the workers
        (["sampler.sde_type=cps", "sampler.noise_level=1.5"], ["sampler.noise_level=1.5", "cps", "[0, 1]"]),
        (
            ["model=tiny-qwen-image", "sampler.noise_level=null", "sampler.sde_type=cps"],
            ["sampler.noise_level=1.2 (the model's default)"],
        ),
        (
            ["algo.timestep_selection=fast-window", "algo.fast_window=5"],
            ["algo.fast_window=5", "num_steps // 2 = 4"],
        ),
        (["algo=mixgrpo", "algo.mix_window=9"], ["algo.mix_window=9", "sampler.num_steps=8"]),
        (
            ["algo=mixgrpo", "algo.mix_ode_solver=dpm2", "tsp.stages=2"],
            ["algo.mix_ode_solver=dpm2", "tsp.stages=2"],
        ),
        (["algo=grpo"], ["algo.name='grpo'", "flowgrpo, mixgrpo, diffusionnft"]),
        (["algo=diffusionnft", "tcss=true"], ["algo.name=diffusionnft", "tcss.enabled=true", "on-policy"]),
        (
            ["algo=diffusionnft", "algo.nft_ode_solver=dpm2", "tsp.stages=2"],
            ["algo.nft_ode_solver=dpm2", "tsp.stages=2"],
        ),
        (["sync.mode=full"], ["sync.mode='full'", "trainer.mode='lora'"]),
        (["reward=pickscore"], ["reward 'pickscore'", "reward.weights_path"]),
        (
            ["reward=pickscore", "reward.weights_path=/nonexistent/clip"],
            ["reward.weights_path='/nonexistent/clip'"],
        ),
        (["reward.weights={beauty: 1}"], ["reward.weights key='beauty'", "brightness"]),
    ],
)
def test_the_audits_bad_values_fail_at_startup_naming_the_key(overrides, needles):
    message = _error(overrides)
    for needle in needles:
        assert needle in message, (needle, message)


# ------------------------------------------------------------------------------------- knobs not read


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        (["algo.fast_window=3"], ["algo.fast_window=3", "timestep_selection=fast-window", "'first'"]),
        (["algo.mix_window=2"], ["algo.mix_window=2", "with algo.name=mixgrpo", "'flowgrpo'"]),
        (["algo=diffusionnft", "algo.mix_window=4"], ["algo.mix_window=4", "with algo.name=mixgrpo"]),
        (["algo=diffusionnft", "algo.clip_range=0.1"], ["algo.clip_range=0.1", "DiffusionNFT has no ratio"]),
        (["algo=diffusionnft", "algo.ratio_norm=true"], ["algo.ratio_norm=true", "'diffusionnft'"]),
        (["algo.nft_beta=0.5"], ["algo.nft_beta=0.5", "with algo.name=diffusionnft"]),
        (["algo=diffusionnft", "algo.timestep_selection=shuffled"], ["algo.timestep_selection='shuffled'"]),
        (["sampler.sde_type=cps", "algo.ratio_norm=true"], ["algo.ratio_norm=true", "sampler.sde_type=sde"]),
        (["algo=mixgrpo", "algo.timestep_fraction=0.5"], ["algo.timestep_fraction=0.5", "'mixgrpo'"]),
        (
            ["algo=mixgrpo", "algo.mix_schedule=random", "algo.mix_shift_interval=5"],
            ["algo.mix_shift_interval=5", "mix_schedule=progressive"],
        ),
        (["algo.timestep_selection=shuffled", "algo.fast_window=1"], ["algo.fast_window=1", "'shuffled'"]),
        (
            ["trainer.mode=full", "trainer.lora_rank=4"],
            ["trainer.lora_rank=4", "trainer.mode=lora", "'full'"],
        ),
        (["trainer.mode=full", "trainer.lora_alpha=4"], ["trainer.lora_alpha=4"]),
        (["trainer.mode=full", "trainer.lora_targets=[attn.to_q]"], ["trainer.lora_targets=['attn.to_q']"]),
        (["trainer.deepspeed_stage=3"], ["trainer.deepspeed_stage=3", "trainer.backend=deepspeed", "'auto'"]),
        (["trainer.backend=ddp", "trainer.deepspeed_stage=0"], ["trainer.deepspeed_stage=0", "'ddp'"]),
        (["algo.cfg_grad=both"], ["algo.cfg_grad='both'", "classifier-free guidance", "guidance_scale=1"]),
        (
            ["sampler.guidance_scale=0.5", "algo.cfg_grad=cond"],
            ["algo.cfg_grad='cond'", "guidance_scale=0.5"],
        ),
        (
            ["model=tiny-flux", "sampler.guidance_scale=3.5", "algo.cfg_grad=both"],
            ["algo.cfg_grad", "'tiny-flux', which embeds the guidance scale"],
        ),
        (
            ["tag=false", "tag.policy=always"],
            ["tag.policy='always'", "tag.enabled=true", "tag.enabled=false"],
        ),
        (["tag=false", "tag.max_fragments=2"], ["tag.max_fragments=2"]),
        (["tag.enabled=false", "tag.park_grads=true"], ["tag.park_grads=true"]),
        (
            ["reward.weights={brightness: 1}", "reward.name=jpeg-compressibility"],
            ["reward.name='jpeg-compressibility'", "reward.weights replaces reward.name"],
        ),
        (["reward.weights_path=/tmp"], ["reward.weights_path='/tmp'", "a reward that runs a model"]),
        (
            ["system=colocated-sync", "tag.policy=always"],
            ["tag.policy", "system='colocated-sync'", "digenrl"],
        ),
    ],
)
def test_a_knob_the_run_would_not_read_is_refused_naming_it_and_why(overrides, needles):
    message = _error(overrides)
    assert "(set in the command line)" in message
    for needle in needles:
        assert needle in message, (needle, message)


def test_the_same_knobs_are_accepted_where_they_are_read(tmp_path):
    _valid(["algo.timestep_selection=fast-window", "algo.fast_window=3"], tmp_path)
    _valid(["algo=mixgrpo", "algo.mix_window=2", "algo.mix_stride=2", "algo.mix_ode_solver=dpm2"], tmp_path)
    _valid(["algo.ratio_norm=true", "algo.step_reweight=true", "algo.clip_range=2e-6"], tmp_path)
    _valid(
        ["algo=diffusionnft", "algo.nft_beta=0.1", "algo.kl_beta=1e-4", "algo.timestep_fraction=0.5"],
        tmp_path,
    )
    _valid(["trainer.deepspeed_stage=2", "trainer.backend=deepspeed", "system=colocated-sync"], tmp_path)
    _valid(["sampler.guidance_scale=4.5", "algo.cfg_grad=both"], tmp_path)
    _valid(["tag.policy=always", "tag.max_fragments=2", "tag.park_grads=true"], tmp_path)
    _valid(["reward.weights={brightness: 1, jpeg-compressibility: 0.5}", "reward.name=brightness"], tmp_path)


def test_a_config_file_setting_a_knob_its_own_switch_turns_off_names_the_file(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("trainer:\n  mode: full\n  lora_rank: 8\n")
    message = _error([], config=path, world=1)
    assert f"trainer.lora_rank=8 (set in {path})" in message and "trainer.mode='full'" in message


def test_a_command_line_switch_turns_off_what_the_config_file_set_for_it(tmp_path):
    """tiny.yaml sets trainer.lora_rank / lora_alpha: ``trainer.mode=full`` runs it as full fine-tuning. A
    file's TAG settings under ``tag=false``, or its digenrl knobs under ``system=separate-sync``, likewise."""
    _valid(["trainer.mode=full"], tmp_path)
    path = tmp_path / "exp.yaml"
    path.write_text(TINY.read_text() + "tag:\n  policy: always\ngap:\n  fragment_groups: 2\n")
    _valid(["tag=false"], tmp_path, config=path)
    _valid(["system=separate-sync"], tmp_path, config=path)
    _valid(["reward.weights={jpeg-compressibility: 1}"], tmp_path)  # tiny.yaml: reward.name=brightness


# ------------------------------------------------------------------------------------- files


def test_a_binary_or_non_utf8_config_file_names_the_option_and_file(tmp_path):
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    with pytest.raises(
        ConfigError, match=rf"--config='{binary}' is a binary file \(a NUL byte at offset 8\)"
    ):
        load_config(binary)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("system: digenrl\n# caf\xe9\n".encode("latin-1"))
    with pytest.raises(
        ConfigError, match=rf"--config='{latin}' is not UTF-8 text \(byte 0xe9 at offset 21\)"
    ):
        load_config(latin)
    with pytest.raises(ConfigError, match=rf"--config='{tmp_path}' is a directory"):
        load_config(tmp_path)
    with pytest.raises(ConfigError, match=r"--config='.*missing.yaml' is not an existing file"):
        load_config(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        (
            "system: digenrl\nseed: 1\nseed: 2\n",
            ["line 3, column 1", "duplicate key 'seed' (first on line 2)"],
        ),
        (
            "algo:\n  group_size: 4\n  clip_range: 0.1\n  group_size: 8\n",
            ["line 4, column 3", "duplicate key 'group_size' (first on line 2)"],
        ),
        ("tsp_stages: 2\ntsp:\n  stages: 3\n", ["sets tsp.stages twice (as tsp_stages and as tsp)"]),
    ],
)
def test_a_key_twice_in_a_yaml_file_is_refused_naming_it_and_the_line(tmp_path, text, needles):
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"config file {path}" in str(info.value)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))


def test_an_empty_config_file_means_the_defaults(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing set yet\n")
    assert load_config(path) == load_config(None)


def test_aliases_work_in_a_yaml_file_as_on_the_command_line(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(TINY.read_text() + "tsp_stages: 2\npools:\n  trainers: 2\n  generators: 2\n")
    cfg = load_config(path, ["profile=cpu-4"])
    assert cfg.tsp.stages == 2 and load_config(None, ["tsp_stages=2"]).tsp.stages == 2
    validate_config(cfg, world_size=4)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"a cat\n\x00\x01\x02", "is a binary file (a NUL byte at offset 6)"),
        ("a caf\xe9\n".encode("latin-1"), "is not UTF-8 text (byte 0xe9 at offset 5)"),
    ],
)
def test_a_binary_or_non_utf8_prompt_file_names_the_key_and_file(tmp_path, content, needle):
    path = tmp_path / "prompts.txt"
    path.write_bytes(content)
    message = _error([f"data.prompts={path}"])
    assert f"data.prompts='{path}' {needle}" in message, message


def test_a_prompt_folder_is_named_as_not_a_file():
    message = _error(["data.prompts=/tmp"])
    assert "data.prompts='/tmp' is neither a shipped set nor an existing file" in message


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"\x00\x01binary", "is a binary file"),
        (b"name: a\nname: b\n", "line 2, column 1: duplicate key 'name'"),
        (b"name: [\n", "not valid YAML"),
    ],
)
def test_a_broken_hardware_profile_file_names_the_key_and_file(tmp_path, content, needle):
    path = tmp_path / "profile.yaml"
    path.write_bytes(content)
    message = _error([f"profile={path}"])
    assert message.startswith(f"profile='{path}'") and needle in message, message


# ------------------------------------------------------------------------------------- the real command


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["sampler.guidance_scale=.nan"], "sampler.guidance_scale=nan"),
        (["sync.mode=bogus"], "sync.mode='bogus'"),
        (["profile=cpu-3"], "profile='cpu-3'"),
        (["tag=false", "tag.policy=always"], "tag.policy='always'"),
    ],
)
def test_the_command_exits_2_in_seconds_naming_the_key_before_any_worker_starts(tmp_path, args, needle):
    """These checks import nothing heavy (no torch): the command ends long before a worker could start."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, str(REPO / "experiments/run_train.py"), "--config", str(TINY), *args]
    start = time.monotonic()
    proc = subprocess.run(
        [*cmd, f"out_dir={tmp_path}"], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    elapsed = time.monotonic() - start
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("config error: ") and needle in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "starting" not in proc.stdout
    assert elapsed < 3.0, f"{elapsed:.1f} s"


@pytest.mark.parametrize("entry", [[str(REPO / "experiments/run_train.py")], ["-m", "digenrl.launch"]])
def test_the_command_refuses_a_binary_config_file_with_exit_2(tmp_path, entry):
    """Both commands (``python -m digenrl.launch`` is what torchrun's workers run, outside the checkout)."""
    binary = tmp_path / "exp.yaml"
    binary.write_bytes(bytes(range(256)))
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(
        [sys.executable, *entry, "--config", str(binary)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and f"--config='{binary}' is a binary file" in proc.stderr, proc.stderr
    assert "UnicodeDecodeError" not in proc.stderr


def test_every_models_published_defaults_lie_inside_the_ranges():
    """The ranges admit real-model settings: each model's defaults, which a user may also set explicitly
    (experiments/configs/*.yaml validate in tests/config/test_config.py)."""
    from digenrl.models.specs import MODEL_SPECS

    fields = {k: d["range"] for k, _, d in DECLARED if "range" in d}
    for spec in MODEL_SPECS.values():
        assert spec.noise_level in fields["sampler.noise_level"], spec.name
        assert spec.default_guidance_scale in fields["sampler.guidance_scale"], spec.name
        assert spec.shift in fields["sampler.shift"], spec.name
        assert spec.default_num_steps in fields["sampler.num_steps"], spec.name
        assert spec.default_height in fields["model.height"] and spec.default_width in fields["model.width"]
        if spec.default_frames is not None:
            assert spec.default_frames in fields["model.frames"], spec.name
