"""Safe attention-backend selection: the known-bad table, fallbacks, the cuDNN SDPA switch, bad names."""

from __future__ import annotations

import logging
import random
import re

import pytest
import torch

from digenrl.models.attention_safety import (
    FALLBACK_BACKEND,
    KNOWN_BAD_ATTENTION,
    AttentionShape,
    KnownBadAttention,
    parse_cudnn_version,
    parse_torch_version,
    select_attention_backend,
)

BAD_TORCH, BAD_CUDNN = "2.11.0+cu130", 91900  # the combination seen failing on the H200


@pytest.fixture(autouse=True)
def restore_cudnn_sdp():
    """select_attention_backend flips a process-wide switch; every test starts and ends with it on."""
    torch.backends.cuda.enable_cudnn_sdp(True)
    yield
    torch.backends.cuda.enable_cudnn_sdp(True)


def test_training_on_the_bad_combo_disables_cudnn_sdp_and_says_why(caplog):
    with caplog.at_level(logging.WARNING, logger="digenrl.models.attention_safety"):
        choice = select_attention_backend(
            "native", needs_backward=True, device="cuda", torch_version=BAD_TORCH, cudnn_version=BAD_CUDNN
        )
    assert choice.backend == "native" and choice.disable_cudnn_sdp
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    assert any("FLUX-size" in r for r in choice.reasons)
    assert "cuDNN SDPA disabled" in caplog.text and "torch 2.11" in caplog.text


def test_inference_on_the_bad_combo_keeps_cudnn():
    choice = select_attention_backend(
        "native", needs_backward=False, device="cuda", torch_version=BAD_TORCH, cudnn_version=BAD_CUDNN
    )
    assert choice.backend == "native" and not choice.disable_cudnn_sdp and choice.reasons == ()
    assert torch.backends.cuda.cudnn_sdp_enabled()


@pytest.mark.parametrize(
    ("torch_version", "cudnn"),
    [("2.10.1+cu128", 91900), ("2.14.0", 91900), ("2.11.0", 92100), ("2.11.0", 90800), ("2.11.0", None)],
)
def test_other_versions_are_left_alone(torch_version, cudnn):
    choice = select_attention_backend(
        "native", needs_backward=True, device="cuda", torch_version=torch_version, cudnn_version=cudnn
    )
    assert not choice.disable_cudnn_sdp and torch.backends.cuda.cudnn_sdp_enabled()


def test_forced_cudnn_backend_falls_back_for_training():
    choice = select_attention_backend(
        "_native_cudnn", needs_backward=True, device="cuda", torch_version=BAD_TORCH, cudnn_version=BAD_CUDNN
    )
    assert choice.requested == "_native_cudnn" and choice.backend == FALLBACK_BACKEND
    # the fallback lands on "native", whose own row then turns cuDNN out of SDPA as well
    assert choice.disable_cudnn_sdp and not torch.backends.cuda.cudnn_sdp_enabled()
    assert choice.reasons[0].startswith("_native_cudnn -> native")


def test_inference_only_backend_is_refused_for_training():
    choice = select_attention_backend("sage", needs_backward=True, device="cuda", torch_version="2.12.0")
    assert choice.backend == FALLBACK_BACKEND and choice.reasons


def test_gpu_backend_on_cpu_falls_back():
    choice = select_attention_backend("_native_cudnn", needs_backward=False, device="cpu")
    assert choice.backend == "native" and "CUDA" in choice.reasons[0]
    assert (
        select_attention_backend("_native_math", needs_backward=True, device="cpu").backend == "_native_math"
    )


@pytest.mark.parametrize("name", ["warp-speed", "flash_hub", "", "NATIVE"])
def test_unknown_backend_raises_naming_the_config_key(name):
    with pytest.raises(ValueError, match=r"model\.attention_backend") as err:
        select_attention_backend(name, needs_backward=True, device="cpu")
    assert "native" in str(err.value)  # the allowed names are listed


def test_forward_rows_apply_to_inference_and_training():
    row = KnownBadAttention(
        backends=("native",),
        direction="forward",
        remedy="disable-cudnn-sdp",
        reason="test row",
        device_type="cpu",
    )
    for needs_backward in (False, True):
        torch.backends.cuda.enable_cudnn_sdp(True)
        choice = select_attention_backend(
            "native", needs_backward=needs_backward, device="cpu", known_bad=(row,)
        )
        assert choice.disable_cudnn_sdp and "test row" in choice.reasons[0]


