"""model.compile_vae (digenrl/models/optimize.py compile_vae_decoder): the compiled decode gives the eager
decode's pixels, and a scoring rank's decoder is compiled only when the key asks for it."""

from __future__ import annotations

import pytest
import torch

from digenrl.config import load_config
from digenrl.models import get_model_spec
from digenrl.models.optimize import compile_vae_decoder
from digenrl.models.vae import LatentDecoder, latent_channels


@pytest.mark.slow  # an inductor compile: ~20 s a VAE on 2 cores
@pytest.mark.parametrize("name", ["tiny-sd3", "tiny-qwen-image"])
def test_compiled_decode_equals_the_eager_one(name):
    """Inductor on the CPU (the tiny VAEs compile in seconds); the tolerance of the other compile checks."""
    torch.manual_seed(0)
    decoder = LatentDecoder.build(get_model_spec(name))
    side = 32 // decoder.spatial_factor
    latents = torch.randn(2, latent_channels(decoder.spec), side, side)
    eager = decoder.decode(latents)
    assert compile_vae_decoder(decoder)
    assert decoder.vae.decoder._compiled_call_impl is not None
    compiled = decoder.decode(latents)
    assert compiled.shape == eager.shape == (2, 3, 32, 32)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    assert eager.std() > 1e-3  # a constant image would make the comparison vacuous


@pytest.mark.parametrize("on", [False, True])
def test_a_scoring_rank_compiles_its_decoder_when_asked(tmp_path, monkeypatch, on):
    import digenrl.systems.components as components
    from digenrl.runtime.comm.distributed import DistContext
    from digenrl.trainer.run_dir import RunStart

    compiled = []
    monkeypatch.setattr(components, "compile_vae_decoder", lambda decoder: compiled.append(decoder) or True)
    cfg = load_config(
        None,
        [
            f"model.compile_vae={str(on).lower()}",
            "trainer.backend=none",
            "eval.every=0",
            f"out_dir={tmp_path}",
        ],
    )
    ctx = DistContext(0, 1, 0, torch.device("cpu"), "gloo", False)
    parts = components.build_rank_components(
        cfg, ctx, role="trainer", generate=True, train=False, clock_origin=0.0, run=RunStart("t")
    )
    assert compiled == ([parts.scorer.decoder] if on else [])
