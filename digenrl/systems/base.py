"""The outer training loop every system shares; a system only writes ``run_iteration``.

Like torchtitan's ``train.py`` the loop is one readable function: resume → for each iteration
(schedule-specific work, metrics, checkpoint) → merge the profile trace. Checkpoints store the
trainer state and the next iteration index; every random draw of the run is keyed by
``(seed, iteration, …)``, so resuming from iteration k replays exactly what an uninterrupted run
would have done.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass, field
from typing import ClassVar

from digenrl.config import Config, save_config
from digenrl.runtime.distributed import DistContext
from digenrl.runtime.events import agree_clock_origin, merge_chrome_trace
from digenrl.runtime.metrics import add_event_summary
from digenrl.runtime.telemetry import GpuTelemetry
from digenrl.systems import SystemRequirements
from digenrl.systems.components import RankComponents
from digenrl.trainer.checkpoint import load_latest_checkpoint, save_checkpoint

log = logging.getLogger(__name__)


@dataclass
class IterationReport:
    """What one iteration produced, reduced over the ranks that own the logical batch."""

    samples: int
    reward_mean: float
    reward_std: float
    train: dict[str, float]
    step: dict[str, float]
    phase_s: dict[str, float] = field(default_factory=dict)


def inject_fault(rank: int, iteration: int) -> None:
    """Fault injection for robustness tests: ``DIGENRL_INJECT_FAULT="rank=R,iteration=I[,kind=raise|kill]"``
    makes rank R raise (or SIGKILL itself) at the start of iteration I."""
    spec = os.environ.get("DIGENRL_INJECT_FAULT")
    if not spec:
        return
    fields = dict(item.split("=", 1) for item in spec.split(","))
    if int(fields["rank"]) != rank or int(fields["iteration"]) != iteration:
        return
    if fields.get("kind", "raise") == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError(f"injected fault on rank {rank} at iteration {iteration}")


class System:
    """Base class of a schedule. Subclasses set ``name``/``requirements`` and write ``setup`` and
    ``run_iteration``; they must build their parts with :func:`build_rank_components`."""

    name: ClassVar[str]
    requirements: ClassVar[SystemRequirements]

    def __init__(self, cfg: Config, ctx: DistContext):
        self.cfg = cfg
        self.ctx = ctx
        self.clock_origin = agree_clock_origin(ctx)
        self.parts: RankComponents = self.setup()
        self.policy_version = 0

    def setup(self) -> RankComponents:  # pragma: no cover - abstract
        raise NotImplementedError

    def run_iteration(self, iteration: int) -> IterationReport:  # pragma: no cover - abstract
        raise NotImplementedError

    def before_first_iteration(self) -> None:
        """Hook after setup and resume (separate pools sync the initial weights here)."""

    # ------------------------------------------------------------------ checkpoint
    def checkpoint_payload(self, next_iteration: int) -> dict:
        trainer = self.parts.trainer
        return {
            "next_iteration": next_iteration,
            "policy_version": self.policy_version,
            "trainer": trainer.state_dict() if trainer is not None else None,
        }

    def restore(self, payload: dict) -> int:
        self.policy_version = int(payload["policy_version"])
        if self.parts.trainer is not None:
            self.parts.trainer.load_state_dict(payload["trainer"])
        return int(payload["next_iteration"])

    def checkpoint_ranks(self) -> tuple[bool, object]:
        """(does this rank take part in saving, over which process group). Default: every rank."""
        return True, None

    def _save(self, next_iteration: int) -> None:
        takes_part, group = self.checkpoint_ranks()
        if not takes_part:
            return
        save_checkpoint(
            self.cfg.out_dir,
            next_iteration,
            self.checkpoint_payload(next_iteration),
            rank=self.ctx.rank,
            is_writer=self.ctx.rank == 0,
            group=group,
        )

    # ------------------------------------------------------------------ the loop
    def run(self) -> list[dict]:
        cfg, ctx = self.cfg, self.ctx
        start = 0
        if cfg.resume:
            payload = load_latest_checkpoint(cfg.out_dir)
            if payload is not None:
                start = self.restore(payload)
                if ctx.rank == 0:
                    log.info("resumed from %s at iteration %d", cfg.out_dir, start)
        if ctx.rank == 0:
            save_config(cfg, f"{cfg.out_dir}/config.yaml")
        self.before_first_iteration()
        telemetry = GpuTelemetry(self.parts.events) if ctx.device.type == "cuda" else None
        if telemetry is not None:
            telemetry.start()
        records = []
        for iteration in range(start, cfg.iterations):
            inject_fault(ctx.rank, iteration)
            t0 = time.perf_counter()
            report = self.run_iteration(iteration)
            wall = time.perf_counter() - t0
            record = {
                "iteration": iteration,
                "iterations": cfg.iterations,
                "reward_mean": report.reward_mean,
                "reward_std": report.reward_std,
                **{k: v for k, v in report.train.items() if k != "units"},
                "train_units": report.train.get("units", 0.0),
                **{k: v for k, v in report.step.items() if k != "policy_version"},
                "policy_version": self.policy_version,
                "samples": report.samples,
                "samples_per_s": report.samples / wall if wall > 0 else 0.0,
                "wall_s": wall,
                **{f"{phase}_s": s for phase, s in report.phase_s.items()},
            }
            self.parts.metrics.log(record)
            records.append(record)
            last = iteration + 1 == cfg.iterations
            if last or (cfg.checkpoint_every and (iteration + 1) % cfg.checkpoint_every == 0):
                self._save(iteration + 1)
        if telemetry is not None:
            telemetry.stop()
        self.parts.events.close()
        ctx.barrier("events flushed before trace merge", cfg.runtime.timeout_s)
        if ctx.rank == 0:
            merge_chrome_trace(cfg.out_dir)
            add_event_summary(cfg.out_dir)
        return records
