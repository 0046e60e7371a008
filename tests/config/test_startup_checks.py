"""Errors that used to surface after the model was built (or as tracebacks) fail at startup, naming the key.

Unit level: ``validate_config`` / ``validate_devices`` on a Config, no process group, no weights.
"""

from __future__ import annotations

import resource
import time
from pathlib import Path

import pytest

from digenrl.config import ConfigError, load_config
from digenrl.validation import validate_config, validate_devices

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "experiments" / "configs" / "tiny.yaml"
SD35 = REPO / "experiments" / "configs" / "sd35-medium-lora.yaml"


def _fails(overrides: list[str], *needles: str, world: int = 2) -> str:
    cfg = load_config(TINY, overrides)
    with pytest.raises(ConfigError) as info:
        validate_config(cfg, world_size=world)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))
    return str(info.value)


def test_prompt_file_missing_or_empty_is_named(tmp_path):
    _fails([f"data.prompts={tmp_path / 'nope.txt'}"], "data.prompts=", "nope.txt", "builtin")
    _fails(["data.prompts=''"], "data.prompts=''", "builtin")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n   \n\n")
    _fails([f"data.prompts={empty}"], f"data.prompts='{empty}'", "no prompts")
    good = tmp_path / "prompts.txt"
    good.write_text("a cat\n\na dog\n")
    validate_config(load_config(TINY, [f"data.prompts={good}", f"out_dir={tmp_path / 'run'}"]), world_size=2)


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        (["model.height=30"], ["model.height=30", "multiple of 8", "tiny-sd3", "e.g. 32"]),
        (["model.width=36"], ["model.width=36", "multiple of 8"]),
        (
            ["model=tiny-qwen-image", "model.width=40"],
            ["model.width=40", "multiple of 16", "tiny-qwen-image"],
        ),
        (["model.frames=5"], ["model.frames=5", "image model tiny-sd3", "video"]),
        (["model.frames=1"], ["model.frames=1", "image model"]),
        (["model=tiny-wan", "model.frames=6"], ["model.frames=6", "tiny-wan", "(frames - 1) % 4"]),
    ],
)
def test_resolution_and_frames_are_checked_against_the_model_spec(overrides, needles):
    _fails(overrides, *needles)


def test_a_valid_resolution_and_video_frames_pass(tmp_path):
    out = f"out_dir={tmp_path}"
    validate_config(load_config(TINY, ["model.height=64", "model.width=32", out]), world_size=2)
    validate_config(load_config(TINY, ["model=tiny-wan", "model.frames=9", out]), world_size=2)


def test_unknown_attention_backend_lists_the_allowed_names():
    message = _fails(["model.attention_backend=flash4"], "model.attention_backend='flash4'", "native")
    assert "xformers" in message and "_native_math" in message


def test_pretrained_path_must_exist_with_its_sub_folders(tmp_path):
    _fails([f"model.pretrained_path={tmp_path / 'missing'}"], "model.pretrained_path=", "missing", "local")
    directory = tmp_path / "sd3"
    for sub in ("transformer", "text_encoder"):
        (directory / sub).mkdir(parents=True)
    message = _fails([f"model.pretrained_path={directory}"], "model.pretrained_path=", "vae/")
    # tiny-sd3 has three text encoders: the missing ones are named too, and the complete layout listed
    assert "text_encoder_2/" in message and "text_encoder_3/" in message and "transformer/" in message


def test_lora_targets_are_checked_against_the_modules_the_spec_builds():
    _fails(["trainer.lora_targets=[attn.to_qq]"], "trainer.lora_targets", "attn.to_qq", "to_q")
    _fails(["trainer.lora_targets=[]"], "trainer.lora_targets", "non-empty")
    _fails(["trainer.mode=full", "trainer.lora_targets=[attn.to_q]"], "trainer.lora_targets", "mode='full'")


