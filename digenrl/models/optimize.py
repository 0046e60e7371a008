"""The project's optimised FlowModel path, applied by one small function (torchtitan style: each
optimisation is a function that modifies the model in place, composed where the model is built).

    applied = optimize_flow_model(flow_model, compile=cfg.model.compile,
                                  attention_backend=cfg.model.attention_backend, needs_backward=train,
                                  autocast=cfg.model.autocast)

What it applies is what the ecosystem provides, nothing hand-written:

* attention: a diffusers attention backend chosen by :func:`~digenrl.models.attention_safety.
  select_attention_backend`, which never keeps a (backend, torch, cuDNN, direction) combination known to fail;
* ``model.autocast``: 16-bit ``torch.autocast`` over the transformer, so fp32 LoRA adapters multiply on
  the tensor cores (:meth:`~digenrl.models.flow_model.FlowModel.set_autocast`);
* ``torch.compile`` of the transformer forward. By default *regional* compilation: every repeated block
  (diffusers' ``_repeated_blocks``, else its ``_no_split_modules`` classes, e.g. SD3's
  ``JointTransformerBlock``) gets ``nn.Module.compile``, as diffusers ``ModelMixin.compile_repeated_blocks``
  does (diffusers models/modeling_utils.py; PyTorch recipe "regional compilation"). Blocks of one class
  share one compiled graph, so compile time is that of a few blocks, not of the whole model, and module
  names, parameters and peft LoRA targeting are unchanged (weight sync and checkpoints see the same
  state dict). ``mode="reduce-overhead"`` (CUDA graphs for the fixed-shape denoising loop) compiles the
  whole transformer instead, because CUDA-graph trees record one graph per distinct parameter address set
  and the blocks' parameters all differ.

bf16 weights come from ``model.dtype``; the SDE step and its log-prob stay float32 in
:meth:`digenrl.rollout.sampler.Sampler.transition` whatever is applied here.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from digenrl.config import COMPILE_MODES
from digenrl.models.attention_safety import (
    AttentionChoice,
    AttentionShape,
    apply_attention_backend,
    select_attention_backend,
)
from digenrl.models.flow_model import FlowModel
from digenrl.models.vae import LatentDecoder

log = logging.getLogger(__name__)

RECOMPILE_LIMIT = 64
"""Per-code-object graph cache size while compiling. Regional compilation keys the cache by the block class's
``forward``; block variants (SD3.5's dual-attention / context-pre-only blocks), grad vs no-grad, LoRA on/off
(the KL reference) and batch shapes each add entries, and torch's default (8) would silently drop the rest
to eager."""


@dataclass(frozen=True)
class CompileSettings:
    """How ``torch.compile`` is called.

    ``dynamic=None`` is torch's default (static shapes first; a dimension that changes is recompiled as
    symbolic once), which bounds compile time when many batch sizes meet the same model; ``False`` gives
    one specialised graph per shape (a rollout's fixed-shape loop needs one or two).
    """

    mode: str = "default"
    dynamic: bool | None = None
    regional: bool = True
    backend: str = "inductor"  # "eager" runs dynamo alone (a quick CPU check of the wiring)
    fullgraph: bool = False

    def __post_init__(self) -> None:
        if self.mode not in COMPILE_MODES:
            raise ValueError(f"compile mode={self.mode!r}; allowed: {', '.join(COMPILE_MODES)}")


@dataclass(frozen=True)
class AppliedOptimizations:
    """What :func:`optimize_flow_model` did (benchmarks report it next to their numbers)."""

    attention: AttentionChoice
    compiled: bool
    compiled_regions: int = 0  # modules given nn.Module.compile (blocks, or 1 for the whole transformer)
    compile_settings: CompileSettings | None = None
    compile_skipped: str | None = None  # why compile=True was not applied
    notes: tuple[str, ...] = field(default_factory=tuple)
    autocast: bool = False  # FlowModel.set_autocast: 16-bit autocast, LoRA matmuls in bf16
    text_padding: str = "mask"  # FlowModel.set_text_padding (digenrl/models/text_padding.py)

    def to_dict(self) -> dict[str, object]:
        return {
            "attention": self.attention.to_dict(),
            "compiled": self.compiled,
            "compiled_regions": self.compiled_regions,
            "compile_settings": None if self.compile_settings is None else asdict(self.compile_settings),
            "compile_skipped": self.compile_skipped,
            "notes": list(self.notes),
            "autocast": self.autocast,
            "text_padding": self.text_padding,
        }


def repeated_blocks(transformer: nn.Module) -> list[nn.Module]:
    """The transformer's repeated blocks: diffusers' ``_repeated_blocks`` classes, else its
    ``_no_split_modules`` classes (SD3 declares only the latter)."""
    names = set(getattr(transformer, "_repeated_blocks", None) or ()) or set(
        getattr(transformer, "_no_split_modules", None) or ()
    )
    return [m for m in transformer.modules() if m is not transformer and type(m).__name__ in names]


def _is_fsdp_sharded(module: nn.Module) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return False
    return any(isinstance(m, FSDPModule) for m in module.modules())


def _raise_recompile_limit() -> None:
    import torch._dynamo

    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):  # renamed in torch 2.6; older name kept as alias
        if hasattr(config, name) and getattr(config, name) < RECOMPILE_LIMIT:
            setattr(config, name, RECOMPILE_LIMIT)
            return


def _compile_kwargs(settings: CompileSettings) -> dict[str, object]:
    _raise_recompile_limit()
    kwargs = {"backend": settings.backend, "dynamic": settings.dynamic, "fullgraph": settings.fullgraph}
    if settings.backend == "inductor":
        kwargs["mode"] = settings.mode
    return kwargs


def compile_flow_model(flow_model: FlowModel, settings: CompileSettings | None = None) -> int:
    """``nn.Module.compile`` the transformer's repeated blocks (or the whole transformer); returns how many
    modules were compiled. Compilation itself happens lazily at the first forward of each shape."""
    settings = settings or CompileSettings()
    kwargs = _compile_kwargs(settings)
    transformer = flow_model.transformer
    blocks = repeated_blocks(transformer) if settings.regional and settings.mode != "reduce-overhead" else []
    if blocks:
        for block in blocks:
            block.compile(**kwargs)
        return len(blocks)
    transformer.compile(**kwargs)
    return 1


def compile_vae_decoder(decoder: LatentDecoder, settings: CompileSettings | None = None) -> bool:
    """``model.compile_vae``: ``nn.Module.compile`` the VAE's decoder network (diffusers' ``vae.decoder``,
    what ``vae.decode`` runs after its post-quant conv), so the score phase's decode runs inductor's fused
    kernels instead of eager convolutions, norms and activations one launch at a time. Returns whether a
    decoder network was found and compiled. Compilation happens at the first decode of each shape (the
    rollout's decode batches: one or two shapes); the pixels agree with the eager decode up to float
    rounding."""
    network = getattr(decoder.vae, "decoder", None)
    if not isinstance(network, nn.Module):
        return False
    network.compile(**_compile_kwargs(settings or CompileSettings()))
    return True


def optimize_flow_model(
    flow_model: FlowModel,
    *,
    compile: bool,
    attention_backend: str,
    needs_backward: bool = False,
    compile_settings: CompileSettings | None = None,
    autocast: bool = False,
    compute_dtype: torch.dtype | None = None,
    cudnn_sdpa: str = "auto",
    text_padding: str = "mask",
) -> AppliedOptimizations:
    """Apply the safe attention backend and, if ``compile``, ``torch.compile`` to ``flow_model`` in place.

    ``needs_backward``: the model will be trained in this process (the attention choice then avoids
    backends whose backward is known to fail). With ``compile=False`` and the default ``native`` backend
    the forward is unchanged bit for bit. Compile is skipped (with the reason) when the transformer is
    already FSDP2-sharded: torchtitan compiles blocks *before* ``fully_shard``, and the trainer here shards
    first. ``compute_dtype``: the dtype autocast computes in when the parameters are not in it (fp32 master
    shards of FSDP2 full fine-tuning); default the model's own. ``text_padding``: ``model.text_padding``
    (:meth:`FlowModel.set_text_padding`; the default ``mask`` leaves the forward as built).
    """
    choice = select_attention_backend(
        attention_backend,
        needs_backward=needs_backward,
        device=flow_model.device,
        shape=AttentionShape.of(flow_model),
        cudnn_sdpa=cudnn_sdpa,
    )
    apply_attention_backend(flow_model, choice.backend)
    flow_model.set_autocast(autocast, compute_dtype)
    flow_model.set_text_padding(text_padding)
    if not compile:
        return AppliedOptimizations(
            attention=choice, compiled=False, autocast=autocast, text_padding=text_padding
        )
    settings = compile_settings or CompileSettings()
    if _is_fsdp_sharded(flow_model.transformer):
        reason = "the transformer is FSDP2-sharded already (compile blocks before fully_shard)"
        log.warning("model.compile=true ignored: %s", reason)
        return AppliedOptimizations(
            attention=choice,
            compiled=False,
            compile_skipped=reason,
            autocast=autocast,
            text_padding=text_padding,
        )
    notes = []
    if settings.mode == "reduce-overhead" and settings.regional:
        notes.append("reduce-overhead (CUDA graphs) compiles the whole transformer, not its blocks")
    regions = compile_flow_model(flow_model, settings)
    log.info(
        "torch.compile applied to %d region(s) of %s (mode=%s, dynamic=%s)",
        regions,
        type(flow_model.transformer).__name__,
        settings.mode,
        settings.dynamic,
    )
    return AppliedOptimizations(
        attention=choice,
        compiled=True,
        compiled_regions=regions,
        compile_settings=settings,
        notes=tuple(notes),
        autocast=autocast,
        text_padding=text_padding,
    )
