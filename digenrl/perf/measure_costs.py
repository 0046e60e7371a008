"""Measure a :class:`~digenrl.costs.cost_model.CostModel` from the real components on one device.

Everything timed is the code a real run executes, built the way ``digenrl/systems/components.py`` builds
it: ``build_model_bundle`` (random weights unless ``pretrained_path``), :class:`PolicyTrainer` (which
applies the LoRA adapter first, so the generator forward is timed with the adapter a generator rank also
carries, ``trainer.lora.prepare_generator_model``), :class:`Sampler` (``velocity`` + ``transition``
is one sampler step exactly as :class:`RolloutEngine` issues it), the bundle's VAE decoder, the reward
from the registry, and :meth:`PolicyTrainer.accumulate` / :meth:`PolicyTrainer.step` on a trajectory batch
the :class:`RolloutEngine` generated. Each measurement: ``warmup`` untimed calls, then the median of
``iters`` timed calls (CUDA synchronised). Trajectory byte counts come from the transfer encoding
(``runtime.transfer.batch_to_tensors``) of that batch.

A TAG switch costs a device synchronisation (``switch_sync_s``) plus what it moves
(:mod:`digenrl.sim.residency`); the round trip of parking the pending gradients to host memory and back
(what ``tag.park_grads=true`` adds, docs/design.md §3 (TAG)) is recorded as ``meta["grad_park_s"]``. On
CUDA the peak memory of every generator step and training micro-batch is recorded
(``torch.cuda.max_memory_allocated``), and the text encoders' and VAE's bytes are counted, for the
simulator's memory check (:mod:`digenrl.planning.memory`). ``compile`` / ``autocast`` time the project's GPU
path (``model.compile`` / ``model.autocast``); the file's ``path`` says which was timed.
"""

from __future__ import annotations

import copy
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from digenrl.config import MODEL_DTYPES, TRAINER_MODES, Config, apply_overrides
from digenrl.costs.cost_model import CFG_KEYS, CostModel, run_path
from digenrl.data.dtypes import TORCH_DTYPES
from digenrl.data.text_condition import TextCondition
from digenrl.data.trajectory import TrajectoryBatch
from digenrl.models import ModelBundle, ModelSpec, build_model_bundle
from digenrl.models.optimize import optimize_flow_model
from digenrl.perf.roofline import resolve_device, synchronize, tensor_bytes
from digenrl.rewards.registry import build_reward
from digenrl.rollout.engine import RolloutEngine
from digenrl.rollout.sampler import Sampler
from digenrl.runtime.comm.transfer import batch_to_tensors
from digenrl.runtime.hardware.profiles import detect_device
from digenrl.trainer.trainer import PolicyTrainer


def device_label(device: torch.device) -> str:
    """``cpu``, or the GPU's family (``h200``, ``h100``:
    :func:`digenrl.runtime.hardware.profiles.device_family`, the rule a run's profile check uses) for cost
    file names."""
    return detect_device(device.type, device.index or 0).family