def test_lora_targets_check_allocates_no_weights_and_is_fast(tmp_path):
    # Qwen-Image's transformer has 20.4 B parameters (82 GB in fp32, far more than this machine holds):
    # the check builds it on the meta device, so the process's peak memory barely moves.
    cfg = load_config(
        TINY, ["model=qwen-image", "trainer.lora_targets=[attn.to_q, attn.add_k_proj]", f"out_dir={tmp_path}"]
    )
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    validate_config(cfg, world_size=2)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before < 1024**2  # < 1 GiB
    tiny = load_config(TINY, ["trainer.lora_targets=[attn.to_q, attn.to_v]", f"out_dir={tmp_path}"])
    validate_config(tiny, world_size=2)  # warm: diffusers imported once per process
    start = time.perf_counter()
    validate_config(tiny, world_size=2)
    # measured 0.05 s (idle) to 0.6 s (load 12) on the 2-core CI machine; a real-weight build would not fit
    assert time.perf_counter() - start < 10


def test_out_dir_that_cannot_be_written_is_named(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    _fails([f"out_dir={blocker / 'run'}"], f"out_dir='{blocker / 'run'}'", "is a file")
    _fails([f"out_dir={blocker}"], "out_dir=", "is a file")
    validate_config(load_config(TINY, [f"out_dir={tmp_path / 'new' / 'deeper'}"]), world_size=2)
    assert not (tmp_path / "new").exists()  # the check creates nothing


@pytest.mark.parametrize("value", ["1", "0.001", "9.99", "0", "-5", ".nan", ".inf"])
def test_runtime_timeout_below_its_floor_is_refused_with_the_reason(tmp_path, value):
    """1 s killed a healthy run during setup and 0.001 s failed inside c10d: refused at startup instead."""
    _fails(
        [f"runtime.timeout_s={value}", f"out_dir={tmp_path}"],
        "runtime.timeout_s=",
        "[10, 604800]",
        "start of the process group",
        "hang watchdog",
    )


def test_runtime_timeout_at_its_floor_passes(tmp_path):
    validate_config(load_config(TINY, ["runtime.timeout_s=10", f"out_dir={tmp_path}"]), world_size=2)


def test_nccl_needs_torchrun_and_gpus():
    cfg = load_config(TINY, ["runtime.backend=nccl", "profile=cpu-1", "system=colocated-sync"])
    with pytest.raises(ConfigError, match=r"runtime\.backend=nccl .*single process"):
        validate_devices(cfg, 1, distributed=False, cuda_devices=1)
    with pytest.raises(ConfigError, match=r"2 ranks on this node would share 0 GPU.*runtime\.backend\)"):
        validate_devices(cfg, 2, distributed=True, cuda_devices=0)
    validate_devices(cfg, 2, distributed=True, cuda_devices=2)


def test_real_size_model_on_cpu_is_refused_with_its_memory_estimate():
    cfg = load_config(SD35)
    with pytest.raises(ConfigError) as info:
        validate_devices(cfg, 1, distributed=False, cuda_devices=0)
    message = str(info.value)
    for needle in (
        "model.name='sd3.5-medium'",
        "CPU",
        "GiB",
        "transformer 2.24 B",
        "runtime.allow_large_cpu_model",
    ):
        assert needle in message, (needle, message)
    # the estimate: 7.9 B parameters x 2 bytes (bf16) = 14.7 GiB of weights, plus a small LoRA trainer
    assert "weights 14.7 GiB" in message and "LoRA adapter" in message
    # gloo ranks compute on the CPU even where GPUs exist
    with pytest.raises(ConfigError, match=r"runtime\.backend=gloo"):
        validate_devices(load_config(SD35, ["runtime.backend=gloo"]), 2, distributed=True, cuda_devices=2)
    # full fine-tuning adds gradients and AdamW states of the transformer: 3 x 2.24 B x 2 bytes
    with pytest.raises(ConfigError, match=r"trainer 12\.5 GiB \(gradients and AdamW"):
        validate_devices(load_config(SD35, ["trainer.mode=full"]), 1, distributed=False, cuda_devices=0)
    validate_devices(
        load_config(SD35, ["runtime.allow_large_cpu_model=true"]), 1, distributed=False, cuda_devices=0
    )
    # a GPU: fine (profile=auto would read this CPU machine's devices: the GPU machine's profile is named)
    validate_devices(load_config(SD35, ["profile=h200-1"]), 1, distributed=False, cuda_devices=1)
    validate_devices(load_config(TINY), 2, distributed=True, cuda_devices=0)  # tiny-* always allowed


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        (["trainer.checkpoint_format=zip"], ["trainer.checkpoint_format='zip'", "auto, full, sharded"]),
        (
            ["trainer.mode=lora", "trainer.checkpoint_format=sharded"],
            ["trainer.checkpoint_format=sharded", "lora"],
        ),
        (
            ["trainer.mode=full", "trainer.backend=ddp", "trainer.checkpoint_format=sharded"],
            ["trainer.checkpoint_format=sharded", "trainer.backend='ddp'"],
        ),
        (
            ["trainer.mode=full", "trainer.backend=deepspeed", "trainer.checkpoint_format=sharded"],
            ["trainer.checkpoint_format=sharded", "trainer.backend='deepspeed'"],
        ),
    ],
)
def test_checkpoint_format_is_checked_at_startup(overrides, needles):
    _fails(overrides, *needles)


