"""The outer training loop every system shares; a system only writes ``run_iteration``.

Like torchtitan's ``train.py`` the loop is one readable function: resume → for each iteration
(schedule-specific work, metrics, checkpoint) → merge the profile trace. Checkpoints store the
trainer state, the next iteration index and the run's identity (its ``run_id`` and resolved config,
digenrl/trainer/run_dir.py); every random draw of the run is keyed by ``(seed, iteration, …)``, so
resuming from iteration k replays exactly what an uninterrupted run would have done. Schedules that
generate ahead of the trainer (TCSS, ``separate-async``) generate the iteration after a checkpoint
on-policy, so nothing is in flight when it is written (:class:`digenrl.async_policy.tcss.StalenessBound`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import yaml

from digenrl.config import Config, config_yaml
from digenrl.plan import RunPlan
from digenrl.rollout.evaluate import EvalPhases, EvalResult, eval_schedule
from digenrl.runtime.comm.distributed import DistContext
from digenrl.runtime.comm.policy_version import PolicyVersion
from digenrl.runtime.comm.shard_groups import ShardGroups, build_shard_groups
from digenrl.runtime.faults.fault_injection import inject_fault
from digenrl.runtime.faults.stop_request import STOP
from digenrl.runtime.hardware.profiles import (
    AUTO,
    detect_device,
    device_mismatch,
    load_profile,
    profile_to_dict,
)
from digenrl.runtime.observe.events import agree_clock_origin, merge_chrome_trace
from digenrl.runtime.observe.iteration_profile import profiled_iteration
from digenrl.runtime.observe.metrics import add_event_summary, read_metrics
from digenrl.runtime.observe.run_report import closing_summary, start_banner
from digenrl.runtime.observe.sample_grid import grid_path, write_sample_grid
from digenrl.runtime.observe.span_phases import Phase
from digenrl.runtime.observe.telemetry import GpuTelemetry
from digenrl.runtime.run_folder.run_files import write_atomic
from digenrl.systems.components import RankComponents
from digenrl.trainer.checkpoint import load_checkpoint, save_checkpoint
from digenrl.trainer.lora_export import checkpoint_lora_writer
from digenrl.trainer.run_dir import PLAN_FILE, PROFILE_FILE, RunStart

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


class System:
    """Base class of a schedule. Subclasses set ``name`` and ``knobs`` and write ``setup`` and
    ``run_iteration``; they must build their parts with :func:`build_rank_components`.

    ``knobs`` lists the system-specific config sections and keys the schedule reads (see
    :data:`digenrl.validation.SYSTEM_SPECIFIC`); a user-set key outside them is rejected at startup.

    Every schedule decision (pools, mechanism knobs, split, staleness, sharding) reads ``self.plan``, the
    :class:`~digenrl.plan.RunPlan` of the config on the launched world, built once here and written to
    ``plan.json``; the config supplies only what is not schedule (model, sampler, algorithm, trainer
    hyper-parameters, runtime timeouts, paths). tests/test_plan_reads.py keeps it so.
    """

    name: ClassVar[str]
    knobs: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def check(cls, cfg: Config, plan: RunPlan) -> None:
        """Start-up checks of ``plan`` (the config's on the launched ranks, ``plan.world_size``) before any
        model exists; each system adds its own."""

    def __init__(self, cfg: Config, ctx: DistContext, run: RunStart):
        self.cfg = cfg
        self.ctx = ctx
        self.run_start = run  # agreed at startup (digenrl/trainer/run_dir.py agree_run_start)
        self.clock_origin = agree_clock_origin(ctx)
        self.version = PolicyVersion()  # the one owner of this rank's policy version
        # the real device, and how it differs from the profile's (runtime.allow_profile_mismatch; else
        # refused at startup: digenrl/validation.py check_profile_device)
        # the hardware profile, loaded once (profile=auto reads the devices and the shipped profiles)
        self.profile = load_profile(cfg.profile)
        self.plan = RunPlan.from_config(cfg, self.profile, world_size=ctx.world_size)  # the schedule it runs
        self.device = detect_device(ctx.device.type, ctx.device.index or 0)
        self.profile_mismatch = device_mismatch(self.profile, ctx.rank, self.device)
        self.parts: RankComponents = self.setup()

    def setup(self) -> RankComponents:  # pragma: no cover - abstract
        raise NotImplementedError

    def trainer_shard_groups(self, trainer_ranks: Sequence[int]) -> ShardGroups | None:
        """``trainer.sharding=hybrid``: the trainer ranks' HSDP groups, by the profile's nodes (this rank's,
        None on a rank that does not train); every rank of the run must call it, in setup, before building
        its parts (``dist.new_group`` is a collective over the world). None with flat sharding."""
        if self.plan.trainer_sharding != "hybrid":
            return None
        return build_shard_groups(trainer_ranks, self.profile.node_of, timeout_s=self.cfg.runtime.timeout_s)

    def run_iteration(self, iteration: int) -> IterationReport:  # pragma: no cover - abstract
        raise NotImplementedError

    def describe_pools(self) -> str:
        """The start banner's pool line (separate systems override it)."""
        return "colocated: every rank generates and trains"

    def describe_mechanisms(self) -> str:
        """The start banner's mechanism line ("" = none to report)."""
        return ""

    def before_first_iteration(self) -> None:
        """Hook after setup and resume (separate pools sync the initial weights here)."""

    def after_run(self) -> None:
        """Hook after the last iteration, before the logs are merged (generators join the last push)."""

    # ------------------------------------------------------------------ evaluation
    def evaluation_phases(self) -> AbstractContextManager[EvalPhases | None]:
        """What brings the rollout and the reward onto the device during an evaluation (colocated systems:
        their residency planner); default: nothing to move."""
        return nullcontext(None)

    def evaluate(self, iteration: int, *, final: bool) -> EvalResult | None:
        """The evaluation ``eval_schedule`` puts at the start of ``iteration`` (θ_iteration) or, ``final``,
        after it (θ_N): on every rank holding the trainer's weights (those with an evaluator),
        collectively, as an ``eval`` span; the result on rank 0, which writes the grid and the metrics. The
        iteration's ``wall_s`` does not include it (its ``eval_s`` is its own)."""
        evaluator, trainer = self.parts.evaluator, self.parts.trainer
        if evaluator is None or not eval_schedule(self.cfg, iteration, final=final):
            return None
        version = self.version.current
        weights = trainer.ema_weights() if self.cfg.eval.use_ema else None
        with (
            self.parts.events.span(
                Phase.EVAL, iteration=iteration, policy_version=version, samples=len(evaluator.mine)
            ),
            self.evaluation_phases() as phases,
        ):
            result = evaluator.run(iteration, version, weights=weights, phases=phases)
        # with sequence parallelism every data group's first rank holds a result (rank 0's group included)
        return result if self.ctx.rank == 0 else None

    # ------------------------------------------------------------------ checkpoint
    def checkpoint_payload(self, next_iteration: int) -> tuple[dict, dict | None]:
        """(the writer's payload, this rank's trainer shards in the sharded format or ``None``)."""
        trainer = self.parts.trainer
        state, shards = trainer.checkpoint_state() if trainer is not None else (None, None)
        payload = {
            "next_iteration": next_iteration,
            "policy_version": self.version.current,
            "trainer": state,
            "run_id": self.run_start.run_id,
            "config": self.cfg.to_dict(),
            # fingerprints of the input files (runtime/run_folder/run_inputs.py)
            "inputs": self.run_start.inputs,
        }
        return payload, shards

    def restore(self, payload: dict) -> int:
        self.version = PolicyVersion(int(payload["policy_version"]))
        if self.parts.trainer is not None:
            self.parts.trainer.load_state_dict(payload["trainer"], checkpoint_dir=payload["path"])
        return int(payload["next_iteration"])

    def obey_stop_request(self, iteration: int) -> None:
        """At the end of ``iteration``: once a rank got SIGTERM, end the run after the iteration all ranks
        agreed on (digenrl/runtime/faults/stop_request.py) by lowering ``cfg.iterations`` to it, so every
        system ends as at a planned last iteration. The lead covers how far a rank may run ahead of another:
        a generator starts iteration k+1 before the trainer ends k, plus the versions it may run ahead (the
        plan's staleness: ``asynchrony.max_staleness``, TCSS's one) and generations in flight."""
        cfg = self.cfg
        lead = 2 + self.plan.staleness + self.plan.max_inflight
        end = STOP.last_iteration(self.ctx, iteration, lead)
        if end is not None and end + 1 < cfg.iterations:
            cfg.iterations = max(end, iteration) + 1

    def checkpoint_ranks(self) -> tuple[bool, object]:
        """(does this rank take part in saving, over which process group). Default: every rank."""
        return True, None

    def _save(self, next_iteration: int) -> None:
        takes_part, group = self.checkpoint_ranks()
        if not takes_part:
            return
        payload, shards = self.checkpoint_payload(next_iteration)
        save_checkpoint(
            self.cfg.out_dir,
            next_iteration,
            payload,
            rank=self.ctx.rank,
            is_writer=self.ctx.rank == 0,
            group=group,
            keep=self.cfg.checkpoint_keep,
            sharded=shards,
            timeout_s=self.cfg.runtime.timeout_s,
            write_extra=checkpoint_lora_writer(self.cfg, payload["trainer"]),  # checkpoint.export_lora
        )

    # ------------------------------------------------------------------ the loop
    def model_counts(self) -> dict[str, int]:
        """One forward's and one VAE decode's FLOPs at the run's resolution (cached per model and size)."""
        from digenrl.costs.flops import model_flops
        from digenrl.systems.components import resolve_resolution

        return model_flops(self.cfg.model.name, *resolve_resolution(self.cfg, self.parts.bundle))

    def text_counts(self, report: IterationReport) -> dict[str, float] | None:
        """Under ``model.text_padding=split`` (a family whose forward cuts the padding), the forwards of the
        iteration's real text: the trained units' mean, from their mean real tokens and mean square
        (:func:`~digenrl.costs.flops.text_forward_flops`), and the empty prompt's for the CFG pass. None
        when the forward runs the padded text (the default count is then exact) or the lengths are unknown."""
        from digenrl.costs.flops import text_forward_flops
        from digenrl.systems.components import resolve_resolution

        flow = self.parts.bundle.flow_model
        mean, square = report.train.get("text_tokens_mean"), report.train.get("text_tokens_sq_mean")
        if flow.text_padding != "split" or not flow.cuts_text_padding or mean is None or square is None:
            return None
        a, b, c = text_forward_flops(self.cfg.model.name, *resolve_resolution(self.cfg, self.parts.bundle))
        forward = a + b * mean + c * square
        trainer = self.parts.trainer
        uncond = None if trainer is None or trainer.uncond is None else trainer.uncond.with_lengths().lengths
        return {
            "forward": forward,
            "forward_uncond": a + b * uncond[0] + c * uncond[0] ** 2 if uncond else forward,
        }

    def loop_bound(self, report: IterationReport, wall_s: float) -> dict:
        """The iteration's model FLOPs by phase, the matmul ceiling and the loop's fraction of it
        (digenrl/costs/flops.py); without a measured ceiling, the reason instead of a fraction."""
        from digenrl.costs.flops import iteration_flops, loop_ceiling

        cfg, ctx, parts = self.cfg, self.ctx, self.parts
        counts = self.model_counts()
        text = self.text_counts(report)
        if text is not None:
            counts = {**counts, **text}
        flops = iteration_flops(
            counts,
            samples=report.samples,
            train_units=float(report.train.get("units", 0.0)),
            num_steps=parts.sampler.num_steps,
            true_cfg=parts.sampler.true_cfg,
            cfg_grad=cfg.algo.cfg_grad,
            trainer_mode=cfg.trainer.mode,
        )
        ceiling, source = loop_ceiling(self.profile, ctx.device.type, self.device)
        out: dict = {"flops": flops}
        if text is not None:  # the count followed the real text (text_tokens_mean), not the padded length
            out["flops_text"] = "real tokens (model.text_padding=split)"
        if ceiling is None:
            return out | {"bound_note": source}
        # the GPUs the loop occupies: one per rank, or the shared ones (runtime.share_device)
        gpus = min(ctx.world_size, torch.cuda.device_count()) if ctx.share_device else ctx.world_size
        bound_s = flops["total"] / (ceiling * 1e12 * gpus)
        return out | {
            "ceiling_tflops": ceiling,
            "ceiling_source": source,
            "fraction_of_bound": bound_s / wall_s if wall_s > 0 else None,
        }

    def run(self) -> list[dict]:
        cfg, ctx, run = self.cfg, self.ctx, self.run_start
        start = 0
        if run.checkpoint is not None:
            payload = load_checkpoint(run.checkpoint, rank=ctx.rank)
            if payload.get("run_id") != run.run_id:  # the directory changed under us since startup
                raise RuntimeError(
                    f"rank {ctx.rank}: checkpoint {run.checkpoint} belongs to run {payload.get('run_id')}, "
                    f"not to run {run.run_id} that startup agreed to resume"
                )
            start = self.restore(payload)
        if ctx.rank == 0:
            write_atomic(f"{cfg.out_dir}/config.yaml", config_yaml(cfg, run_id=run.run_id))
            # the schedule this run executes, as the simulator and the planner read it (docs/design.md §5)
            profile = self.profile
            self.plan.write(f"{cfg.out_dir}/{PLAN_FILE}")
            if cfg.profile == AUTO:  # what auto resolved to here: a validation elsewhere prices these devices
                profile_yaml = yaml.safe_dump(profile_to_dict(profile), sort_keys=False)
                write_atomic(f"{cfg.out_dir}/{PROFILE_FILE}", profile_yaml)
            print(
                start_banner(cfg, ctx.world_size, self.describe_pools(), self.describe_mechanisms(), run),
                flush=True,
            )
            if self.profile_mismatch:
                print(f"[digenrl] WARNING (runtime.allow_profile_mismatch=true): {self.profile_mismatch}")
            if self.parts.evaluator is not None:  # rank 0 trains, so it evaluates when eval.every > 0
                print(f"[digenrl] {self.parts.evaluator.describe()}", flush=True)
        if ctx.rank == 0:  # counted before iteration 0, so a model the counter cannot trace fails at startup
            self.model_counts()
        self.before_first_iteration()
        telemetry = GpuTelemetry(self.parts.events) if ctx.device.type == "cuda" else None
        if telemetry is not None:
            telemetry.start()
        records = []
        planned = cfg.iterations
        iteration = start - 1
        while iteration + 1 < cfg.iterations:  # a stop request may lower cfg.iterations (stop_request.py)
            iteration += 1
            inject_fault(ctx.rank, iteration)
            if ctx.device.type == "cuda":  # peak_mem_gib: this iteration's peak on this rank's GPU
                torch.cuda.reset_peak_memory_stats(ctx.device)
                retries_before = torch.cuda.memory_stats(ctx.device).get("num_alloc_retries", 0)
            evaluation = self.evaluate(iteration, final=False)
            # runtime.profile_iteration: this iteration under the kernel profiler on every rank
            profiled = iteration == cfg.runtime.profile_iteration
            profiler = (
                profiled_iteration(cfg.out_dir, ctx.rank, ctx.device, iteration)
                if profiled
                else nullcontext()
            )
            t0 = time.perf_counter()
            with profiler:
                report = self.run_iteration(iteration)
            wall = time.perf_counter() - t0
            evaluation = self.evaluate(iteration, final=True) or evaluation
            record = {
                "iteration": iteration,
                "iterations": cfg.iterations,
                "reward_mean": report.reward_mean,
                "reward_std": report.reward_std,
                **{k: v for k, v in report.train.items() if k != "units"},
                "train_units": report.train.get("units", 0.0),
                **report.step,
                "policy_version": self.version.current,
                "samples": report.samples,
                "samples_per_s": report.samples / wall if wall > 0 else 0.0,
                "wall_s": wall,
                **{f"{phase}_s": s for phase, s in report.phase_s.items()},
            }
            if self.profile_mismatch:  # allowed, and kept beside every number it affects
                record["profile_mismatch"] = self.profile_mismatch
            if profiled:
                record["profiled"] = True  # its wall time includes the profiler's overhead
            if ctx.rank == 0:  # metrics.jsonl is rank 0's
                record |= self.loop_bound(report, wall)
            if ctx.device.type == "cuda":
                record["peak_mem_gib"] = torch.cuda.max_memory_allocated(ctx.device) / 2**30
                # the caching allocator's side: what it held from the driver, and how often a request found
                # no cached block and it freed its cache and retried (each one a device-wide sync and
                # cudaFree/cudaMalloc: the ~20 ms host stalls of a run near the memory limit)
                record["peak_reserved_gib"] = torch.cuda.max_memory_reserved(ctx.device) / 2**30
                stats = torch.cuda.memory_stats(ctx.device)
                record["alloc_retries"] = float(stats.get("num_alloc_retries", 0) - retries_before)
                # every rank's own peak (metrics.jsonl is rank 0's): what a shared-device run sums
                self.parts.events.counter("memory", {"peak_gib": record["peak_mem_gib"]})
            image = None
            if evaluation is not None:  # rank 0: the evaluation's numbers and its grid
                record.update(evaluation.metrics)
                image = write_sample_grid(
                    grid_path(cfg.out_dir, evaluation.policy_version),
                    evaluation.images,
                    evaluation.prompts,
                    evaluation.rewards,
                    title=f"iteration {iteration}: policy v{evaluation.policy_version}, "
                    f"eval reward {evaluation.metrics['eval_reward_mean']:+.4f}",
                )
            self.parts.metrics.log(record, image=image)
            records.append(record)
            self.obey_stop_request(iteration)
            last = iteration + 1 == cfg.iterations
            if last or (cfg.checkpoint_every and (iteration + 1) % cfg.checkpoint_every == 0):
                self._save(iteration + 1)
        if cfg.iterations < planned:  # stopped on SIGTERM: the checkpoint is written, end without hanging
            STOP.finishing()
            if ctx.rank == 0:
                print(
                    f"[digenrl] stopped on SIGTERM after iteration {cfg.iterations - 1}: checkpoint at step "
                    f"{cfg.iterations} written; continue with resume=true",
                    flush=True,
                )
        self.after_run()
        if telemetry is not None:
            telemetry.stop()
        self.parts.metrics.close()
        self.parts.events.close()
        ctx.barrier("events flushed before trace merge", cfg.runtime.timeout_s)
        if ctx.rank == 0:
            merge_chrome_trace(cfg.out_dir)
            add_event_summary(cfg.out_dir)
            print(closing_summary(read_metrics(cfg.out_dir)[-len(records) :], cfg.out_dir), flush=True)
        return records
