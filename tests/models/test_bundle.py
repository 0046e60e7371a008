"""Save a tiny random bundle in the diffusers layout, load it back, and get identical outputs."""

from __future__ import annotations

import os

import pytest
import torch

from digenrl.models import build_flow_model, build_model_bundle, save_model_bundle

TINY_NAMES = ["tiny-sd3", "tiny-flux", "tiny-qwen-image", "tiny-wan", "tiny-hunyuan-video"]


@pytest.mark.parametrize("name", TINY_NAMES)
def test_save_then_load_gives_identical_outputs(name, bundles, tmp_path):
    original = bundles(name)
    spec = original.spec
    directory = str(tmp_path / name)
    save_model_bundle(original, directory)
    assert os.path.isdir(os.path.join(directory, "transformer"))
    assert os.path.isdir(os.path.join(directory, "vae"))
    assert os.path.isdir(os.path.join(directory, "text_encoder"))
    loaded = build_model_bundle(name, pretrained_path=directory)

    prompts = ["a lighthouse at dusk", "x"]
    cond_a = original.text_encoder.encode(prompts)
    cond_b = loaded.text_encoder.encode(prompts)
    assert torch.equal(cond_a.embeds, cond_b.embeds)
    shape = original.flow_model.latent_shape(spec.default_height, spec.default_width, spec.default_frames)
    x, sigma = torch.randn(2, *shape), torch.rand(2)
    with torch.no_grad():
        assert torch.equal(original.flow_model(x, sigma, cond_a), loaded.flow_model(x, sigma, cond_b))
    assert torch.equal(original.decoder.decode(x), loaded.decoder.decode(x))


def test_transformer_only_directory_loads_with_build_flow_model(bundles, tmp_path):
    original = bundles("tiny-sd3").flow_model
    original.transformer.save_pretrained(str(tmp_path))
    loaded = build_flow_model("tiny-sd3", pretrained_path=str(tmp_path))
    for (n_a, p_a), (n_b, p_b) in zip(
        original.transformer.state_dict().items(), loaded.transformer.state_dict().items(), strict=True
    ):
        assert n_a == n_b and torch.equal(p_a, p_b)


def test_pretrained_path_errors(bundles, tmp_path):
    with pytest.raises(ValueError, match="pretrained_path"):
        build_model_bundle("tiny-sd3", pretrained_path=str(tmp_path / "missing"))
    directory = str(tmp_path / "flux")
    save_model_bundle(bundles("tiny-flux"), directory)
    with pytest.raises(ValueError, match=r"model\.name"):
        build_model_bundle("tiny-sd3", pretrained_path=directory)