def test_sharded_checkpoints_with_fsdp2_full_fine_tuning_pass(tmp_path):
    for backend in ("auto", "fsdp2"):
        overrides = ["trainer.mode=full", f"trainer.backend={backend}", "trainer.checkpoint_format=sharded"]
        validate_config(load_config(TINY, [*overrides, f"out_dir={tmp_path / 'run'}"]), world_size=2)


@pytest.mark.parametrize(
    "overrides",
    [[], ["system=colocated-sync", "profile=cpu-1"], ["trainer.mode=full", "system=separate-sync"]],
)
def test_a_runs_resolved_config_loads_back_as_a_config(tmp_path, overrides):
    """``--config runs/a/config.yaml`` (docs/operations.md, "Reading a run"): the resolved file lists every
    key, read or not; none counts as set by the user, so the knob rules do not refuse the run's own config."""
    from digenrl.config import save_config

    cfg = load_config(TINY, [*overrides, f"out_dir={tmp_path / 'run'}"])
    validate_config(cfg, world_size=2 if cfg.profile == "cpu-2" else 1)
    save_config(cfg, tmp_path / "config.yaml", run_id="feed")
    again = load_config(tmp_path / "config.yaml")
    validate_config(again, world_size=2 if cfg.profile == "cpu-2" else 1)
    assert again.to_dict() == cfg.to_dict()


def test_a_plain_config_file_still_has_its_unread_knobs_refused(tmp_path):
    from digenrl.config import save_config

    """Only a run's resolved config (its ``# run_id:`` line) is read that way: a user's file that sets an
    unread knob is still refused, and so is an unread knob set on the command line on top of a resolved
    config."""
    path = tmp_path / "mine.yaml"
    path.write_text("system: colocated-sync\nprofile: cpu-1\ntag:\n  policy: auto\n")
    with pytest.raises(ConfigError, match=r"tag\.policy"):
        validate_config(load_config(path, [f"out_dir={tmp_path / 'run'}"]), world_size=1)
    path.write_text("system: colocated-sync\nprofile: cpu-1\n")
    save_config(load_config(path), tmp_path / "config.yaml", run_id="feed")
    with pytest.raises(ConfigError, match=r"tag\.max_fragments"):
        validate_config(
            load_config(tmp_path / "config.yaml", ["tag.max_fragments=2", f"out_dir={tmp_path / 'run'}"]),
            world_size=1,
        )


@pytest.mark.needs("torchao")
def test_fp8_is_checked_at_startup(tmp_path):
    _fails(["model.fp8=true", "trainer.mode=full"], "model.fp8=true needs trainer.mode=lora", "'full'")
    _fails(["model.fp8=true", "trainer.backend=deepspeed"], "model.fp8=true", "deepspeed")
    _fails(["model.fp8=true", "model=tiny-wan"], "model.fp8=true", "divisible by 16")
    validate_config(load_config(TINY, ["model.fp8=true", f"out_dir={tmp_path}"]), world_size=2)


def test_fp8_without_torchao_names_the_key_and_the_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_torchao(name, *args, **kwargs):
        if name.split(".")[0] == "torchao":
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torchao)
    monkeypatch.setattr("importlib.import_module", lambda name, *a: no_torchao(name))
    _fails(["model.fp8=true"], "model.fp8=true needs torchao", ".[fp8]")
