"""The record a rollout hands to the trainer.

A :class:`TrajectoryBatch` holds B trajectories and, for each, only what the policy update needs: the
latent before and after every *trained* transition, the log-probability the behaviour policy emitted
for it (``logp_old``), the sigmas of that transition, the prompt conditioning, and the identity of the
sample (prompt index within the iteration = group id, sample index, per-sample seed) and of the
policy version that produced it. Rewards and advantages are filled in after scoring.

Every field is a tensor with a leading batch dimension (or per-batch metadata), so a batch can be cut
into fragments, concatenated, moved between devices and shipped point-to-point without knowing what
model produced it.

Two further uses share the type. An *in-flight* rollout between TSP pipeline stages has
``steps_done < T``: ``final_latents`` is the current x, and the trained-transition buffers are filled up
to that step (:meth:`RolloutEngine.start` / :meth:`RolloutEngine.advance`). A *unit shard* for one
trainer rank holds one K = 1 row per (sample, trained step) (:meth:`TrajectoryBatch.select_units`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from digenrl.data.text_condition import TextCondition


@dataclass
class TrajectoryBatch:
    """B trajectories with K trained transitions each (shapes in the field comments)."""

    prompts: list[str]  # [B] prompt text (for reward models and error reports)
    prompt_ids: torch.Tensor  # [B] int64: prompt index within the iteration's logical batch = group id
    sample_ids: torch.Tensor  # [B] int64: index of the sample within its group
    seeds: torch.Tensor  # [B] int64: per-sample seed (see rollout.noise.sample_seed)
    cond: TextCondition  # [B] prompt conditioning the rollout used
    latents: torch.Tensor  # [B, K, *latent] x at the start of each trained transition
    next_latents: torch.Tensor  # [B, K, *latent] x after it (the sample whose log-prob is trained)
    log_probs: torch.Tensor  # [B, K] float32 behaviour log-prob of each trained transition
    step_indices: torch.Tensor  # [B, K] int64 denoising step index of each trained transition
    sigmas: torch.Tensor  # [B, K] float32 sigma at the start of the transition
    next_sigmas: torch.Tensor  # [B, K] float32 sigma at its end
    policy_version: torch.Tensor  # [B] int64 version of the policy that generated each sample
    iteration: int  # the training iteration this batch belongs to
    final_latents: torch.Tensor | None = None  # [B, *latent] clean latent (decoded for the reward)
    rewards: torch.Tensor | None = None  # [B] float32
    advantages: torch.Tensor | None = None  # [B] float32
    steps_done: int = 0  # denoising steps run: final_latents is x after them (generate() sets T)

    @property
    def batch_size(self) -> int:
        return len(self.prompts)

    @property
    def num_train_steps(self) -> int:
        return int(self.log_probs.shape[1])

    @property
    def num_units(self) -> int:
        """Training units: one per (sample, trained timestep)."""
        return self.batch_size * self.num_train_steps

    def _tensor_fields(self) -> list[str]:
        return [f.name for f in fields(self) if isinstance(getattr(self, f.name), torch.Tensor)]

    def select(self, index: torch.Tensor | list[int]) -> TrajectoryBatch:
        """The sub-batch of the given sample indices (order preserved)."""
        idx = torch.as_tensor(index, dtype=torch.long)
        updates = {
            name: getattr(self, name)[idx.to(getattr(self, name).device)] for name in self._tensor_fields()
        }
        return replace(
            self, prompts=[self.prompts[i] for i in idx.tolist()], cond=self.cond.index_select(idx), **updates
        )

    def select_units(
        self, sample_index: torch.Tensor | list[int], k_index: torch.Tensor | list[int]
    ) -> TrajectoryBatch:
        """One row per training unit ``(sample_index[u], k_index[u])``, each with K = 1.

        A unit row carries its sample's identity, conditioning, reward and advantage and the one trained
        transition, so any subset of units — e.g. a trainer rank's share of a fragment, cut by timestep
        (:mod:`digenrl.gap.unit_sharding`) — is again a TrajectoryBatch the trainer accepts unchanged.
        A sample listed at several steps appears in several rows (its conditioning is repeated).
        """
        b = torch.as_tensor(sample_index, dtype=torch.long).reshape(-1)
        k = torch.as_tensor(k_index, dtype=torch.long).reshape(-1)
        if b.shape != k.shape:
            raise ValueError(
                f"sample_index and k_index must have the same length, got {b.numel()} and {k.numel()}"
            )
        if b.numel() and not (int(b.min()) >= 0 and int(b.max()) < self.batch_size):
            raise ValueError(f"sample_index must lie in [0, {self.batch_size}), got {b.tolist()}")
        if k.numel() and not (int(k.min()) >= 0 and int(k.max()) < self.num_train_steps):
            raise ValueError(f"k_index must lie in [0, {self.num_train_steps}), got {k.tolist()}")
        per_unit = {"latents", "next_latents", "log_probs", "step_indices", "sigmas", "next_sigmas"}
        updates = {}
        for name in self._tensor_fields():
            t = getattr(self, name)
            bi = b.to(t.device)
            updates[name] = t[bi, k.to(t.device)].unsqueeze(1) if name in per_unit else t[bi]
        return replace(
            self, prompts=[self.prompts[i] for i in b.tolist()], cond=self.cond.index_select(b), **updates
        )

    def to(self, device: torch.device | str) -> TrajectoryBatch:
        updates = {name: getattr(self, name).to(device) for name in self._tensor_fields()}
        return replace(self, cond=self.cond.to(device), **updates)

    @classmethod
    def cat(cls, batches: list[TrajectoryBatch]) -> TrajectoryBatch:
        """Concatenate along the batch dimension; all parts must belong to one iteration."""
        if not batches:
            raise ValueError("TrajectoryBatch.cat needs at least one batch")
        iterations = {b.iteration for b in batches}
        if len(iterations) != 1:
            raise ValueError(f"cannot concatenate trajectories of different iterations {sorted(iterations)}")
        first = batches[0]
        merged: dict[str, object] = {}
        for f in fields(first):
            values = [getattr(b, f.name) for b in batches]
            if f.name == "prompts":
                merged[f.name] = [p for b in batches for p in b.prompts]
            elif f.name == "cond":
                merged[f.name] = TextCondition.cat(values)
            elif f.name == "iteration":
                merged[f.name] = first.iteration
            elif f.name == "steps_done":
                if len(set(values)) != 1:
                    raise ValueError(
                        f"cannot concatenate trajectories at different steps_done {sorted(set(values))}"
                    )
                merged[f.name] = first.steps_done
            elif all(v is None for v in values):
                merged[f.name] = None
            elif any(v is None for v in values):
                raise ValueError(f"field {f.name!r} is set on some batches but not on others")
            else:
                merged[f.name] = torch.cat(values)
        return cls(**merged)

    def sort_by_identity(self) -> TrajectoryBatch:
        """Order samples by (prompt id, sample id): a canonical order for comparing schedules."""
        key = self.prompt_ids * (int(self.sample_ids.max()) + 1 if self.batch_size else 1) + self.sample_ids
        return self.select(torch.argsort(key.cpu()))
