"""HPSv2.1 without open_clip: an open_clip-layout state dict (built here by a small re-implementation of
open_clip's ViT ``CLIP`` — ``nn.MultiheadAttention`` blocks, ``c_fc``/``c_proj`` MLPs, argmax text pooling,
transposed projections) converted to transformers' ``CLIPModel`` computes the same embeddings, and the
reward scores the cosine on HPSv2's pad-to-square preprocessing. With open_clip installed, its own model is
compared too. Plus the tiny twin's range, seeding, round trip and the real size (meta device)."""

from __future__ import annotations

import importlib.util
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from torch import nn

from digenrl.models.text import fallback_tokenizer_dir
from digenrl.rewards import build_reward
from digenrl.rewards.hpsv2 import (
    TINY_OPEN_CLIP,
    HPSv21,
    ResizeMaxSize,
    convert_open_clip_checkpoint,
    open_clip_to_transformers,
    read_open_clip_state_dict,
)

WIDTH, LAYERS, HEADS, EMBED, PATCH, IMAGE, CONTEXT = 32, 2, 2, 16, 8, 32, 77
PROMPTS = ["a cat on a mat", "a red car", "an astronaut riding a horse on the moon"]


class Block(nn.Module):
    """open_clip transformer.py ``ResidualAttentionBlock`` (sequence-first, pre-LN, GELU MLP)."""

    def __init__(self) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(WIDTH)
        self.attn = nn.MultiheadAttention(WIDTH, HEADS)
        self.ln_2 = nn.LayerNorm(WIDTH)
        mlp = [
            ("c_fc", nn.Linear(WIDTH, 4 * WIDTH)),
            ("gelu", nn.GELU()),
            ("c_proj", nn.Linear(4 * WIDTH, WIDTH)),
        ]
        self.mlp = nn.Sequential(OrderedDict(mlp))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, need_weights=False, attn_mask=mask)[0]
        return x + self.mlp(self.ln_2(x))


