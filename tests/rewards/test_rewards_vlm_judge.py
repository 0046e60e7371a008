"""The VLM-judge reward (Qwen2.5-VL yes/no judge) on its tiny twin: the score against an independent
computation (transformers' PIL image processor, a float64 copy of the model, full-vocabulary softmax),
batching, seeding, the save → from_pretrained round trip, the prompt's effect, and loading errors.
The real-size configuration is checked on the meta device (shapes only, no weights)."""

from __future__ import annotations

import copy
import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from digenrl.rewards import build_reward
from digenrl.rewards.registry import reward_needs_weights
from digenrl.rewards.vlm_judge import (
    IMAGE_TOKEN,
    NO_WORDS,
    QWEN25_VL_7B,
    VARLEN_ATTENTION,
    YES_WORDS,
    QwenImageTransform,
    TinyVLMJudge,
    VLMJudge,
    build_config,
    chatml_text,
    offline_tokenizer,
    smart_resize,
    varlen_window_attention,
)

SIZE = 56  # a multiple of patch 14 x merge 2: no resize, 4 x 4 patches = 4 language-model tokens
PROMPTS = ["a cat", "an astronaut riding a horse on the moon, photorealistic", "a red car", "a cat"]


def exact_uint8_images(
    batch: int, height: int = SIZE, width: int = SIZE, seed: int = 0, smooth: bool = False
):
    """Float images whose values are exactly k/255, and the same pixels as PIL images. ``smooth``: upsampled
    from a coarse grid, so resampling them is well conditioned (bicubic on pixel noise is not)."""
    generator = torch.Generator().manual_seed(seed)
    if smooth:
        coarse = torch.rand(batch, 3, max(height // 6, 2), max(width // 6, 2), generator=generator)
        fine = torch.nn.functional.interpolate(coarse, size=(height, width), mode="bilinear")
        pixels = (fine * 255).round().to(torch.uint8)
    else:
        pixels = torch.randint(0, 256, (batch, 3, height, width), dtype=torch.uint8, generator=generator)
    return pixels.float() / 255.0, [Image.fromarray(p.permute(1, 2, 0).numpy()) for p in pixels]


@pytest.fixture(scope="module")
def judge() -> VLMJudge:
    return build_reward("tiny-vlm-judge", batch_size=8)


@pytest.fixture(scope="module")
def saved_dir(judge: VLMJudge, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return judge.save_pretrained(tmp_path_factory.mktemp("tiny_vlm_judge"))


def test_registered_as_model_rewards_with_optional_weights() -> None:
    for name in ("vlm-judge", "tiny-vlm-judge"):
        # a model to host: scorer ranks may run it and residency may park it
        assert reward_needs_weights(name) is True
    assert VLMJudge.weights_optional and TinyVLMJudge.weights_optional
    assert VLMJudge.name == "vlm-judge" and TinyVLMJudge.name == "tiny-vlm-judge"
    with pytest.raises(ValueError, match=r"reward\.weights_path"):  # other model rewards still require it
        build_reward("pickscore")


def test_scores_are_float32_probabilities_one_per_image(judge: VLMJudge) -> None:
    images, _ = exact_uint8_images(5, seed=1)
    prompts = [*PROMPTS, "a dog"]
    scores = judge(images, prompts)
    assert scores.shape == (5,) and scores.dtype == torch.float32
    assert torch.isfinite(scores).all() and (scores >= 0).all() and (scores <= 1).all()
    assert judge.name == "tiny-vlm-judge" and judge.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in judge.model.parameters())
    # random weights give near-even odds, but the scores must still depend on the input
    assert scores.std() > 0


def test_score_matches_independent_float64_computation(judge: VLMJudge) -> None:
    """P(yes)/(P(yes)+P(no)) from the full softmax of a float64 copy, fed by transformers' PIL processor."""
    images, pil_images = exact_uint8_images(len(PROMPTS), seed=2)
    scores = judge(images, PROMPTS)
    processor = judge.transform.image_processor()
    reference = copy.deepcopy(judge.model).double()
    tokenizer = judge.tokenizer
    yes_ids = {tokenizer.convert_tokens_to_ids(tokenizer.tokenize(w))[0] for w in YES_WORDS}
    no_ids = {tokenizer.convert_tokens_to_ids(tokenizer.tokenize(w))[0] for w in NO_WORDS}
    expected = []
    for pil_image, prompt in zip(pil_images, PROMPTS, strict=True):
        vision = processor(images=[pil_image], return_tensors="pt")
        merge = processor.merge_size**2
        text = chatml_text(f'Does this image show "{prompt}"? Please answer yes or no.')
        text = text.replace(IMAGE_TOKEN, IMAGE_TOKEN * int(vision["image_grid_thw"][0].prod() // merge))
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            logits = reference(
                input_ids=ids,
                pixel_values=vision["pixel_values"].double(),
                image_grid_thw=vision["image_grid_thw"],
                mm_token_type_ids=(ids == reference.config.image_token_id).int(),
                use_cache=False,
            ).logits[0, -1]
        probs = torch.softmax(logits, dim=-1)
        p_yes, p_no = probs[sorted(yes_ids)].sum(), probs[sorted(no_ids)].sum()
        expected.append(float(p_yes / (p_yes + p_no)))
    np.testing.assert_allclose(scores.numpy(), expected, atol=1e-5)


def test_batch_of_n_equals_n_singles(judge: VLMJudge) -> None:
    images, _ = exact_uint8_images(len(PROMPTS), seed=3)
    mask = judge.encode(images, PROMPTS)["attention_mask"]
    assert (mask == 0).any(), "prompts of different lengths must exercise the left padding"
    batched = judge.score_images(images, PROMPTS)
    singles = torch.cat(
        [judge.score_images(images[i : i + 1], PROMPTS[i : i + 1]) for i in range(len(PROMPTS))]
    )
    torch.testing.assert_close(batched, singles, atol=1e-5, rtol=0)


def test_video_is_mean_of_frame_scores(judge: VLMJudge) -> None:
    frames, _ = exact_uint8_images(6, seed=4)
    video = frames.view(2, 3, 3, SIZE, SIZE).permute(0, 2, 1, 3, 4)  # [B=2, 3, F=3, H, W]
    scores = judge(video, ["a cat", "a dog"])
    for b, prompt in enumerate(["a cat", "a dog"]):
        per_frame = judge(video[b].permute(1, 0, 2, 3), [prompt] * 3)
        np.testing.assert_allclose(scores[b].item(), per_frame.mean().item(), atol=1e-6)


def test_random_weights_are_seeded(judge: VLMJudge) -> None:
    images, _ = exact_uint8_images(2, seed=5)
    again = build_reward("tiny-vlm-judge", seed=0)
    other = build_reward("tiny-vlm-judge", seed=1)
    assert torch.equal(again(images, PROMPTS[:2]), judge(images, PROMPTS[:2]))
    assert not torch.allclose(other(images, PROMPTS[:2]), judge(images, PROMPTS[:2]), atol=1e-6)


def test_save_then_from_pretrained_gives_identical_scores(judge: VLMJudge, saved_dir: Path) -> None:
    assert {"config.json", "model.safetensors", "preprocessor_config.json", "tokenizer_config.json"} <= {
        p.name for p in saved_dir.iterdir()
    }
    loaded = build_reward("vlm-judge", weights_path=str(saved_dir))  # the real reward's loading path
    assert type(loaded) is VLMJudge and loaded.weights_path == str(saved_dir)
    assert loaded.num_parameters() == judge.num_parameters()
    assert loaded.transform == judge.transform
    images, _ = exact_uint8_images(3, seed=6)
    torch.testing.assert_close(loaded(images, PROMPTS[:3]), judge(images, PROMPTS[:3]), atol=0, rtol=0)


def test_prompt_enters_the_question(judge: VLMJudge) -> None:
    images, _ = exact_uint8_images(1, seed=7)
    same_image = images.expand(3, -1, -1, -1)
    prompts = ["a cat", "a bowl of ramen on a wooden table", "a cat"]
    scores = judge(same_image, prompts)
    assert abs(float(scores[0] - scores[1])) > 1e-6
    assert float(scores[0]) == float(scores[2])
    assert 'Does this image show "a bowl of ramen on a wooden table"?' in judge.chat_text(prompts[1])
    custom = build_reward("tiny-vlm-judge", question="Is this a photo of {prompt}? Answer yes or no.")
    assert "Is this a photo of a cat?" in custom.chat_text("a cat")
    assert abs(float(custom(images, ["a cat"])[0] - scores[0])) > 1e-6
    with pytest.raises(ValueError, match=r"\{prompt\}"):
        build_reward("tiny-vlm-judge", question="Is this good?")


def test_chat_template_in_weights_dir_is_used(judge: VLMJudge, saved_dir: Path, tmp_path: Path) -> None:
    import shutil

    directory = tmp_path / "templated"
    shutil.copytree(saved_dir, directory)
    template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\nJUDGE MODE "
        "{% for c in m['content'] %}{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
        "{% else %}{{ c['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    (directory / "chat_template.jinja").write_text(template)
    templated = build_reward("vlm-judge", weights_path=str(directory))
    text = templated.chat_text("a cat")
    assert text.startswith("<|im_start|>user\nJUDGE MODE <|vision_start|><|image_pad|><|vision_end|>Does")
    assert "system" not in text and "system" in judge.chat_text("a cat")
    images, _ = exact_uint8_images(1, seed=8)
    assert abs(float(templated(images, ["a cat"])[0] - judge(images, ["a cat"])[0])) > 1e-6


def test_loading_errors_name_the_setting(saved_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"reward\.weights_path=.*not an existing local directory"):
        build_reward("vlm-judge", weights_path=str(tmp_path / "missing"))
    with pytest.raises(
        ValueError, match=r"reward\.weights_path=.*missing: model config \(config\.json\); weights"
    ):
        build_reward("vlm-judge", weights_path=str(tmp_path))
    wrong = tmp_path / "wrong"
    shutil.copytree(saved_dir, wrong)
    config = json.loads((saved_dir / "config.json").read_text())
    (wrong / "config.json").write_text(json.dumps({**config, "model_type": "qwen2_vl"}))
    with pytest.raises(ValueError, match=r"'qwen2_vl' model.*Qwen2\.5-VL"):
        build_reward("vlm-judge", weights_path=str(wrong))


def test_bf16_judge_scores_close_to_float32(judge: VLMJudge) -> None:
    """The bfloat16 compute path on the float32 judge's weights (rounded). The weights are copied, not
    re-drawn: a random build in bfloat16 draws its own values, which need not be the float32 draws
    rounded on every torch build (on the H200 image's torch 2.11 the scores differed by 0.07, here by
    4e-4), and a random model's scores move far more with its weights than with bfloat16 arithmetic."""
    half = build_reward("tiny-vlm-judge", dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in half.model.parameters())
    half.model.load_state_dict(judge.model.state_dict())
    images, _ = exact_uint8_images(2, seed=9)
    scores = half(images, PROMPTS[:2])
    assert scores.dtype == torch.float32
    np.testing.assert_allclose(scores.numpy(), judge(images, PROMPTS[:2]).numpy(), atol=2e-2)


@pytest.mark.parametrize("hw", [(56, 56), (70, 98), (64, 48), (30, 200)])
def test_tensor_preprocessing_matches_the_processor(judge: VLMJudge, hw: tuple[int, int]) -> None:
    """Exact at native sizes; resized sizes agree with PIL's uint8 path to about one uint8 step."""
    processor = judge.transform.image_processor()
    images, pil_images = exact_uint8_images(2, *hw, seed=10, smooth=hw != judge.transform.output_hw(*hw))
    ours, grid = judge.transform(images)
    ref = processor(images=pil_images, return_tensors="pt")
    torch.testing.assert_close(grid, ref["image_grid_thw"])
    assert ours.shape == ref["pixel_values"].shape
    quantum = 1.0 / 255.0 / min(judge.transform.std)
    error = (ours - ref["pixel_values"]).abs()
    if hw == judge.transform.output_hw(*hw):
        assert error.max() < 1e-5
    else:
        assert error.max() < 3 * quantum and error.mean() < 0.6 * quantum


def test_smart_resize_matches_transformers() -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as reference

    for height, width in [(512, 512), (1024, 1024), (480, 832), (30, 200), (20, 20), (4000, 3000)]:
        for min_pixels, max_pixels in [(56 * 56, 28 * 28 * 1280), (3136, 12845056), (56 * 56, 256 * 28 * 28)]:
            assert smart_resize(height, width, 28, min_pixels, max_pixels) == reference(
                height, width, 28, min_pixels, max_pixels
            )


def test_real_size_configuration_is_qwen25_vl_7b() -> None:
    from transformers import Qwen2_5_VLForConditionalGeneration

    tokenizer = offline_tokenizer()
    config = build_config(QWEN25_VL_7B, tokenizer)
    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration(config)
    assert sum(p.numel() for p in model.parameters()) == 8_292_166_656  # Qwen2.5-VL-7B-Instruct
    assert sum(p.numel() for p in model.model.visual.parameters()) == 676_550_144
    assert config.text_config.vocab_size == 152064 and not config.tie_word_embeddings
    assert config.image_token_id == tokenizer.convert_tokens_to_ids(IMAGE_TOKEN) < 152064
    # a 512^2 image is resized to 504^2: 36 x 36 patches, 2 x 2 merged = 324 language-model tokens
    assert QwenImageTransform().output_hw(512, 512) == (504, 504)
    assert QwenImageTransform().tokens_per_image(512, 512) == 324


def test_varlen_window_attention_equals_one_sdpa_call_per_window() -> None:
    generator = torch.Generator().manual_seed(11)
    heads, dim, bounds = 2, 8, [0, 5, 16, 20, 33]
    query, key, value = (torch.randn(1, heads, bounds[-1], dim, generator=generator) for _ in range(3))
    out, weights = varlen_window_attention(
        None, query, key, value, scaling=0.3, cu_seq_lens_q=torch.tensor(bounds), max_length_q=13
    )
    assert weights is None and out.shape == (bounds[-1], heads, dim)  # [T, H, D], as flash kernels return
    for a, b in itertools.pairwise(bounds):
        expected = (
            torch.softmax(query[0, :, a:b] @ key[0, :, a:b].transpose(-1, -2) * 0.3, dim=-1)
            @ value[0, :, a:b]
        )
        torch.testing.assert_close(out[a:b], expected.transpose(0, 1), atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="cu_seq_lens_q"):
        varlen_window_attention(None, query, key, value)


def test_vision_attention_modes_score_alike(judge: VLMJudge, monkeypatch: pytest.MonkeyPatch) -> None:
    """``varlen`` sends all windows of the batch through the registered entry point in one call per block."""
    from transformers import AttentionInterface

    assert judge.vision_attention == "loop"  # auto on CPU: the varlen kernel needs CUDA and 16 bits
    packed = build_reward("tiny-vlm-judge", vision_attention="varlen")
    assert packed.vision_attention == "varlen"
    assert packed.model.model.visual.config._attn_implementation == VARLEN_ATTENTION
    assert packed.model.config.text_config._attn_implementation == "sdpa"
    calls: list[int] = []

    def spy(*args, **kwargs):
        calls.append(len(kwargs["cu_seq_lens_q"]) - 1)
        return varlen_window_attention(*args, **kwargs)

    monkeypatch.setitem(AttentionInterface._global_mapping, VARLEN_ATTENTION, spy)
    images, _ = exact_uint8_images(3, 70, 98, seed=12, smooth=True)  # 56 x 112: two windows per image
    prompts = ["a cat", "a red car on a street", "a dog"]
    scores = packed(images, prompts)
    depth = packed.model.config.vision_config.depth
    assert len(calls) == depth and max(calls) == 6 and min(calls) == 3  # windowed blocks / full blocks
    torch.testing.assert_close(scores, judge(images, prompts), atol=1e-6, rtol=0)
    assert packed.set_vision_attention("loop") == "loop"
    assert packed.model.model.visual.config._attn_implementation == "sdpa"
    with pytest.raises(ValueError, match="vision_attention"):
        build_reward("tiny-vlm-judge", vision_attention="fast")


def test_the_qwen25_vl_7b_configuration_is_declared_once() -> None:
    """The judge and Qwen-Image's text encoder build the same Qwen2.5-VL-7B (issue 33: two copies had
    different rope settings)."""
    from digenrl.models.families.qwen_image import QWEN25_VL_7B_CONFIG
    from digenrl.rewards.vlm_judge import TINY_QWEN25_VL

    assert QWEN25_VL_7B is QWEN25_VL_7B_CONFIG
    assert TINY_QWEN25_VL["text_config"].keys() <= QWEN25_VL_7B["text_config"].keys()
