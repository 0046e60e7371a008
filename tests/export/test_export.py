"""experiments/export.py: every export loads where diffusers and peft load it and computes the velocity of
the project's trained model on the same inputs, bit for bit in fp32 (SD3 and FLUX tiny models, LoRA and full
fine-tuning, raw weights and EMA); bad input exits with status 2 naming the folder, file or flag.

The checkpoints here are saved from a trainer directly (fast); tests/systems/test_export_runs.py exports the
checkpoints of real runs."""

from __future__ import annotations

import json
from pathlib import Path

import diffusers
import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file

from digenrl.config import ConfigError
from digenrl.export import find_checkpoint, main
from digenrl.models import build_model_bundle
from digenrl.trainer.checkpoint import save_checkpoint
from digenrl.trainer.lora_export import DIFFUSERS_LORA_FILE, PEFT_CONFIG_FILE, PEFT_WEIGHTS_FILE
from digenrl.validation import check_declared, check_unread_knobs, validate_config
from tests.export.helpers import (
    base_pipeline,
    inputs,
    project_trainer,
    run_config,
    save_as_a_run,
    train_with_random_gradients,
    trained_velocity,
    velocity,
)


@pytest.fixture(scope="module", params=["tiny-sd3", "tiny-flux"])
def lora_run(request, tmp_path_factory):
    """A LoRA run (r=8, alpha=16) with an EMA, checkpointed after 3 optimizer steps."""
    cfg = run_config(request.param, "trainer.ema_decay=0.5")
    trainer, bundle = project_trainer(cfg)
    train_with_random_gradients(trainer, 3)
    run = tmp_path_factory.mktemp(request.param)
    save_as_a_run(run, cfg, trainer, 3)
    return run, cfg, trainer, bundle


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    cfg = run_config("tiny-sd3", "trainer.mode=full", "trainer.lr=1e-3")
    trainer, bundle = project_trainer(cfg)
    train_with_random_gradients(trainer, 2)
    run = tmp_path_factory.mktemp("full")
    save_as_a_run(run, cfg, trainer, 2)
    return run, cfg, trainer, bundle


def _export(run: Path, out: Path, *flags: str) -> Path:
    assert main([str(run), "--out", str(out), *flags]) == 0
    return out


@pytest.mark.parametrize("ema", [False, True], ids=["weights", "ema"])
def test_a_diffusers_lora_loads_with_load_lora_weights_at_the_trained_strength(lora_run, tmp_path, ema):
    run, cfg, trainer, bundle = lora_run
    out = _export(run, tmp_path / "lora", "--format", "diffusers", *(["--ema"] if ema else []))
    assert sorted(p.name for p in out.iterdir()) == [DIFFUSERS_LORA_FILE]
    pipe = base_pipeline(cfg)  # StableDiffusion3Pipeline / FluxPipeline around the run's base
    pipe.load_lora_weights(out)
    config = pipe.transformer.peft_config["default_0"]
    assert (config.r, config.lora_alpha) == (8, 16)
    given = inputs(bundle)
    expected = trained_velocity(trainer, given, ema=ema)
    assert torch.equal(velocity(bundle.spec, pipe.transformer, given), expected)
    assert not torch.equal(expected, trained_velocity(trainer, given, ema=not ema))


