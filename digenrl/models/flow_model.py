"""`FlowModel`: one velocity interface over every diffusers transformer of the zoo.

    v = flow_model(latents, sigma, cond, guidance=None)

with x_sigma = (1 - sigma) * x0 + sigma * noise, sigma in [0, 1] (1 = pure noise) and v ~ noise - x0, on
unpacked latents of shape [B, *latent_shape(...)]. Per-family timestep scaling, 2x2 packing, position ids,
masks and guidance embeddings live in the family's `velocity` (`families/<family>.py`, looked up through
`specs.get_family`). The wrapped module stays a plain attribute
`flow_model.transformer`, so peft LoRA and FSDP2 can target its submodules directly.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor, nn

from digenrl.data.text_condition import TextCondition
from digenrl.models.construction import instantiate_diffusers_model, load_diffusers_model
from digenrl.models.spec_types import ModelSpec
from digenrl.models.specs import get_family, get_model_spec
from digenrl.models.text_padding import check_text_padding, padding_free_forward
from digenrl.models.vae import latent_channels, latent_compression


def latent_shape_for(
    spec: ModelSpec, height: int, width: int, frames: int | None = None, *, key_prefix: str = ""
) -> tuple[int, ...]:
    """Unpacked per-sample latent shape of ``spec`` at this resolution: (C, h, w) for images, (C, f, h, w)
    for videos. Pure spec arithmetic, so start-up validation checks a resolution without building a model.

    Height and width must be multiples of VAE factor x patch; video frames must satisfy
    (frames - 1) % temporal_factor == 0 (causal video VAEs keep the first frame), f = (F - 1) / t + 1.
    Errors name the keys as ``<key_prefix>height`` etc. (validation passes ``"model."``).
    """
    temporal_factor, spatial_factor = latent_compression(spec)
    patch_t, patch = get_family(spec.family).patch_size(spec.transformer_config)
    multiple = spatial_factor * patch
    for key, value in (("height", height), ("width", width)):
        if value <= 0 or value % multiple:
            near = max(multiple, round(value / multiple) * multiple)
            raise ValueError(
                f"{key_prefix}{key}={value} must be a positive multiple of {multiple} for {spec.name} "
                f"(VAE factor {spatial_factor} x patch {patch}), e.g. {near}"
            )
    h, w = height // spatial_factor, width // spatial_factor
    channels = latent_channels(spec)
    if not spec.is_video:
        if frames is not None:
            raise ValueError(
                f"{key_prefix}frames={frames} given for image model {spec.name}; leave it unset, only video "
                "models (wan*, hunyuan-video) have frames"
            )
        return channels, h, w
    frames = spec.default_frames if frames is None else frames
    if frames < 1 or (frames - 1) % temporal_factor:
        raise ValueError(
            f"{key_prefix}frames={frames} invalid for {spec.name}: need (frames - 1) % {temporal_factor} "
            f"== 0, e.g. {spec.default_frames}"
        )
    f = (frames - 1) // temporal_factor + 1
    if f % patch_t:
        raise ValueError(
            f"{key_prefix}frames={frames} gives {f} latent frames, not a multiple of patch {patch_t} "
            f"for {spec.name}"
        )
    return channels, f, h, w


def token_count_for(spec: ModelSpec, height: int, width: int, frames: int | None = None) -> int:
    """Image/video tokens the transformer sees (the `image_seq_len` of dynamic time shifting): latent cells
    over the patch, pure spec arithmetic like :func:`latent_shape_for`."""
    shape = latent_shape_for(spec, height, width, frames)
    patch_t, patch = get_family(spec.family).patch_size(spec.transformer_config)
    spatial = (shape[-2] // patch) * (shape[-1] // patch)
    return spatial * (shape[1] // patch_t if spec.is_video else 1)


class FlowModel(nn.Module):
    """Velocity predictor v(x_sigma, sigma, text) ~ noise - x0 for one generator of the zoo."""

    def __init__(self, spec: ModelSpec, transformer: nn.Module) -> None:
        super().__init__()
        family = get_family(spec.family)
        self.spec = spec
        self.transformer = transformer
        self._velocity = family.velocity
        self.temporal_factor, self.spatial_factor = latent_compression(spec)
        self.patch_t, self.patch = family.patch_size(spec.transformer_config)
        self.latent_channels = latent_channels(spec)
        self.autocast_dtype: torch.dtype | None = None
        self._cuts_text_padding = family.cuts_text_padding
        # "mask" (the padded text as built) or "split" (digenrl/models/text_padding.py); set_text_padding
        self.text_padding = "mask"

    # --- mixed precision ---------------------------------------------------------------------------------

    def set_autocast(self, enabled: bool, dtype: torch.dtype | None = None) -> None:
        """Run the transformer under ``torch.autocast`` in its own 16-bit dtype (``model.autocast``).

        Why: LoRA adapters keep fp32 weights (AdamW's master copy, digenrl/trainer/lora.py), and peft then
        casts each adapted layer's input to fp32 and multiplies in fp32 (peft ``lora.Linear.forward``),
        which on a GPU runs off the tensor cores. Under autocast the adapter matmuls run in bf16/fp16 on the
        fp32 weights (torch AMP: weights cast per op, gradients land in fp32), so peft's input cast is
        switched off on every LoRA layer (the ``cast_input_dtype_enabled`` flag peft's
        ``helpers.disable_input_dtype_casting`` toggles). Autocast also runs its fp32-listed ops (layer
        norms, softmax) in fp32, so the forward differs slightly from the plain 16-bit one; rollout and
        training both pass here, so the on-policy ratio still starts at 1. Call again after adding
        adapters (``apply_lora`` does).
        """
        if enabled:
            # ``dtype``: the compute dtype when it is not the parameters' own (FSDP2 full fine-tuning keeps
            # fp32 master shards and computes in the bf16 the model was built in)
            dtype = dtype or self.dtype
            if dtype not in (torch.bfloat16, torch.float16):
                raise ValueError(
                    f"model.autocast=true needs a 16-bit model.dtype (bfloat16 or float16), "
                    f"{self.spec.name} computes in {dtype}"
                )
            self.autocast_dtype = dtype
        else:
            self.autocast_dtype = None
        for module in self.transformer.modules():
            if hasattr(module, "cast_input_dtype_enabled"):  # a peft tuner layer
                module.cast_input_dtype_enabled = not enabled

    @property
    def cuts_text_padding(self) -> bool:
        """Whether the family's forward can cut a masked encoder's padding (ModelFamily.cuts_text_padding)."""
        return self._cuts_text_padding

    def set_text_padding(self, mode: str) -> None:
        """``model.text_padding``: ``split`` runs each forward as groups of rows of one real text length with
        the padding cut and no mask, for families where that is exact (``ModelFamily.cuts_text_padding``;
        a no-op elsewhere); ``mask`` keeps the padded, masked text."""
        self.text_padding = check_text_padding(mode)

    # --- properties --------------------------------------------------------------------------------------

    @property
    def dtype(self) -> torch.dtype:
        """Compute dtype: diffusers' `ModelMixin.dtype`, which skips `_keep_in_fp32_modules` (Wan keeps its
        modulation tables and norms in float32 under bf16) and honours layerwise-casting hooks."""
        dtype = getattr(self.transformer, "dtype", None)
        if isinstance(dtype, torch.dtype):
            return dtype
        return next(p.dtype for p in self.transformer.parameters() if p.is_floating_point())

    @property
    def device(self) -> torch.device:
        return next(self.transformer.parameters()).device

    @property
    def uses_true_cfg(self) -> bool:
        """False for guidance-distilled FLUX-dev / HunyuanVideo: guidance is an input, no cond/uncond pair."""
        return self.spec.uses_true_cfg

    @property
    def embeds_guidance(self) -> bool:
        return bool(getattr(self.transformer.config, "guidance_embeds", False))

    # --- shapes ------------------------------------------------------------------------------------------

    def latent_shape(self, height: int, width: int, frames: int | None = None) -> tuple[int, ...]:
        """Unpacked per-sample latent shape: (C, h, w) for images, (C, f, h, w) for videos
        (:func:`latent_shape_for`)."""
        return latent_shape_for(self.spec, height, width, frames)

    def token_count(self, height: int, width: int, frames: int | None = None) -> int:
        """Image/video tokens the transformer sees (:func:`token_count_for`)."""
        return token_count_for(self.spec, height, width, frames)

    # --- forward -----------------------------------------------------------------------------------------

    def forward(
        self,
        latents: Tensor,
        sigma: Tensor | float,
        cond: TextCondition,
        guidance: Tensor | float | None = None,
    ) -> Tensor:
        """Velocity [B, *latent_shape] in the model dtype.

        `guidance` is the embedded guidance scale of guidance-distilled models (defaults to the spec's
        `default_guidance_scale`); models without a guidance embedding reject it (use CFG instead).
        """
        expected_ndim = 5 if self.spec.is_video else 4
        if latents.ndim != expected_ndim or latents.shape[1] != self.latent_channels:
            raise ValueError(
                f"latents shape {tuple(latents.shape)} invalid for {self.spec.name}: "
                f"expected {expected_ndim}-D "
                f"with {self.latent_channels} channels"
            )
        batch = latents.shape[0]
        if cond.batch_size != batch:
            raise ValueError(f"cond batch {cond.batch_size} != latents batch {batch}")
        dtype = self.dtype
        sigma = self._per_sample(sigma, batch, "sigma", latents.device)
        if guidance is not None and not self.embeds_guidance:
            raise ValueError(
                f"guidance given but {self.spec.name} has no guidance embedding; "
                "apply classifier-free guidance instead"
            )
        if self.embeds_guidance:
            scale = self.spec.default_guidance_scale if guidance is None else guidance
            guidance = self._per_sample(scale, batch, "guidance", latents.device)
        cond = cond.to(device=latents.device, dtype=dtype)
        latents = latents.to(dtype)
        if self.text_padding == "split" and self._cuts_text_padding and cond.mask is not None:
            return padding_free_forward(self._transformer_call, latents, sigma, cond, guidance)
        return self._transformer_call(latents, sigma, cond, guidance)

    def _transformer_call(
        self, latents: Tensor, sigma: Tensor, cond: TextCondition, guidance: Tensor | None
    ) -> Tensor:
        if self.autocast_dtype is None:
            return self._velocity(self.transformer, latents, sigma, cond, guidance)
        with torch.autocast(latents.device.type, dtype=self.autocast_dtype):
            v = self._velocity(self.transformer, latents, sigma, cond, guidance)
        return v.to(self.dtype)

    @staticmethod
    def _per_sample(value: Tensor | float, batch: int, name: str, device: torch.device) -> Tensor:
        t = torch.as_tensor(value, dtype=torch.float32, device=device)
        if t.ndim == 0:
            return t.expand(batch)
        if t.shape != (batch,):
            raise ValueError(f"{name} must be a scalar or shape [B={batch}], got {tuple(t.shape)}")
        return t.float()


def build_flow_model(
    spec: ModelSpec | str,
    *,
    pretrained_path: str | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> FlowModel:
    """Random init from `spec.transformer_config`, or `from_pretrained` of a local diffusers directory
    (its `transformer/` subfolder when present). `device="meta"` builds a shape-only model."""
    if isinstance(spec, str):
        spec = get_model_spec(spec)
    if pretrained_path is None:
        transformer = instantiate_diffusers_model(
            spec.transformer_class, spec.transformer_config, device=device, dtype=dtype
        )
    else:
        sub = os.path.join(pretrained_path, "transformer")
        transformer = load_diffusers_model(
            spec.transformer_class, sub if os.path.isdir(sub) else pretrained_path, device=device, dtype=dtype
        )
    return FlowModel(spec, transformer)


def available_attention_backends() -> list[str]:
    """Diffusers attention backends usable offline ("native" = torch SDPA is the default)."""
    from diffusers.models.attention_dispatch import AttentionBackendName

    return sorted(b.value for b in AttentionBackendName if not b.value.endswith("_hub"))


def set_attention_backend(flow_model: FlowModel, name: str = "native") -> None:
    """Route the transformer's attention through diffusers backend `name` (flash, sage, xformers, ...).

    Kernels are imported by diffusers only when selected; an uninstalled one raises there. Hub-downloaded
    kernels are refused because the machines have no hub access.
    """
    allowed = available_attention_backends()
    if name not in allowed:
        raise ValueError(f"attention backend {name!r} unknown or unavailable offline; allowed: {allowed}")
    transformer = flow_model.transformer
    setter = getattr(transformer, "set_attention_backend", None)
    if setter is None:
        if name != "native":
            raise ValueError(f"{type(transformer).__name__} does not support attention backends")
        return
    if name == "native" and current_attention_backends(flow_model) <= {"native"}:
        return  # already the default; diffusers would only log its "experimental" warning
    setter(name)


def current_attention_backends(flow_model: FlowModel) -> set[str]:
    """Backends the transformer's attention processors are set to ("native" when unset)."""
    backends = set()
    for module in flow_model.transformer.modules():
        processor = getattr(module, "processor", None)
        if processor is not None and hasattr(processor, "_attention_backend"):
            backend = processor._attention_backend
            backends.add("native" if backend is None else str(getattr(backend, "value", backend)))
    return backends
