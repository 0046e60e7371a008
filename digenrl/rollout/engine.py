"""The generator engine: batched group rollout that records FlowGRPO trajectories.

All G samples of a prompt — and as many prompts as ``sampler.samples_per_forward`` allows — go
through one transformer forward per denoising step (batching a group is worth ~4x on an H200,
DESIGN.md §1; verl-omni measured +62% for B = N over B = 1, references/003). Every random draw is
keyed by the sample's identity (:mod:`digenrl.rollout.noise`), so the trajectory of a sample does not
depend on how the engine batches it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from digenrl.algo.timesteps import sde_step_mask, select_train_steps
from digenrl.models.flow_model import FlowModel
from digenrl.models.text import TextCondition, TextEncoder
from digenrl.rollout.noise import INITIAL_NOISE_STEP, mix_seed, sample_generator, sample_seed, step_noise
from digenrl.rollout.sampler import Sampler
from digenrl.rollout.trajectory import TrajectoryBatch

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
    ):
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

    def uncond(self) -> TextCondition | None:
        """The empty-prompt condition for true CFG (cached by the encoder), else None."""
        return self.text_encoder.negative_condition(1) if self.sampler.true_cfg else None

    def _train_steps(self, iteration: int, seeds: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sample trained step indices [B, K] and the per-step SDE mask [T].

        ``shuffled`` (DanceGRPO) draws per sample; ``fast-window`` (FlowGRPO-Fast) draws one window
        per iteration, because the sampler must know which steps are stochastic for the whole batch.
        """
        t = self.sampler.num_steps
        mode = self.timestep_selection
        if mode == "fast-window":
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
        mask = sde_step_mask(t, steps, mode=mode)
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
        the iteration's logical batch (group ids), which — with the sample index — key every draw."""
        if len(prompts) != len(prompt_ids):
            raise ValueError("prompts and prompt_ids must have the same length")
        g = self.group_size
        seeds = [sample_seed(self.seed, iteration, pid, j) for pid in prompt_ids for j in range(g)]
        b = len(seeds)
        sample_prompts = [p for p in prompts for _ in range(g)]
        cond = self.text_encoder.encode(prompts).repeat_interleave(g).to(self.device)
        uncond = self.uncond()
        seeds_t = torch.tensor(seeds, dtype=torch.long)
        train_steps, sde_mask = self._train_steps(iteration, seeds)

        sigmas = self.sampler.sigmas.to(self.device)
        x = step_noise(seeds, INITIAL_NOISE_STEP, self.latent_shape, device=self.device)
        visited = [x]
        log_probs = torch.zeros(b, self.sampler.num_steps, dtype=torch.float32, device=self.device)
        chunk = self.samples_per_forward or b
        for i in range(self.sampler.num_steps):
            noise = step_noise(seeds, i, self.latent_shape, device=self.device)
            nxt = torch.empty_like(x)
            for start in range(0, b, chunk):
                sl = slice(start, min(start + chunk, b))
                n = sl.stop - sl.start
                sigma = sigmas[i].expand(n)
                v = self.sampler.velocity(
                    self.model, x[sl], sigma, cond.index_select(torch.arange(sl.start, sl.stop)), uncond
                )
                res = self.sampler.transition(
                    v, x[sl], sigma, sigmas[i + 1].expand(n), noise=noise[sl], stochastic=bool(sde_mask[i])
                )
                nxt[sl] = res.prev_sample
                log_probs[sl, i] = res.log_prob
            x = nxt
            visited.append(x)
            if on_step is not None:
                on_step(i)

        trajectory = torch.stack(visited, dim=1)  # [B, T+1, *latent]
        idx = train_steps.to(self.device)
        gather_idx = idx.view(b, -1, *([1] * len(self.latent_shape))).expand(-1, -1, *self.latent_shape)
        k = idx.shape[1]
        return TrajectoryBatch(
            prompts=sample_prompts,
            prompt_ids=torch.tensor([pid for pid in prompt_ids for _ in range(g)], dtype=torch.long),
            sample_ids=torch.arange(g).repeat(len(prompt_ids)),
            seeds=seeds_t,
            cond=cond,
            latents=torch.gather(trajectory, 1, gather_idx),
            next_latents=torch.gather(trajectory, 1, gather_idx + 1),
            log_probs=torch.gather(log_probs, 1, idx),
            step_indices=train_steps.clone(),
            sigmas=sigmas[idx].reshape(b, k),
            next_sigmas=sigmas[idx + 1].reshape(b, k),
            policy_version=torch.full((b,), policy_version, dtype=torch.long),
            iteration=iteration,
            final_latents=x,
        )
