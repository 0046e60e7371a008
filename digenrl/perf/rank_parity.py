"""Do a generator rank and a trainer rank built from one config roll out the same trajectories?

The separate systems promise that a generator rank samples what a colocated (trainer) rank would from the same
seed: same base weights, same text conditions, same kernels, hence an on-policy ratio of exactly 1 when the
trainer recomputes the generator's log-probs (docs/algorithm.md, "Loss"). Each role is built in its own
process here, as a run builds it (:func:`digenrl.systems.components.build_rank_components`, which gives a
generator the trainer's adapter through :func:`digenrl.trainer.lora.prepare_generator_model`), because
process-wide switches (SDPA kernels, matmul precision, diffusers' active attention backend) are part of what
may differ. Each process
records its numerics-relevant settings, digests of its frozen weights, the text conditions and the rollout of
one prompt group at policy version 0 (LoRA B = 0, so no weight sync is needed); the parent compares them
field by field and names the first that differs.

    python -m digenrl.perf.rank_parity --config experiments/configs/sd35-medium-lora.yaml \\
        --out /tmp/parity --roles trainer,generator,trainer sampler.num_steps=6 algo.group_size=4

Every role is compared with the first; repeating a role (``trainer,trainer``) checks that two processes agree
at all. The last stdout line is the JSON verdict; ``--out`` also gets ``rank_parity.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

ROLES = ("trainer", "generator", "generator-eval")
"""``generator-eval``: a generator rank put in eval mode, as generator ranks were built before 2026-12-02 (a
diagnostic variant: does the module mode change the GPU forward?)."""
TENSOR_FIELDS = ("cond.embeds", "cond.pooled", "uncond.embeds", "velocity", "latents", "log_probs", "final")


def _digest(module: torch.nn.Module, *, skip_lora: bool) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        if skip_lora and "lora_" in name:
            continue
        h.update(name.encode())
        t = tensor.detach().contiguous().cpu()
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def _settings(flow_model) -> dict[str, object]:
    """The process-wide and model switches that change a forward's arithmetic."""
    from digenrl.models.attention_safety import process_attention_backend
    from digenrl.models.flow_model import current_attention_backends

    tuner_cast = [
        bool(m.cast_input_dtype_enabled)
        for m in flow_model.transformer.modules()
        if hasattr(m, "cast_input_dtype_enabled")
    ]
    out: dict[str, object] = {
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "attention_backends": sorted(current_attention_backends(flow_model)),
        "process_attention_backend": process_attention_backend(),
        "autocast_dtype": str(flow_model.autocast_dtype),
        "transformer_training": flow_model.transformer.training,
        "lora_layers": len(tuner_cast),
        "lora_input_cast_on": sum(tuner_cast),
        "param_dtypes": sorted({str(p.dtype) for p in flow_model.transformer.parameters()}),
    }
    if torch.cuda.is_available():
        cuda = torch.backends.cuda
        out.update(
            sdp_flash=cuda.flash_sdp_enabled(),
            sdp_mem_efficient=cuda.mem_efficient_sdp_enabled(),
            sdp_cudnn=cuda.cudnn_sdp_enabled(),
            sdp_math=cuda.math_sdp_enabled(),
            matmul_allow_tf32=cuda.matmul.allow_tf32,
            matmul_bf16_reduced_reduction=cuda.matmul.allow_bf16_reduced_precision_reduction,
        )
    return out


def snapshot(
    config: str | None, overrides: list[str], role: str, out_dir: Path, *, tag: str | None = None
) -> dict[str, object]:
    """Build ``role``'s components as a run does; record what :func:`compare` needs (``out_dir/ROLE.pt``)."""
    from digenrl.config import load_config
    from digenrl.rollout.noise import step_noise
    from digenrl.runtime.comm.distributed import DistContext, configured_backend, planned_device_type
    from digenrl.runtime.hardware.profiles import load_profile
    from digenrl.systems.components import build_rank_components
    from digenrl.trainer.run_dir import RunStart
    from digenrl.validation import validate_config

    if role not in ROLES:
        raise ValueError(f"role={role!r}; allowed: {', '.join(ROLES)}")
    cfg = load_config(
        config, [*overrides, f"out_dir={out_dir / (tag or role)}", "overwrite=true", "eval.every=0"]
    )
    validate_config(cfg)
    backend = configured_backend(cfg.runtime.backend, load_profile(cfg.profile).backend, share_device=False)
    kind = planned_device_type(backend, distributed=False, cuda_available=torch.cuda.is_available())
    device = torch.device("cuda", 0) if kind == "cuda" else torch.device("cpu")
    ctx = DistContext(rank=0, world_size=1, local_rank=0, device=device, backend="gloo", is_distributed=False)
    train = role == "trainer"
    parts = build_rank_components(
        cfg,
        ctx,
        role="trainer" if train else "generator",
        generate=True,
        train=train,
        score=False,
        clock_origin=time.time(),
        run=RunStart(run_id=f"parity-{role}"),
    )
    flow_model = parts.bundle.flow_model
    if role == "generator-eval":
        flow_model.eval()
    engine = parts.engine
    assert engine is not None
    prompt = parts.prompts.prompts_for(0, 1)[0]
    cond = engine.text_encoder.encode([prompt]).to(device)
    uncond = engine.uncond()
    x = step_noise([1234], 0, parts.latent_shape, device=device)
    sigma = engine.sampler.sigmas[:1].to(device)
    with torch.no_grad():
        velocity = engine.sampler.velocity(flow_model, x, sigma, cond, uncond).float()
    batch = engine.generate_rows([prompt], [0], None, iteration=0, policy_version=0)
    tensors = {
        "cond.embeds": cond.embeds,
        "cond.pooled": cond.pooled,
        "uncond.embeds": None if uncond is None else uncond.embeds,
        "velocity": velocity,
        "latents": batch.latents,
        "log_probs": batch.log_probs,
        "final": batch.final_latents,
    }
    torch.save(
        {k: None if v is None else v.detach().float().cpu() for k, v in tensors.items()},
        out_dir / f"{tag or role}.pt",
    )
    return {
        "role": role,
        "device": str(device),
        "prompt": prompt,
        "settings": _settings(flow_model),
        "digests": {
            "transformer_base": _digest(flow_model.transformer, skip_lora=True),
            "vae": _digest(parts.bundle.decoder.vae, skip_lora=False)
            if hasattr(parts.bundle.decoder, "vae")
            else None,
        },
    }


