"""The bad-input rule (issue 35, item 7): a table of bad inputs — types, names, cross-key settings, sizes a
run cannot hold, resolutions the model cannot take, surrogate settings that train nothing, files, paths,
remote settings, YAML shapes — each refused at startup (``load_config`` + ``validate_config``, what
``launch.main`` runs before any worker starts) with a ConfigError naming the key. Never a traceback, never
accepted. One process, validation only: no model is built, nothing trains (well under a second in all for
most rows)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from digenrl.config import ConfigError, load_config
from digenrl.validation import validate_config

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "experiments" / "configs" / "tiny.yaml"  # digenrl on cpu-2 (2 ranks), tiny-sd3

#: (overrides, the key the error must name). ``{tmp}`` is a fresh folder of the test's own.
CASES: list[tuple[list[str], str]] = [
    # -- wrong types: a word, a list, a mapping or a fraction where a number belongs
    (["iterations=many"], "iterations"),
    (["iterations=[3]"], "iterations"),
    (["iterations={a: 1}"], "iterations"),
    (["iterations=2.5"], "iterations"),
    (["iterations=true"], "iterations"),
    (["seed=zero"], "seed"),
    (["seed=1.5"], "seed"),
    (["checkpoint_every=often"], "checkpoint_every"),
    (["checkpoint_keep=[1, 2]"], "checkpoint_keep"),
    (["trainer.lr=fast"], "trainer.lr"),
    (["trainer.lr=[0.1]"], "trainer.lr"),
    (["trainer.lr={x: 1}"], "trainer.lr"),
    (["trainer.weight_decay=none-at-all"], "trainer.weight_decay"),
    (["trainer.eps=tiny"], "trainer.eps"),
    (["trainer.grad_clip=off"], "trainer.grad_clip"),
    (["trainer.micro_batch_size=2.5"], "trainer.micro_batch_size"),
    (["trainer.micro_batch_size=big"], "trainer.micro_batch_size"),
    (["trainer.lora_rank=eight"], "trainer.lora_rank"),
    (["trainer.lora_alpha=[16]"], "trainer.lora_alpha"),
    (["trainer.betas=[a, b]"], "trainer.betas"),
    (["trainer.betas=0.9"], "trainer.betas"),
    (["trainer.betas=[0.9, 0.99, 0.999]"], "trainer.betas"),
    (["trainer.betas=[1.0, 0.999]"], "trainer.betas"),
    (["trainer.betas=[0.9, -0.1]"], "trainer.betas"),
    (["trainer.ema_decay=1.0"], "trainer.ema_decay"),
    (["trainer.ema_decay=half"], "trainer.ema_decay"),
    (["trainer.lora_targets=5"], "trainer.lora_targets"),
    (["trainer.lora_targets=[]"], "trainer.lora_targets"),
    (["trainer.lora_targets=[no_such_layer]"], "trainer.lora_targets"),
    (["trainer.lora_targets=[1, 2]"], "trainer.lora_targets"),
    (["trainer.deepspeed_stage=4"], "trainer.deepspeed_stage"),
    (["trainer.deepspeed_stage=two"], "trainer.deepspeed_stage"),
    (["trainer.mode=half"], "trainer.mode"),
    (["trainer.backend=horovod"], "trainer.backend"),
    (["trainer.nonfinite=ignore"], "trainer.nonfinite"),
    (["trainer.checkpoint_format=zip"], "trainer.checkpoint_format"),
    (["trainer.activation_checkpointing=maybe"], "trainer.activation_checkpointing"),
    (["sampler.num_steps=1"], "sampler.num_steps"),
    (["sampler.num_steps=ten"], "sampler.num_steps"),
    (["sampler.num_steps=8.5"], "sampler.num_steps"),
    (["sampler.noise_level=loud"], "sampler.noise_level"),
    (["sampler.noise_level=-0.1"], "sampler.noise_level"),
    (["sampler.guidance_scale=-1"], "sampler.guidance_scale"),
    (["sampler.guidance_scale=[1, 2]"], "sampler.guidance_scale"),
    (["sampler.sde_type=ode"], "sampler.sde_type"),
    (["sampler.shift=-0.5"], "sampler.shift"),
    (["sampler.samples_per_forward=-2"], "sampler.samples_per_forward"),
    (["algo.group_size=1"], "algo.group_size"),
    (["algo.group_size=four"], "algo.group_size"),
    (["algo.prompts_per_iteration=0"], "algo.prompts_per_iteration"),
    (["algo.prompts_per_iteration=-4"], "algo.prompts_per_iteration"),
    (["algo.timestep_fraction=0"], "algo.timestep_fraction"),
    (["algo.timestep_fraction=1.5"], "algo.timestep_fraction"),
    (["algo.clip_range=0"], "algo.clip_range"),
    (["algo.clip_range=wide"], "algo.clip_range"),
    (["algo.kl_beta=-0.1"], "algo.kl_beta"),
    (["algo.adv_std=batch"], "algo.adv_std"),
    (["algo.adv_clamp=0"], "algo.adv_clamp"),
    (["algo.num_updates_per_batch=0"], "algo.num_updates_per_batch"),
    (["algo.cfg_grad=uncond"], "algo.cfg_grad"),
    (["algo.timestep_selection=last"], "algo.timestep_selection"),
    (["algo.fast_window=0"], "algo.fast_window"),
    (["model.dtype=float8"], "model.dtype"),
    (["model.dtype=fp32"], "model.dtype"),
    (["model.height=tall"], "model.height"),
    (["model.height=0"], "model.height"),
    (["model.width=-64"], "model.width"),
    (["model.frames=0"], "model.frames"),
    (["model.cudnn_sdpa=sometimes"], "model.cudnn_sdpa"),
    (["model.fp8=yes-please"], "model.fp8"),
    (["model.compile=[1]"], "model.compile"),
    (["runtime.timeout_s=1"], "runtime.timeout_s"),
    (["runtime.timeout_s=forever"], "runtime.timeout_s"),
    (["runtime.backend=mpi"], "runtime.backend"),
    (["runtime.deterministic=sure"], "runtime.deterministic"),
    (["runtime.profile_iteration=-1"], "runtime.profile_iteration"),
    (["runtime.profile_iteration=20"], "runtime.profile_iteration"),
    (["sync.bucket_mb=-1"], "sync.bucket_mb"),
    (["sync.bucket_mb=huge"], "sync.bucket_mb"),
    (["sync.verify_checksum=perhaps"], "sync.verify_checksum"),
    (["eval.num_prompts=0", "eval.every=5"], "eval.num_prompts"),
    (["eval.every=-1"], "eval.every"),
    (["eval.batch_size=-1", "eval.every=5"], "eval.batch_size"),
    (["eval.num_steps=1", "eval.every=5"], "eval.num_steps"),
    (["logger.wandb_mode=sometimes"], "logger.wandb_mode"),
    (["gap.assignment=random"], "gap.assignment"),
    (["gap.train_order=reverse"], "gap.train_order"),
    (["gap.fragment_groups=0"], "gap.fragment_groups"),
    (["tag.policy=never"], "tag.policy"),
    (["tag.max_fragments=-1"], "tag.max_fragments"),
    (["tsp.stages=0"], "tsp.stages"),
    (["colocated.split=random", "system=colocated-sync"], "colocated.split"),
    (["reward.nonfinite_policy=ignore"], "reward.nonfinite_policy"),
    (["pools.trainers=-1"], "pools.trainers"),
    (["asynchrony.max_inflight=0"], "asynchrony.max_inflight"),
    # -- names that are not there: a misspelt key, section or value
    (["trainr.lr=0.1"], "trainr"),
    (["trainer.lrate=0.1"], "trainer.lrate"),
    (["model.nmae=tiny-sd3"], "model.nmae"),
    (["iteration=3"], "iteration"),
    (["gap.bogus=1"], "gap.bogus"),
    (["trainer=fast"], "trainer"),
    (["model.name=tiny-sd4"], "model.name"),
    (["model.name="], "model.name"),
    (["system=digenrl-plus"], "system"),
    (["profile=cpu-7"], "profile"),
    (["profile=/nonexistent/profile.yaml"], "profile"),
    (["reward.name=beauty"], "reward.name"),
    (["reward.weights={brightness: 1, nope: 2}"], "reward.weights"),
    (["reward.weights=[brightness]"], "reward.weights"),
    (["reward.weights={brightness: 0, jpeg-compressibility: 0}"], "reward.weights"),
    (["reward.weights={brightness: 0}"], "reward.weights"),
    (["model.attention_backend=flash9"], "model.attention_backend"),
    # -- settings that contradict each other
    (["resume=true", "overwrite=true"], "overwrite"),
    (["resume.step=3"], "resume.step"),
    (["sync.mode=full", "trainer.mode=lora"], "sync.mode"),
    (["algo.timestep_selection=fast-window", "algo.fast_window=6"], "algo.fast_window"),
    (["sampler.sde_type=cps", "sampler.noise_level=2.0"], "sampler.noise_level"),
    (["eval.use_ema=true", "eval.every=5"], "eval.use_ema"),
    (["eval.every=5", "eval.num_prompts=100000"], "eval.num_prompts"),
    (["trainer.deepspeed_stage=3"], "trainer.deepspeed_stage"),
    (["runtime.share_device=true", "runtime.backend=nccl"], "runtime.share_device"),
    (["pools.trainers=5"], "pools"),
    (["pools.generators=7"], "pools"),
    (["tsp.stages=3"], "tsp.stages"),
    (["tsp.boundaries=[2]"], "tsp.boundaries"),
    (["gap.fragment_samples=3"], "gap.fragment_samples"),
    (["gap.fragment_samples=4", "gap.fragment_groups=2"], "gap.fragment_groups"),
    (["tcss.switch=99", "tcss=true"], "tcss.switch"),
    (["tcss.switch=sometimes", "tcss=true"], "tcss.switch"),
    (["asynchrony.max_staleness=2"], "asynchrony.max_staleness"),
    (["colocated.split=speed"], "colocated.split"),
    (["reward.url=http://127.0.0.1:8000"], "reward.url"),
    (["reward.timeout_s=5"], "reward.timeout_s"),
    (["reward.weights_path=/models/x"], "reward.weights_path"),
    (["residency.reward_resident=false"], "residency.reward_resident"),
    (["model.fp8=true", "trainer.mode=full"], "model.fp8"),
    # -- sizes a run cannot hold, resolutions the model cannot take, surrogates that train nothing
    (["algo.prompts_per_iteration=1000000", "algo.group_size=1000000"], "algo.prompts_per_iteration"),
    (["algo.group_size=999999"], "algo.group_size"),
    (["model.height=1024", "model.width=1024"], "model.height"),
    (["model.width=2048"], "model.width"),
    (["model.height=640"], "model.height"),
    (["model.height=50"], "model.height"),
    (["model.width=33"], "model.width"),
    (["model.frames=9"], "model.frames"),
    # -- files and paths
    (["data.prompts=/nonexistent/prompts.txt"], "data.prompts"),
    (["data.prompts={tmp}"], "data.prompts"),
    (["data.prompts={tmp}/empty.txt"], "data.prompts"),
    (["data.prompts={tmp}/binary.txt"], "data.prompts"),
    (["data.prompts={tmp}/latin1.txt"], "data.prompts"),
    (["data.prompts={tmp}/huge.txt"], "data.prompts"),
    (["data.prompts={tmp}/huge.jsonl"], "data.prompts"),
    (["data.prompts={tmp}/bad.jsonl"], "data.prompts"),
    (["data.prompts={tmp}/noprompt.jsonl"], "data.prompts"),
    (["data.eval_prompts=/nonexistent/eval.txt", "eval.every=5"], "data.eval_prompts"),
    (["data.prompts=builtin:test"], "data.prompts"),
    (["model.pretrained_path=/nonexistent/model"], "model.pretrained_path"),
    (["model.pretrained_path={tmp}/empty.txt"], "model.pretrained_path"),
    (["runtime.costs_dir=/nonexistent/costs"], "runtime.costs_dir"),
    (["runtime.costs_dir={tmp}/empty.txt"], "runtime.costs_dir"),
    (["out_dir="], "out_dir"),
    (["out_dir=/"], "out_dir"),
    (["out_dir=~/digenrl-runs/x"], "out_dir"),
    (["out_dir={tmp}/empty.txt"], "out_dir"),
    (["out_dir={tmp}/empty.txt/run"], "out_dir"),
    (["out_dir={tmp}/oldrun/checkpoints/new"], "out_dir"),
    (["out_dir={tmp}/" + "x" * 5000], "out_dir"),
    (["out_dir={tmp}/" + "/".join(["d" * 200] * 30)], "out_dir"),
    # -- a remote reward's settings
    (["reward=remote"], "reward.url"),
    (["reward=remote", "reward.url=ftp://host:21"], "reward.url"),
    (["reward=remote", "reward.url=http://host"], "reward.url"),
    (["reward=remote", "reward.url=http://user:pw@host:8000"], "reward.url"),
    (["reward=remote", "reward.url=http://host:0"], "reward.url"),
    (["reward=remote", "reward.url=http://host:99999"], "reward.url"),
    (["reward=remote", "reward.url=http://host:8000", "reward.timeout_s=0"], "reward.timeout_s"),
    (["reward=remote", "reward.url=http://host:8000", "reward.retries=-1"], "reward.retries"),
    (
        ["reward=remote", "reward.url=http://host:8000", "reward.token_file=/nonexistent/t"],
        "reward.token_file",
    ),
    (
        ["reward=remote", "reward.url=http://host:8000", "reward.token_file={tmp}/empty.txt"],
        "reward.token_file",
    ),
    (["reward.token_file={tmp}/token"], "reward.token_file"),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """The folder ``{tmp}`` names: files each bad in one way, and a run folder to nest into."""
    tmp = tmp_path_factory.mktemp("bad-inputs")
    (tmp / "empty.txt").write_text("")
    (tmp / "binary.txt").write_bytes(b"\x00\x01\x02 prompt\n")
    (tmp / "latin1.txt").write_bytes("café crème\n".encode("latin-1"))
    (tmp / "huge.txt").write_text("a" * (2 << 20) + "\n")  # one 2 MiB prompt
    (tmp / "huge.jsonl").write_text('{"prompt": "a cat"}\n{"prompt": "' + "b" * 30_000 + '"}\n')
    (tmp / "bad.jsonl").write_text('{"prompt": "a cat"}\n{"prompt": \n')
    (tmp / "noprompt.jsonl").write_text('{"text": "a cat"}\n')
    (tmp / "prompts.csv").write_text("prompt\na cat\n")
    (tmp / "token").write_text("0123456789abcdef0123\n")
    run = tmp / "oldrun"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("# run_id: 0123\nseed: 0\n")
    (run / "metrics.jsonl").write_text('{"iteration": 0}\n')
    return tmp


@pytest.mark.parametrize(("overrides", "key"), CASES, ids=[" ".join(o)[:60] for o, _ in CASES])
def test_a_bad_input_is_refused_at_startup_naming_its_key(overrides, key, files, tmp_path):
    overrides = [o.replace("{tmp}", str(files)) for o in overrides]
    if not any(o.startswith("out_dir=") for o in overrides):
        overrides.append(f"out_dir={tmp_path / 'run'}")
    with pytest.raises(ConfigError) as info:
        validate_config(load_config(TINY, overrides), world_size=2)
    assert re.search(rf"(?<![\w.]){re.escape(key)}(?![\w])", str(info.value)), str(info.value)


#: YAML config files that are wrong in shape, each named with its key or the file.
YAML_CASES: list[tuple[str, str]] = [
    ("- iterations: 3\n", "config file"),
    ("iterations: [1, 2]\n", "iterations"),
    ("trainer:\n  lr: {fast: 1}\n", "trainer.lr"),
    ("trainer: 3\n", "trainer"),
    ("model:\n  name:\n    nested: tiny\n", "model.name"),
    ("a:\n" + "".join("  " * (i + 1) + f"b{i}:\n" for i in range(200)) + "  " * 201 + "c: 1\n", "a"),
    ("# run_id: forged\nsystem: colocated-sync\ngap:\n  fragment_groups: 3\n", "gap.fragment_groups"),
    ("iterations: &x 3\nseed: *y\n", "config file"),
    ("iterations: 3\n\tseed: 1\n", "config file"),
    ("trainer:\n  lr: 0.1\n  lr: 0.2\n", "duplicate key 'lr'"),
]


@pytest.mark.parametrize(("text", "key"), YAML_CASES, ids=[f"yaml{i}" for i in range(len(YAML_CASES))])
def test_a_bad_config_file_is_refused_at_startup_naming_its_key(text, key, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        validate_config(load_config(path, [f"out_dir={tmp_path / 'run'}"]), world_size=1)
    assert key in str(info.value), str(info.value)


def test_the_table_is_large_enough():
    assert len(CASES) + len(YAML_CASES) >= 150
