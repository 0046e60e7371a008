"""Build the pieces one rank needs (model, sampler, rollout engine, scorer, trainer, logs) from a Config.

Every system builds its parts here, so a baseline and DigenRL run the same model code, the same
sampler, the same reward and the same trainer; only the schedule around them differs.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from digenrl.config import Config
from digenrl.data.dtypes import TORCH_DTYPES
from digenrl.data.prompts import PromptSource, configured_prompt_sets, metadata_lookup
from digenrl.models import ModelBundle, build_model_bundle
from digenrl.models.optimize import CompileSettings, compile_vae_decoder, optimize_flow_model
from digenrl.rewards.registry import build_configured_reward
from digenrl.rollout.engine import RolloutEngine
from digenrl.rollout.evaluate import Evaluator, local_scoring
from digenrl.rollout.remote_scoring import ScorerPool
from digenrl.rollout.sampler import Sampler
from digenrl.rollout.scoring import Scorer
from digenrl.runtime.comm.distributed import DistContext
from digenrl.runtime.comm.sequence_groups import SequenceGroups
from digenrl.runtime.comm.shard_groups import ShardGroups
from digenrl.runtime.observe.events import EventLogger
from digenrl.runtime.observe.metrics import MetricsWriter, open_tensorboard, open_wandb
from digenrl.runtime.reproducibility.batch_ledger import BatchLedger
from digenrl.trainer.lora import prepare_generator_model
from digenrl.trainer.run_dir import RunStart
from digenrl.trainer.trainer import PolicyTrainer

log = logging.getLogger(__name__)


def resolve_resolution(cfg: Config, bundle: ModelBundle) -> tuple[int, int, int | None]:
    spec = bundle.spec
    frames = cfg.model.frames or (spec.default_frames if spec.is_video else None)
    return cfg.model.height or spec.default_height, cfg.model.width or spec.default_width, frames


@dataclass
class RankComponents:
    """What one rank holds. ``trainer`` is None on a pure generator rank, ``engine`` on a pure trainer."""

    cfg: Config
    ctx: DistContext
    bundle: ModelBundle
    sampler: Sampler
    latent_shape: tuple[int, ...]
    prompts: PromptSource
    engine: RolloutEngine | None
    scorer: Scorer | None
    trainer: PolicyTrainer | None
    events: EventLogger
    metrics: MetricsWriter
    evaluator: Evaluator | None = None  # on the ranks holding the trainer's weights when eval.every > 0
    #: ``colocated-engine``: the rollout's own copy of the policy (the engine generates with it)
    generation_model: torch.nn.Module | None = None


def build_rank_components(
    cfg: Config,
    ctx: DistContext,
    *,
    role: str,
    generate: bool,
    train: bool,
    clock_origin: float,
    run: RunStart,
    process_group: torch.distributed.ProcessGroup | None = None,
    score: bool | None = None,
    generation_copy: bool = False,
    shard_groups: ShardGroups | None = None,
    scorer_pool: ScorerPool | None = None,
    sequence: SequenceGroups | None = None,
) -> RankComponents:
    """Build this rank's parts. The same seed gives every rank the same initial weights, so the
    policy is identical everywhere before the first update (checked by the weight checksum tests).


    ``score``: whether this rank decodes and scores (default: when it generates). A scorer rank of a
    separate layout scores without generating or training: its transformer and text encoder are built
    on the ``meta`` device (shapes only, no memory), only the VAE and the reward model are real.

    ``run``: how the run starts in out_dir — a resumed run appends to its event logs and cuts
    ``metrics.jsonl`` back to its checkpoint's iteration (digenrl/trainer/run_dir.py).

    With ``eval.every > 0`` every training rank also gets an :class:`Evaluator`: evaluation runs where the
    trainer's weights are, over ``process_group`` (digenrl/rollout/evaluate.py), and scores with this rank's
    own reward, or, given the run's ``scorer_pool`` (``pools.scorers``), on the scorer ranks: the training
    ranks then build no reward model at all.

    ``generation_copy`` (``colocated-engine``, with ``generate`` and ``train``): the engine generates with its
    own copy of the policy, built as a generator rank builds its model (the trainer's adapter, frozen,
    optimised once) from a copy of the base weights taken before the trainer wraps them; the system copies
    the trainer's weights into it before every rollout (digenrl/systems/colocated_engine.py).

    ``shard_groups``: a training rank's HSDP groups under ``trainer.sharding=hybrid``
    (:meth:`digenrl.systems.base.System.trainer_shard_groups`, which every rank calls).
    """
    evaluate = train and cfg.eval.every > 0
    score = generate if score is None else score
    score = score or (evaluate and scorer_pool is None)
    bundle = build_model_bundle(
        cfg.model.name,
        pretrained_path=cfg.model.pretrained_path,
        dtype=TORCH_DTYPES[cfg.model.dtype],
        device=ctx.device,
        generation_device=None if generate or train else torch.device("meta"),
        seed=cfg.seed,
    )
    height, width, frames = resolve_resolution(cfg, bundle)
    latent_shape = bundle.flow_model.latent_shape(height, width, frames)
    latent_tokens = bundle.flow_model.token_count(height, width, frames)
    sampler = Sampler.from_config(cfg, bundle.spec, latent_tokens)
    if generation_copy and not (generate and train):
        raise ValueError("generation_copy: a rank that both generates and trains (colocated-engine)")
    # the base weights, untouched by the trainer's adapter, wrapper and compile below
    generation_model = copy.deepcopy(bundle.flow_model) if generation_copy else None

    trainer = None
    compile_, autocast = cfg.model.optimised(ctx.device.type)
    if generate and not train:
        # a generator rank of a separate system: the trainer's adapter first, as PolicyTrainer applies it
        # before the model is optimised below, so both ranks build the same module in the same order
        prepare_generator_model(bundle.flow_model, cfg)
    if train:
        uncond = bundle.text_encoder.negative_condition(1) if sampler.true_cfg else None
        # the trainer optimises the model once (attention backend, autocast in its compute dtype, compile)
        trainer = PolicyTrainer(
            cfg,
            bundle.flow_model,
            sampler,
            uncond=uncond,
            device=ctx.device,
            process_group=process_group,
            world_size=torch.distributed.get_world_size(process_group) if ctx.is_distributed else 1,
            compile=compile_,
            shard_groups=shard_groups,
        )
    if generation_model is not None:
        # the adapter's initial draws must not move the run's random stream (the trainer drew its own above
        # and the first re-shard overwrites these), so a colocated-engine run draws what colocated-sync draws
        with torch.random.fork_rng(devices=[]):
            prepare_generator_model(generation_model, cfg)
    if generate and (generation_model is not None or not train):
        # model.attention_backend / model.compile (digenrl/models/optimize.py), on the model the engine runs
        # (a generator rank's, or colocated-engine's generation copy). needs_backward on generating
        # ranks too: the rollout must run the kernels the trainer's forward runs, so its log-probs are the
        # trainer's (on-policy ratio 1) and a generator rank generates what a colocated rank does. On one
        # H200 a generator rank that kept cuDNN's SDPA forward (which the trainer's choice disables) gave
        # ratio 0.999984 and other trajectories from iteration 0 (experiments/results/gpu/shared/).
        optimize_flow_model(
            bundle.flow_model if generation_model is None else generation_model,
            compile=compile_,
            attention_backend=cfg.model.attention_backend,
            needs_backward=True,
            compile_settings=CompileSettings(mode=cfg.model.compile_mode),
            autocast=autocast,
            cudnn_sdpa=cfg.model.cudnn_sdpa,
            text_padding=cfg.model.text_padding,
        )
    if sequence is not None:
        from digenrl.models.sequence_parallel import enable_sequence_parallel

        if generation_model is not None:
            raise ValueError("sequence parallelism with a separate generation copy (colocated-engine)")
        enable_sequence_parallel(bundle.flow_model, sequence.sequence_group, sequence.single_rank_group)
    engine = scorer = None
    prompt_sets = configured_prompt_sets(cfg.data)
    if score:
        reward = build_configured_reward(
            cfg.reward.name,
            cfg.reward.weights,
            cfg.reward.weights_path,
            device=ctx.device,
            remote=cfg.reward.remote_settings(),
        )
        if cfg.model.compile_vae:
            compile_vae_decoder(bundle.decoder)
        # decoded in the rollout's forward batches: two schedules that generate in the same batches then
        # decode (and score) the same shapes too (docs/operations.md, "Reproducible runs")
        scorer = Scorer(
            bundle.decoder,
            reward,
            cfg.reward.nonfinite_policy,
            decode_batch=cfg.sampler.samples_per_forward,
            metadata=metadata_lookup(prompt_sets),
        )
    if generate:
        engine = RolloutEngine(
            bundle.flow_model if generation_model is None else generation_model,
            bundle.text_encoder,
            sampler,
            latent_shape=latent_shape,
            group_size=cfg.algo.group_size,
            seed=cfg.seed,
            **RolloutEngine.algo_settings(cfg.algo),
            samples_per_forward=cfg.sampler.samples_per_forward,
            device=ctx.device,
        )
    out = Path(cfg.out_dir)
    events = EventLogger(
        out,
        ctx.rank,
        role,
        clock_origin,
        append=run.resumed,
        run_id=run.run_id,
        start_iteration=run.start_iteration,
    )
    writer = ctx.rank == 0
    metrics = MetricsWriter(
        out,
        is_writer=writer,
        start_iteration=run.start_iteration,
        run_id=run.run_id,
        tensorboard=open_tensorboard(out, run.start_iteration) if writer else None,
        wandb=open_wandb(cfg.logger, out, run.run_id, cfg.to_dict()) if writer else None,
    )
    if cfg.runtime.record_batches:  # which samples each batched computation ran on (batch_ledger.py)
        ledger = BatchLedger(out, ctx.rank, append=run.resumed)
        for part in (engine, scorer, trainer):
            if part is not None:
                part.ledger = ledger
    evaluator = None
    if evaluate:
        remote = scorer_pool is not None
        evaluator = Evaluator.build(
            cfg,
            bundle,
            latent_shape,
            latent_tokens,
            scorer_pool.evaluation_scoring(bundle.decoder) if remote else local_scoring(scorer),
            prompt_sets["data.eval_prompts"].prompts,
            device=ctx.device,
            group=process_group if sequence is None else sequence.data_group,
            scored_on=f"scorer rank(s) {list(scorer_pool.scorer_ranks)}" if remote else "",
        )
    return RankComponents(
        cfg=cfg,
        ctx=ctx,
        bundle=bundle,
        sampler=sampler,
        latent_shape=latent_shape,
        prompts=PromptSource(prompt_sets["data.prompts"].prompts, cfg.seed),
        engine=engine,
        scorer=scorer,
        trainer=trainer,
        events=events,
        metrics=metrics,
        evaluator=evaluator,
        generation_model=generation_model,
    )
