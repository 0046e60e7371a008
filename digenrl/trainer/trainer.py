"""The FlowGRPO policy update: recompute each trained transition's log-prob under θ, PPO-clip loss,
optional KL to the adapter-disabled reference, gradient accumulation, one optimizer step per batch.

Exactness of accumulation (GAP relies on it, docs/design.md §3). The objective of one optimizer step is the
mean per-unit loss over the N units (sample, trained timestep) of the logical batch:
``L = (1/N) Σ_u loss_u``. :meth:`PolicyTrainer.accumulate` backpropagates ``unit_weight · Σ_{u∈mb} loss_u``
for every micro-batch mb, with ``unit_weight = 1/N`` supplied by the caller (N counted over *all* ranks
and fragments). Gradients add, so after all micro-batches of all fragments on all ranks, and a cross-rank
**sum** (see :mod:`digenrl.trainer.parallel`), the gradient is ∇L exactly (up to float summation order),
whatever the micro-batch size, the fragment cut or the number of trainer ranks. flow_grpo instead means
over each micro-batch and divides by the accumulation count (scripts/train_sd3.py); that equals ∇L only
when all micro-batches have equal size, which GAP fragments and uneven rank shares do not guarantee.

Loss per unit (docs/algorithm.md "Loss"; flow_grpo scripts/train_sd3.py): ``max(−A·r, −A·clip(r, 1±ε))`` with
``r = exp(logp_θ − logp_old)``, plus ``β · mean((μ_θ − μ_ref)² / (2σ_t²))`` when ``algo.kl_beta > 0``.
GRPO-Guard (docs/algorithm.md, "GRPO-Guard"): ``algo.ratio_norm`` clips the normalised ratio
``exp((log r + mean((μ_θ − μ_old)²)/(2s²))·s)`` instead, μ_old recomputed from the rollout's keyed noise;
``algo.step_reweight`` divides each unit's policy loss by −dt.

With classifier-free guidance the training forward applies the rollout's guidance, and ``algo.cfg_grad``
chooses the gradient (:mod:`digenrl.rollout.sampler`): ``cond`` (default) detaches the unconditional
prediction, w·∂v_c, as yifan123/flow_grpo_refactor's ``compute_log_prob`` does; ``both`` is the full gradient
(1 − w)·∂v_u + w·∂v_c, as yifan123/flow_grpo's scripts/train_sd3.py and DanceGRPO's train_grpo_sd35.py
compute it. With ``cond``, micro-batches of at least ``CFG_SPLIT_MIN_BATCH`` units run the unconditional
branch as a separate no-graph pass, so backward and saved activations cover B samples, not 2B.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from digenrl.algo.loss import (
    KL_STD_ERROR,
    PolicyLossTerms,
    clipped_policy_loss,
    kl_to_reference,
    ratio_norm_terms,
)
from digenrl.algo.nft import nft_loss, velocity_kl
from digenrl.algo.sde_step import check_sigma_pairs
from digenrl.config import Config
from digenrl.data.device_index import index_on
from digenrl.data.micro_batches import plan_micro_batches
from digenrl.models.fp8 import apply_fp8
from digenrl.models.optimize import CompileSettings, optimize_flow_model
from digenrl.rollout.noise import step_noise
from digenrl.runtime.reproducibility.batch_ledger import BatchLedger
from digenrl.trainer.checkpoint import TRAINER_FILE, load_sharded
from digenrl.trainer.checkpoint_files import CheckpointError
from digenrl.trainer.ema import TrainerEMA
from digenrl.trainer.lora import apply_lora, enable_full_finetune, reference_policy
from digenrl.trainer.optim import build_optimizer
from digenrl.trainer.parallel import ParallelBackend, wrap_for_training

if TYPE_CHECKING:
    from digenrl.data.text_condition import TextCondition
    from digenrl.data.trajectory import TrajectoryBatch
    from digenrl.rollout.sampler import Sampler
    from digenrl.runtime.comm.shard_groups import ShardGroups


@dataclass
class _MicroBatch:
    """The tensors of one micro-batch of units, on the training device."""

    latents: torch.Tensor
    next_latents: torch.Tensor
    sigmas: torch.Tensor
    next_sigmas: torch.Tensor
    log_probs: torch.Tensor
    advantages: torch.Tensor
    cond: TextCondition
    seeds: torch.Tensor  # [n] int64 sample seed of each unit (GRPO-Guard regenerates the step's noise)
    step_indices: torch.Tensor  # [n] int64 denoising step of each unit

    @property
    def size(self) -> int:
        return int(self.log_probs.shape[0])

    def first(self) -> _MicroBatch:
        """A one-unit copy (template for the zero-weight padding micro-batches of lockstep backends)."""
        return _MicroBatch(
            latents=self.latents[:1].clone(),
            next_latents=self.next_latents[:1].clone(),
            sigmas=self.sigmas[:1].clone(),
            next_sigmas=self.next_sigmas[:1].clone(),
            log_probs=self.log_probs[:1].clone(),
            advantages=self.advantages[:1].clone(),
            cond=self.cond.index_select([0]),
            seeds=self.seeds[:1].clone(),
            step_indices=self.step_indices[:1].clone(),
        )


def _gather_units(
    batch: TrajectoryBatch,
    units: list[tuple[int, int]],
    device: torch.device,
    cond: TextCondition | None = None,
) -> _MicroBatch:
    """``cond``: the batch's condition with its host lengths (:meth:`TextCondition.with_lengths`, read once
    per batch; default ``batch.cond``), so the micro-batch's rows carry theirs (the host index keeps them)."""
    cond = batch.cond if cond is None else cond
    host = torch.tensor(units, dtype=torch.long).reshape(-1, 2)  # [n, (b, k)]
    on_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def index(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(b, k) on ``t``'s device: one queued copy per device, never a blocking one (data/device_index)."""
        if t.device not in on_device:
            both = index_on(host, t.device)
            on_device[t.device] = (both[:, 0], both[:, 1])
        return on_device[t.device]

    def take(t: torch.Tensor) -> torch.Tensor:
        return t[index(t)].to(device, non_blocking=True)

    return _MicroBatch(
        latents=take(batch.latents),
        next_latents=take(batch.next_latents),
        sigmas=take(batch.sigmas),
        next_sigmas=take(batch.next_sigmas),
        log_probs=take(batch.log_probs),
        advantages=batch.advantages[index(batch.advantages)[0]].to(device, non_blocking=True),
        # the host index as well, so the rows keep their host text lengths (no read back of the mask)
        cond=cond.index_select(host[:, 0], device_index=index(cond.embeds)[0]).to(device),
        # left where the batch is (no host sync per micro-batch); only GRPO-Guard's RatioNorm reads them
        seeds=batch.seeds[index(batch.seeds)[0]],
        step_indices=batch.step_indices[index(batch.step_indices)],
    )


def _unit_keys(batch: TrajectoryBatch, units: list[tuple[int, int]]) -> list[list[int]]:
    """``[group id, index in group, step index]`` of each unit (the batch ledger's key of a unit)."""
    return [
        [int(batch.prompt_ids[b]), int(batch.sample_ids[b]), int(batch.step_indices[b, k])] for b, k in units
    ]


def _behaviour_mean(mb: _MicroBatch, std: torch.Tensor) -> torch.Tensor:
    """μ_old of every unit, x' − s·ε: the rollout drew x' = μ_old + s·ε with ε keyed by (sample seed, step)
    (digenrl/rollout/noise.py), so the behaviour mean needs no extra tensor on the wire. Draws are
    device-type specific, like the rollout's: the trainer must run on the generators' device type."""
    shape = tuple(mb.next_latents.shape[1:])
    noise = torch.empty_like(mb.next_latents, dtype=torch.float32)
    seeds, steps = mb.seeds.cpu(), mb.step_indices.cpu()
    for step in steps.unique().tolist():
        rows = (steps == step).nonzero(as_tuple=True)[0]
        noise[index_on(rows, noise.device)] = step_noise(seeds[rows], int(step), shape, device=noise.device)
    return mb.next_latents.float() - std * noise


class PolicyTrainer:
    """Owns the trainable policy (LoRA or full), its data-parallel wrapper and the optimizer.

    ``process_group`` is the group of trainer ranks (``None``: the default group if torch.distributed is
    initialised, else a single process); ``world_size`` must equal its size and is checked.
    ``exact_backend``: use ``trainer.backend`` as named even with one trainer process (backend benchmarks).
    ``steps`` counts optimizer steps (several per policy version with ``algo.num_updates_per_batch`` > 1;
    the version itself is owned by :class:`digenrl.runtime.comm.policy_version.PolicyVersion`).
    ``micro_batch_size``: this rank's micro-batch size when it differs from ``trainer.micro_batch_size``
    (None = that; ``colocated.split=speed`` sets it per rank, :mod:`digenrl.data.rank_shares`).
    """

    micro_batch_size: int | None = None
    #: runtime.record_batches: the micro-batches, in the order their gradients accumulate
    ledger: BatchLedger | None = None

    def __init__(
        self,
        cfg: Config,
        flow_model: nn.Module,
        sampler: Sampler,
        *,
        uncond: TextCondition | None,
        device: torch.device | str,
        process_group: Any = None,
        world_size: int = 1,
        exact_backend: bool = False,
        compile: bool = False,
        shard_groups: ShardGroups | None = None,
    ) -> None:
        """``compile``: ``torch.compile`` the transformer too (a run's resolved ``model.compile``), in the
        one :func:`optimize_flow_model` call a training rank makes (attention backend, autocast in the
        compute dtype, compile), after the parallel wrapper. ``shard_groups``: this rank's HSDP groups, which
        ``trainer.sharding=hybrid`` needs (:func:`digenrl.runtime.comm.shard_groups.build_shard_groups`,
        created on every rank of the run)."""
        self.cfg = cfg
        self.flow_model = flow_model
        self.sampler = sampler
        self.device = torch.device(device)
        tcfg = cfg.trainer
        if cfg.algo.kl_beta > 0 and tcfg.mode != "lora":
            raise ValueError(
                "algo.kl_beta > 0 needs trainer.mode=lora (the reference is the adapter-disabled model)"
            )
        if tcfg.mode == "lora":
            apply_lora(flow_model, rank=tcfg.lora_rank, alpha=tcfg.lora_alpha, targets=tcfg.lora_targets)
            if cfg.model.fp8:  # the frozen base linears in FP8, before wrapping and compile (models/fp8.py)
                apply_fp8(flow_model)
        elif tcfg.mode == "full":
            enable_full_finetune(flow_model)
        else:
            raise ValueError(f"trainer.mode={tcfg.mode!r} is not allowed; choose one of: lora, full")
        if (tcfg.sharding == "hybrid") != (shard_groups is not None):
            raise ValueError(
                f"trainer.sharding={tcfg.sharding} but shard_groups were "
                f"{'not ' if shard_groups is None else ''}given: hybrid sharding needs build_shard_groups' "
                "groups (digenrl/runtime/comm/shard_groups.py), flat sharding none"
            )
        compute_dtype = flow_model.dtype  # before FSDP2 full fine-tuning turns the weights into fp32 masters
        self.backend: ParallelBackend = wrap_for_training(
            flow_model,
            tcfg.backend,
            process_group=process_group,
            device=self.device,
            mode=tcfg.mode,
            deepspeed_stage=tcfg.deepspeed_stage,
            grad_clip=tcfg.grad_clip,
            activation_checkpointing=tcfg.activation_checkpointing,
            exact_backend=exact_backend,
            shard_groups=shard_groups,
        )
        # Never train through an attention backend known to fail in backward (falls back with a logged
        # reason; may turn cuDNN SDPA off): digenrl/models/attention_safety.py
        self.optimizations = optimize_flow_model(
            flow_model,
            compile=compile,
            attention_backend=cfg.model.attention_backend,
            needs_backward=True,
            compile_settings=CompileSettings(mode=cfg.model.compile_mode),
            autocast=cfg.model.optimised(torch.device(device).type)[1],
            compute_dtype=compute_dtype,
            cudnn_sdpa=cfg.model.cudnn_sdpa,
            text_padding=cfg.model.text_padding,
        )
        if self.checkpoint_format == "sharded" and self.backend.name == "deepspeed":
            raise ValueError("trainer.checkpoint_format=sharded needs trainer.backend=fsdp2, not deepspeed")
        if self.backend.world_size != world_size:
            raise ValueError(
                f"world_size={world_size} but the trainer process group has {self.backend.world_size} ranks"
            )
        self.optimizer = self.backend.attach_optimizer(
            build_optimizer(self.backend.trainable_parameters(), tcfg)
        )
        # trainer.ema_decay > 0: an EMA of the trainable weights, laid out like them (digenrl/trainer/ema.py)
        self.ema = TrainerEMA(self.backend, tcfg.ema_decay) if tcfg.ema_decay > 0 else None
        self.uncond = uncond.to(self.device) if uncond is not None else None
        self.steps = 0
        self._template: _MicroBatch | None = None

    # ------------------------------------------------------------------ forward / backward
    def unit_losses(self, mb: _MicroBatch) -> tuple[torch.Tensor, Any, torch.Tensor | None]:
        """Per-unit total loss [n] (with graph), the PolicyLossTerms, and the per-unit KL [n] or None.

        The reference forward runs without autograd, so it keeps the rollout's batched CFG layout; the
        training forward follows ``sampler.cfg_grad`` (:meth:`Sampler.velocity`). The micro-batch's sigma
        pairs must have been checked (:meth:`accumulate` checks its batch's once)."""
        if self.cfg.algo.name == "diffusionnft":
            return self._nft_unit_losses(mb)
        sampler, model = self.sampler, self.flow_model
        kl = None
        ref_mean = None
        if self.cfg.algo.kl_beta > 0:
            # reference first: its activations are freed before the training graph is built
            with torch.no_grad(), reference_policy(model):
                v_ref = sampler.velocity(model, mb.latents, mb.sigmas, mb.cond, self.uncond)
                ref_mean = sampler.transition(
                    v_ref,
                    mb.latents,
                    mb.sigmas,
                    mb.next_sigmas,
                    prev_sample=mb.next_latents,
                    sigmas_checked=True,
                ).mean
        v = sampler.velocity(model, mb.latents, mb.sigmas, mb.cond, self.uncond)
        # the batch's sigma pairs were checked once by accumulate(): no read of them per micro-batch
        res = sampler.transition(
            v, mb.latents, mb.sigmas, mb.next_sigmas, prev_sample=mb.next_latents, sigmas_checked=True
        )
        algo = self.cfg.algo
        bias = scale = None
        if algo.ratio_norm:  # GRPO-Guard's RatioNorm (digenrl.algo.loss.ratio_norm_terms)
            bias, scale = ratio_norm_terms(res.mean, _behaviour_mean(mb, res.std), res.std)
        terms = clipped_policy_loss(
            res.log_prob,
            mb.log_probs,
            mb.advantages,
            algo.clip_range,
            log_ratio_bias=bias,
            log_ratio_scale=scale,
        )
        total = terms.loss
        if algo.step_reweight:  # GRPO-Guard's gradient reweighting: 1 / (−dt) per unit
            total = total / (mb.sigmas - mb.next_sigmas).to(total)
        if ref_mean is not None:
            # flow_grpo divides by std_dev_t² (the σ_t of the SDE, StepResult.noise_scale), which is the
            # scale its β values (0.04 / 0.01) were tuned for; see digenrl.algo.loss.kl_to_reference.
            kl = kl_to_reference(res.mean, ref_mean, res.noise_scale, check_std=False)  # accumulate checked
            total = total + self.cfg.algo.kl_beta * kl
        return total, terms, kl

    def _transition_stds(self, batch: TrajectoryBatch) -> torch.Tensor:
        """σ_t (``StepResult.noise_scale``, the KL's std) of every transition of ``batch``, from the sampler's
        own step on zero inputs: checked once per batch instead of once per micro-batch."""
        sigmas = batch.sigmas.reshape(-1).float()
        zeros = torch.zeros(sigmas.shape[0], 1, device=sigmas.device)
        next_sigmas = batch.next_sigmas.reshape(-1).float()
        res = self.sampler.transition(
            zeros, zeros, sigmas, next_sigmas, prev_sample=zeros, sigmas_checked=True
        )
        return res.noise_scale

    def _nft_unit_losses(self, mb: _MicroBatch) -> tuple[torch.Tensor, PolicyLossTerms, torch.Tensor | None]:
        """DiffusionNFT's loss per unit (digenrl/algo/nft.py): a unit is (x_σ, σ, x0) with x_σ in ``latents``
        and x0 in ``next_latents``. v_old is the sampling policy's velocity: validation admits DiffusionNFT
        only on-policy with one optimizer step per batch, where the sampling weights are the current ones,
        so v_old is v_θ's own value, detached (the published code's `decay_type=0` soft update). The ratio
        statistics report 1: there is no likelihood ratio."""
        sampler, model, algo = self.sampler, self.flow_model, self.cfg.algo
        kl = v_ref = None
        if algo.kl_beta > 0:
            with torch.no_grad(), reference_policy(model):
                v_ref = sampler.velocity(model, mb.latents, mb.sigmas, mb.cond, self.uncond)
        v = sampler.velocity(model, mb.latents, mb.sigmas, mb.cond, self.uncond)
        nft = nft_loss(
            v,
            v.detach(),
            mb.latents,
            mb.next_latents,
            mb.sigmas,
            mb.advantages,
            beta=algo.nft_beta,
            adv_clip_max=algo.adv_clamp,
        )
        total = nft.loss
        if v_ref is not None:
            kl = velocity_kl(v, v_ref)
            total = total + algo.kl_beta * kl
        ones = torch.ones_like(nft.loss.detach())
        return total, PolicyLossTerms(loss=nft.loss, ratio=ones, clipped=ones.bool().logical_not()), kl

    def accumulate(self, batch: TrajectoryBatch, unit_weight: float) -> dict[str, float]:
        """Add ``unit_weight · ∇ Σ_units loss`` of ``batch``'s units to the pending gradient.

        ``unit_weight`` must be ``1 / (units of the logical batch summed over all trainer ranks)`` (see the
        module docstring). With a lockstep backend (FSDP2, ZeRO-2/3) this call is a collective: every trainer
        rank calls it once per fragment, possibly with a different number of units; ranks with fewer
        micro-batches run zero-weight copies of a unit so that all ranks run the same number.
        Returns sums for the caller to reduce: loss_sum, ratio_sum, ratio_min, ratio_max, clipped_count,
        kl_sum, units; and, over the units whose text lengths are known (a masked encoder's prompts), their
        count and the sums of their real text tokens and of its square (text_units, text_tokens_sum,
        text_tokens_sq_sum: what a forward with the padding cut computes, digenrl/costs/flops.py).
        """
        if not (unit_weight > 0 and math.isfinite(unit_weight)):
            raise ValueError(f"unit_weight must be a positive finite number, got {unit_weight!r}")
        if batch.advantages is None:
            raise ValueError("batch.advantages is None: compute advantages before training on a batch")
        micro_batch_size = self.micro_batch_size or self.cfg.trainer.micro_batch_size
        plan = plan_micro_batches(batch.batch_size, batch.num_train_steps, micro_batch_size)
        rounds = self.backend.max_over_ranks(len(plan)) if self.backend.lockstep else len(plan)
        # Sums stay on the device until the end: a host read per micro-batch would stall the queue.
        # float64 accumulators add the fp32 per-micro-batch sums exactly as Python floats would.
        acc = torch.zeros(5, dtype=torch.float64, device=self.device)  # loss, ratio, clipped, kl, units
        extremes = torch.full((2,), -math.inf, dtype=torch.float64, device=self.device)  # -min, max
        # host reads once per batch, not per micro-batch: the text lengths (model.text_padding) and the
        # transitions' sigma pairs (unit_losses skips the per-step check; DiffusionNFT trains no transitions)
        cond = batch.cond.with_lengths()
        if self.cfg.algo.name != "diffusionnft":
            check_sigma_pairs(batch.sigmas, batch.next_sigmas)
            if self.cfg.algo.kl_beta > 0 and not bool((self._transition_stds(batch) > 0).all()):
                raise ValueError(KL_STD_ERROR)
        for i in range(rounds):
            if i < len(plan):
                mb, weight = _gather_units(batch, plan[i], self.device, cond), unit_weight
                if self.ledger is not None:
                    self.ledger.record("train", batch.iteration, "units", _unit_keys(batch, plan[i]))
                self._template = mb.first()
            elif self._template is not None:
                mb, weight = self._template, 0.0
            else:
                raise RuntimeError(
                    f"trainer rank {self.backend.rank} has no training unit in its first fragment while "
                    "other ranks do; lockstep backends (fsdp2, deepspeed stage >= 2) need at least one unit "
                    "per rank in the first accumulate() call"
                )
            total, terms, kl = self.unit_losses(mb)
            self.backend.backward(total.sum() * weight)
            if weight == 0.0:
                continue
            ratio = terms.ratio.detach()
            zero = ratio.new_zeros(())
            acc += torch.stack(
                [
                    terms.loss.detach().sum(),
                    ratio.sum(),
                    terms.clipped.sum().to(ratio.dtype),
                    kl.detach().sum() if kl is not None else zero,
                    zero + mb.size,
                ]
            ).to(acc)
            extremes = torch.maximum(extremes, torch.stack([-ratio.min(), ratio.max()]).to(extremes))
        loss_sum, ratio_sum, clipped, kl_sum, units, neg_min, ratio_max = torch.cat([acc, extremes]).tolist()
        lengths = [cond.lengths[b] for part in plan for b, _ in part] if cond.lengths is not None else []
        return {
            "text_units": float(len(lengths)),
            "text_tokens_sum": float(sum(lengths)),
            "text_tokens_sq_sum": float(sum(n * n for n in lengths)),
            "loss_sum": loss_sum,
            "ratio_sum": ratio_sum,
            "ratio_min": -neg_min,
            "ratio_max": ratio_max,
            "clipped_count": clipped,
            "kl_sum": kl_sum,
            "units": units,
        }

    # ------------------------------------------------------------------ optimizer step
    def step(self, iteration: int | None = None) -> dict[str, float]:
        """Reduce, clip (trainer.grad_clip), AdamW step, zero the gradient; ``steps += 1``.

        ``grad_norm`` is the global norm before clipping; ``update_norm`` = ‖θ_{k+1} − θ_k‖₂ over all
        trainable parameters (global across shards).

        A non-finite update is never committed (``trainer.nonfinite``). The gradient norm is checked before
        the optimizer runs and the parameters after it (a finite gradient still overflows with a huge lr);
        both checks are reduced over the trainer ranks, so every rank decides alike. After a bad step the
        parameters are copied back from the flat copy the update norm needs anyway; with ``skip`` the
        optimizer state is too, from a copy taken before the step (its moments: twice the trainable
        parameters for AdamW — small for LoRA; for full fine-tuning ``stop`` takes no copy). ``stop`` raises
        FloatingPointError naming ``iteration`` and the quantity; ``skip`` returns ``nonfinite_skipped``
        = 1, ``update_norm`` = 0 and leaves ``steps`` (and the EMA) as they were.

        With ``trainer.ema_decay`` > 0 a committed step also updates the EMA (:attr:`ema`).
        """
        self.backend.finish_gradients()
        grad_norm = self.backend.clip_grad_norm(self.cfg.trainer.grad_clip)
        deepspeed = self.backend.name == "deepspeed"  # clips inside its own step: norm known only after it
        if not deepspeed and self._on_any_rank(not math.isfinite(grad_norm)):
            return self._reject(f"gradient norm ({grad_norm})", iteration, grad_norm)
        params = [self.backend.local_view(p).detach() for p in self.backend.trainable_parameters()]
        # One flat copy instead of a clone and a norm per tensor: a LoRA has ~10³ small tensors, and
        # per-tensor kernels made the update-norm bookkeeping slower than the AdamW step itself.
        before = torch.cat([p.reshape(-1) for p in params]) if params else None
        saved = self._optimizer_state_copy() if self.cfg.trainer.nonfinite == "skip" else None
        self.backend.optimizer_step(self.optimizer)
        if deepspeed:
            grad_norm = getattr(self.backend, "last_grad_norm", grad_norm)
        after = [torch.cat([p.reshape(-1) for p in params]) - before] if params else []
        update_sq = self.backend.global_sq_norm(after)
        del after
        if self._on_any_rank(not math.isfinite(update_sq)):
            what = f"parameters after the optimizer step ({self._first_nonfinite_parameter()})"
            _copy_flat_into(before, params)
            if saved is not None:
                self.optimizer.state.clear()
                self.optimizer.state.update(saved)
            return self._reject(what, iteration, grad_norm)
        del before, saved
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        if self.ema is not None:
            self.ema.update()
        return {
            "grad_norm": grad_norm,
            "update_norm": math.sqrt(update_sq),
            "lr": float(self.optimizer.param_groups[0]["lr"]),
            "optimizer_steps": float(self.steps),
            "nonfinite_skipped": 0.0,
        }

    def _on_any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any trainer rank (one tiny all-reduce with several ranks)."""
        return self.backend.max_over_ranks(int(flag)) > 0

    def _optimizer_state_copy(self) -> dict[Any, dict[str, Any]]:
        return {
            param: {
                key: value.clone() if isinstance(value, torch.Tensor) else value for key, value in st.items()
            }
            for param, st in self.optimizer.state.items()
        }

    def _first_nonfinite_parameter(self) -> str:
        for name, param in self.backend.named_trainable():
            if not bool(torch.isfinite(self.backend.local_view(param).detach()).all()):
                return f"first: {name}"
        return "in another trainer rank's shard"

    def _reject(self, what: str, iteration: int | None, grad_norm: float) -> dict[str, float]:
        """Drop the pending gradient; raise (``stop``) or report a skipped step (``skip``)."""
        self.optimizer.zero_grad(set_to_none=True)
        where = (
            f"iteration {iteration} (optimizer step {self.steps})"
            if iteration is not None
            else (f"optimizer step {self.steps}")
        )
        if self.cfg.trainer.nonfinite == "stop":
            raise FloatingPointError(
                f"non-finite {what} at {where}; the update was not applied and the last checkpoint is "
                "intact. Lower trainer.lr or check the reward, or set trainer.nonfinite=skip to drop such "
                "steps and go on"
            )
        return {
            "grad_norm": grad_norm,
            "update_norm": 0.0,
            "lr": float(self.optimizer.param_groups[0]["lr"]),
            "optimizer_steps": float(self.steps),
            "nonfinite_skipped": 1.0,
        }

    def zero_grad(self) -> None:
        """Drop a pending accumulation (e.g. an aborted iteration)."""
        self.optimizer.zero_grad(set_to_none=True)

    @contextmanager
    def ema_weights(self) -> Iterator[PolicyTrainer]:
        """Inside the block the policy's trainable weights are their EMA (``trainer.ema_decay``); leaving it
        puts the trained weights back bit for bit, whatever happens inside (gradients and optimizer state
        are not touched). No communication: under FSDP2 every rank swaps its own shards, so every trainer
        rank enters the block before a forward (a collective there anyway)."""
        if self.ema is None:
            raise ValueError("trainer.ema_decay=0: this run keeps no EMA of the weights to swap in")
        with self.ema.swapped_in():
            yield self

    # ------------------------------------------------------------------ state
    def trainable_state_dict(self, *, all_ranks: bool = False) -> dict[str, torch.Tensor]:
        """Full trainable tensors (the LoRA adapter in lora mode) on CPU, keyed by transformer parameter
        name. Collective under FSDP2; complete on the trainer group's first rank (on all with
        ``all_ranks``)."""
        return self.backend.gather_full_state(all_ranks=all_ranks)

    def load_trainable_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.backend.load_full_state(state)

    def state_dict(self) -> dict[str, Any]:
        """Trainable weights + optimizer state (full tensors, keyed by name) + the optimizer step count.
        Collective under FSDP2; complete on the trainer group's first rank, ``{}``-valued elsewhere.
        With an EMA, ``ema`` holds :meth:`TrainerEMA.full_state` (its weights keyed by name)."""
        state = {
            "model": self.trainable_state_dict(),
            "optimizer": self.backend.gather_optimizer_state(self.optimizer),
            "steps": self.steps,
            "mode": self.cfg.trainer.mode,
        }
        if self.ema is not None:
            state["ema"] = self.ema.full_state()
        return state

    @property
    def checkpoint_format(self) -> str:
        """``full`` or ``sharded`` (digenrl/trainer/checkpoint.py): ``trainer.checkpoint_format``, with
        ``auto`` = sharded for FSDP2 full fine-tuning, where gathering the state to one rank cannot scale."""
        fmt = self.cfg.trainer.checkpoint_format
        if fmt == "auto":
            return "sharded" if self.backend.name == "fsdp2" and self.cfg.trainer.mode == "full" else "full"
        return fmt

    def checkpoint_state(self) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """(the trainer's part of ``trainer.pt``, this rank's shards for ``trainer_dcp/`` or ``None``) in
        :attr:`checkpoint_format`. Collective under FSDP2. The sharded format gathers nothing: the shards
        are views of the DTensors this rank already holds."""
        if self.checkpoint_format == "full":
            return self.state_dict(), None
        small = {"steps": self.steps, "mode": self.cfg.trainer.mode, "format": "sharded"}
        if self.ema is not None:
            small["ema"] = self.ema.meta()  # its tensors are shards in trainer_dcp/, beside the weights'
        return small, self.sharded_state_dict()

    def sharded_state_dict(self) -> dict[str, Any]:
        """``{"model": …, "optimizer": …}`` as torch.distributed.checkpoint saves and loads it: this rank's
        shards (DTensors under FSDP2, plain tensors otherwise) keyed by parameter name, the same keys as
        :meth:`state_dict` (buffers, e.g. fixed positional embeddings, are rebuilt with the model, as in the
        full format). An optimizer that has not stepped yet gets its state created (zero-lr step). With an
        EMA, ``ema`` holds its tensors, sharded like the weights."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optimizer = get_state_dict(self.backend.module, self.optimizer, options=_dcp_options())
        trained = {name for name, _ in self.backend.named_trainable()}
        state = {"model": {k: v for k, v in model.items() if k in trained}, "optimizer": optimizer}
        if self.ema is not None:
            state["ema"] = self.ema.shards()
        return state

    def load_state_dict(self, state: dict[str, Any], *, checkpoint_dir: str | Path | None = None) -> None:
        """Full format: every trainer rank passes the full state (e.g. each loads the same checkpoint file).
        Sharded format (``state["format"] == "sharded"``): the tensors are read from ``checkpoint_dir``,
        each rank its own part of them, whatever layout wrote them (a collective over the trainer ranks)."""
        if state.get("mode", self.cfg.trainer.mode) != self.cfg.trainer.mode:
            raise ValueError(
                f"checkpoint was written with trainer.mode={state['mode']!r}, this run has "
                f"trainer.mode={self.cfg.trainer.mode!r}"
            )
        if ("ema" in state) != (self.ema is not None):
            holds = "holds" if "ema" in state else "holds no"
            raise ValueError(
                f"the checkpoint {holds} EMA of the weights, but this run has "
                f"trainer.ema_decay={self.cfg.trainer.ema_decay:g}"
            )
        if state.get("format", "full") == "sharded":
            self._load_sharded(checkpoint_dir)  # fills the EMA's shards in place too
        else:
            where = (
                f"{Path(checkpoint_dir) / TRAINER_FILE}" if checkpoint_dir is not None else "trainer state"
            )
            self._check_optimizer_state(state, where)
            try:
                self.backend.load_full_state(state["model"])
                self.backend.load_optimizer_state(self.optimizer, state["optimizer"])
            except CheckpointError:
                raise
            except (ValueError, KeyError, TypeError) as error:
                raise CheckpointError(f"{where}: {error}") from None
        if self.ema is not None:
            self.ema.load_state(state["ema"])
        self.steps = int(state["steps"])

    def _check_optimizer_state(self, state: dict[str, Any], where: str) -> None:
        """The full-format optimizer state fits this trainer before anything is loaded: an entry per trained
        parameter once the optimizer has stepped (an empty state would restart Adam's moments at zero and
        silently leave the run it resumes), each moment shaped like its parameter, no unknown names. A
        CheckpointError names the file and the field."""
        optimizer, steps = state.get("optimizer"), state.get("steps", 0)
        if not (
            isinstance(optimizer, dict)
            and isinstance(optimizer.get("state"), dict)
            and isinstance(optimizer.get("param_groups"), list)
        ):
            raise CheckpointError(
                f"{where}: 'trainer.optimizer' is not an optimizer state (state, param_groups)"
            )
        shapes = {name: self.backend.full_shape(p) for name, p in self.backend.named_trainable()}
        entries = optimizer["state"]
        missing = sorted(set(shapes) - set(entries))
        if missing and isinstance(steps, int) and steps > 0:
            raise CheckpointError(
                f"{where}: 'trainer.optimizer.state' has no entry for {len(missing)} of the {len(shapes)} "
                f"trained parameters (first: {missing[0]!r}) although 'trainer.steps' is {steps}; resuming "
                "would restart the optimizer's moments at zero and diverge from the run it continues"
            )
        for name, entry in entries.items():
            if name not in shapes:
                raise CheckpointError(
                    f"{where}: 'trainer.optimizer.state' holds {name!r}, which this trainer does not train"
                )
            if not isinstance(entry, dict):
                raise CheckpointError(f"{where}: 'trainer.optimizer.state[{name!r}]' is not a dict")
            for key, value in entry.items():
                if isinstance(value, torch.Tensor) and value.dim() and tuple(value.shape) != shapes[name]:
                    raise CheckpointError(
                        f"{where}: 'trainer.optimizer.state[{name!r}].{key}' has shape {tuple(value.shape)}, "
                        f"the parameter {shapes[name]}"
                    )

    def _load_sharded(self, checkpoint_dir: str | Path | None) -> None:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        if checkpoint_dir is None:
            raise ValueError(
                "a sharded trainer state needs checkpoint_dir, the directory holding trainer_dcp/"
            )
        if self.backend.name == "deepspeed":
            raise ValueError(
                f"{checkpoint_dir} holds a sharded checkpoint, which trainer.backend=deepspeed cannot load; "
                "resume with trainer.backend=fsdp2, or convert it with digenrl.trainer.checkpoint."
                "full_trainer_state"
            )
        template = self.sharded_state_dict()
        load_sharded(checkpoint_dir, template, group=self.backend.group)
        set_state_dict(
            self.backend.module,
            self.optimizer,
            model_state_dict=template["model"],
            optim_state_dict=template["optimizer"],
            options=_dcp_options(),
        )


def _dcp_options() -> Any:
    """Sharded state as each rank holds it (no full-tensor gather, no CPU copy); frozen parameters and
    buffers are part of the model, not of the trained state, hence not strict (DCP itself fails on a
    trained tensor the checkpoint lacks)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=False, cpu_offload=False, ignore_frozen_params=True, strict=False)


def _copy_flat_into(flat: torch.Tensor | None, tensors: list[torch.Tensor]) -> None:
    """Write consecutive slices of ``flat`` back into ``tensors`` (the inverse of ``torch.cat`` of them)."""
    offset = 0
    with torch.no_grad():
        for t in tensors:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()