def reset_peak(device: torch.device) -> None:
    """Start a new peak-memory window (CUDA only; CPU peaks are not recorded)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_bytes(device: torch.device) -> int:
    """Peak allocated bytes since :func:`reset_peak` (0 on CPU: not measured)."""
    return int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else 0


def median_seconds(fn: Callable[[], object], device: torch.device, warmup: int, iters: int) -> float:
    """Median wall time of ``fn`` over ``iters`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_costs(
    model_name: str,
    device: str = "auto",
    *,
    batches: Sequence[int] = (1, 2, 4),
    micro_batches: Sequence[int] = (1, 2, 4),
    cfg_flags: Sequence[bool] = (False, True),
    mode: str = "lora",
    reward: str = "brightness",
    dtype: str | None = None,
    num_steps: int | None = None,
    height: int | None = None,
    width: int | None = None,
    pretrained_path: str | None = None,
    warmup: int = 1,
    iters: int = 3,
    device_name: str | None = None,
    command: str = "",
    compile: bool = False,
    autocast: bool = False,
) -> CostModel:
    """Measure every per-operation cost of ``model_name`` on ``device`` (see the module docstring).

    ``cfg_flags`` lists the guidance settings to measure; guidance-distilled models (FLUX-dev,
    HunyuanVideo) have no separate CFG pass, so only ``False`` is measured for them.
    """
    if not batches or min(batches) < 1 or not micro_batches or min(micro_batches) < 1:
        raise ValueError(f"batches and micro_batches need positive ints, got {batches}, {micro_batches}")
    if iters < 1 or warmup < 0:
        raise ValueError(f"iters must be >= 1 and warmup >= 0, got {iters}, {warmup}")
    torch_device = resolve_device(device)
    dtype_name = dtype or ("bfloat16" if torch_device.type == "cuda" else "float32")
    if dtype_name not in TORCH_DTYPES:
        raise ValueError(f"dtype={dtype_name!r} is not allowed; choose one of: {', '.join(TORCH_DTYPES)}")
    cfg = apply_overrides(
        Config(),
        {
            "model.name": model_name,
            "model.dtype": dtype_name,
            "model.pretrained_path": pretrained_path,
            "model.height": height,
            "model.width": width,
            "sampler.num_steps": num_steps,
            "trainer.mode": mode,
            "trainer.backend": "none",
            "reward.name": reward,
        },
    )
    torch.manual_seed(0)
    bundle = build_model_bundle(
        model_name, pretrained_path=pretrained_path, dtype=TORCH_DTYPES[dtype_name], device=torch_device
    )
    spec, flow_model = bundle.spec, bundle.flow_model
    if compile or autocast:
        optimize_flow_model(
            flow_model, compile=compile, attention_backend="native", needs_backward=True, autocast=autocast
        )
    h, w_px = height or spec.default_height, width or spec.default_width
    frames = spec.default_frames if spec.is_video else None
    latent_shape = flow_model.latent_shape(h, w_px, frames)
    tokens = flow_model.token_count(h, w_px, frames)
    flags = [f for f in dict.fromkeys(bool(f) for f in cfg_flags) if not (f and spec.guidance_embedded)]
    if not flags:
        raise ValueError(f"cfg_flags={list(cfg_flags)} leaves nothing to measure for {model_name}")
    samplers = {flag: _sampler(cfg, spec, tokens, flag) for flag in flags}
    uncond = bundle.text_encoder.negative_condition(1).to(torch_device)
    trainer = PolicyTrainer(
        cfg, flow_model, samplers[flags[0]], uncond=uncond, device=torch_device, world_size=1
    )

    def timed(fn: Callable[[], object]) -> float:
        return median_seconds(fn, torch_device, warmup, iters)

    prompts = [f"a photo of object number {i}" for i in range(max(max(batches), max(micro_batches)))]
    generator_points: dict[str, dict[int, float]] = {}
    generator_peaks: dict[str, dict[int, int]] = {}
    for flag, sampler in samplers.items():
        points, peaks = {}, {}
        for b in batches:
            cond = bundle.text_encoder.encode(prompts[:b]).to(torch_device)
            x = torch.randn(b, *latent_shape, device=torch_device)
            reset_peak(torch_device)
            points[b] = timed(lambda s=sampler, x=x, c=cond: _sampler_step(s, flow_model, x, c, uncond))
            peaks[b] = peak_bytes(torch_device)
        generator_points[CFG_KEYS[flag]] = points
        if all(peaks.values()):
            generator_peaks[CFG_KEYS[flag]] = peaks

    reward_fn = build_reward(reward, device=torch_device)
    decode_points, reward_points = {}, {}
    for b in batches:
        z = torch.randn(b, *latent_shape, device=torch_device)
        decode_points[b] = timed(lambda z=z: bundle.decoder.decode(z))
        images = bundle.decoder.decode(z)
        reward_points[b] = timed(lambda im=images, b=b: reward_fn(im, prompts[:b]))

    group = max(micro_batches)
    train_points: dict[str, dict[int, float]] = {}
    train_peaks: dict[str, dict[int, int]] = {}
    batch: TrajectoryBatch | None = None
    for flag, sampler in samplers.items():
        batch = _rollout(cfg, bundle, sampler, latent_shape, group, torch_device, prompts[0])
        trainer.sampler, trainer.uncond = sampler, (uncond if sampler.true_cfg else None)
        points, peaks = {}, {}
        for m in micro_batches:
            trainer.cfg.trainer.micro_batch_size = m
            reset_peak(torch_device)
            seconds = timed(lambda b=batch: _accumulate_and_drop(trainer, b))
            points[m] = seconds * m / batch.num_units
            peaks[m] = peak_bytes(torch_device)
        train_points[CFG_KEYS[flag]] = points
        if all(peaks.values()):
            train_peaks[CFG_KEYS[flag]] = peaks
    assert batch is not None
    trainer.cfg.trainer.micro_batch_size = max(micro_batches)

    optimizer_s = _time_optimizer_step(trainer, batch, torch_device, warmup, iters)
    grad_park_s = time_grad_park(trainer, batch, torch_device, warmup, iters)
    switch_sync_s = median_seconds(lambda: None, torch_device, warmup, iters)
    trainable = list(trainer.backend.trainable_parameters())
    wire = wire_bytes(batch)
    reward_params = [p for m in reward_fn.modules() for p in m.parameters()]
    return CostModel(
        device=device_name or device_label(torch_device),
        model=model_name,
        generator_step_points=generator_points,
        vae_decode_points=decode_points,
        reward_points=reward_points,
        train_points=train_points,
        optimizer_step_s=optimizer_s,
        weight_sync_bytes=tensor_bytes(trainable),
        grad_bytes=tensor_bytes(trainable),
        fragment_bytes_per_sample=wire["per_sample"],
        unit_bytes=wire["per_unit"],
        cond_bytes_per_sample=wire["cond"],
        latent_bytes_per_sample=wire["latent"],
        param_bytes=tensor_bytes(list(flow_model.parameters())),
        optimizer_bytes=tensor_bytes(
            [t for state in trainer.optimizer.state.values() for t in state.values() if torch.is_tensor(t)]
        ),
        reward_param_bytes=tensor_bytes(reward_params),
        text_encoder_bytes=tensor_bytes(list(bundle.text_encoder.parameters())),
        vae_param_bytes=tensor_bytes(list(bundle.decoder.parameters())),
        switch_sync_s=switch_sync_s,
        path=run_path(compile, autocast),
        train_peak_bytes=train_peaks,
        generator_peak_bytes=generator_peaks,
        source="measured",
        command=command,
        meta={
            "device_name": torch.cuda.get_device_name(torch_device)
            if torch_device.type == "cuda"
            else f"{platform.machine()} CPU, {torch.get_num_threads()} threads",
            "dtype": dtype_name,
            "trainer_mode": mode,
            "lora_rank": cfg.trainer.lora_rank if mode == "lora" else None,
            "reward": reward,
            "height": h,
            "width": w_px,
            "frames": frames,
            "latent_shape": list(latent_shape),
            "num_steps": samplers[flags[0]].num_steps,
            "train_steps_per_sample": batch.num_train_steps,
            "train_batch_samples": batch.batch_size,
            "cfg_grad": cfg.algo.cfg_grad,  # which CFG branches the timed training backward went through
            "cfg_split_min_batch": samplers[flags[0]].cfg_split_min_batch,
            "warmup": warmup,
            "iters": iters,
            "torch": torch.__version__,
            "grad_park_s": grad_park_s,
        },
    )


def _sampler(cfg: Config, spec: ModelSpec, tokens: int, cfg_on: bool) -> Sampler:
    """The sampler of ``cfg`` with guidance on (the model's default scale, at least 1.5) or off (1.0);
    guidance-distilled models keep their embedded scale."""
    run = copy.deepcopy(cfg)
    if spec.guidance_embedded:
        run.sampler.guidance_scale = spec.default_guidance_scale
    else:
        run.sampler.guidance_scale = max(spec.default_guidance_scale, 1.5) if cfg_on else 1.0
    return Sampler.from_config(run, spec, tokens)


@torch.no_grad()
def _sampler_step(
    sampler: Sampler, model: torch.nn.Module, x: torch.Tensor, cond: TextCondition, uncond: TextCondition
) -> torch.Tensor:
    """One rollout step exactly as RolloutEngine.generate issues it: guided velocity, then transition."""
    b = x.shape[0]
    sigma = sampler.sigmas[0].to(x.device).expand(b)
    sigma_next = sampler.sigmas[1].to(x.device).expand(b)
    v = sampler.velocity(model, x, sigma, cond, uncond if sampler.true_cfg else None)
    return sampler.transition(v, x, sigma, sigma_next, noise=torch.randn_like(x)).prev_sample


def _rollout(
    cfg: Config,
    bundle: ModelBundle,
    sampler: Sampler,
    latent_shape: tuple[int, ...],
    group: int,
    device: torch.device,
    prompt: str,
) -> TrajectoryBatch:
    """One real rollout of ``group`` samples of one prompt; rewards/advantages filled like a scored batch."""
    engine = RolloutEngine(
        bundle.flow_model,
        bundle.text_encoder,
        sampler,
        latent_shape=latent_shape,
        group_size=group,
        seed=0,
        **RolloutEngine.algo_settings(cfg.algo),
        device=device,
    )
    batch = engine.generate([prompt], [0], iteration=0, policy_version=0)
    batch.rewards = torch.rand(batch.batch_size, device=device)
    batch.advantages = torch.randn(batch.batch_size, device=device)
    return batch


def wire_bytes(batch: TrajectoryBatch) -> dict[str, int]:
    """Bytes on the wire (``runtime.transfer.batch_to_tensors``) of what the systems ship: a whole
    sample's record without the clean latent (``systems/separate.py``), one unit row of a GAP shard
    (``TrajectoryBatch.select_units``, as ``gap.unit_sharding.shard_units``), the condition, one latent."""
    if batch.final_latents is None:
        raise ValueError("the measured rollout has no final latents")
    latent = batch.final_latents[0].numel() * batch.final_latents[0].element_size()
    shipped = replace(batch, final_latents=None)
    b, k = shipped.batch_size, shipped.num_train_steps
    units = shipped.select_units(
        [i for i in range(b) for _ in range(k)], [j for _ in range(b) for j in range(k)]
    )
    return {
        "per_sample": tensor_bytes(batch_to_tensors(shipped)[1]) // b,
        "per_unit": tensor_bytes(batch_to_tensors(units)[1]) // units.batch_size,
        "cond": shipped.cond.num_bytes() // b,
        "latent": latent,
    }


def _accumulate_and_drop(trainer: PolicyTrainer, batch: TrajectoryBatch) -> None:
    trainer.accumulate(batch, 1.0 / batch.num_units)
    trainer.zero_grad()


def _time_optimizer_step(
    trainer: PolicyTrainer, batch: TrajectoryBatch, device: torch.device, warmup: int, iters: int
) -> float:
    times = []
    for i in range(warmup + iters):
        trainer.accumulate(batch, 1.0 / batch.num_units)
        synchronize(device)
        start = time.perf_counter()
        trainer.step()
        synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_grad_park(
    trainer: PolicyTrainer, batch: TrajectoryBatch, device: torch.device, warmup: int, iters: int
) -> float:
    """What ``tag.park_grads=true`` adds to one TAG switch (docs/design.md §3 (TAG)): park the pending
    gradients to host + eval(), then train() + restore them; the median round trip halved (a round trip is
    2 switches). Shared by the cost measurement here and the trainer benchmark."""
    trainer.accumulate(batch, 1.0 / batch.num_units)
    params = [p for p in trainer.backend.trainable_parameters() if p.grad is not None]
    model = trainer.flow_model

    def round_trip() -> None:
        parked = [p.grad.to("cpu", copy=True) for p in params]
        for p in params:
            p.grad = None
        model.eval()
        model.train()
        for p, g in zip(params, parked, strict=True):
            p.grad = g.to(p.device)

    seconds = median_seconds(round_trip, device, warmup, iters)
    trainer.zero_grad()
    return seconds / 2


# ----------------------------------------------------------------------------- command line


def parse_args(argv: list[str] | None = None):
    import argparse

    from digenrl.perf.bench_cli import int_list

    p = argparse.ArgumentParser(
        prog="experiments/measure.py costs",
        description="Measure the simulator's per-operation cost model of one model on this machine's device "
        "(digenrl/perf/measure_costs.py); writes runs/costs/<device>-<model>.json unless --out says "
        "otherwise.",
    )
    p.add_argument("--model", default="tiny-sd3", help="zoo entry (model.name)")
    p.add_argument("--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda, cuda:1")
    p.add_argument("--device-name", default=None, help="name in the cost file (default: cpu / h200 / …)")
    p.add_argument("--out", default=None, help="output JSON (default: runs/costs/<device>-<model>.json)")
    p.add_argument("--batches", default="1,2,4", help="generator / decode / reward batch sizes")
    p.add_argument("--micro-batches", default="1,2,4", help="training micro-batch sizes (units)")
    p.add_argument(
        "--cfg", default="both", choices=["on", "off", "both"], help="guidance settings to measure"
    )
    p.add_argument("--mode", default="lora", choices=TRAINER_MODES, help="trainer.mode")
    p.add_argument("--reward", default="brightness", help="reward registry name")
    p.add_argument("--dtype", default=None, choices=MODEL_DTYPES, help="default: bf16 on cuda")
    p.add_argument("--compile", action="store_true", help="time the compiled path (model.compile)")
    p.add_argument("--autocast", action="store_true", help="time with 16-bit autocast (model.autocast)")
    p.add_argument("--num-steps", type=int, default=None, help="sampler steps (default: the model's)")
    p.add_argument("--height", type=int, default=None)
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--pretrained-path", default=None, help="local diffusers-style directory")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5, help="timed calls per measurement (median)")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for torch (default on CPU: 1 — tiny models are overhead-bound and extra threads "
        "only add contention noise on shared machines)",
    )
    args = p.parse_args(argv)
    args.batches = int_list(args.batches, "--batches", p)
    args.micro_batches = int_list(args.micro_batches, "--micro-batches", p)
    return args


def main(argv: list[str] | None = None) -> int:
    import shlex
    import sys
    from pathlib import Path

    from digenrl.costs.cost_model import cost_path

    args = parse_args(argv)
    threads = args.threads or (1 if resolve_device(args.device).type == "cpu" else None)
    if threads:
        torch.set_num_threads(threads)
    flags = {"on": [True], "off": [False], "both": [False, True]}[args.cfg]
    command = "python experiments/measure.py costs " + shlex.join(sys.argv[2:] if argv is None else argv)
    start = time.perf_counter()
    costs = measure_costs(
        args.model,
        args.device,
        batches=args.batches,
        micro_batches=args.micro_batches,
        cfg_flags=flags,
        mode=args.mode,
        reward=args.reward,
        dtype=args.dtype,
        num_steps=args.num_steps,
        height=args.height,
        width=args.width,
        pretrained_path=args.pretrained_path,
        warmup=args.warmup,
        iters=args.iters,
        device_name=args.device_name,
        command=command.strip(),
        compile=args.compile,
        autocast=args.autocast,
    )
    out = Path(args.out) if args.out else cost_path(costs.device, costs.model, "runs/costs")
    costs.save(out)
    print(costs.describe())
    print(f"wrote {out} ({time.perf_counter() - start:.1f} s)")
    return 0
