"""The schedule of a run as one frozen value: system, pools and their ranks, and every mechanism knob.

A :class:`RunPlan` is what ``experiments/run_train.py`` runs (:meth:`RunPlan.from_config`, written to
``out_dir/plan.json`` by every run, :data:`digenrl.trainer.run_dir.PLAN_FILE`), what the simulator prices
(:func:`digenrl.sim.simulate`), what the planner searches (:mod:`digenrl.planning`) and what
``simulate.py validate`` compares a run with.
:meth:`RunPlan.to_config` is the exact inverse of :meth:`RunPlan.from_config` for every plan the runtime can
run (``tests/plan/test_run_plan.py`` checks it over generated configs), so a plan the planner chooses is a
config file (``simulate.py plan --emit-config``).

Only the knobs the plan's system reads are taken from a config; every other field stays at its default
(one plan has one spelling). A few fields are simulator what-ifs the runtime has no key for
(``transport`` other than the system's, ``overlap_sub_batches``, ``weight_sync_interval``,
``reap_before_launch=False``); :attr:`RunPlan.runnable` says whether a plan has none, and
:meth:`RunPlan.to_config` refuses one that has.

Rank placement follows :mod:`digenrl.runtime.launch.layout`: in a separate layout ranks ``[0, trainers)``
train, the next ``generators`` ranks generate and the next ``scorers`` ranks score; colocated schedules use
every rank of the profile.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Protocol

from digenrl.config import (
    COLOCATED_SPLITS,
    COLOCATED_SYSTEMS,
    GAP_ASSIGNMENTS,
    SYSTEMS,
    TAG_POLICIES,
    TRAIN_ORDERS,
    TRAINER_BACKENDS,
    TRAINER_SHARDINGS,
    Config,
    ConfigError,
)
from digenrl.data.rank_shares import RankShare, rank_shares, split_backend_conflict
from digenrl.gap.fragments import FragmentPlan
from digenrl.plan.sequence_shape import group_problem, support_problem
from digenrl.plan.workload import Workload
from digenrl.rules import (
    fragment_size,
    hybrid_sharding_problem,
    resolve_switch,
    separate_pools,
    staleness_lag,
)

#: How a colocated schedule shares the logical batch (``colocated.split``, digenrl/data/rank_shares.py).
WORK_SPLITS = COLOCATED_SPLITS
#: Trajectory transports (:mod:`digenrl.sim.channel`): the separate baselines' ``rendezvous`` send, the
#: ``buffered`` send of digenrl's fragment stream and TSP hand-offs.
TRANSPORTS = ("rendezvous", "buffered")
#: The config keys (and sections) a plan is made of: :meth:`RunPlan.from_config` reads nothing else, and
#: :meth:`RunPlan.to_config` replaces exactly these of its base config.
SCHEDULE_KEYS = (
    "system",
    "profile",
    "runtime.share_device",
    "trainer.backend",
    "trainer.deepspeed_stage",
    "trainer.micro_batch_size",
    "trainer.activation_checkpointing",
    "trainer.sequence_parallel",
    "sampler.samples_per_forward",
    "sampler.sequence_parallel",
    "residency",
    "colocated",
    "engine",
    "pools",
    "asynchrony.max_staleness",
    "asynchrony.max_inflight",
    "gap",
    "tsp",
    "tag",
    "tcss",
)


def is_schedule_key(key: str) -> bool:
    """Whether the dotted config ``key`` is one a plan decides (:data:`SCHEDULE_KEYS`)."""
    return any(key == k or key.startswith(k + ".") for k in SCHEDULE_KEYS)


class Profile(Protocol):
    """What :meth:`RunPlan.from_config` reads of a hardware profile
    (:class:`~digenrl.runtime.hardware.profiles.HardwareProfile`)."""

    name: str
    world_size: int


@dataclass(frozen=True)
class RunPlan:
    """A schedule and its knobs; the fields that do not apply to ``system`` stay at their defaults.

    Every system: ``profile`` (the config's ``profile`` string, "" = not given) and its ``world_size``
    (0 = not given); ``share_device`` (``runtime.share_device``); ``trainer_backend`` /
    ``deepspeed_stage`` (how the trainer pool shards, ``trainer.backend``; ``auto`` = FSDP2 for a full
    fine-tune on several trainers); ``trainer_sharding`` (``trainer.sharding``: ``hybrid`` shards a full
    fine-tune inside each node and replicates across nodes, :func:`digenrl.rules.schedule.shard_group`);
    ``micro_batch_size`` / ``activation_checkpointing`` /
    ``samples_per_forward`` (None = the workload's ``trainer.micro_batch_size`` /
    ``trainer.activation_checkpointing`` / ``sampler.samples_per_forward``; a run's plan holds the values;
    the planner lowers them where memory requires, :mod:`digenrl.planning.memory`).
    ``sequence_parallel`` (``trainer.sequence_parallel``; ``colocated-sync``: also
    ``sampler.sequence_parallel``) and ``generator_sequence_parallel`` (``separate-sync``'s generator pool:
    ``sampler.sequence_parallel``): groups of that many consecutive ranks of the pool shard every forward's
    tokens (Ulysses) and act as one data-parallel member (:mod:`digenrl.plan.sequence_shape`, docs/models.md
    "Sequence parallelism").
    ``colocated-*``: ``train_resident`` / ``reward_resident`` (``residency.*``: False parks the optimizer
    state during generation, and the reward weights outside scoring; :mod:`digenrl.sim.residency`),
    ``work_split`` (``colocated.split``, :data:`WORK_SPLITS`), ``overlap_sub_batches`` (``colocated-overlap``:
    each rank's share in this many sub-batches; None = the runtime's rule; other values are a simulator
    what-if). ``colocated-engine`` reads ``work_split`` and ``engine_offload`` (``engine.offload``: the
    trainer's states and the generation copy take turns on the device; docs/design.md §4), not the
    ``residency.*`` knobs (its switch decides what moves).
    Separate systems: ``trainers`` / ``generators`` / ``scorers`` (``pools.*``); ``transport`` of
    trajectories (None = the runtime's for the system, :attr:`transport_mode`).
    ``separate-async`` (UniRL, docs/references.md [000]): ``max_staleness`` / ``max_inflight``
    (``asynchrony.*``), ``weight_sync_interval`` and ``reap_before_launch`` (simulator what-ifs).
    ``digenrl``: ``gap`` / ``fragment_groups`` / ``fragment_samples`` (S samples per fragment, any divisor
    of the batch, also below a group; 0 = ``fragment_groups`` whole groups) / ``fragment_assignment`` /
    ``train_order`` (``gap.*``), ``tsp_stages`` / ``tsp_boundaries`` (``tsp.*``), ``tag`` with
    ``tag_policy`` (``auto``: the budget is searched, up to ``tag_max_fragments`` when > 0; ``always``: at
    most ``tag_max_fragments`` per trainer rank per iteration, 0 = no limit) and ``park_grads`` (``tag.*``),
    ``tcss`` with ``tcss_switch`` (``tcss.*``: ``auto``, ``timing`` or a fragment index;
    :mod:`digenrl.async_policy.tcss`).
    """

    system: str
    profile: str = ""
    world_size: int = 0
    trainers: int = 0
    generators: int = 0
    scorers: int = 0
    share_device: bool = False
    trainer_backend: str = "auto"
    trainer_sharding: str = "flat"
    deepspeed_stage: int = 2
    micro_batch_size: int | None = None
    activation_checkpointing: bool | None = None
    samples_per_forward: int | None = None
    sequence_parallel: int = 1
    generator_sequence_parallel: int = 1
    train_resident: bool = True
    reward_resident: bool = True
    work_split: str = "equal"
    overlap_sub_batches: int | None = None
    engine_offload: bool = True
    max_staleness: int = 1
    max_inflight: int = 1
    weight_sync_interval: int = 1
    reap_before_launch: bool = True
    transport: str | None = None
    gap: bool = True
    fragment_assignment: str = "dynamic"
    train_order: str = "index"
    fragment_groups: int = 1
    fragment_samples: int = 0
    tsp_stages: int = 1
    tsp_boundaries: tuple[int, ...] | None = None
    tag: bool = False
    tag_policy: str = "auto"
    tag_max_fragments: int = 0
    park_grads: bool = False
    tcss: bool = False
    tcss_switch: str = "auto"

    def __post_init__(self) -> None:
        if self.system not in SYSTEMS:
            raise ValueError(f"system={self.system!r} is not allowed; choose one of: {', '.join(SYSTEMS)}")
        if self.overlap_sub_batches is not None and self.overlap_sub_batches < 1:
            raise ValueError(
                f"RunPlan.overlap_sub_batches must be >= 1 or None, got {self.overlap_sub_batches}"
            )
        for name in ("micro_batch_size", "samples_per_forward"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"RunPlan.{name} must be None or an int >= 0, got {value!r}")
        if self.micro_batch_size == 0:
            raise ValueError("RunPlan.micro_batch_size must be >= 1")
        for name in (
            "weight_sync_interval",
            "fragment_groups",
            "tsp_stages",
            "max_inflight",
            "sequence_parallel",
            "generator_sequence_parallel",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"RunPlan.{name} must be an int >= 1, got {value!r}")
        for name in (
            "world_size",
            "trainers",
            "generators",
            "scorers",
            "max_staleness",
            "fragment_samples",
            "tag_max_fragments",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"RunPlan.{name} must be an int >= 0, got {value!r}")
        if self.transport is not None and self.transport not in TRANSPORTS:
            raise ValueError(
                f"RunPlan.transport={self.transport!r} is not allowed; choose one of: "
                + ", ".join(TRANSPORTS)
            )
        for name, allowed in (
            ("fragment_assignment", GAP_ASSIGNMENTS),
            ("train_order", TRAIN_ORDERS),
            ("work_split", WORK_SPLITS),
            ("tag_policy", TAG_POLICIES),
            ("trainer_backend", TRAINER_BACKENDS),
            ("trainer_sharding", TRAINER_SHARDINGS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"RunPlan.{name}={getattr(self, name)!r} is not allowed; choose one of: "
                    + ", ".join(allowed)
                )
        if self.tsp_boundaries is not None and not isinstance(self.tsp_boundaries, tuple):
            object.__setattr__(self, "tsp_boundaries", tuple(self.tsp_boundaries))  # JSON gives a list

    # ------------------------------------------------------------------ config and file
    @classmethod
    def from_config(cls, cfg: Config, profile: Profile, *, world_size: int | None = None) -> RunPlan:
        """The plan ``cfg`` runs on ``profile``: the knobs its system reads (module docstring).
        ``world_size``: the ranks launched, where fewer than the profile's devices (a system builds its plan
        on its world: :class:`digenrl.systems.base.System`); default the profile's."""
        world = profile.world_size if world_size is None else world_size
        knobs: dict[str, Any] = {
            "profile": cfg.profile,
            "world_size": world,
            "share_device": cfg.runtime.share_device,
            "trainer_backend": cfg.trainer.backend,
            "micro_batch_size": cfg.trainer.micro_batch_size,
            "activation_checkpointing": cfg.trainer.activation_checkpointing,
            "samples_per_forward": cfg.sampler.samples_per_forward,
        }
        if cfg.trainer.backend == "deepspeed":
            knobs["deepspeed_stage"] = cfg.trainer.deepspeed_stage
        if cfg.trainer.sharding != "flat":
            knobs["trainer_sharding"] = cfg.trainer.sharding
        if cfg.system == "colocated-engine":
            knobs |= {"work_split": cfg.colocated.split, "engine_offload": cfg.engine.offload}
        elif cfg.system in COLOCATED_SYSTEMS:
            knobs |= {"train_resident": cfg.residency.train_resident, "work_split": cfg.colocated.split}
            if cfg.system == "colocated-sync":  # colocated-overlap keeps the reward resident
                knobs["reward_resident"] = cfg.residency.reward_resident
                knobs["sequence_parallel"] = cfg.trainer.sequence_parallel
        else:
            pools = cfg.pools
            trainers, generators, scorers = separate_pools(
                pools.trainers, pools.generators, pools.scorers, world
            )
            knobs |= {"trainers": trainers, "generators": generators, "scorers": scorers}
            if cfg.system == "separate-sync":
                knobs["sequence_parallel"] = cfg.trainer.sequence_parallel
                knobs["generator_sequence_parallel"] = cfg.sampler.sequence_parallel
        if cfg.system == "separate-async":
            knobs |= {
                "max_staleness": cfg.asynchrony.max_staleness,
                "max_inflight": cfg.asynchrony.max_inflight,
            }
        if cfg.system == "digenrl":
            knobs |= {
                "gap": cfg.gap.enabled,
                "fragment_samples": cfg.gap.fragment_samples,
                "fragment_assignment": cfg.gap.assignment,
                "train_order": cfg.gap.train_order,
                "tsp_stages": cfg.tsp.stages,
                "tsp_boundaries": None if cfg.tsp.boundaries is None else tuple(cfg.tsp.boundaries),
                "tag": cfg.tag.enabled,
                "tcss": cfg.tcss.enabled,
            }
            if not cfg.gap.fragment_samples:
                knobs["fragment_groups"] = cfg.gap.fragment_groups
            if cfg.tag.enabled:
                knobs |= {
                    "tag_policy": cfg.tag.policy,
                    "tag_max_fragments": cfg.tag.max_fragments,
                    "park_grads": cfg.tag.park_grads,
                }
            if cfg.tcss.enabled:
                knobs["tcss_switch"] = cfg.tcss.switch
        return cls(cfg.system, **knobs)

    def config_items(self) -> dict[str, Any]:
        """The dotted config keys that run this plan, only those its system reads (so a config file of them
        passes :mod:`digenrl.validation`'s knob rules); :meth:`to_config` sets them.

        Raises ValueError for a plan the runtime cannot run (:attr:`runnable`)."""
        if not self.runnable:
            raise ValueError(
                f"{self.describe()} holds a simulator what-if run_train.py cannot run "
                f"({'; '.join(self._what_ifs())}); keep the runtime's values"
            )
        out: dict[str, Any] = {"system": self.system}
        if self.profile:
            out["profile"] = self.profile
        if self.share_device:
            out["runtime.share_device"] = True
        if self.trainer_backend != "auto":
            out["trainer.backend"] = self.trainer_backend
        if self.trainer_backend == "deepspeed":
            out["trainer.deepspeed_stage"] = self.deepspeed_stage
        if self.trainer_sharding != "flat":
            out["trainer.sharding"] = self.trainer_sharding
        for key, value in (
            ("trainer.micro_batch_size", self.micro_batch_size),
            ("trainer.activation_checkpointing", self.activation_checkpointing),
            ("sampler.samples_per_forward", self.samples_per_forward),
        ):
            if value is not None:
                out[key] = value
        if self.system == "colocated-engine":
            return out | {"colocated.split": self.work_split, "engine.offload": self.engine_offload}
        if self.colocated:
            out |= {"residency.train_resident": self.train_resident, "colocated.split": self.work_split}
            if self.system == "colocated-sync":
                out["residency.reward_resident"] = self.reward_resident
            if self.sequence_parallel > 1:
                out["trainer.sequence_parallel"] = out["sampler.sequence_parallel"] = self.sequence_parallel
            return out
        out |= {"pools.trainers": self.trainers, "pools.generators": self.generators}
        if self.sequence_parallel > 1:
            out["trainer.sequence_parallel"] = self.sequence_parallel
        if self.generator_sequence_parallel > 1:
            out["sampler.sequence_parallel"] = self.generator_sequence_parallel
        if self.scorers:
            out["pools.scorers"] = self.scorers
        if self.system == "separate-async":
            out |= {
                "asynchrony.max_staleness": self.max_staleness,
                "asynchrony.max_inflight": self.max_inflight,
            }
        if self.system == "digenrl":
            out["gap.enabled"] = self.gap
            if self.fragment_samples:
                out["gap.fragment_samples"] = self.fragment_samples
            else:
                out["gap.fragment_groups"] = self.fragment_groups
            out |= {
                "gap.assignment": self.fragment_assignment,
                "gap.train_order": self.train_order,
                "tsp.stages": self.tsp_stages,
                "tag.enabled": self.tag,
                "tcss.enabled": self.tcss,
            }
            if self.tsp_boundaries is not None:
                out["tsp.boundaries"] = list(self.tsp_boundaries)
            if self.tag:
                out |= {
                    "tag.policy": self.tag_policy,
                    "tag.max_fragments": self.tag_max_fragments,
                    "tag.park_grads": self.park_grads,
                }
            if self.tcss:
                out["tcss.switch"] = self.tcss_switch
        return out

    def to_config(self, base: Config | None = None) -> Config:
        """``base`` (default: a default :class:`Config`) with every schedule key (:data:`SCHEDULE_KEYS`)
        at its default and then this plan's (:meth:`config_items`) set, everything else (model, algorithm,
        iterations, …) kept; ``RunPlan.from_config(plan.to_config(), profile) == plan`` for every plan
        :meth:`from_config` returns."""
        cfg = copy.deepcopy(base) if base is not None else Config()
        defaults = Config()
        for key in SCHEDULE_KEYS:
            *sections, name = key.split(".")
            target, source = cfg, defaults
            for section in sections:
                target, source = getattr(target, section), getattr(source, section)
            setattr(target, name, copy.deepcopy(getattr(source, name)))
        for key, value in self.config_items().items():
            *sections, name = key.split(".")
            target = cfg
            for section in sections:
                target = getattr(target, section)
            setattr(target, name, value)
        return cfg

    def to_json(self) -> dict[str, Any]:
        """The plan as ``plan.json`` holds it: every field, plus the ranks of each pool (derived, for
        readers; :meth:`from_json` ignores them)."""
        out = asdict(self)
        out["tsp_boundaries"] = None if self.tsp_boundaries is None else list(self.tsp_boundaries)
        if self.world_size:
            out["ranks"] = {
                "trainer": list(self.trainer_ranks(self.world_size)),
                "generator": list(self.generator_ranks(self.world_size)),
                "scorer": list(self.scorer_ranks()),
            }
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunPlan:
        """A plan from :meth:`to_json`'s mapping; an unknown key is an error naming it."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names - {"ranks"})
        if unknown:
            raise ValueError(
                f"plan keys {unknown} are not RunPlan fields (allowed: {', '.join(sorted(names))})"
            )
        return cls(**{k: v for k, v in data.items() if k in names})

    def write(self, path: str | Path) -> None:
        """Write :meth:`to_json` to ``path`` (atomically: a crash leaves the old file or the new one; never
        through a link, digenrl/runtime/run_folder/run_files.py)."""
        from digenrl.runtime.run_folder.run_files import write_atomic

        write_atomic(path, json.dumps(self.to_json(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> RunPlan:
        """The plan in a ``plan.json`` (a run's: :data:`digenrl.trainer.run_dir.PLAN_FILE`)."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"cannot read the plan {path}: {error}") from None
        return cls.from_json(data)

    # ------------------------------------------------------------------ what the runtime can run
    def _what_ifs(self) -> list[str]:
        out = []
        if self.transport is not None and self.transport != self._runtime_transport:
            out.append(f"transport={self.transport} (the runtime's: {self._runtime_transport})")
        if self.overlap_sub_batches is not None:
            out.append(f"overlap_sub_batches={self.overlap_sub_batches}")
        if self.weight_sync_interval != 1:
            out.append(f"weight_sync_interval={self.weight_sync_interval}")
        if not self.reap_before_launch:
            out.append("reap_before_launch=False")
        return out

    @property
    def runnable(self) -> bool:
        """Whether ``run_train.py`` can run this plan (no simulator what-if, module docstring)."""
        return not self._what_ifs()

    @property
    def _runtime_transport(self) -> str:
        return "buffered" if self.system == "digenrl" else "rendezvous"

    # ------------------------------------------------------------------ schedule
    @property
    def transport_mode(self) -> str:
        """The trajectory transport: as given, or the runtime's for this system."""
        return self.transport if self.transport is not None else self._runtime_transport

    @property
    def colocated(self) -> bool:
        return self.system in COLOCATED_SYSTEMS

    @property
    def staleness(self) -> int:
        """Most policy versions a trained trajectory may lag (docs/design.md §4 "Equal staleness")."""
        return staleness_lag(self.system, tcss=self.tcss, max_staleness=self.max_staleness)

    def effective_workload(self, workload: Workload) -> Workload:
        """``workload`` with this plan's micro-batch, checkpointing and generator batch cap."""
        changes = {
            "micro_batch_size": self.micro_batch_size,
            "activation_checkpointing": self.activation_checkpointing,
            "samples_per_forward": self.samples_per_forward,
        }
        return replace(workload, **{k: v for k, v in changes.items() if v is not None})

    def resolved(self, workload: Workload, profile: Profile | None = None) -> RunPlan:
        """This plan with the workload's micro-batch, checkpointing and generator batch where it leaves
        them None, and ``profile``'s name and size: the plan as a run of it records it (``plan.json``)."""
        w = self.effective_workload(workload)
        changes: dict[str, Any] = {
            "micro_batch_size": w.micro_batch_size,
            "activation_checkpointing": w.activation_checkpointing,
            "samples_per_forward": w.samples_per_forward,
        }
        if profile is not None:
            changes |= {"profile": self.profile or profile.name, "world_size": profile.world_size}
        return replace(self, **changes)

    def trainer_ranks(self, world_size: int | None = None) -> tuple[int, ...]:
        world = world_size or self.world_size
        return tuple(range(world)) if self.colocated else tuple(range(self.trainers))

    def generator_ranks(self, world_size: int | None = None) -> tuple[int, ...]:
        if self.colocated:
            return tuple(range(world_size or self.world_size))
        return tuple(range(self.trainers, self.trainers + self.generators))

    def scorer_ranks(self) -> tuple[int, ...]:
        start = self.trainers + self.generators
        return () if self.colocated else tuple(range(start, start + self.scorers))

    def colocated_shares(self, workload: Workload, speeds: Sequence[float]) -> list[RankShare]:
        """Every rank's share of a colocated iteration as the runtime cuts it
        (:func:`digenrl.data.rank_shares.rank_shares`; ``speeds``: each rank's ``relative_speed``). With
        ``sequence_parallel`` = N the members are groups of N consecutive ranks, and every rank of a group
        holds its group's share (digenrl/systems/colocated_sync.py)."""
        w = self.effective_workload(workload)
        n = self.sequence_parallel
        members = rank_shares(
            w.prompts_per_iteration, w.group_size, speeds[::n], w.micro_batch_size, self.work_split
        )
        return [members[rank // n] for rank in range(len(speeds))]

    def _check_sequence_parallel(
        self, world_size: int, workload: Workload, node_of: Callable[[int], int]
    ) -> None:
        """The runtime's start-up checks of the two degrees (digenrl/validation.py
        ``check_sequence_parallel``) that a plan can violate."""
        if self.colocated and self.generator_sequence_parallel != 1:
            raise ValueError(
                "RunPlan.generator_sequence_parallel is for separate-sync's generator pool; a colocated "
                "plan's ranks generate with sequence_parallel"
            )
        pools = {"sequence_parallel": self.trainer_ranks(world_size)}
        pools["generator_sequence_parallel"] = self.generator_ranks(world_size)
        split = self.work_split if self.colocated else "equal"
        for key, ranks in pools.items():
            degree = getattr(self, key)
            mode, backend = workload.trainer_mode, self.trainer_backend
            problem = support_problem(key, degree, self.system, mode, backend, split)
            if problem is None and degree > 1:
                problem = group_problem(ranks, degree, node_of, key)
            if problem:
                raise ValueError(problem)
        if max(self.sequence_parallel, self.generator_sequence_parallel) > 1 and self.scorers:
            raise ValueError(
                "sequence parallelism with scorer ranks (one request per fragment and eval call)"
            )

    def check(
        self,
        world_size: int,
        workload: Workload,
        speeds: Sequence[float] | None = None,
        node_of: Callable[[int], int] | None = None,
    ) -> None:
        """Raise ValueError if the plan cannot run ``workload`` on ``world_size`` devices (the runtime's
        start-up checks that a plan can violate: ``digenrl/systems/colocated_sync.py``,
        ``colocated_engine.py`` and ``digenrl_system.py`` ``check``). ``speeds``: each rank's
        ``relative_speed`` (None: all equal), which the speed split reads; ``node_of``: each rank's node (the
        profile's ``node_of``), which hybrid sharding reads."""
        if self.trainer_sharding == "hybrid":
            problem = hybrid_sharding_problem(
                self.trainer_ranks(world_size),
                node_of,
                mode=workload.trainer_mode,
                backend=self.trainer_backend,
            )
            if problem:
                raise ValueError(problem)
        p = workload.prompts_per_iteration
        self._check_sequence_parallel(world_size, workload, node_of or (lambda rank: 0))
        if self.colocated:
            try:
                self.colocated_shares(workload, [1.0] * world_size if speeds is None else speeds)
            except ValueError as error:
                raise ValueError(f"{self.system}: {error} (digenrl/data/rank_shares.py)") from None
            # trainer.backend=auto on several ranks: FSDP2 for full fine-tuning, ddp for LoRA
            backend = "fsdp2" if workload.trainer_mode == "full" and world_size > 1 else "ddp"
            conflict = split_backend_conflict(self.work_split, backend)
            if conflict:
                raise ValueError(f"{self.system}: {conflict}")
            if self.system == "colocated-engine" and self.trainer_backend == "deepspeed":
                raise ValueError("colocated-engine: its re-shard reads FSDP2 shards or replicas, not ZeRO's")
            return
        if self.trainers < 1 or self.generators < 1:
            raise ValueError(
                f"{self.system} needs trainers >= 1 and generators >= 1 (separate pools), "
                f"got trainers={self.trainers}, generators={self.generators}"
            )
        if self.trainers + self.generators + self.scorers > world_size:
            raise ValueError(
                f"trainers + generators + scorers = {self.trainers + self.generators + self.scorers} exceeds "
                f"the profile's {world_size} devices"
            )
        if self.system in ("separate-sync", "separate-async"):  # digenrl/systems/separate.py
            samples = p * workload.group_size
            # a sequence-parallel group is one member of its pool
            generators = self.generators // self.generator_sequence_parallel
            trainers = self.trainers // self.sequence_parallel
            if samples % generators:
                raise ValueError(
                    f"P·G={samples} samples are not divisible by {generators} generators (the same "
                    "number of samples each)"
                )
            per_generator = samples // generators
            if per_generator < trainers:
                raise ValueError(
                    f"each generator produces {per_generator} samples, fewer than {trainers} trainers"
                )
        if self.system == "digenrl":
            if self.generators % self.tsp_stages:
                raise ValueError(
                    f"generators ({self.generators}) must be a multiple of tsp_stages ({self.tsp_stages}): "
                    "the generator pool is D pipelines x S stages"
                )
            if self.tsp_stages > workload.num_steps:
                raise ValueError(
                    f"tsp_stages ({self.tsp_stages}) must be <= num_steps ({workload.num_steps}): "
                    "every stage owns at least one step"
                )
            samples = self.fragment_size(workload)
            if workload.trainer_mode == "full" and self.trainers > 1 and samples < self.trainers:
                raise ValueError(
                    f"a fragment of {samples} samples has fewer than {self.trainers} sharded (FSDP2) trainers"
                    " (each trains every fragment as a collective and needs a unit of it: runtime check)"
                )
            if self.fragment_plan(workload).splits_groups and self.transport_mode == "rendezvous":
                raise ValueError(
                    "fragments that split a group need buffered sends (the runtime's): a trainer holding a "
                    "fragment waits for the rest of its groups' rewards, which a rendezvous send would block"
                )
            if self.tag and self.fragment_assignment != "dynamic":
                raise ValueError(
                    "TAG needs fragment_assignment='dynamic' (helpers claim from the shared queue)"
                )
            if self.tcss:
                self.switch_fragment(workload)  # auto, timing or a fragment index (ValueError)
            if self.tag and workload.trainer_mode == "full" and self.trainers > 1:
                raise ValueError(
                    "TAG needs a trainer that can generate alone; full fine-tuning shards the model (FSDP2)"
                )

    @property
    def pipelines(self) -> int:
        return self.generators // self.tsp_stages

    def fragment_plan(self, workload: Workload) -> FragmentPlan:
        """The runtime's fragment plan for this schedule (the simulator and the runtime share it)."""
        return FragmentPlan(
            workload.prompts_per_iteration,
            self.fragment_groups,
            self.pipelines,
            self.fragment_assignment,
            group_size=workload.group_size,
            sample_size=self.fragment_samples,
        )

    def fragment_size(self, workload: Workload) -> int:
        """Samples per fragment (:func:`digenrl.rules.fragment_size`)."""
        return fragment_size(workload.group_size, self.fragment_groups, self.fragment_samples)

    def num_fragments(self, workload: Workload) -> int:
        return self.fragment_plan(workload).num_fragments

    def switch_fragment(self, workload: Workload) -> int | None:
        """TCSS's switch fragment as the runtime resolves ``tcss.switch`` (None: ``timing``)."""
        try:
            return resolve_switch(self.tcss_switch, self.num_fragments(workload))
        except ConfigError as error:
            raise ValueError(str(error)) from None

    # ------------------------------------------------------------------ TAG's budget
    @property
    def searches_tag_budget(self) -> bool:
        """Whether the helper budget is decided by the search (``tag.policy=auto``), not fixed by the plan."""
        return self.system == "digenrl" and self.tag and self.tag_policy == "auto"

    def tag_budget(self, num_fragments: int) -> int:
        """Fragments each trainer rank may generate per iteration: 0 without TAG (and before ``auto`` has
        searched one), ``tag_max_fragments`` with ``always`` (0 = no limit: every fragment)."""
        if not self.tag or self.tag_policy == "auto":
            return 0
        return self.tag_max_fragments or num_fragments

    def with_tag_budget(self, budget: int) -> RunPlan:
        """The plan with a fixed helper budget per trainer rank (``tag.policy=always``,
        ``tag.max_fragments=budget``); 0 is the TAG-off plan."""
        if budget == 0:
            return replace(self, tag=False, tag_policy="auto", tag_max_fragments=0, park_grads=False)
        return replace(self, tag=True, tag_policy="always", tag_max_fragments=budget)

    def with_(self, **changes: Any) -> RunPlan:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    # ------------------------------------------------------------------ text
    def _memory_knobs(self) -> list[str]:
        knobs = []
        if self.micro_batch_size is not None:
            knobs.append(f"micro-batch {self.micro_batch_size}")
        if self.activation_checkpointing:
            knobs.append("activation ckpt")
        if self.trainer_sharding != "flat":
            knobs.append(f"{self.trainer_sharding} sharding")
        if self.sequence_parallel > 1:
            knobs.append(f"sequence parallel {self.sequence_parallel}")
        if self.generator_sequence_parallel > 1:
            knobs.append(f"generator sequence parallel {self.generator_sequence_parallel}")
        if self.samples_per_forward:
            knobs.append(f"{self.samples_per_forward} samples/forward")
        return knobs

    def describe(self) -> str:
        """One line with only the knobs that matter for this system."""
        if self.colocated:
            knobs = []
            if self.work_split != "equal":
                knobs.append(f"speed-proportional split ({self.work_split})")
            if not self.train_resident:
                knobs.append("optimizer parked")
            if not self.reward_resident:
                knobs.append("reward parked")
            if self.system == "colocated-engine":
                knobs.append("states offloaded" if self.engine_offload else "both copies resident")
            if self.system == "colocated-overlap":
                sub = (
                    "runtime rule"
                    if self.overlap_sub_batches is None
                    else f"{self.overlap_sub_batches} (simulator only)"
                )
                knobs.append(f"sub_batches={sub}")
            knobs += self._memory_knobs()
            return f"{self.system} ({', '.join(knobs)})" if knobs else self.system
        pools = f"{self.trainers} trainers + {self.generators} generators"
        if self.scorers:
            pools += f" + {self.scorers} scorers"
        if self.system == "separate-async":
            return (
                f"{self.system} ({pools}, max_staleness={self.max_staleness}, "
                f"sync_interval={self.weight_sync_interval}, "
                f"{'reap-before-launch' if self.reap_before_launch else 'launch-first'})"
            )
        if self.system == "digenrl":
            tag = "off"
            if self.tag and self.tag_policy == "auto":
                tag = "auto" + (f" <= {self.tag_max_fragments}" if self.tag_max_fragments else "")
            elif self.tag:
                tag = f"{self.tag_max_fragments or 'any'}/trainer/iter"
            extra = "".join(f", {k}" for k in self._memory_knobs())
            return (
                f"digenrl ({pools}, D={self.pipelines} x S={self.tsp_stages}, {self._fragment_text()}"
                f"/fragment, GAP={'on' if self.gap else 'off'}, TAG={tag}, "
                f"TCSS={self._tcss_text()}; {self.fragment_assignment}, "
                f"{self.train_order} order, {self.transport_mode}{extra})"
            )
        extra = "".join(f", {k}" for k in self._memory_knobs())
        return f"{self.system} ({pools}, {self.transport_mode}{extra})"

    def _fragment_text(self) -> str:
        if self.fragment_samples:
            return f"{self.fragment_samples} samples"
        return f"F={self.fragment_groups} groups"

    def _tcss_text(self) -> str:
        if not self.tcss:
            return "off"
        return "on" if self.tcss_switch == "auto" else f"on, switch {self.tcss_switch}"

    def overrides(self) -> list[str]:
        """The ``experiments/run_train.py`` overrides that run this plan (``key=value``,
        :meth:`config_items`)."""
        return [f"{key}={_override_value(value)}" for key, value in self.config_items().items()]


def _override_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ",".join(str(v) for v in value) + "]"
    return str(value)