class Tower(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.resblocks = nn.ModuleList(Block() for _ in range(LAYERS))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x.transpose(0, 1)  # NLD -> LND
        for block in self.resblocks:
            x = block(x, mask)
        return x.transpose(0, 1)


class Visual(nn.Module):
    """open_clip ``VisionTransformer`` (learnable positions, ln_pre, class-token pooling, ``@ proj``)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, WIDTH, kernel_size=PATCH, stride=PATCH, bias=False)
        self.class_embedding = nn.Parameter(torch.randn(WIDTH) * WIDTH**-0.5)
        self.positional_embedding = nn.Parameter(torch.randn((IMAGE // PATCH) ** 2 + 1, WIDTH) * WIDTH**-0.5)
        self.ln_pre, self.ln_post = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.transformer = Tower()
        self.proj = nn.Parameter(torch.randn(WIDTH, EMBED) * WIDTH**-0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_embedding.expand(x.shape[0], 1, -1), x], dim=1) + self.positional_embedding
        x = self.ln_post(self.transformer(self.ln_pre(x)))
        return x[:, 0] @ self.proj


class MiniOpenClip(nn.Module):
    """open_clip model.py ``CLIP``: the text tower's attributes at top level, as in HPSv2's checkpoints."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.visual = Visual()
        self.transformer = Tower()
        self.token_embedding = nn.Embedding(vocab, WIDTH)
        self.positional_embedding = nn.Parameter(torch.randn(CONTEXT, WIDTH) * 0.01)
        self.ln_final = nn.LayerNorm(WIDTH)
        self.text_projection = nn.Parameter(torch.randn(WIDTH, EMBED) * WIDTH**-0.5)
        self.logit_scale = nn.Parameter(torch.tensor(4.6))
        self.register_buffer("attn_mask", torch.full((CONTEXT, CONTEXT), float("-inf")).triu(1))

    def encode_text(self, ids: torch.Tensor, pool_at: torch.Tensor | None = None) -> torch.Tensor:
        length = ids.shape[1]
        x = self.token_embedding(ids) + self.positional_embedding[:length]
        x = self.ln_final(self.transformer(x, self.attn_mask[:length, :length]))
        pool_at = (
            ids.argmax(dim=-1) if pool_at is None else pool_at
        )  # open_clip: the end token's id is largest
        return x[torch.arange(ids.shape[0]), pool_at] @ self.text_projection


@pytest.fixture(scope="module")
def tokenizer_dir() -> str:
    return fallback_tokenizer_dir()


@pytest.fixture(scope="module")
def reference(tokenizer_dir: str) -> MiniOpenClip:
    from transformers import AutoTokenizer

    torch.manual_seed(0)
    return MiniOpenClip(len(AutoTokenizer.from_pretrained(tokenizer_dir))).eval()


@pytest.fixture(scope="module")
def converted(reference: MiniOpenClip, tokenizer_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hps") / "HPS_v2.1_compressed.pt"
    torch.save({"state_dict": reference.state_dict()}, path)  # the layout HPSv2 loads ["state_dict"] from
    out = tmp_path_factory.mktemp("hps_converted")
    return convert_open_clip_checkpoint(path, out, tokenizer_path=tokenizer_dir, architecture=TINY_OPEN_CLIP)


def test_every_open_clip_weight_is_mapped_once(reference: MiniOpenClip, tokenizer_dir: str) -> None:
    from transformers import AutoTokenizer, CLIPModel

    from digenrl.rewards.clip_backbone import clip_config

    state = reference.state_dict()
    out = open_clip_to_transformers(state)
    target = CLIPModel(clip_config(TINY_OPEN_CLIP, AutoTokenizer.from_pretrained(tokenizer_dir))).state_dict()
    assert set(out) == set(target)  # one open_clip tensor (or a third of one) per transformers tensor
    assert all(out[k].shape == target[k].shape for k in out)
    assert len(out) == len(state) - 1 + 4 * 2 * LAYERS  # attn_mask dropped; in_proj w, b -> q, k, v
    q, k, v = state["transformer.resblocks.1.attn.in_proj_weight"].chunk(3)
    for name, part in (("q", q), ("k", k), ("v", v)):
        assert torch.equal(out[f"text_model.encoder.layers.1.self_attn.{name}_proj.weight"], part)
    assert torch.equal(out["visual_projection.weight"], state["visual.proj"].t())
    with pytest.raises(ValueError, match=r"unknown keys \['visual\.attnpool\.x'\]"):
        open_clip_to_transformers({**state, "visual.attnpool.x": torch.zeros(1)})


def test_converted_model_computes_open_clips_embeddings(reference: MiniOpenClip, converted: Path) -> None:
    from transformers import CLIPModel

    model = CLIPModel.from_pretrained(converted, local_files_only=True).eval()
    pixels = torch.randn(3, 3, IMAGE, IMAGE)
    # token ids below the end token (102, [SEP] of the stand-in), so open_clip's argmax finds it
    ids = torch.randint(1, 100, (3, 12))
    ids[:, 0], ids[0, 5:], ids[1, 11:], ids[2, 8:] = 101, 0, 0, 0
    ids[0, 4], ids[1, 10], ids[2, 7] = 102, 102, 102
    with torch.no_grad():
        ours_image = model.get_image_features(pixel_values=pixels)
        ours_text = model.get_text_features(input_ids=ids)
        ours_image = ours_image if isinstance(ours_image, torch.Tensor) else ours_image.pooler_output
        ours_text = ours_text if isinstance(ours_text, torch.Tensor) else ours_text.pooler_output
        torch.testing.assert_close(ours_image, reference.visual(pixels), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours_text, reference.encode_text(ids), atol=1e-5, rtol=1e-5)


def test_reward_is_the_cosine_on_hpsv2_preprocessing(reference: MiniOpenClip, converted: Path) -> None:
    from transformers import AutoTokenizer

    reward = build_reward("hpsv2.1", weights_path=str(converted), batch_size=2)
    assert type(reward) is HPSv21 and reward.clip.transform == ResizeMaxSize(IMAGE)
    images = torch.rand(3, 3, 48, 40)
    scores = reward(images, PROMPTS)
    tokens = AutoTokenizer.from_pretrained(converted)(PROMPTS, padding=True, return_tensors="pt")
    end = (tokens["input_ids"] == 102).int().argmax(dim=-1)  # the stand-in's [SEP] is not its largest id
    with torch.no_grad():
        image = reference.visual(ResizeMaxSize(IMAGE)(images))
        text = reference.encode_text(tokens["input_ids"], pool_at=end)
    expected = torch.nn.functional.cosine_similarity(image, text, dim=-1)
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=1e-5)


def test_resize_max_size_scales_the_longer_side_and_pads_to_a_square() -> None:
    transform = ResizeMaxSize(32, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    tall = torch.rand(1, 3, 64, 32)
    out = transform(tall)
    assert out.shape == (1, 3, 32, 32)
    assert torch.equal(out[..., :8], torch.zeros(1, 3, 32, 8)) and torch.equal(
        out[..., 24:], torch.zeros(1, 3, 32, 8)
    )
    inner = torch.nn.functional.interpolate(tall, size=(32, 16), mode="bicubic", antialias=True)
    torch.testing.assert_close(out[..., 8:24], inner)
    square = torch.rand(2, 3, 32, 32)
    assert torch.equal(transform(square), square)  # native size: no resampling, no padding


def test_tiny_twin_range_seed_and_round_trip(tmp_path: Path) -> None:
    tiny = build_reward("tiny-hpsv2.1")
    images = torch.rand(3, 3, 32, 32)
    scores = tiny(images, PROMPTS)
    assert scores.shape == (3,) and ((scores >= -1) & (scores <= 1)).all()
    assert torch.equal(scores, build_reward("tiny-hpsv2.1")(images, PROMPTS))
    assert not torch.allclose(scores, build_reward("tiny-hpsv2.1", seed=3)(images, PROMPTS), atol=1e-4)
    loaded = build_reward("hpsv2.1", weights_path=str(tiny.save_pretrained(tmp_path / "hps")))
    assert torch.equal(loaded(images, PROMPTS), scores)


def test_real_size_is_open_clip_vit_h_14() -> None:
    reward = build_reward("hpsv2.1", device="meta")
    assert reward.num_parameters() == 986_109_441  # open_clip ViT-H-14
    assert reward.clip.transform == ResizeMaxSize(224)


def test_checkpoint_file_errors_are_named(tmp_path: Path, tokenizer_dir: str) -> None:
    bad = tmp_path / "bad.pt"
    torch.save({"state_dict": {"visual.proj": "not a tensor"}}, bad)
    with pytest.raises(ValueError, match=r"bad\.pt: not an open_clip checkpoint"):
        read_open_clip_state_dict(bad)
    wrapped = tmp_path / "ddp.pt"
    torch.save({"state_dict": {"module.logit_scale": torch.ones(())}}, wrapped)
    assert set(read_open_clip_state_dict(wrapped)) == {"logit_scale"}
    with pytest.raises(ValueError, match="do not fit the configured architecture"):
        convert_open_clip_checkpoint(
            {"logit_scale": torch.ones(())},
            tmp_path / "out",
            tokenizer_path=tokenizer_dir,
            architecture=TINY_OPEN_CLIP,
        )


@pytest.mark.skipif(importlib.util.find_spec("open_clip") is None, reason="open_clip is not installed")
def test_matches_open_clip_itself(tmp_path: Path, tokenizer_dir: str) -> None:  # pragma: no cover - optional
    import open_clip
    from transformers import AutoTokenizer, CLIPModel

    vocab = len(AutoTokenizer.from_pretrained(tokenizer_dir))
    model = open_clip.model.CLIP(
        EMBED,
        {
            "image_size": IMAGE,
            "layers": LAYERS,
            "width": WIDTH,
            "head_width": WIDTH // HEADS,
            "patch_size": PATCH,
        },
        {"context_length": CONTEXT, "vocab_size": vocab, "width": WIDTH, "heads": HEADS, "layers": LAYERS},
    ).eval()
    out = convert_open_clip_checkpoint(
        model.state_dict(), tmp_path / "oc", tokenizer_path=tokenizer_dir, architecture=TINY_OPEN_CLIP
    )
    ours = CLIPModel.from_pretrained(out, local_files_only=True).eval()
    pixels = torch.randn(2, 3, IMAGE, IMAGE)
    ids = torch.tensor([[101, 5, 7, 102, 0, 0], [101, 9, 3, 4, 8, 102]])
    with torch.no_grad():
        image = ours.get_image_features(pixel_values=pixels)
        text = ours.get_text_features(input_ids=ids)
        image = image if isinstance(image, torch.Tensor) else image.pooler_output
        text = text if isinstance(text, torch.Tensor) else text.pooler_output
        torch.testing.assert_close(image, model.encode_image(pixels), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(text, model.encode_text(ids), atol=1e-5, rtol=1e-5)
