"""Ulysses sequence parallelism of one transformer over a group of ranks, through diffusers' own context
parallelism (``ContextParallelConfig(ulysses_degree=N)``, diffusers models/_modeling_parallel.py and
hooks/context_parallel.py).

DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv 2309.14509): each of the N ranks of a group holds 1/N of the
token sequence. Before attention an all-to-all turns the sequence shards of Q, K and V into head shards
(every rank then holds the whole sequence for H/N heads), attention runs locally, and an all-to-all of the
output turns head shards back into sequence shards: four all-to-alls of an activation-sized tensor per
attention layer in the forward, four more in the backward (diffusers ``TemplatedUlyssesAttention``).
Everything else in a block (projections, norms, MLP) is token-wise and runs on the local shard. What is
split and where is the model's diffusers ``_cp_plan``: for Wan, the rotary tables and the hidden states at
``blocks.0`` are split along the sequence and ``proj_out``'s output is gathered, so the velocity leaves the
transformer whole on every rank of the group.

Gradients. Each rank's parameter gradients are the contribution of its own tokens only; their sum over
the group is the full gradient (the gather's backward hands each rank its slice). The trainer reduces
gradients with SUM over all trainer ranks and counts each sample once per group
(:mod:`digenrl.trainer.parallel`, "Gradient semantics"), so the group acts as one data-parallel member
with no other change.

Why not ``ModelMixin.enable_parallelism``: it builds the device as ``rank % torch.accelerator.device_count()``
(a division by zero on a CPU-only gloo run) and a mesh over the whole world (a pool is a subset of it).
:func:`enable_sequence_parallel` makes the same three moves on a mesh of the group's ranks: the config set
up on that mesh, handed to every attention processor, and ``apply_context_parallel`` with the model's plan.
Every process group it uses is made beforehand on every rank (``dist.new_group`` is a collective over the
world): :func:`digenrl.runtime.comm.sequence_groups.build_sequence_groups`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from digenrl.models.spec_types import ModelSpec

if TYPE_CHECKING:
    from digenrl.models.flow_model import FlowModel


def context_parallel_plan(transformer_class: str) -> dict[str, Any] | None:
    """The diffusers ``_cp_plan`` of a transformer class (None: diffusers cannot shard its sequence)."""
    import diffusers

    return getattr(getattr(diffusers, transformer_class), "_cp_plan", None)


def _splits_text(plan: dict[str, Any]) -> bool:
    return any("encoder_hidden_states" in entry for entry in plan.values() if isinstance(entry, dict))


def sequence_parallel_problem(spec: ModelSpec, degree: int, tokens: int, key: str) -> str | None:
    """Why ``key=degree`` cannot shard ``spec``'s sequence of ``tokens`` image/video tokens, or None.

    The degree must divide the attention heads (each rank attends over H/N heads) and the token count
    (equal shards; diffusers' ``EquipartitionSharder``), and the transformer needs a diffusers
    context-parallel plan (diffusers 0.42: Wan, FLUX, Qwen-Image among the zoo; not SD3, not HunyuanVideo).
    """
    if degree == 1:
        return None
    plan = context_parallel_plan(spec.transformer_class)
    if not plan:
        return (
            f"{key}={degree}: {spec.name}'s {spec.transformer_class} has no diffusers context-parallel plan "
            "(_cp_plan), so its sequence cannot be sharded; sequence parallelism covers wan* (and the other "
            f"transformers diffusers plans); set {key}=1"
        )
    heads = int(spec.transformer_config["num_attention_heads"])
    if heads % degree:
        fits = [n for n in range(1, heads + 1) if heads % n == 0]
        return f"{key}={degree} does not divide {spec.name}'s {heads} attention heads; choose one of {fits}"
    if tokens % degree:
        return (
            f"{key}={degree} does not divide the {tokens} tokens of {spec.name} at this resolution "
            "(model.height / model.width / model.frames); change the degree or the resolution"
        )
    text = spec.text_encoder.seq_len
    if _splits_text(plan) and text % degree:
        return f"{key}={degree} does not divide {spec.name}'s {text} text tokens, which its plan shards too"
    return None


def enable_sequence_parallel(flow_model: FlowModel, group: Any, single_rank_group: Any) -> None:
    """Shard ``flow_model``'s token sequence over the ranks of ``group`` (Ulysses; module doc), in place.

    ``single_rank_group``: a group holding this rank alone, the mesh's size-1 ``ring`` dimension
    (``dist.new_group`` is a collective over the world, so the caller creates both groups on every rank:
    :func:`digenrl.runtime.comm.sequence_groups.build_sequence_groups`). Call after the attention backend
    is set (the backend must support context parallelism: ``native``, flash, sage, cuDNN). Every rank of the
    group must then run every forward and backward of the transformer together, on the same inputs.
    """
    from diffusers.hooks.context_parallel import apply_context_parallel
    from diffusers.models._modeling_parallel import ContextParallelConfig, ParallelConfig
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry
    from torch.distributed.device_mesh import DeviceMesh

    transformer = flow_model.transformer
    plan = context_parallel_plan(type(transformer).__name__)
    if not plan:
        raise ValueError(f"{type(transformer).__name__} has no diffusers context-parallel plan (_cp_plan)")
    if getattr(transformer, "_parallel_config", None) is not None:
        raise RuntimeError(f"sequence parallelism is already enabled on {type(transformer).__name__}")
    ranks = dist.get_process_group_ranks(group)
    device = flow_model.device
    mesh = DeviceMesh.from_group(
        [single_rank_group, group],
        device.type,
        mesh=torch.tensor([ranks]),
        mesh_dim_names=("ring", "ulysses"),
    )
    # diffusers' setup flattens ("ring", "ulysses"), and DeviceMesh._flatten would make a new process group:
    # a collective only this group's ranks reach while every other group's ranks make theirs, so the groups'
    # rendezvous cross-wire (seen with two groups on gloo). The flattened mesh is the sequence group itself:
    # registered first, _flatten returns it (torch DeviceMesh._create_flatten_mesh).
    mesh._flatten_mapping["ring_ulysses"] = DeviceMesh.from_group(
        group, device.type, mesh_dim_names=("ring_ulysses",)
    )
    cp = ContextParallelConfig(ulysses_degree=len(ranks), mesh=mesh)
    config = ParallelConfig(context_parallel_config=cp)
    config.setup(dist.get_rank(), dist.get_world_size(), device, mesh=mesh)
    processors = [
        module.processor
        for module in transformer.modules()
        if getattr(module, "processor", None) is not None and hasattr(module.processor, "_parallel_config")
    ]
    for processor in processors:
        backend = processor._attention_backend
        backend = _AttentionBackendRegistry.get_active_backend()[0] if backend is None else backend
        if not _AttentionBackendRegistry._is_context_parallel_available(AttentionBackendName(backend)):
            raise ValueError(
                f"model.attention_backend={AttentionBackendName(backend).value!r} cannot run sequence "
                f"parallelism; choose one of {sorted(_AttentionBackendRegistry._supports_context_parallel)}"
            )
        processor._parallel_config = config
    transformer._parallel_config = config
    apply_context_parallel(transformer, cp, plan)
    # the plan shards the text tokens too (Qwen-Image): their count must stay the padded length the
    # degree was checked against, so model.text_padding=split falls back to the padded, masked text here
    flow_model.set_text_padding("mask")
