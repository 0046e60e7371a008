"""optimize_flow_model: identity without compile, regional compile wiring, where the project applies it."""

from __future__ import annotations

import pytest
import torch

from digenrl.config import Config, apply_overrides, load_config
from digenrl.models import TextCondition, build_flow_model
from digenrl.models.optimize import CompileSettings, optimize_flow_model, repeated_blocks
from digenrl.rollout.sampler import Sampler
from digenrl.trainer import PolicyTrainer


def _inputs(flow_model, batch: int = 2):
    shape = flow_model.latent_shape(32, 32)
    text = flow_model.spec.text_encoder
    cond = TextCondition(
        torch.randn(batch, text.seq_len, text.embed_dim),
        None if text.pooled_dim is None else torch.randn(batch, text.pooled_dim),
        torch.ones(batch, text.seq_len, dtype=torch.bool) if text.uses_mask else None,
    )
    return torch.randn(batch, *shape), torch.rand(batch), cond


@pytest.mark.parametrize("name", ["tiny-sd3", "tiny-flux", "tiny-qwen-image"])
def test_without_compile_the_forward_is_bit_identical(name):
    flow_model = build_flow_model(name).eval()
    x, sigma, cond = _inputs(flow_model)
    keys = list(flow_model.transformer.state_dict())
    with torch.no_grad():
        before = flow_model(x, sigma, cond)
    applied = optimize_flow_model(flow_model, compile=False, attention_backend="native")
    with torch.no_grad():
        after = flow_model(x, sigma, cond)
    assert not applied.compiled and applied.attention.backend == "native"
    assert torch.equal(before, after)
    assert list(flow_model.transformer.state_dict()) == keys


def test_regional_compile_wraps_each_repeated_block_and_keeps_names():
    flow_model = build_flow_model("tiny-flux").eval()
    x, sigma, cond = _inputs(flow_model, batch=3)
    keys = list(flow_model.transformer.state_dict())
    with torch.no_grad():
        before = flow_model(x, sigma, cond)
    blocks = repeated_blocks(flow_model.transformer)
    assert {type(b).__name__ for b in blocks} == {"FluxTransformerBlock", "FluxSingleTransformerBlock"}
    # backend="eager" runs dynamo alone: the wiring is checked without a C++/Triton compile
    applied = optimize_flow_model(
        flow_model,
        compile=True,
        attention_backend="native",
        compile_settings=CompileSettings(backend="eager"),
    )
    assert applied.compiled and applied.compiled_regions == len(blocks)
    assert all(b._compiled_call_impl is not None for b in blocks)
    with torch.no_grad():
        after = flow_model(x, sigma, cond)
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-6)
    assert list(flow_model.transformer.state_dict()) == keys
    assert applied.to_dict()["compile_settings"]["backend"] == "eager"


def test_sd3_blocks_come_from_no_split_modules():
    flow_model = build_flow_model("tiny-sd3")
    assert not getattr(flow_model.transformer, "_repeated_blocks", None)
    blocks = repeated_blocks(flow_model.transformer)
    assert blocks and all(type(b).__name__ == "JointTransformerBlock" for b in blocks)


def test_cuda_graph_mode_compiles_the_whole_transformer():
    flow_model = build_flow_model("tiny-sd3")
    settings = CompileSettings(mode="reduce-overhead", backend="eager")
    applied = optimize_flow_model(
        flow_model, compile=True, attention_backend="native", compile_settings=settings
    )
    assert applied.compiled_regions == 1 and applied.notes
    assert flow_model.transformer._compiled_call_impl is not None


def test_bad_compile_mode_is_rejected():
    with pytest.raises(ValueError, match="compile mode"):
        CompileSettings(mode="turbo")


def test_model_compile_config_key():
    """Unset, compile follows the device (the GPU path on CUDA, eager elsewhere); set, it is what runs."""
    default = Config().model
    assert default.compile is None
    assert default.optimised("cpu")[0] is False and default.optimised("cuda")[0] is True
    assert load_config(None, ["model.compile=false"]).model.optimised("cuda")[0] is False
    assert load_config(None, ["model.compile=true"]).model.compile is True
    with pytest.raises(ValueError, match=r"model\.compile"):
        load_config(None, ["model.compile=3"])


def test_trainer_checks_the_attention_backend_at_build_time():
    cfg = apply_overrides(Config(), {"model.attention_backend": "warp-speed", "trainer.backend": "none"})
    flow_model = build_flow_model("tiny-sd3")
    sampler = Sampler.from_config(cfg, flow_model.spec, flow_model.token_count(32, 32))
    with pytest.raises(ValueError, match=r"model\.attention_backend"):
        PolicyTrainer(cfg, flow_model, sampler, uncond=None, device="cpu")
    cfg.model.attention_backend = "native"
    trainer = PolicyTrainer(cfg, build_flow_model("tiny-sd3"), sampler, uncond=None, device="cpu")
    assert trainer.optimizations.attention.needs_backward and not trainer.optimizations.compiled


def test_safe_choice_also_resets_the_diffusers_process_default():
    """diffusers' set_attention_backend changes a process-wide default that unset processors follow."""
    from digenrl.models.attention_safety import process_attention_backend

    other = build_flow_model("tiny-flux")
    other.transformer.set_attention_backend("_native_math")
    try:
        assert process_attention_backend() == "_native_math"
        flow_model = build_flow_model("tiny-flux")
        optimize_flow_model(flow_model, compile=False, attention_backend="native", needs_backward=True)
        assert process_attention_backend() == "native"
    finally:
        other.transformer.set_attention_backend("native")


@pytest.mark.parametrize(
    ("generate", "train", "calls"), [(True, True, 1), (True, False, 1), (False, True, 1)]
)
def test_a_rank_optimises_its_model_once(tmp_path, monkeypatch, generate, train, calls):
    """Issue 33: a training rank ran optimize_flow_model twice (the trainer's, then the rank's with compile),
    the second resetting autocast's compute dtype; now the trainer's call compiles too, and only a rank
    without a trainer makes its own, in the mode ``model.compile_mode`` names."""
    import digenrl.systems.components as components
    import digenrl.trainer.trainer as trainer_module
    from digenrl.runtime.comm.distributed import DistContext
    from digenrl.trainer.run_dir import RunStart

    made: list[dict] = []

    def counted(flow_model, **settings):
        made.append(settings)
        return optimize_flow_model(flow_model, **{**settings, "compile": False})  # compile: recorded only

    monkeypatch.setattr(components, "optimize_flow_model", counted)
    monkeypatch.setattr(trainer_module, "optimize_flow_model", counted)
    cfg = load_config(
        None,
        [
            "model.compile=true",
            "model.compile_mode=reduce-overhead",
            "trainer.backend=none",
            "eval.every=0",
            f"out_dir={tmp_path}",
        ],
    )
    ctx = DistContext(0, 1, 0, torch.device("cpu"), "gloo", False)
    components.build_rank_components(
        cfg, ctx, role="trainer", generate=generate, train=train, clock_origin=0.0, run=RunStart("t")
    )
    assert len(made) == 1 and made[0]["compile"] is True and made[0]["needs_backward"]
    assert made[0]["compile_settings"].mode == "reduce-overhead"  # model.compile_mode reaches either caller
    if train:
        assert made[0]["compute_dtype"] == torch.float32  # the trainer's: autocast keeps its dtype