def compare(a: dict, b: dict, ta: dict, tb: dict) -> dict[str, object]:
    """Field-by-field differences of two snapshots. ``identical`` and ``first_difference`` (data-flow order)
    are about weights and tensors; the settings that differ are listed as candidate causes (the trainer's
    module is in train mode, a generator's in eval mode, which changes nothing without dropout)."""
    settings = {
        k: [a["settings"].get(k), b["settings"].get(k)]
        for k in sorted(set(a["settings"]) | set(b["settings"]))
        if a["settings"].get(k) != b["settings"].get(k)
    }
    digests = {
        k: [a["digests"][k], b["digests"][k]] for k in a["digests"] if a["digests"][k] != b["digests"][k]
    }
    tensors: dict[str, float | None] = {}
    for name in TENSOR_FIELDS:
        x, y = ta.get(name), tb.get(name)
        if x is None or y is None:
            tensors[name] = None if x is None and y is None else float("inf")
        else:
            tensors[name] = float((x - y).abs().max()) if x.shape == y.shape else float("inf")
    order = [f"digest.{k}" for k in digests]
    order += [f"tensor.{k}" for k in TENSOR_FIELDS if tensors[k]]
    return {
        "identical": not order,
        "first_difference": order[0] if order else None,
        "settings_differ": settings,
        "digests_differ": digests,
        "max_abs_diff": tensors,
    }


def markdown(result: dict) -> str:
    lines = ["# Rank parity: roles built as a run builds them, each in its own process", ""]
    for c in result["comparisons"]:
        verdict = "yes" if c["identical"] else "NO"
        lines += [
            f"## {c['candidate']} against {c['reference']}: identical **{verdict}**",
            "",
            f"first difference: {c['first_difference']}",
            "",
            "| field | max abs diff |",
            "|---|---|",
        ]
        lines += [f"| {k} | {v} |" for k, v in c["max_abs_diff"].items()]
        for key in ("settings_differ", "digests_differ"):
            for k, (x, y) in c[key].items():
                lines.append(f"- {key.split('_')[0]} `{k}`: {c['reference']} {x!r}, {c['candidate']} {y!r}")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=None, help="the run's config (YAML)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument(
        "--roles",
        default="trainer,generator",
        help=f"comma-separated, each built in its own process and compared with the first "
        f"({', '.join(ROLES)}; a role may repeat: trainer,trainer checks that two processes agree at all)",
    )
    p.add_argument("--role", default=None, help="(internal) snapshot one role in this process, as NAME:INDEX")
    p.add_argument("overrides", nargs="*", help="key=value config overrides, as run_train.py takes them")
    args = p.parse_intermixed_args(argv)  # overrides may come before and after the options
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.role is not None:
        role, _, index = args.role.partition(":")
        print(json.dumps(snapshot(args.config, args.overrides, role, out, tag=f"{role}-{index}")))
        return 0
    roles = [r.strip() for r in args.roles.split(",") if r.strip()]
    bad = [r for r in roles if r not in ROLES]
    if len(roles) < 2 or bad:
        p.error(f"--roles needs at least two of {', '.join(ROLES)}; got {args.roles!r}")
    snaps, tensors = [], []
    for index, role in enumerate(roles):
        cmd = [
            sys.executable,
            "-m",
            "digenrl.perf.rank_parity",
            "--out",
            str(out),
            "--role",
            f"{role}:{index}",
        ]
        cmd += (["--config", args.config] if args.config else []) + args.overrides
        print(f"[rank_parity] building role {index} ({role}) in its own process", flush=True)
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
            print(f"[rank_parity] role {index} ({role}) failed (exit {done.returncode})", file=sys.stderr)
            return 1
        snaps.append(json.loads(done.stdout.strip().splitlines()[-1]))
        tensors.append(torch.load(out / f"{role}-{index}.pt"))
    comparisons = [
        {
            "reference": f"{roles[0]}-0",
            "candidate": f"{roles[i]}-{i}",
            **compare(snaps[0], snaps[i], tensors[0], tensors[i]),
        }
        for i in range(1, len(roles))
    ]
    result = {
        "identical": all(c["identical"] for c in comparisons),
        "comparisons": comparisons,
        "snapshots": snaps,
    }
    (out / "rank_parity.json").write_text(json.dumps(result, indent=1))
    (out / "rank_parity.md").write_text(markdown(result))
    print(markdown(result))
    print(
        json.dumps(
            {
                "identical": result["identical"],
                "first_differences": [c["first_difference"] for c in comparisons],
            }
        )
    )
    return 0 if result["identical"] else 2


if __name__ == "__main__":
    raise SystemExit(main())
