"""`ModelFamily`: everything the code knows about one diffusers architecture, declared in one place.

A family is what differs between generators as *code* rather than as config data (after torchtitan's
`TrainSpec`: a model plugs in by registering one object). Each family lives in its own module under
`families/` and is registered in `specs.py`; every consumer asks the registry (`specs.get_family`):

* `FlowModel` calls `velocity` and reads `patch_size` (token count, valid resolutions);
* `TextEncoder` combines its components' outputs with `compose_condition`;
* `LatentDecoder` and `latent_shape_for` read `latent_compression` and decode with `vae_decode`;
* the trainer's LoRA defaults are `lora_targets` (`trainer/lora.py`);
* the zoo (`MODEL_SPECS`, config key `model.name`) is the union of every family's `specs`.

Everything per *model* (configs, scheduler shift, default steps, noise level, CFG style) is `ModelSpec` data.
Adding a family: docs/models.md, "Adding a model family".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

if TYPE_CHECKING:
    from digenrl.data.text_condition import TextCondition
    from digenrl.models.spec_types import ModelSpec

#: (transformer, unpacked latents, sigma [B], condition, embedded guidance [B] or None) -> v = noise - x0
VelocityFn = Callable[[nn.Module, Tensor, Tensor, "TextCondition", Tensor | None], Tensor]
#: one text-encoder component's output: (sequence [B, L, D] or None, pooled [B, Dp] or None, mask [B, L])
ComponentOutput = tuple[Tensor | None, Tensor | None, Tensor]
#: component outputs by component name -> (embeds [B, L, D], pooled [B, Dp] or None, mask [B, L] or None)
ComposeFn = Callable[[dict[str, ComponentOutput]], tuple[Tensor, Tensor | None, Tensor | None]]


def plain_vae_decode(vae: nn.Module, latents: Tensor) -> Tensor:
    """``vae.decode(z).sample``: what every diffusers pipeline of a VAE with the latents' own rank does."""
    return vae.decode(latents).sample


@dataclass(frozen=True)
class ModelFamily:
    """One architecture family: how to call, patch, condition and fine-tune its diffusers transformer.

    ``velocity``: the transformer call that reproduces the family's diffusers pipeline and returns
    v = noise - x0 on unpacked latents (timestep scaling, packing, position ids, masks, guidance).
    ``compose_condition``: the text-encoder outputs combined into (embeds, pooled, mask) as the pipeline's
    ``encode_prompt`` does. ``patch_size``: the transformer config -> (temporal, spatial) patch of one
    token, counting packing done outside the model (FLUX's 2x2). ``latent_compression``: the VAE config ->
    (temporal, spatial) downsampling. ``vae_decode``: decode de-normalised latents to pixels in [-1, 1].
    ``lora_targets``: module-name suffixes the default LoRA adapter wraps (peft ``target_modules``).
    ``specs``: the zoo entries of this family (published configurations and tiny CPU variants).
    ``pipeline_class``: the diffusers pipeline class of the family (exports load through it).
    ``kohya_lora``: whether ComfyUI's loader maps ``lora_transformer_<diffusers module>`` keys onto this
    family's diffusers modules (comfy/lora.py does for SD3 and FLUX), so ``export.py --format kohya`` may
    write it (digenrl/trainer/lora_export.py).
    ``cuts_text_padding``: the transformer only masks padded text keys and numbers text positions from the
    first text token, so a forward may cut the padded tail and drop the mask (``model.text_padding=split``,
    digenrl/models/text_padding.py, which says why that is exact).
    """

    name: str
    velocity: VelocityFn
    compose_condition: ComposeFn
    patch_size: Callable[[dict[str, Any]], tuple[int, int]]
    latent_compression: Callable[[dict[str, Any]], tuple[int, int]]
    lora_targets: tuple[str, ...]
    specs: tuple[ModelSpec, ...]
    pipeline_class: str
    vae_decode: Callable[[nn.Module, Tensor], Tensor] = plain_vae_decode
    kohya_lora: bool = False
    cuts_text_padding: bool = False

    def __post_init__(self) -> None:
        if not self.lora_targets:
            raise ValueError(f"model family {self.name!r} needs at least one default LoRA target")
        for spec in self.specs:
            if spec.family != self.name or spec.text_encoder.composition != self.name:
                raise ValueError(
                    f"model family {self.name!r} lists spec {spec.name!r} of family {spec.family!r} "
                    f"with text composition {spec.text_encoder.composition!r}; both must be {self.name!r}"
                )