def test_rows_match_exactly_their_inclusive_version_ranges():
    for row in KNOWN_BAD_ATTENTION:
        backend = row.backends[random.randrange(len(row.backends))]
        lo_t, hi_t = row.torch_versions or ((2, 0), (2, 20))
        inside_cudnn = row.cudnn_versions[0] if row.cudnn_versions else None
        kwargs = {"needs_backward": True, "device_type": row.device_type, "cudnn_version": inside_cudnn}
        assert row.matches(backend, torch_version=lo_t, **kwargs)
        assert row.matches(backend, torch_version=hi_t, **kwargs)
        assert not row.matches("no-such-backend", torch_version=lo_t, **kwargs)
        assert not row.matches(backend, torch_version=lo_t, **{**kwargs, "device_type": "mps"})
        if row.torch_versions:
            assert not row.matches(backend, torch_version=(hi_t[0], hi_t[1] + 1), **kwargs)
        if row.cudnn_versions:
            above = (row.cudnn_versions[1][0], row.cudnn_versions[1][1] + 1)
            assert not row.matches(backend, torch_version=lo_t, **{**kwargs, "cudnn_version": above})
        if row.direction == "backward":
            assert not row.matches(backend, torch_version=lo_t, **{**kwargs, "needs_backward": False})


def test_version_parsing():
    major, minor, patch = random.randint(9, 12), random.randint(0, 99), random.randint(0, 99)
    assert parse_cudnn_version(major * 10000 + minor * 100 + patch) == (major, minor)
    assert parse_cudnn_version(8902) == (8, 9)
    assert parse_cudnn_version(None) is None
    assert parse_torch_version("2.11.0+cu130") == (2, 11)
    assert parse_torch_version("2.13.0.dev20260101") == (2, 13)
    with pytest.raises(ValueError, match="torch version"):
        parse_torch_version("nightly")


def test_table_rejects_unknown_direction_and_remedy():
    with pytest.raises(ValueError, match="direction"):
        KnownBadAttention(backends=("native",), direction="sideways", remedy="fallback", reason="x")
    with pytest.raises(ValueError, match="remedy"):
        KnownBadAttention(backends=("native",), direction="both", remedy="pray", reason="x")


def _train_choice(shape, **kwargs):
    return select_attention_backend(
        "native",
        needs_backward=True,
        device="cuda",
        torch_version=BAD_TORCH,
        cudnn_version=BAD_CUDNN,
        shape=shape,
        **kwargs,
    )


def test_verified_unmasked_shape_keeps_cudnn_for_training():
    """SD3.5-medium's attention (head dim 64, no mask) passed the backward regression check on the H200."""
    choice = _train_choice(AttentionShape(head_dim=64, masked=False))
    assert not choice.disable_cudnn_sdp and choice.reasons == ()
    assert torch.backends.cuda.cudnn_sdp_enabled()


@pytest.mark.parametrize(
    ("shape", "rows"),
    [
        (AttentionShape(head_dim=128, masked=False), ["FLUX-size"]),  # FLUX, Wan: not verified
        (AttentionShape(head_dim=128, masked=True), ["FLUX-size", "attention mask"]),  # Qwen-Image
        (AttentionShape(head_dim=64, masked=True), ["FLUX-size", "attention mask"]),  # verified unmasked only
        (None, ["FLUX-size", "attention mask"]),  # unknown shape: every row applies
    ],
)
def test_unverified_or_masked_shapes_disable_cudnn_naming_each_row(shape, rows):
    choice = _train_choice(shape)
    assert choice.disable_cudnn_sdp and not torch.backends.cuda.cudnn_sdp_enabled()
    assert len(choice.reasons) == len(rows)
    for reason, row in zip(choice.reasons, rows, strict=True):
        assert row in reason


def test_cudnn_sdpa_disabled_overrides_the_table_and_bad_values_are_named():
    choice = _train_choice(AttentionShape(head_dim=64, masked=False), cudnn_sdpa="disabled")
    assert choice.disable_cudnn_sdp and choice.reasons == ("cuDNN SDPA disabled: model.cudnn_sdpa=disabled",)
    with pytest.raises(ValueError, match=re.escape("model.cudnn_sdpa='off'; allowed: auto, disabled")):
        _train_choice(None, cudnn_sdpa="off")


def test_shape_of_reads_the_spec():
    from digenrl.models import build_flow_model

    shape = AttentionShape.of(build_flow_model("tiny-sd3", device="meta"))
    assert shape == AttentionShape(head_dim=8, masked=False)
    assert AttentionShape.of(build_flow_model("tiny-qwen-image", device="meta")).masked
