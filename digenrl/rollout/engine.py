"""The generator engine: batched group rollout that records FlowGRPO trajectories.

All G samples of a prompt — and as many prompts as ``sampler.samples_per_forward`` allows — go
through one transformer forward per denoising step (batching a group is worth ~4x on an H200,
docs/design.md §1; verl-omni measured +62% for B = N over B = 1, docs/references.md [003]). Every random
draw is keyed by the sample's identity (:mod:`digenrl.rollout.noise`), so the trajectory of a sample
does not depend on how the engine batches it.

A rollout can also run in pieces (docs/design.md §3 (TSP)): :meth:`RolloutEngine.start` draws x_T and decides
the trained steps, :meth:`RolloutEngine.advance` runs a range of steps on the in-flight batch — on any
rank, since the noise of step i is keyed by (sample seed, i) — and ``generate = advance(start(...), T)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from digenrl.algo.sde_step import check_sigma_pairs, dpm_solver_2m_step
from digenrl.algo.timesteps import MixWindow, sde_step_mask, select_train_steps
from digenrl.config import AlgoConfig
from digenrl.data.device_index import index_on
from digenrl.data.seeding import mix_seed
from digenrl.data.text_condition import TextCondition
from digenrl.data.trajectory import TrajectoryBatch
from digenrl.models.flow_model import FlowModel
from digenrl.models.text import TextEncoder
from digenrl.rollout.noise import (
    FORWARD_NOISE_STEP,
    INITIAL_NOISE_STEP,
    sample_generator,
    sample_seed,
    step_noise,
)
from digenrl.rollout.sampler import Sampler
from digenrl.runtime.reproducibility.batch_ledger import BatchLedger, sample_keys

_TRAIN_STEP_PURPOSE = 1


class RolloutEngine:
    """Generates trajectories for whole prompt groups with the policy currently in ``model``."""

    def __init__(
        self,
        model: FlowModel,
        text_encoder: TextEncoder,
        sampler: Sampler,
        *,
        latent_shape: tuple[int, ...],
        group_size: int,
        seed: int,
        timestep_fraction: float,
        timestep_selection: str,
        fast_window: int,
        samples_per_forward: int = 0,
        device: torch.device | str = "cpu",
        mix_window: MixWindow | None = None,
        ode_solver: str = "euler",
        forward_process: bool = False,
    ):
        """``mix_window``: MixGRPO's sliding SDE window (replaces ``timestep_selection``); ``ode_solver``
        ``dpm2``: DPM-Solver++(2M) on the ODE steps (after MixGRPO's window: MixGRPO-Flash; every step of a
        DiffusionNFT rollout). ``forward_process`` (DiffusionNFT): every step is an ODE step and a trained
        step k records the unit (x_σk = (1 − σ_k)·x0 + σ_k·ε_k, x0) of the clean latent x0 instead of a
        transition, with ε_k keyed by (sample seed, ``FORWARD_NOISE_STEP`` + k); no log-probability."""
        if ode_solver not in ("euler", "dpm2"):
            raise ValueError(f"ode_solver must be 'euler' or 'dpm2', got {ode_solver!r}")
        if ode_solver == "dpm2" and mix_window is None and not forward_process:
            raise ValueError("ode_solver='dpm2' needs a mix_window (MixGRPO-Flash) or forward_process")
        if forward_process and mix_window is not None:
            raise ValueError("forward_process (DiffusionNFT) and mix_window (MixGRPO) exclude each other")
        self.forward_process = forward_process
        self.model = model
        self.text_encoder = text_encoder
        self.sampler = sampler
        self.latent_shape = tuple(latent_shape)
        self.group_size = group_size
        self.seed = seed
        self.timestep_fraction = timestep_fraction
        self.timestep_selection = timestep_selection
        self.fast_window = fast_window
        self.samples_per_forward = samples_per_forward
        self.device = torch.device(device)
        self.ledger: BatchLedger | None = None  # runtime.record_batches: the forwards' batches
        self.mix_window = mix_window
        self.ode_solver = ode_solver

    @staticmethod
    def algo_settings(algo: AlgoConfig) -> dict[str, Any]:
        """The constructor's keyword arguments that ``algo`` decides (which steps are trained and stochastic,
        the ODE solver), for every place that builds an engine from a config."""
        mix, nft = algo.name == "mixgrpo", algo.name == "diffusionnft"
        solver = algo.mix_ode_solver if mix else algo.nft_ode_solver if nft else "euler"
        return {
            "timestep_fraction": algo.timestep_fraction,
            # DiffusionNFT trains a random K of the grid's sigmas per sample (train_nft_sd3.py: `perms_time`)
            "timestep_selection": "shuffled" if nft else algo.timestep_selection,
            "fast_window": algo.fast_window,
            "mix_window": MixWindow.from_config(algo) if mix else None,
            "ode_solver": solver,
            "forward_process": nft,
        }

    @property
    def sde_mode(self) -> str:
        """How the trained steps decide the stochastic ones (:func:`digenrl.algo.timesteps.sde_step_mask`)."""
        if self.forward_process:
            return "diffusionnft"
        return "mixgrpo" if self.mix_window is not None else self.timestep_selection

    def uncond(self) -> TextCondition | None:
        """The empty-prompt condition for true CFG (cached by the encoder), else None. Every TSP stage
        computes it from its own text encoder, so it never travels with a batch."""
        return self.text_encoder.negative_condition(1) if self.sampler.true_cfg else None

    def _train_steps(self, iteration: int, seeds: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sample trained step indices [B, K] and the per-step SDE mask [T].

        ``shuffled`` (DanceGRPO) draws per sample; ``fast-window`` (FlowGRPO-Fast) draws one window
        per iteration, because the sampler must know which steps are stochastic for the whole batch.
        """
        t = self.sampler.num_steps
        mode = self.timestep_selection
        if self.mix_window is not None:  # MixGRPO: one window per iteration, for the whole batch
            generator = torch.Generator().manual_seed(mix_seed(self.seed, iteration, 0x3172))
            steps = self.mix_window.steps(t, iteration, generator)
            per_sample = steps.unsqueeze(0).expand(len(seeds), -1)
        elif mode == "fast-window":
            generator = torch.Generator().manual_seed(mix_seed(self.seed, iteration, 0xFA57))
            steps = select_train_steps(t, self.timestep_fraction, mode, generator, window=self.fast_window)
            per_sample = steps.unsqueeze(0).expand(len(seeds), -1)
        elif mode == "shuffled":
            per_sample = torch.stack(
                [
                    select_train_steps(
                        t, self.timestep_fraction, mode, sample_generator(s, _TRAIN_STEP_PURPOSE)
                    )
                    for s in seeds
                ]
            )
            steps = per_sample[0]
        else:
            steps = select_train_steps(t, self.timestep_fraction, mode)
            per_sample = steps.unsqueeze(0).expand(len(seeds), -1)
        mask = sde_step_mask(t, steps, mode=self.sde_mode)
        return per_sample.contiguous(), mask

    @torch.no_grad()
    def generate(
        self,
        prompts: list[str],
        prompt_ids: list[int],
        *,
        iteration: int,
        policy_version: int,
        on_step: Callable[[int], None] | None = None,
    ) -> TrajectoryBatch:
        """Roll out ``group_size`` samples for each prompt; ``prompt_ids`` are the prompts' indices in
        the iteration's logical batch (group ids), which — with the sample index — key every draw.

        Equals ``advance(start(...), num_steps)``: a rollout split into TSP stages reproduces it bit for
        bit."""
        batch = self.start(prompts, prompt_ids, iteration=iteration, policy_version=policy_version)
        return self._advance(batch, self.sampler.num_steps, on_step, in_place=True)

    def generate_rows(
        self,
        prompts: list[str],
        prompt_ids: list[int],
        rows: Sequence[int] | None,
        *,
        iteration: int,
        policy_version: int,
    ) -> TrajectoryBatch:
        """Roll out only ``rows`` of the groups' samples (row ``n * group_size + j`` = sample j of prompt n;
        ``None`` = all of them, i.e. :meth:`generate`): the groups are started and cut to those rows before
        any step runs. Every draw is keyed by its (group, sample index), so the rows are exactly the samples a
        whole-group rollout makes — how a GAP fragment, a TAG fragment or a rank's share smaller than a
        group is generated."""
        if rows is None:
            return self.generate(prompts, prompt_ids, iteration=iteration, policy_version=policy_version)
        batch = self.start(prompts, prompt_ids, iteration=iteration, policy_version=policy_version)
        return self.advance(batch.select(list(rows)), self.sampler.num_steps)

    @torch.no_grad()
    def start(
        self, prompts: list[str], prompt_ids: list[int], *, iteration: int, policy_version: int
    ) -> TrajectoryBatch:
        """A rollout that has run no step yet (``steps_done = 0``), the first stage of a TSP pipeline.

        ``final_latents`` holds the initial noise x_T; the trained steps are decided here, so that their
        sigmas are known and the ``latents`` / ``next_latents`` / ``log_probs`` buffers (zeros until the
        step that fills them has run) travel with the batch from stage to stage.
        """
        if len(prompts) != len(prompt_ids):
            raise ValueError("prompts and prompt_ids must have the same length")
        g = self.group_size
        seeds = [sample_seed(self.seed, iteration, pid, j) for pid in prompt_ids for j in range(g)]
        b = len(seeds)
        cond = self.text_encoder.encode(prompts).repeat_interleave(g).to(self.device)
        train_steps, _ = self._train_steps(iteration, seeds)
        sigmas = self.sampler.sigmas.to(self.device)
        idx = train_steps.to(self.device)
        k = idx.shape[1]
        x = step_noise(seeds, INITIAL_NOISE_STEP, self.latent_shape, device=self.device)
        return TrajectoryBatch(
            prompts=[p for p in prompts for _ in range(g)],
            prompt_ids=torch.tensor([pid for pid in prompt_ids for _ in range(g)], dtype=torch.long),
            sample_ids=torch.arange(g).repeat(len(prompt_ids)),
            seeds=torch.tensor(seeds, dtype=torch.long),
            cond=cond,
            latents=x.new_zeros(b, k, *self.latent_shape),
            next_latents=x.new_zeros(b, k, *self.latent_shape),
            log_probs=torch.zeros(b, k, dtype=torch.float32, device=self.device),
            step_indices=train_steps.clone(),
            sigmas=sigmas[idx].reshape(b, k),
            next_sigmas=sigmas[idx + 1].reshape(b, k),
            policy_version=torch.full((b,), policy_version, dtype=torch.long),
            iteration=iteration,
            final_latents=x,
            steps_done=0,
        )

    @torch.no_grad()
    def advance(
        self,
        batch: TrajectoryBatch,
        until_step: int,
        *,
        on_step: Callable[[int], None] | None = None,
    ) -> TrajectoryBatch:
        """``batch`` after denoising steps ``[batch.steps_done, until_step)`` (a new batch; the input is
        left untouched, so a fragment kept for a resend or a test stays valid).

        Each trained transition the range passes is recorded (x before and after, behaviour log-prob).
        Everything a step needs comes from the batch (seeds, cond, trained steps) or from this engine's
        config (sigmas, SDE mask, the unconditional condition from its own text encoder), and the noise
        of step i is keyed by (sample seed, i): a TSP stage on another rank, with its own engine, draws
        exactly what a single-rank rollout would.
        """
        return self._advance(batch, until_step, on_step, in_place=False)

    def _forward_units(
        self,
        clean: torch.Tensor,
        seeds: list[int],
        train_steps: torch.Tensor,
        sigmas: torch.Tensor,
        latents: torch.Tensor,
        next_latents: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """DiffusionNFT's units of a finished rollout: ``latents[b, k]`` = x_σ = (1 − σ)·x0 + σ·ε at step
        ``train_steps[b, k]``, ``next_latents[b, k]`` = x0 (digenrl/algo/nft.py)."""
        for k in range(train_steps.shape[1]):
            for step in train_steps[:, k].unique().tolist():
                rows = (train_steps[:, k] == step).nonzero(as_tuple=True)[0]
                eps = step_noise(
                    [seeds[r] for r in rows.tolist()],
                    FORWARD_NOISE_STEP + step,
                    self.latent_shape,
                    device=self.device,
                )
                rows = index_on(rows, self.device)
                sigma = sigmas[step]
                latents[rows, k] = (1 - sigma) * clean[rows] + sigma * eps
                next_latents[rows, k] = clean[rows]
        return latents, next_latents

    def _advance(
        self,
        batch: TrajectoryBatch,
        until_step: int,
        on_step: Callable[[int], None] | None,
        *,
        in_place: bool,
    ) -> TrajectoryBatch:
        """``in_place`` writes the trained transitions into ``batch``'s own buffers (``generate``'s fresh
        batch) instead of copies."""
        t = self.sampler.num_steps
        first = batch.steps_done
        if isinstance(until_step, bool) or not isinstance(until_step, int) or not first <= until_step <= t:
            raise ValueError(
                f"until_step must be an int in [steps_done={first}, num_steps={t}], got {until_step!r}"
            )
        if batch.final_latents is None:
            raise ValueError("batch.final_latents is None: advance() needs the current latent x")
        buffers = (batch.latents, batch.next_latents, batch.log_probs)
        latents, next_latents, log_probs = (buf.to(self.device) for buf in buffers)
        if not in_place:
            latents, next_latents, log_probs = latents.clone(), next_latents.clone(), log_probs.clone()
        x = batch.final_latents.to(self.device)
        seeds = batch.seeds.tolist()
        b = len(seeds)
        cond = batch.cond.to(self.device).with_lengths()  # host text lengths: one read a batch, not a step
        uncond = self.uncond()
        train_steps = batch.step_indices.cpu()
        sde_mask = sde_step_mask(t, batch.step_indices[0].cpu(), mode=self.sde_mode) if b else None
        sigmas = self.sampler.sigmas.to(self.device)
        # the steps' sigma pairs, checked once on the host grid instead of read back from the device each step
        check_sigma_pairs(
            self.sampler.sigmas[first:until_step], self.sampler.sigmas[first + 1 : until_step + 1]
        )
        chunk = self.samples_per_forward or b
        if self.ledger is not None and first < until_step:
            keys = sample_keys(batch.prompt_ids.tolist(), batch.sample_ids.tolist())
            for start in range(0, b, chunk):
                rows = keys[start : start + chunk]
                self.ledger.record("rollout", batch.iteration, "samples", rows, steps=[first, until_step])
        # MixGRPO-Flash: DPM-Solver++(2M) on the ODE steps after the window, from the previous step's x̂0
        # (kept within this call: validation refuses a TSP split of a Flash rollout)
        flash_from = t
        if self.ode_solver == "dpm2" and b:
            flash_from = 0 if self.forward_process else int(train_steps[0].max()) + 1
        prev_x0: torch.Tensor | None = None
        grid = self.sampler.sigmas.tolist()
        for i in range(first, until_step):
            noise = step_noise(seeds, i, self.latent_shape, device=self.device)
            nxt = torch.empty_like(x)
            x0_pred = torch.empty_like(x) if self.ode_solver == "dpm2" else None
            step_log_prob = torch.empty(b, dtype=torch.float32, device=self.device)
            for start in range(0, b, chunk):
                sl = slice(start, min(start + chunk, b))
                n = sl.stop - sl.start
                sigma = sigmas[i].expand(n)
                v = self.sampler.velocity(self.model, x[sl], sigma, cond[sl], uncond)
                res = self.sampler.transition(
                    v,
                    x[sl],
                    sigma,
                    sigmas[i + 1].expand(n),
                    noise=noise[sl],
                    stochastic=bool(sde_mask[i]),
                    sigmas_checked=True,
                )
                nxt[sl] = res.prev_sample
                step_log_prob[sl] = res.log_prob
                if self.ode_solver == "dpm2":  # python floats from the host grid: no device read
                    prev = None if prev_x0 is None or i < flash_from else prev_x0[sl]
                    flash_x, x0_pred[sl] = dpm_solver_2m_step(
                        v, x[sl], grid[i], grid[i + 1], prev_x0=prev, prev_sigma=grid[i - 1] if i else None
                    )
                    if i >= flash_from:
                        nxt[sl] = flash_x
            rows, cols = torch.nonzero(train_steps == i, as_tuple=True)  # on CPU: no device sync
            if rows.numel() and not self.forward_process:
                rows, cols = index_on(rows, self.device), index_on(cols, self.device)  # queued, no host sync
                latents[rows, cols] = x[rows]
                next_latents[rows, cols] = nxt[rows]
                log_probs[rows, cols] = step_log_prob[rows]
            x = nxt
            prev_x0 = x0_pred
            if on_step is not None:
                on_step(i)
        if self.forward_process and until_step == t and b:
            latents, next_latents = self._forward_units(x, seeds, train_steps, sigmas, latents, next_latents)
        return replace(
            batch,
            latents=latents,
            next_latents=next_latents,
            log_probs=log_probs,
            final_latents=x,
            steps_done=until_step,
        )
