"""Evaluation on held-out prompts: the one code path every system runs (docs/operations.md, "Reading a run").

An evaluation samples one image per prompt of the first ``eval.num_prompts`` prompts of
``data.eval_prompts`` with the policy the trainer holds now (or its EMA, ``eval.use_ema``), scores every
reward term and hands the writer rank the metrics (``eval_*`` fields of ``metrics.jsonl``) and the pictures
(the captioned grid in ``out_dir/samples/``).

* Fixed noise: the initial latent (and, with ``eval.sde``, every step's noise) is keyed by the run seed,
  a constant evaluation key and the prompt's index in the evaluation set (:mod:`digenrl.rollout.noise`),
  never by the iteration, so every evaluation of a run draws the same noise and two evaluations of the
  same weights give the same numbers, however the prompts are split over ranks.
* Sampling: ``eval.num_steps`` steps (the model's evaluation default, FlowGRPO's: docs/algorithm.md,
  "Rollout settings"), the deterministic ODE (``noise_level`` 0) unless ``eval.sde``; every other sampler
  setting (shift, guidance) is the training sampler's. It runs through the rollout engine every system
  generates with, so evaluation samples what a rollout of the same policy samples.
* Where: on the ranks that hold the trainer's weights — every rank of a colocated system, the trainer pool
  of a disaggregated one — each on a contiguous share of the prompts, padded to equal sizes (an equal
  number of forwards, so a sharded trainer's collective forwards line up); the results are gathered on the
  group's first rank (global rank 0, which writes the metrics). Why there: docs/operations.md, "Reading a
  run". The rewards are computed by an :data:`EvalScoring`: the rank's own reward, or, with scorer ranks
  (``pools.scorers``), the scorer pool, so the reward model lives on the scorer ranks only
  (:meth:`digenrl.rollout.remote_scoring.ScorerPool.evaluation_scoring`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from digenrl.config import Config, ConfigError, EvalConfig
from digenrl.data.seeding import mix_seed
from digenrl.data.trajectory import TrajectoryBatch
from digenrl.models.bundle import ModelBundle
from digenrl.rollout.engine import RolloutEngine
from digenrl.rollout.sampler import Sampler
from digenrl.rollout.scoring import Scorer

#: Key of the evaluation's noise stream (mixed with the run seed): disjoint from every training draw.
EVAL_NOISE_KEY = 0xE7A1
#: Frames of a video sample kept for its row of the grid (evenly spaced, first and last included).
GRID_FRAMES = 4

#: How an evaluating rank scores one rollout call: ``(batch, the evaluation's iteration, the call's index
#: over all evaluating ranks) -> (pixels in [0, 1] on the CPU, {"reward": …, <term>: …} each [B] float32)``,
#: as :meth:`digenrl.rollout.scoring.Scorer.score_terms` returns them.
EvalScoring = Callable[[TrajectoryBatch, int, int], tuple[torch.Tensor, dict[str, torch.Tensor]]]


def local_scoring(scorer: Scorer) -> EvalScoring:
    """Score on this rank, with its decoder and reward."""
    return lambda batch, iteration, call: scorer.score_terms(batch.final_latents, list(batch.prompts))


def rollout_calls(cfg: EvalConfig, ranks: int) -> int:
    """Rollout calls per evaluating rank of one evaluation, the same on every rank (shares are padded to
    equal sizes, then cut in calls of ``eval.batch_size``): what a scorer rank counts on."""
    per_rank = math.ceil(cfg.num_prompts / ranks)
    return math.ceil(per_rank / (cfg.batch_size or per_rank))


class EvalPhases(Protocol):
    """Per-chunk phases of an evaluation (digenrl/systems/residency.py ``EvaluationPhases`` is one)."""

    def generation(self) -> AbstractContextManager[None]: ...

    def scoring(self) -> AbstractContextManager[None]: ...


@dataclass
class EvalResult:
    """One evaluation as the writer rank sees it (other ranks get None from :meth:`Evaluator.run`)."""

    iteration: int  # the metrics record it belongs to
    policy_version: int  # the policy evaluated: θ_v, the weights after v iterations' updates
    metrics: dict[str, float]  # the ``eval_*`` fields
    prompts: list[str]
    rewards: list[float]  # the configured reward of each sample, in prompt order
    images: torch.Tensor  # uint8 [N, 3, H, W], or [N, frames, 3, H, W] for a video model


def eval_schedule(cfg: Config, iteration: int, *, final: bool) -> bool:
    """Whether an evaluation runs at the start of ``iteration`` (``final=False``: it evaluates θ_iteration) or
    after it (``final=True``: θ_N after the last iteration). Starts: iteration 0 and every ``eval.every``-th,
    except the last iteration's start, whose record holds the final evaluation instead (with one iteration,
    only the final one runs); ``eval.every=0``: never."""
    every, last = cfg.eval.every, cfg.iterations - 1
    if not every:
        return False
    if final:
        return iteration == last
    return iteration % every == 0 and iteration != last


def evaluated_prompts(cfg: EvalConfig, eval_prompts: tuple[str, ...], source: str) -> list[str]:
    """The first ``eval.num_prompts`` prompts of the evaluation set, or a ConfigError naming both keys."""
    if cfg.num_prompts > len(eval_prompts):
        raise ConfigError(
            f"eval.num_prompts={cfg.num_prompts} but data.eval_prompts={source!r} holds {len(eval_prompts)} "
            "prompt(s); lower eval.num_prompts or give a larger prompt set"
        )
    return list(eval_prompts[: cfg.num_prompts])


def eval_sampler(cfg: Config, bundle: ModelBundle, latent_tokens: int) -> Sampler:
    """The training sampler's settings with ``eval.num_steps`` steps (default: the model's evaluation steps)
    and, unless ``eval.sde``, noise level 0: the deterministic ODE (docs/algorithm.md, "Flow-SDE step with
    log-probability")."""
    steps = cfg.eval.num_steps or bundle.spec.default_eval_num_steps
    resolved = dataclasses.replace(cfg, sampler=dataclasses.replace(cfg.sampler, num_steps=steps))
    sampler = Sampler.from_config(resolved, bundle.spec, latent_tokens)
    return sampler if cfg.eval.sde else dataclasses.replace(sampler, noise_level=0.0)


class Evaluator:
    """Runs evaluations on one evaluating rank (see the module docstring); build it with :meth:`build`."""

    def __init__(
        self,
        cfg: EvalConfig,
        prompts: list[str],
        engine: RolloutEngine,
        scoring: EvalScoring,
        *,
        group: dist.ProcessGroup | None = None,
        scored_on: str = "",
    ):
        self.cfg = cfg
        self.prompts = prompts
        self.engine = engine
        self.scoring = scoring
        self.scored_on = scored_on  # where the rewards are computed, for describe(); "" = on these ranks
        self.group = group
        distributed = dist.is_available() and dist.is_initialized()
        self.ranks = dist.get_world_size(group) if distributed else 1
        self.rank = dist.get_rank(group) if distributed else 0
        # an equal number of samples on every rank (sharded forwards are collective): the last ranks' shares
        # are padded with repeats of the last prompt, whose results are dropped
        per_rank = math.ceil(len(prompts) / self.ranks)
        share = range(self.rank * per_rank, (self.rank + 1) * per_rank)
        self.mine = [i for i in share if i < len(prompts)]
        self.padding = per_rank - len(self.mine)

    @classmethod
    def build(
        cls,
        cfg: Config,
        bundle: ModelBundle,
        latent_shape: tuple[int, ...],
        latent_tokens: int,
        scoring: EvalScoring,
        eval_prompts: tuple[str, ...],
        *,
        device: torch.device,
        group: dist.ProcessGroup | None = None,
        scored_on: str = "",
    ) -> Evaluator:
        sampler = eval_sampler(cfg, bundle, latent_tokens)
        # one sample per prompt; "first" with one trained step: every step takes the sampler's noise level (0
        # unless eval.sde) and the engine keeps its smallest record buffers (an evaluation trains nothing)
        engine = RolloutEngine(
            bundle.flow_model,
            bundle.text_encoder,
            sampler,
            latent_shape=latent_shape,
            group_size=1,
            seed=mix_seed(cfg.seed, EVAL_NOISE_KEY),
            timestep_fraction=1 / sampler.num_steps,
            timestep_selection="first",
            fast_window=1,
            device=device,
        )
        prompts = evaluated_prompts(cfg.eval, eval_prompts, cfg.data.eval_prompts)
        return cls(cfg.eval, prompts, engine, scoring, group=group, scored_on=scored_on)

    @property
    def num_steps(self) -> int:
        return self.engine.sampler.num_steps

    def describe(self) -> str:
        sampling = "SDE" if self.cfg.sde else "ODE"
        weights = "EMA weights" if self.cfg.use_ema else "trained weights"
        return (
            f"eval at iteration 0, every {self.cfg.every} and the final policy: {len(self.prompts)} held-out "
            f"prompt(s), {self.num_steps} {sampling} steps, fixed noise, {weights}, {self.ranks} rank(s)"
            + (f", scored on {self.scored_on}" if self.scored_on else "")
        )

    def _batches(self) -> Iterator[list[int]]:
        """This rank's share in rollout calls of ``eval.batch_size``, padding included."""
        padded = self.mine + [len(self.prompts) - 1] * self.padding
        size = self.cfg.batch_size or len(padded)
        for start in range(0, len(padded), size):
            yield padded[start : start + size]

    @torch.no_grad()
    def run(
        self,
        iteration: int,
        policy_version: int,
        weights: AbstractContextManager | None = None,
        phases: EvalPhases | None = None,
    ) -> EvalResult | None:
        """Evaluate the policy the engine's model holds now (inside ``weights``, e.g. the trainer's
        ``ema_weights()``; ``phases``: what brings the rollout and the reward onto the device for each
        chunk: a colocated system's residency). Collective over the evaluating ranks; the group's first rank
        gets the result."""
        start = time.perf_counter()
        rewards: list[float] = []
        terms: dict[str, list[float]] = {}
        images: list[torch.Tensor] = []
        calls = rollout_calls(self.cfg, self.ranks)
        with weights if weights is not None else nullcontext():
            for call, ids in enumerate(self._batches()):
                text = [self.prompts[i] for i in ids]
                with phases.generation() if phases is not None else nullcontext():
                    batch = self.engine.generate(text, ids, iteration=0, policy_version=policy_version)
                with phases.scoring() if phases is not None else nullcontext():
                    pixels, scores = self.scoring(batch, iteration, self.rank * calls + call)
                real = max(0, min(len(ids), len(self.mine) - len(rewards)))  # padding comes last
                rewards.extend(scores["reward"][:real].tolist())
                for name, values in scores.items():
                    terms.setdefault(name, []).extend(values[:real].tolist())
                images.append(grid_pixels(pixels[:real]))
        local = (rewards, terms, torch.cat(images) if images else torch.zeros(0, dtype=torch.uint8))
        parts = self._gather(local)
        if parts is None:
            return None
        rewards = [r for part in parts for r in part[0]]
        names = list(parts[0][1])
        all_terms = {name: [v for part in parts for v in part[1][name]] for name in names}
        metrics = {
            "eval_policy_version": policy_version,
            "eval_samples": len(rewards),
            "eval_num_steps": self.num_steps,
            "eval_ema": bool(self.cfg.use_ema),
            "eval_reward_mean": _mean(rewards),
            "eval_reward_std": _std(rewards),
            **{
                f"eval_reward_{name}": _mean(values) for name, values in all_terms.items() if name != "reward"
            },
            "eval_s": time.perf_counter() - start,
        }
        return EvalResult(
            iteration=iteration,
            policy_version=policy_version,
            metrics=metrics,
            prompts=list(self.prompts),
            rewards=rewards,
            images=torch.cat([part[2] for part in parts]),
        )

    def _gather(self, local: tuple) -> list[tuple] | None:
        """Every rank's (rewards, terms, images) on the group's first rank, in rank (= prompt) order."""
        if self.ranks == 1:
            return [local]
        parts: list[tuple] | None = [None] * self.ranks if self.rank == 0 else None  # type: ignore[list-item]
        dst = dist.get_global_rank(self.group, 0) if self.group is not None else 0
        dist.gather_object(local, parts, dst=dst, group=self.group)
        return parts


def grid_pixels(pixels: torch.Tensor) -> torch.Tensor:
    """Decoded pixels in [0, 1] → uint8 for the grid: images ``[B, 3, H, W]``, videos ``[B, 3, F, H, W]`` →
    ``[B, GRID_FRAMES, 3, H, W]`` (evenly spaced frames). Non-finite pixels show black."""
    pixels = torch.nan_to_num(pixels.float(), nan=0.0, posinf=1.0, neginf=0.0)
    if pixels.ndim == 5:
        frames = pixels.shape[2]
        keep = torch.linspace(0, frames - 1, min(GRID_FRAMES, frames)).round().long()
        pixels = pixels[:, :, keep].transpose(1, 2)
    return (pixels.clamp(0, 1) * 255).round().to(torch.uint8)


def _mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite and len(finite) == len(values) else math.nan


def _std(values: list[float]) -> float:
    mean = _mean(values)
    if not math.isfinite(mean):
        return math.nan
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
