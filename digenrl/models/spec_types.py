"""Typed, frozen descriptions of a generator: transformer, VAE, text encoders, sampling defaults.

A spec is pure data (configs as dicts, no tensors), so it can be hashed, logged and compared, and the
builders in `flow_model.py`, `vae.py` and `text.py` turn it into modules. What differs between families
as code (the transformer call, the text composition, patching, VAE factors, LoRA targets) is not here but in
the family's `ModelFamily` (`family.py`, one module per family under `families/`); each family module also
holds its zoo entries: the published diffusers / transformers configs and a tiny variant at toy sizes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class EncoderComponentSpec:
    """One transformers text model feeding the generator (e.g. CLIP-L inside SD3's triple encoder).

    `hidden_state_index=None` reads `last_hidden_state`; an int reads `hidden_states[index]` (SD3's CLIPs use
    -2, HunyuanVideo's Llama uses -3). `pooled` names the output used as pooled vector ("text_embeds" for
    `CLIPTextModelWithProjection`, "pooler_output" for `CLIPTextModel`), `None` if unused. `emits_sequence`
    says whether the per-token states are part of the condition (FLUX's CLIP only gives the pooled vector).
    `prompt_template` / `template_drop_tokens` reproduce the chat templates of Qwen-Image and HunyuanVideo;
    they are applied only with the model's real tokenizer (a local `pretrained_path`), because the crop is a
    token count of that tokenizer. `subfolder` is the component's folder in a diffusers repository; its
    tokenizer lives in the matching `tokenizer*` folder.
    """

    name: str
    model_class: str
    config: dict[str, Any]
    max_length: int
    subfolder: str = "text_encoder"
    emits_sequence: bool = True
    hidden_state_index: int | None = None
    pooled: str | None = None
    pass_attention_mask: bool = False
    zero_padding: bool = False
    prompt_template: str | None = None
    template_drop_tokens: int = 0
    source: str = ""

    def __post_init__(self) -> None:
        if self.pooled not in (None, "text_embeds", "pooler_output"):
            raise ValueError(
                f"EncoderComponentSpec.pooled={self.pooled!r}; allowed: None, 'text_embeds', 'pooler_output'"
            )
        if self.max_length <= 0:
            raise ValueError(f"EncoderComponentSpec.max_length must be > 0, got {self.max_length}")
        if not self.subfolder.startswith("text_encoder"):
            raise ValueError(
                f"EncoderComponentSpec.subfolder={self.subfolder!r} must start with 'text_encoder'"
            )

    @property
    def tokenizer_subfolder(self) -> str:
        return self.subfolder.replace("text_encoder", "tokenizer", 1)


@dataclass(frozen=True)
class TextEncoderSpec:
    """The text encoders of one family and how their outputs are composed (see `text.py`).

    `composition` names the family whose `compose_condition` combines the component outputs.
    `embed_dim` / `pooled_dim` / `seq_len` are what the transformer receives (`seq_len`: the token count L
    of the composed condition, which the family's builder states, e.g. SD3 concatenates CLIP-L and CLIP-G
    along channels and then the CLIP and T5 sequences along tokens); `uses_mask` says whether the
    transformer consumes the token mask (Qwen-Image, HunyuanVideo).
    """

    composition: str
    components: tuple[EncoderComponentSpec, ...]
    embed_dim: int
    pooled_dim: int | None
    uses_mask: bool
    seq_len: int

    def __post_init__(self) -> None:
        if self.seq_len <= 0:
            raise ValueError(f"TextEncoderSpec.seq_len must be > 0, got {self.seq_len}")

    def component(self, name: str) -> EncoderComponentSpec:
        for comp in self.components:
            if comp.name == name:
                return comp
        raise ValueError(
            f"text encoder component {name!r} not found; have {[c.name for c in self.components]}"
        )


@dataclass(frozen=True)
class DynamicShiftSpec:
    """Resolution-dependent time shift of FLUX / Qwen-Image schedulers (diffusers `calculate_shift`).

    mu = base_shift + (max_shift - base_shift) * (n - base_seq_len) / (max_seq_len - base_seq_len), with n
    the packed image token count; the exponential time shift sigma' = e^mu / (e^mu + 1/sigma - 1) is the
    static shift with s = e^mu (diffusers FlowMatchEulerDiscreteScheduler.time_shift).
    """

    base_shift: float
    max_shift: float
    base_seq_len: int
    max_seq_len: int

    def mu(self, image_seq_len: int) -> float:
        slope = (self.max_shift - self.base_shift) / (self.max_seq_len - self.base_seq_len)
        return self.base_shift + slope * (image_seq_len - self.base_seq_len)


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to build and sample one generator with the flow-matching convention.

    Latent convention everywhere: x_sigma = (1 - sigma) * x0 + sigma * noise and the model predicts
    v = noise - x0 (the FlowModel adapter hides each class's timestep scaling and token packing).
    Decoding: z_vae = z / vae_scaling_factor + vae_shift_factor, or per channel
    z_vae = z * latents_std + latents_mean for Wan / Qwen-Image. `family` names the registered
    `ModelFamily` that knows how to call, patch and condition this transformer (`specs.get_family`).
    """

    name: str
    family: str
    transformer_class: str
    transformer_config: dict[str, Any]
    vae_class: str
    vae_config: dict[str, Any]
    text_encoder: TextEncoderSpec
    vae_scaling_factor: float = 1.0
    vae_shift_factor: float = 0.0
    vae_latents_mean: tuple[float, ...] | None = None
    vae_latents_std: tuple[float, ...] | None = None
    default_height: int = 512
    default_width: int = 512
    default_frames: int | None = None
    default_num_steps: int = 10
    default_eval_num_steps: int = 40  # eval.num_steps' default (digenrl/rollout/evaluate.py; FlowGRPO's)
    default_guidance_scale: float = 4.5
    guidance_embedded: bool = False
    cfg_renorm: bool = False
    noise_level: float = 0.7
    shift: float = 1.0
    dynamic_shift: DynamicShiftSpec | None = None
    shift_terminal: float | None = None
    is_video: bool = False
    sources: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if (self.vae_latents_mean is None) != (self.vae_latents_std is None):
            raise ValueError("ModelSpec.vae_latents_mean and vae_latents_std must be given together")
        if self.is_video != (self.default_frames is not None):
            raise ValueError("ModelSpec.default_frames must be set exactly when is_video is True")

    @property
    def uses_true_cfg(self) -> bool:
        """False for guidance-distilled models (FLUX-dev, HunyuanVideo) that embed the guidance scale."""
        return not self.guidance_embedded

    def time_shift(self, image_seq_len: int) -> float:
        """Multiplicative shift s for sigma' = s*sigma / (1 + (s - 1)*sigma) at this token count."""
        if self.dynamic_shift is None:
            return self.shift
        return math.exp(self.dynamic_shift.mu(image_seq_len))