@pytest.mark.parametrize("ema", [False, True], ids=["weights", "ema"])
def test_a_peft_lora_loads_with_peft_model_from_pretrained(lora_run, tmp_path, ema):
    run, cfg, trainer, bundle = lora_run
    out = _export(run, tmp_path / "peft", "--format", "peft", *(["--ema"] if ema else []))
    assert sorted(p.name for p in out.iterdir()) == [PEFT_CONFIG_FILE, PEFT_WEIGHTS_FILE]
    config = json.loads((out / PEFT_CONFIG_FILE).read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (8, 16, "LORA")
    base = build_model_bundle(cfg.model.name, device="cpu", seed=cfg.seed).flow_model.transformer
    model = PeftModel.from_pretrained(base, out)
    given = inputs(bundle)
    assert torch.equal(
        velocity(bundle.spec, model.get_base_model(), given), trained_velocity(trainer, given, ema=ema)
    )


def test_without_the_adapter_config_the_same_weights_load_at_the_wrong_strength(lora_run, tmp_path):
    """What the exports guard against: the tensors alone (the naive conversion) load with alpha = r."""
    run, cfg, trainer, bundle = lora_run
    out = _export(run, tmp_path / "lora", "--format", "diffusers")
    pipe = base_pipeline(cfg)
    pipe.load_lora_weights(load_file(out / DIFFUSERS_LORA_FILE))  # a dict: no metadata
    given = inputs(bundle)
    assert not torch.allclose(
        velocity(bundle.spec, pipe.transformer, given), trained_velocity(trainer, given)
    )


def comfyui_merge(transformer: torch.nn.Module, kohya: dict[str, torch.Tensor]) -> None:
    """What ComfyUI does with a LoRA file, for a diffusers-named SD3 / FLUX model (comfy/lora.py
    ``model_lora_keys_unet``: ``lora_transformer_`` + the module's diffusers name with dots as underscores,
    then ``W += (alpha / rank) · up @ down``); every key must find its module."""
    modules = {
        "lora_transformer_" + name.replace(".", "_"): module
        for name, module in transformer.named_modules()
        if isinstance(module, torch.nn.Linear)
    }
    stems = {key.rsplit(".", 2)[0] if key.endswith(".weight") else key.rsplit(".", 1)[0] for key in kohya}
    assert stems <= modules.keys(), sorted(stems - modules.keys())[:3]
    with torch.no_grad():
        for stem in stems:
            down, up = kohya[f"{stem}.lora_down.weight"], kohya[f"{stem}.lora_up.weight"]
            modules[stem].weight += kohya[f"{stem}.alpha"] / down.shape[0] * (up @ down)


def test_a_kohya_lora_loads_in_comfyui_key_scheme_and_in_diffusers(lora_run, tmp_path):
    from digenrl.trainer.lora_export import KOHYA_LORA_FILE

    run, cfg, trainer, bundle = lora_run
    out = _export(run, tmp_path / "kohya", "--format", "kohya")
    assert sorted(p.name for p in out.iterdir()) == [KOHYA_LORA_FILE]
    kohya = load_file(out / KOHYA_LORA_FILE)
    assert all(k.startswith("lora_transformer_") for k in kohya)
    assert {k.rsplit(".", 2)[-2] for k in kohya if k.endswith(".weight")} == {"lora_down", "lora_up"}
    alphas = {float(v) for k, v in kohya.items() if k.endswith(".alpha")}
    assert alphas == {16.0} and {v.shape[0] for k, v in kohya.items() if "lora_down" in k} == {8}
    given = inputs(bundle)
    expected = trained_velocity(trainer, given)
    # ComfyUI's scheme: merged into the base weights (merging changes the last bits)
    base = build_model_bundle(cfg.model.name, device="cpu", seed=cfg.seed).flow_model.transformer
    comfyui_merge(base, kohya)
    assert torch.allclose(velocity(bundle.spec, base, given), expected, atol=1e-5, rtol=1e-4)
    if cfg.model.name == "tiny-flux":  # diffusers reads kohya files for FLUX (its SD3 loader reads none)
        pipe = base_pipeline(cfg)
        pipe.load_lora_weights(out, weight_name=KOHYA_LORA_FILE)
        assert torch.equal(velocity(bundle.spec, pipe.transformer, given), expected)


def test_a_lora_pipeline_directory_loads_with_from_pretrained(lora_run, tmp_path):
    run, cfg, trainer, bundle = lora_run
    cls = type(base_pipeline(cfg))
    out = _export(run, tmp_path / "pipe", "--format", "diffusers", "--pipeline")
    assert {"model_index.json", "transformer", "vae", "scheduler", "text_encoder", DIFFUSERS_LORA_FILE} <= {
        p.name for p in out.iterdir()
    }
    pipe = cls.from_pretrained(out)
    # the base components are the run's (rebuilt from its seed): VAE and text encoders equal
    for name, module in [("vae", bundle.decoder.vae)] + [
        (c.spec.subfolder, c.model) for c in bundle.text_encoder.components
    ]:
        saved, built = getattr(pipe, name).state_dict(), module.state_dict()
        assert saved.keys() == built.keys() and all(torch.equal(saved[k], built[k]) for k in saved), name
    given = inputs(bundle)
    pipe.load_lora_weights(out)
    assert torch.equal(velocity(bundle.spec, pipe.transformer, given), trained_velocity(trainer, given))
    # and the pipeline samples (from a given condition: the tiny models' stand-in tokenizer is not theirs)
    x, _, cond = given
    latents = pipe(
        prompt_embeds=cond.embeds,
        pooled_prompt_embeds=cond.pooled,
        num_inference_steps=2,
        height=bundle.spec.default_height,
        width=bundle.spec.default_width,
        output_type="latent",
        **({"latents": x, "guidance_scale": 1.0} if cfg.model.name == "tiny-sd3" else {}),
    ).images
    assert torch.isfinite(latents).all()


def test_an_exported_pipeline_generates_from_a_prompt(lora_run, tmp_path):
    """The saved tokenizers read as many tokens as the run's encoders did (the stand-in tokenizer's own
    512 overflowed the tiny encoders' 16 positions), so the pipeline runs from text and conditions as the
    run did."""
    run, cfg, _, bundle = lora_run
    out = _export(run, tmp_path / "pipe", "--format", "diffusers", "--pipeline")
    pipe = type(base_pipeline(cfg)).from_pretrained(out)
    pipe.load_lora_weights(out)
    lengths = {c.spec.model_class: c.spec.max_length for c in bundle.text_encoder.components}
    for component in bundle.text_encoder.components:
        tokenizer = getattr(pipe, component.spec.tokenizer_subfolder)
        assert tokenizer.model_max_length == component.spec.max_length == 16
    t5 = lengths["T5EncoderModel"]
    prompt = "a red cube on a table"
    if cfg.model.name == "tiny-sd3":
        embeds, _, pooled, _ = pipe.encode_prompt(
            prompt, None, None, do_classifier_free_guidance=False, max_sequence_length=t5
        )
    else:
        embeds, pooled, _ = pipe.encode_prompt(prompt, None, max_sequence_length=t5)
    cond = bundle.text_encoder.encode([prompt])
    assert torch.allclose(embeds, cond.embeds, atol=1e-5) and torch.allclose(pooled, cond.pooled, atol=1e-5)
    image = pipe(
        prompt=prompt,
        num_inference_steps=2,
        height=bundle.spec.default_height,
        width=bundle.spec.default_width,
        max_sequence_length=t5,
        output_type="pt",
        generator=torch.Generator().manual_seed(0),
    ).images
    assert image.shape == (1, 3, bundle.spec.default_height, bundle.spec.default_width)
    assert bool(torch.isfinite(image).all())


def test_a_full_fine_tune_exports_its_transformer_with_save_pretrained(full_run, tmp_path):
    run, cfg, trainer, bundle = full_run
    out = _export(run, tmp_path / "transformer", "--format", "diffusers")
    transformer = diffusers.SD3Transformer2DModel.from_pretrained(out)
    given = inputs(bundle)
    assert torch.equal(velocity(bundle.spec, transformer, given), trained_velocity(trainer, given))
    base = build_model_bundle(cfg.model.name, device="cpu", seed=cfg.seed).flow_model.transformer
    assert not torch.equal(velocity(bundle.spec, base, given), trained_velocity(trainer, given))

    pipe = diffusers.StableDiffusion3Pipeline.from_pretrained(
        _export(run, tmp_path / "pipe", "--format", "diffusers", "--pipeline")
    )
    assert torch.equal(velocity(bundle.spec, pipe.transformer, given), trained_velocity(trainer, given))


def test_checkpoint_export_lora_writes_the_adapter_into_the_checkpoint(tmp_path):
    from digenrl.trainer.lora_export import (
        CHECKPOINT_LORA_DIR,
        CHECKPOINT_LORA_EMA_DIR,
        checkpoint_lora_writer,
    )

    cfg = run_config("tiny-sd3", "trainer.ema_decay=0.5", "checkpoint.export_lora=true")
    trainer, bundle = project_trainer(cfg)
    train_with_random_gradients(trainer, 2)
    state = trainer.state_dict()
    writer = checkpoint_lora_writer(cfg, state)
    assert checkpoint_lora_writer(run_config("tiny-sd3"), state) is None  # off by default
    writer(tmp_path)
    given = inputs(bundle)
    for folder, ema in ((CHECKPOINT_LORA_DIR, False), (CHECKPOINT_LORA_EMA_DIR, True)):
        pipe = base_pipeline(cfg)
        pipe.load_lora_weights(tmp_path / folder)
        assert torch.equal(
            velocity(bundle.spec, pipe.transformer, given), trained_velocity(trainer, given, ema=ema)
        )


# ------------------------------------------------------------------------------------------- bad input
def _refused(capsys, argv: list[str], *needles: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    for needle in needles:
        assert needle in err, err


def test_a_run_without_a_checkpoint_is_refused_naming_it(tmp_path, capsys):
    empty = tmp_path / "run"
    empty.mkdir()
    (empty / "metrics.jsonl").write_text("")
    out = str(tmp_path / "out")
    _refused(
        capsys,
        [str(empty), "--format", "diffusers", "--out", out],
        f"RUN_DIR {str(empty)!r} holds no checkpoint",
    )
    _refused(capsys, [str(tmp_path / "nope"), "--format", "diffusers", "--out", out], "is not a directory")
    assert not (tmp_path / "out").exists()


def test_a_missing_step_is_refused_listing_the_checkpoints(lora_run, tmp_path, capsys):
    run = lora_run[0]
    _refused(
        capsys,
        [str(run), "--step", "7", "--format", "diffusers", "--out", str(tmp_path / "out")],
        "--step 7:",
        "step_7 is not a complete checkpoint; complete checkpoints there: step_3",
    )


def test_a_missing_or_bad_latest_is_refused_listing_the_checkpoints_and_naming_step(tmp_path):
    run = tmp_path / "run"
    for step in (2, 4):
        save_checkpoint(run, step, {"x": torch.ones(1)}, rank=0, is_writer=True)
    assert find_checkpoint(run) == run / "checkpoints" / "step_4"
    (run / "checkpoints" / "latest").write_text("nonsense\n")
    with pytest.raises(
        ConfigError,
        match=r"names 'nonsense', which is not a step directory \(step_<n>\); complete checkpoints there: "
        r"step_2, step_4; choose one with --step N",
    ):
        find_checkpoint(run)
    (run / "checkpoints" / "latest").unlink()
    with pytest.raises(
        ConfigError,
        match=r"latest is missing, so which checkpoint is the run's newest is not recorded; complete "
        r"checkpoints there: step_2, step_4; choose one with --step N",
    ):
        find_checkpoint(run)
    assert find_checkpoint(run, 2) == run / "checkpoints" / "step_2"


def test_ema_on_a_run_without_ema_and_peft_for_full_fine_tuning_are_refused(full_run, tmp_path, capsys):
    run = full_run[0]
    _refused(
        capsys,
        [str(run), "--ema", "--format", "diffusers", "--out", str(tmp_path / "a")],
        "--ema:",
        "holds no EMA of the weights (the run had trainer.ema_decay=0)",
    )
    _refused(
        capsys,
        [str(run), "--format", "peft", "--out", str(tmp_path / "b")],
        "--format peft writes a LoRA adapter",
        "trainer.mode=full",
    )
    _refused(capsys, [str(run), "--format", "kohya", "--out", str(tmp_path / "c")], "--format kohya writes")


def test_kohya_with_a_pipeline_or_an_unmapped_family_is_refused(lora_run, tmp_path, capsys):
    from digenrl.trainer.lora_export import check_kohya_family

    argv = [str(lora_run[0]), "--format", "kohya", "--pipeline", "--out", str(tmp_path / "p")]
    _refused(capsys, argv, "--format kohya with --pipeline")
    assert not (tmp_path / "p").exists()
    with pytest.raises(
        ValueError, match=r"--format kohya: ComfyUI maps .* not 'wan'; use --format diffusers"
    ):
        check_kohya_family("wan")


def test_a_damaged_checkpoint_and_a_used_output_folder_are_refused(lora_run, tmp_path, capsys):
    run = lora_run[0]
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine")
    _refused(capsys, [str(run), "--format", "peft", "--out", str(used)], f"--out {str(used)!r} exists")
    copy = tmp_path / "copy"
    import shutil

    shutil.copytree(run, copy)
    (copy / "checkpoints" / "step_3" / "trainer.pt").write_bytes(b"garbage")
    _refused(capsys, [str(copy), "--format", "peft", "--out", str(tmp_path / "o")], "trainer.pt", "step_3")


def test_a_wrong_shaped_or_unknown_adapter_tensor_is_refused_naming_it(lora_run, tmp_path, capsys):
    """Issue 35, item 5: the exporter checks every tensor against the run's model before it writes."""
    import shutil

    run = lora_run[0]
    for name, damage in (
        ("shape", lambda model, key: model.update({key: torch.zeros(3, 3)})),
        ("unknown", lambda model, key: model.update({"bogus.lora_A.default.weight": torch.zeros(1)})),
    ):
        copy = tmp_path / name
        shutil.copytree(run, copy)
        trainer_pt = copy / "checkpoints" / "step_3" / "trainer.pt"
        payload = torch.load(trainer_pt, weights_only=True)
        key = sorted(payload["trainer"]["model"])[0]
        damage(payload["trainer"]["model"], key)
        torch.save(payload, trainer_pt)
        needles = (f"{key!r} has shape (3, 3)",) if name == "shape" else ("unexpected ['bogus.lora_A",)
        out = str(tmp_path / f"o-{name}")
        _refused(capsys, [str(copy), "--format", "diffusers", "--out", out], "trainer.pt", *needles)
        assert not (tmp_path / f"o-{name}").exists()


def test_a_random_base_is_rebuilt_only_on_the_device_it_was_built_on(lora_run, tmp_path, capsys):
    run = lora_run[0]
    _refused(
        capsys,
        [str(run), "--format", "diffusers", "--pipeline", "--device", "meta", "--out", str(tmp_path / "p")],
        "built its random base weights on cpu",
        "--device cpu",
    )


def test_the_new_keys_are_declared_and_read_only_where_they_apply():
    with pytest.raises(ConfigError, match=r"trainer\.ema_decay=1\.0 is outside its allowed range \[0, 1\)"):
        check_declared(run_config("tiny-sd3", "trainer.ema_decay=1"))
    cfg = run_config("tiny-sd3", "trainer.mode=full", "checkpoint.export_lora=true")
    with pytest.raises(
        ConfigError, match=r"checkpoint\.export_lora=true .* applies only with trainer\.mode=lora"
    ):
        check_unread_knobs(cfg)
    ds3 = run_config(
        "tiny-sd3", "trainer.backend=deepspeed", "trainer.deepspeed_stage=3", "trainer.ema_decay=0.9"
    )
    with pytest.raises(ConfigError, match=r"trainer\.ema_decay > 0 cannot average ZeRO-3"):
        validate_config(ds3)
    validate_config(run_config("tiny-sd3", "trainer.ema_decay=0.9", "checkpoint.export_lora=true"))
