"""ImageReward on transformers' BLIP classes: a checkpoint in ImageReward's layout (its timm-style ViT,
re-implemented here after BLIP's vit.py, plus med.py's BERT names and the MLP) converts to a
``BlipForImageTextRetrieval`` directory whose reward is ``(MLP(text CLS state) − mean) / std`` with the text
encoder cross-attending to the ViT's tokens; plus the tiny twin's seeding and round trip, the real size
(meta device) and the errors of an incomplete directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from digenrl.models.text import fallback_tokenizer_dir
from digenrl.rewards import build_reward
from digenrl.rewards.aesthetic import AestheticHead
from digenrl.rewards.imagereward import (
    HEAD_FILENAME,
    IMAGEREWARD_MEAN,
    IMAGEREWARD_STD,
    TINY_IMAGEREWARD,
    ImageReward,
    blip_config,
    convert_imagereward_checkpoint,
)

VISION, TEXT = TINY_IMAGEREWARD["vision_config"], TINY_IMAGEREWARD["text_config"]
PROMPTS = ["a cat on a mat", "a red car", "an astronaut riding a horse on the moon"]


class RefBlock(nn.Module):
    """BLIP vit.py ``Block``: pre-LN (eps 1e-6), fused qkv with bias, GELU MLP."""

    def __init__(self, width: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width, eps=1e-6), nn.LayerNorm(width, eps=1e-6)
        self.attn = nn.Module()
        self.attn.qkv, self.attn.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Module()
        self.mlp.fc1, self.mlp.fc2 = nn.Linear(width, hidden), nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = (
            self.attn.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        )
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = ((q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5).softmax(dim=-1)
        x = x + self.attn.proj((attn @ v).transpose(1, 2).reshape(b, n, c))
        return x + self.mlp.fc2(nn.functional.gelu(self.mlp.fc1(self.norm2(x))))


class RefViT(nn.Module):
    """BLIP vit.py ``VisionTransformer.forward``: patches, class token, positions, blocks, final norm."""

    def __init__(self) -> None:
        super().__init__()
        width, patch = VISION["hidden_size"], VISION["patch_size"]
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(3, width, kernel_size=patch, stride=patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, width) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, (VISION["image_size"] // patch) ** 2 + 1, width) * 0.02)
        self.blocks = nn.ModuleList(
            RefBlock(width, VISION["num_attention_heads"], VISION["intermediate_size"])
            for _ in range(VISION["num_hidden_layers"])
        )
        self.norm = nn.LayerNorm(width, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed.proj(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(fallback_tokenizer_dir())
    tok.add_special_tokens({"bos_token": "[DEC]", "additional_special_tokens": ["[ENC]"]})
    return tok


@pytest.fixture(scope="module")
def original(tokenizer):
    """The parts of an ImageReward checkpoint: ViT, BLIP text encoder, projections, MLP head."""
    from transformers import BlipForImageTextRetrieval

    torch.manual_seed(0)
    blip = BlipForImageTextRetrieval(blip_config(TINY_IMAGEREWARD, tokenizer)).eval()
    head = AestheticHead(TEXT["hidden_size"]).eval()
    for layer in head.layers:  # O(1) scores that differ between inputs
        if isinstance(layer, nn.Linear):
            nn.init.normal_(layer.weight, std=layer.in_features**-0.5)
    return RefViT().eval(), blip.text_encoder, blip, head


@pytest.fixture(scope="module")
def converted(original, tmp_path_factory: pytest.TempPathFactory) -> Path:
    vit, text_encoder, blip, head = original
    state = {f"blip.visual_encoder.{k}": v for k, v in vit.state_dict().items()}
    state |= {f"blip.text_encoder.{k}": v for k, v in text_encoder.state_dict().items()}
    seq = text_encoder.embeddings.position_embeddings.num_embeddings
    state["blip.text_encoder.embeddings.position_ids"] = torch.arange(seq)[None]  # persisted by med.py
    for name in ("vision_proj", "text_proj"):
        state |= {f"blip.{name}.{k}": v for k, v in getattr(blip, name).state_dict().items()}
    state |= {f"mlp.{k}": v for k, v in head.state_dict().items()}
    path = tmp_path_factory.mktemp("ir") / "ImageReward.pt"
    torch.save(state, path)
    out = tmp_path_factory.mktemp("ir_converted")
    return convert_imagereward_checkpoint(
        path, out, tokenizer_path=fallback_tokenizer_dir(), architecture=TINY_IMAGEREWARD
    )


def test_converted_checkpoint_scores_as_imagereward(original, converted: Path, tokenizer) -> None:
    vit, text_encoder, _, head = original
    reward = build_reward("imagereward", weights_path=str(converted), batch_size=2)
    assert type(reward) is ImageReward and (reward.mean, reward.std) == (IMAGEREWARD_MEAN, IMAGEREWARD_STD)
    images = torch.rand(3, 3, 40, 48, generator=torch.Generator().manual_seed(0))
    scores = reward(images, PROMPTS)
    assert scores.shape == (3,) and scores.dtype == torch.float32
    tokens = tokenizer(PROMPTS, padding="max_length", truncation=True, max_length=35, return_tensors="pt")
    with torch.no_grad():
        image_states = vit(reward.transform(images))
        torch.testing.assert_close(
            reward.model.vision_model(pixel_values=reward.transform(images)).last_hidden_state,
            image_states,
            atol=1e-5,
            rtol=1e-5,
        )
        states = text_encoder(
            input_ids=tokens["input_ids"],
            attention_mask=tokens["attention_mask"],
            encoder_hidden_states=image_states,
            encoder_attention_mask=torch.ones(image_states.shape[:-1], dtype=torch.long),
        ).last_hidden_state
        expected = (head(states[:, 0]) - IMAGEREWARD_MEAN) / IMAGEREWARD_STD
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=1e-5)
    assert scores.std() > 1e-3  # the image and the prompt both reach the score
    assert abs(float(reward(images[:1].expand(2, -1, -1, -1), PROMPTS[:2]).diff())) > 1e-6


def test_tiny_twin_is_seeded_and_round_trips(tmp_path: Path) -> None:
    tiny = build_reward("tiny-imagereward")
    images = torch.rand(2, 3, 32, 32)
    scores = tiny(images, PROMPTS[:2])
    assert scores.shape == (2,) and torch.isfinite(scores).all()
    assert torch.equal(scores, build_reward("tiny-imagereward")(images, PROMPTS[:2]))
    assert not torch.allclose(
        scores, build_reward("tiny-imagereward", seed=5)(images, PROMPTS[:2]), atol=1e-6
    )
    directory = tiny.save_pretrained(tmp_path / "ir")
    assert {"config.json", "model.safetensors", HEAD_FILENAME, "tokenizer_config.json"} <= {
        p.name for p in directory.iterdir()
    }
    loaded = build_reward("imagereward", weights_path=str(directory))
    assert torch.equal(loaded(images, PROMPTS[:2]), scores)


def test_real_size_is_imagereward_v1() -> None:
    reward = build_reward("imagereward", device="meta")
    config = reward.model.config
    assert (config.vision_config.hidden_size, config.vision_config.num_hidden_layers) == (1024, 24)
    assert (config.text_config.hidden_size, config.text_config.encoder_hidden_size) == (768, 1024)
    assert config.text_config.vocab_size == 30524 and len(reward.tokenizer) == 30524
    linear = [(m.in_features, m.out_features) for m in reward.head.layers if isinstance(m, nn.Linear)]
    assert linear == [(768, 1024), (1024, 128), (128, 64), (64, 16), (16, 1)]
    assert reward.transform.crop_hw == (224, 224)


def test_incomplete_directory_and_foreign_checkpoint_are_named(tmp_path: Path) -> None:
    directory = build_reward("tiny-imagereward").save_pretrained(tmp_path / "ir")
    (directory / HEAD_FILENAME).unlink()
    with pytest.raises(
        ValueError, match=rf"not a complete ImageReward directory; missing: head \({HEAD_FILENAME}\)"
    ):
        build_reward("imagereward", weights_path=str(directory))
    with pytest.raises(ValueError, match=r"not an ImageReward state dict: unknown keys \['text_model\.x'\]"):
        convert_imagereward_checkpoint(
            {"text_model.x": torch.zeros(1)}, tmp_path / "out", tokenizer_path=fallback_tokenizer_dir()
        )
