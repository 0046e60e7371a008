"""Typed experiment configuration: dataclasses, YAML + ``key=value`` overrides.

A run is described by one :class:`Config`. ``load_config(path, overrides)`` reads a YAML file and
applies command-line overrides written exactly as a user types them::

    system=colocated-sync profile=cpu-2 model=tiny-sd3 reward=brightness iterations=20 seed=3
    algo.group_size=8 trainer.lr=1e-3 sampler.num_steps=6

A bare section name (``model=…``, ``reward=…``) sets that section's ``name``. Parsing checks every key
against the dataclass fields and every value against its type, naming the key on error.

Each field declares what it may hold, once, in its metadata: a numeric key its finite :class:`Range`
(``within``; NaN and ±inf never pass), an enumeration its allowed values (``among``, reading the tuple
constants below that the modules using the value import too). :func:`declared_fields` walks them and
:mod:`digenrl.validation` checks every value against its declaration at startup, together with what needs
the registries (model, reward, profile and system names), each system's declaration of the knobs it honours
and the table of when every other knob is read. This module imports nothing from the package, so every
other module can import it.

``load_config`` remembers which keys the user set (the YAML file and the overrides), so validation can
reject a knob the run does not read only when somebody asked for it (:func:`explicit_keys`).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """An invalid configuration; the message names the offending key and what is allowed."""


# --------------------------------------------------------------------------- declarations


@dataclass(frozen=True)
class Range:
    """The finite interval a numeric key must lie in; ``why`` says where a bound comes from."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False
    why: str = ""

    def __contains__(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def __str__(self) -> str:
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"{left}{_number(self.low)}, {_number(self.high)}{right}"


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def within(
    low: float, high: float, *, low_open: bool = False, high_open: bool = False, why: str = ""
) -> dict[str, Range]:
    """Field metadata: a numeric key (or each number of a list / mapping-valued key) lies in this range."""
    return {"range": Range(low, high, low_open, high_open, why)}


def among(choices: tuple[Any, ...]) -> dict[str, tuple[Any, ...]]:
    """Field metadata: an enumeration key takes one of ``choices``."""
    return {"choices": choices}


#: The enumerations, declared once: validation reads them from the field metadata, the modules that act on
#: a value import the same tuple.
#: The schedules (docs/design.md §4; each a class of digenrl/systems/) and those that share every rank.
SYSTEMS = (
    "colocated-sync",
    "colocated-overlap",
    "colocated-engine",
    "separate-sync",
    "separate-async",
    "digenrl",
)
COLOCATED_SYSTEMS = ("colocated-sync", "colocated-overlap", "colocated-engine")
#: ``colocated.split``: how a colocated system shares the batch over its ranks (digenrl/data/rank_shares.py)
COLOCATED_SPLITS = ("equal", "speed", "speed-lockstep")
MODEL_DTYPES = ("float32", "bfloat16", "float16")
SAMPLER_TYPES = ("sde", "cps", "dance")
TIMESTEP_SELECTIONS = ("first", "shuffled", "fast-window")
ADV_STD_MODES = ("group", "global")
CFG_GRAD_MODES = ("cond", "both")
"""Values of ``algo.cfg_grad``: which CFG branches the training gradient flows through."""
#: ``algo.name``: the policy-update algorithm (docs/algorithm.md, one section each)
ALGORITHMS = ("flowgrpo", "mixgrpo", "diffusionnft")
#: ``algo.mix_schedule``: how MixGRPO's SDE window moves over the iterations (digenrl/algo/timesteps.py)
MIX_SCHEDULES = ("progressive", "random")
#: ``algo.mix_ode_solver``: the ODE solver after MixGRPO's window (dpm2 = MixGRPO-Flash's DPM-Solver++ 2M)
MIX_ODE_SOLVERS = ("euler", "dpm2")
TRAINER_MODES = ("lora", "full")
#: ``trainer.sharding``: how FSDP2 shards a full fine-tune over the trainer ranks (digenrl/rules/schedule.py)
TRAINER_SHARDINGS = ("flat", "hybrid")
TRAINER_BACKENDS = ("auto", "none", "ddp", "fsdp2", "deepspeed")
NONFINITE_ACTIONS = ("stop", "skip")
#: ZeRO stages of trainer.backend=deepspeed (3 partitions parameters too; docs/design.md §3)
DEEPSPEED_STAGES = (0, 1, 2, 3)
CHECKPOINT_FORMATS = ("auto", "full", "sharded")
NONFINITE_POLICIES = ("drop-group", "abort")
SYNC_MODES = ("auto", *TRAINER_MODES)
RUNTIME_BACKENDS = ("gloo", "nccl")
GAP_ASSIGNMENTS = ("dynamic", "round-robin")
TRAIN_ORDERS = ("index", "arrival")
TAG_POLICIES = ("auto", "always")
#: ``model.cudnn_sdpa`` (digenrl/models/attention_safety.py): the safety table decides per shape, or off
CUDNN_SDPA_SETTINGS = ("auto", "disabled")
#: ``model.text_padding`` (digenrl/models/text_padding.py): padded text with a key mask, or cut per row group
TEXT_PADDING_MODES = ("mask", "split")
#: ``model.compile_mode``: torch.compile's mode (digenrl/models/optimize.py; reduce-overhead = CUDA graphs)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

#: Bounds shared by several keys. A bound is the largest value a real run could want, with room to spare;
#: what lies beyond it is a typo or an overflow, refused before any worker starts.
_COUNT = within(1, 1_000_000)
_NON_NEGATIVE_COUNT = within(0, 1_000_000)
_PIXELS = within(1, 16384)
_SEED = within(0, 2**32 - 1, why="what numpy's and torch's generators both accept")


@dataclass
class ModelConfig:
    """Which generator to train (a key of ``digenrl.models.MODEL_SPECS``) and how to build it."""

    name: str = "tiny-sd3"
    pretrained_path: str | None = None  # local diffusers-style directory; None = random weights
    # parameter/compute dtype of the transformer
    dtype: str = field(default="float32", metadata=among(MODEL_DTYPES))
    height: int | None = field(default=None, metadata=_PIXELS)  # pixels; None = the model's default
    width: int | None = field(default=None, metadata=_PIXELS)
    frames: int | None = field(default=None, metadata=within(1, 10_000))  # video models only
    attention_backend: str = "native"  # a diffusers backend (checked against diffusers' list)
    # auto: cuDNN's fused SDPA stays on where digenrl/models/attention_safety.py's table allows it for this
    # model's attention shape; disabled: off on every rank (A/B, or a failure the table does not know yet)
    cudnn_sdpa: str = field(default="auto", metadata=among(CUDNN_SDPA_SETTINGS))
    # Qwen-Image's padded prompt tokens (digenrl/models/text_padding.py): split = each forward runs rows of
    # one real text length with the padding cut and no attention mask (exact, the unmasked flash / cuDNN
    # kernels); mask = every prompt padded to the encoder's max length, padded keys masked (the pipeline)
    text_padding: str = field(default="split", metadata=among(TEXT_PADDING_MODES))
    # torch.compile the transformer's repeated blocks (digenrl/models/optimize.py); None = on for a CUDA
    # device, off on CPU (the GPU path the cost files measure, docs/design.md §5)
    compile: bool | None = None
    # torch.compile's mode where model.compile is on: default compiles the repeated blocks one by one;
    # reduce-overhead compiles the whole transformer and replays its kernels as CUDA graphs (fewer launches;
    # a graph recorded per input shape; on a CPU torch skips the graphs)
    compile_mode: str = field(default="default", metadata=among(COMPILE_MODES))
    # torch.compile the VAE's decoder network, the score phase's decode (digenrl/models/optimize.py
    # compile_vae_decoder); off: the eager decode
    compile_vae: bool = False
    # 16-bit autocast over the transformer: LoRA matmuls in bf16 (FlowModel.set_autocast); None = on for a
    # CUDA device when model.dtype is 16-bit
    autocast: bool | None = None
    # FP8 (torchao float8, rowwise scales) for the frozen base linears of the transformer's blocks, in the
    # rollout and in training alike (digenrl/models/fp8.py); needs trainer.mode=lora and torchao ('.[fp8]')
    fp8: bool = False

    def optimised(self, device_type: str) -> tuple[bool, bool]:
        """(compile, autocast) a run on ``device_type`` (``cuda`` / ``cpu``) executes: the keys as set, else
        the GPU path (compiled + autocast) on CUDA and the eager path elsewhere."""
        gpu = device_type == "cuda"
        compile_ = gpu if self.compile is None else self.compile
        autocast = (gpu and self.dtype in ("bfloat16", "float16")) if self.autocast is None else self.autocast
        return compile_, autocast


@dataclass
class SamplerConfig:
    """The rollout sampler (FlowGRPO flow-SDE by default). ``None`` takes the model's default."""

    num_steps: int | None = field(default=None, metadata=within(2, 1000))
    sde_type: str = field(default="sde", metadata=among(SAMPLER_TYPES))
    # a in sigma_t = a*sqrt(sigma/(1-sigma)); eta for dance (published models use 0.7 to 1.2)
    noise_level: float | None = field(default=None, metadata=within(0.0, 10.0))
    # CFG scale; <= 1 disables CFG for true-CFG models (published defaults 3.5 to 6)
    guidance_scale: float | None = field(default=None, metadata=within(0.0, 100.0))
    # static sigma shift; None = model default (dynamic for FLUX; published static shifts 1 to 7)
    shift: float | None = field(default=None, metadata=within(0.0, 100.0, low_open=True))
    # max samples in one transformer forward; 0 = a whole rollout batch
    samples_per_forward: int = field(default=0, metadata=_NON_NEGATIVE_COUNT)
    # Ulysses sequence parallelism of the rollout: N consecutive generating ranks of a node shard each
    # forward's tokens and act as one data-parallel member (docs/models.md, "Sequence parallelism"); 1 = off
    sequence_parallel: int = field(default=1, metadata=within(1, 1024))


@dataclass
class AlgoConfig:
    """FlowGRPO hyper-parameters (defaults: FlowGRPO reference configs, docs/algorithm.md)."""

    # G samples per prompt
    group_size: int = field(default=4, metadata=within(2, 1_000_000, why="advantages need a group"))
    prompts_per_iteration: int = field(default=4, metadata=_COUNT)  # P prompts per logical batch (B = P * G)
    timestep_fraction: float = field(default=0.99, metadata=within(0.0, 1.0, low_open=True))
    timestep_selection: str = field(default="first", metadata=among(TIMESTEP_SELECTIONS))
    # SDE steps of timestep_selection=fast-window (at most num_steps // 2)
    fast_window: int = field(default=2, metadata=within(1, 500))
    clip_range: float = field(default=1e-4, metadata=within(0.0, 100.0, low_open=True))
    kl_beta: float = field(default=0.0, metadata=within(0.0, 1000.0))
    adv_std: str = field(default="group", metadata=among(ADV_STD_MODES))
    adv_clamp: float = field(default=5.0, metadata=within(0.0, 1e6, low_open=True))
    num_updates_per_batch: int = field(default=1, metadata=within(1, 1000))
    # with CFG, the training gradient flows through: cond = the conditional branch only (unconditional
    # prediction detached), both = both branches; see digenrl/rollout/sampler.py Sampler.velocity
    cfg_grad: str = field(default="cond", metadata=among(CFG_GRAD_MODES))
    # the algorithm: flowgrpo (FlowGRPO / -Fast / DanceGRPO-style, by timestep_selection) or mixgrpo (an SDE
    # window sliding over the steps, ODE elsewhere; docs/algorithm.md, "MixGRPO")
    name: str = field(default="flowgrpo", metadata=among(ALGORITHMS))
    # MixGRPO (algo.name=mixgrpo): SDE steps in the window, the only trained ones (paper default 4 of 25)
    mix_window: int = field(default=4, metadata=within(1, 1000))
    # steps the window moves each time it moves (published script: 1)
    mix_stride: int = field(default=1, metadata=within(1, 1000))
    # iterations between two moves of a progressive window (published script: 25)
    mix_shift_interval: int = field(default=25, metadata=within(1, 1_000_000))
    mix_schedule: str = field(default="progressive", metadata=among(MIX_SCHEDULES))
    # the ODE solver after the window: euler, or dpm2 (MixGRPO-Flash, DPM-Solver++ 2M on the same grid)
    mix_ode_solver: str = field(default="euler", metadata=among(MIX_ODE_SOLVERS))
    # DiffusionNFT (algo.name=diffusionnft; docs/algorithm.md, "DiffusionNFT"): the guidance strength beta of
    # the implicit positive / negative policies (published 1.0; 0.1 for OCR and multi-reward)
    nft_beta: float = field(default=1.0, metadata=within(0.0, 100.0, low_open=True))
    # DiffusionNFT's ODE rollout solver: dpm2 (DPM-Solver++ 2M, the published `sample.solver`) or euler
    nft_ode_solver: str = field(default="dpm2", metadata=among(MIX_ODE_SOLVERS))
    # GRPO-Guard (arXiv 2510.22319; docs/algorithm.md, "GRPO-Guard"), with sampler.sde_type=sde:
    # RatioNorm, ratio = exp((log r + mean((mu - mu_old)^2) / (2 s^2)) * s), s the transition std
    ratio_norm: bool = False
    # GRPO-Guard's gradient reweighting: each unit's policy loss divided by -dt = sigma - sigma_next
    step_reweight: bool = False


@dataclass
class TrainerConfig:
    """How the policy is updated."""

    mode: str = field(default="lora", metadata=among(TRAINER_MODES))
    # full fine-tuning with FSDP2: flat = shard over every trainer rank; hybrid = shard inside each node of
    # the profile and replicate across nodes (HSDP: per-micro-batch gathers stay on NVLink, one gradient
    # all-reduce per step across nodes; runtime: digenrl/trainer/parallel/fsdp2.py, docs/operations.md)
    sharding: str = field(default="flat", metadata=among(TRAINER_SHARDINGS))
    lora_rank: int = field(default=32, metadata=within(1, 65536))
    lora_alpha: int = field(default=64, metadata=within(1, 1_000_000))
    lora_targets: list[str] | None = None  # None = the family's attention projections
    # real runs use <= 1e-2; up to 1e6 so a test can provoke a non-finite update (trainer.nonfinite)
    lr: float = field(default=3e-4, metadata=within(0.0, 1e6, low_open=True))
    weight_decay: float = field(default=1e-4, metadata=within(0.0, 100.0))
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999], metadata=within(0, 1, high_open=True))
    eps: float = field(default=1e-8, metadata=within(0.0, 1.0, low_open=True))
    grad_clip: float = field(default=1.0, metadata=within(0.0, 1e12, low_open=True))
    micro_batch_size: int = field(default=4, metadata=_COUNT)  # training units per forward/backward
    backend: str = field(default="auto", metadata=among(TRAINER_BACKENDS))
    deepspeed_stage: int = field(default=2, metadata=among(DEEPSPEED_STAGES))  # ZeRO stage
    activation_checkpointing: bool = False
    # Ulysses sequence parallelism of training: N consecutive trainer ranks of a node shard each forward's
    # tokens and act as one data-parallel member (docs/models.md, "Sequence parallelism"); 1 = off
    sequence_parallel: int = field(default=1, metadata=within(1, 1024))
    # a step whose gradient or resulting parameters are not finite is never committed; "stop" raises naming
    # the iteration, "skip" drops the step (weights and optimizer state stay, counted in the metrics)
    nonfinite: str = field(default="stop", metadata=among(NONFINITE_ACTIONS))
    # checkpoint layout: "sharded" = every trainer rank writes its own shards of weights and optimizer state
    # (torch.distributed.checkpoint); "full" = one rank writes full tensors; "auto" = sharded for FSDP2 full
    # fine-tuning, full otherwise (docs/operations.md, "Checkpoints and their formats")
    checkpoint_format: str = field(default="auto", metadata=among(CHECKPOINT_FORMATS))
    # an exponential moving average of the trainable weights, updated after every committed optimizer step n
    # with decay min(ema_decay, n / (9 + n)) (diffusers' EMAModel); 0 = off. Checkpointed and resumed;
    # ``PolicyTrainer.ema_weights()`` swaps it in, ``experiments/export.py --ema`` exports it
    # (digenrl/trainer/ema.py, docs/export.md)
    ema_decay: float = field(default=0.0, metadata=within(0.0, 1.0, high_open=True))


@dataclass
class RewardConfig:
    """The reward (a key of the reward registry) or a weighted sum of several."""

    name: str = "brightness"
    # {reward name: weight}; replaces ``name`` when set (negative weights penalise)
    weights: dict[str, float] | None = field(default=None, metadata=within(-1e6, 1e6))
    weights_path: str | None = None  # local directory of a reward model's weights
    nonfinite_policy: str = field(default="drop-group", metadata=among(NONFINITE_POLICIES))
    # reward=remote (or a "remote" part of reward.weights): the server batches are posted to,
    # http://HOST:PORT (python -m digenrl.rewards.serve; wire format in docs/rewards.md)
    url: str | None = None
    # a remote batch fails after this, retries included, naming the URL
    timeout_s: float = field(default=60.0, metadata=within(0.0, 86_400.0, low_open=True))
    # further attempts after a connection error, a timeout or a 5xx answer
    retries: int = field(default=2, metadata=within(0, 100))
    # a file holding the server's bearer token (python -m digenrl.rewards.serve --token-file)
    token_file: str | None = None

    def remote_settings(self) -> dict[str, object]:
        """Constructor settings of the ``remote`` reward (``digenrl/rewards/remote.py``)."""
        return {
            "url": self.url,
            "timeout_s": self.timeout_s,
            "retries": self.retries,
            "token_file": self.token_file,
        }


@dataclass
class DataConfig:
    """Prompt sets (docs/rewards.md, "Prompt sets"): ``builtin`` / ``builtin:eval`` (small fixed lists
    shipped with the package), a published recipe's set ``NAME:SPLIT`` (``pickscore``, ``geneval``,
    ``ocr``, ``drawbench``; ``train`` / ``eval``), a ``.txt`` file (one prompt per line) or a ``.jsonl``
    file (a ``prompt`` field plus metadata for the rewards)."""

    # training prompts: builtin, a shipped set NAME[:SPLIT] (pickscore, geneval, ocr, drawbench) or a file
    prompts: str = "builtin"
    eval_prompts: str = "builtin:eval"  # held-out prompts for evaluation (same forms; e.g. geneval:eval)


@dataclass
class PoolConfig:
    """How many ranks each pool gets. All zero = colocated (every rank generates and trains).

    Separate layouts give ranks ``[0, trainers)`` to the trainer pool (rank 0 writes metrics and
    checkpoints), the next ``generators`` ranks to the generator pool, then ``scorers``.
    """

    trainers: int = field(default=0, metadata=_NON_NEGATIVE_COUNT)
    generators: int = field(default=0, metadata=_NON_NEGATIVE_COUNT)
    # ranks that only decode and run the reward model (a reward with weights), fed by the generators'
    # last stage (digenrl/rollout/remote_scoring.py); separate-sync, separate-async and digenrl
    scorers: int = field(default=0, metadata=_NON_NEGATIVE_COUNT)


@dataclass
class SyncConfig:
    """Trainer → generator weight sync after each optimizer step."""

    # auto = the lora adapter when trainer.mode=lora, else full; an explicit mode must equal trainer.mode
    mode: str = field(default="auto", metadata=among(SYNC_MODES))
    bucket_mb: float = field(default=64.0, metadata=within(0.0, 65536.0, low_open=True))  # per broadcast
    verify_checksum: bool = True  # compare generator and trainer weight checksums after every sync


@dataclass
class AsyncConfig:
    """UniRL-style asynchronous buffer of ``separate-async`` (docs/references.md [000])."""

    # generations in flight; the reference measured that only 1 avoids transfer stalls
    max_inflight: int = field(default=1, metadata=within(1, 1000))
    # policy versions a buffered group may lag the trainer; 0 = on-policy
    max_staleness: int = field(default=0, metadata=within(0, 1000))


@dataclass
class GapConfig:
    """GAP: stream fragments of whole prompt groups to the trainer (system ``digenrl``,
    docs/design.md §3 "GAP")."""

    enabled: bool = True  # false: the trainer waits for every fragment before training (ablation)
    # prompt groups per fragment; a group never straddles fragments
    fragment_groups: int = field(default=1, metadata=_COUNT)
    # samples per fragment instead (0 = gap.fragment_groups whole groups): any divisor of the batch, also
    # smaller than a group — a group's advantages then wait for all its rewards (docs/design.md §3 "GAP")
    fragment_samples: int = field(default=0, metadata=_NON_NEGATIVE_COUNT)
    # who generates fragment f: "dynamic" = the first free producer claims the next fragment (atomic
    # tickets on the c10d store; TAG helpers claim from the tail); "round-robin" = pipeline f mod D
    assignment: str = field(default="dynamic", metadata=among(GAP_ASSIGNMENTS))
    # the order a trainer takes fragments in: "index" (0, 1, 2, …: a fixed accumulation order, so a run
    # is bit-reproducible) or "arrival" (the lowest-numbered fragment that is ready first)
    train_order: str = field(default="index", metadata=among(TRAIN_ORDERS))


@dataclass
class TspConfig:
    """TSP: the generator pool as D data-parallel pipelines × ``stages`` stages of denoising steps."""

    stages: int = field(default=1, metadata=within(1, 1000))  # S; 1 = plain data parallelism
    # fixed stage boundaries [0, b_1, …, T] for every pipeline (e.g. an even split for an ablation);
    # None = balanced by the predicted step costs (digenrl/tsp/stage_plan.py)
    boundaries: list[int] | None = field(default=None, metadata=within(0, 1000))


@dataclass
class TagConfig:
    """TAG: a trainer rank with no training unit ready generates fragments itself (docs/design.md §3
    "TAG"). A ready training unit always wins; helper work never commits or disturbs a gradient."""

    enabled: bool = True
    # "auto": before each iteration, predict the makespan from measured costs with and without helper
    # fragments (the simulator, digenrl/sim) and help only as much as the prediction says shortens it;
    # "always": help whenever idle and a fragment is left to claim; both leave the generators their share
    # (no claim before every generator holds θ_k, only fragments they would reach later: docs/design.md §3)
    policy: str = field(default="auto", metadata=among(TAG_POLICIES))
    # most fragments one trainer rank generates per iteration; 0 = no limit (policy "auto" picks at most this)
    max_fragments: int = field(default=0, metadata=_NON_NEGATIVE_COUNT)
    # move pending gradients to host memory while generating (frees device memory; restored bit-exactly)
    park_grads: bool = False


@dataclass
class TcssConfig:
    """TCSS: generators start iteration k+1 with θ_k while the trainer finishes k; θ_{k+1} takes effect at
    a fragment boundary, so every trajectory has one policy version and is at most one version stale
    (docs/design.md §3 "TCSS"). Opt-in: it changes the algorithm."""

    enabled: bool = False
    # which fragments of iteration k+1 use θ_k, fixed by the plan so a run is reproducible: a fragment
    # index s (fragments [0, s) use θ_k, [s, F) θ_{k+1}) or "auto" = F (all of them); "timing": θ_{k+1}
    # applies at whichever fragment boundary follows its arrival (not reproducible).
    # digenrl/async_policy/tcss.py
    switch: str = "auto"


@dataclass
class ResidencyConfig:
    """Colocated layouts: which roles keep their state on the device while idle (docs/references.md
    [001]).

    The rollout shares the trainer's weights in DigenRL's colocated systems, so ``train`` parks the
    optimizer state during generation and scoring; ``reward`` parks a reward model's weights.
    """

    train_resident: bool = True
    reward_resident: bool = True


@dataclass
class ColocatedConfig:
    """Colocated systems: how the iteration's samples are shared over the ranks (docs/design.md §4, "Work
    split"; :mod:`digenrl.data.rank_shares`). ``equal``: the same number of samples on every rank;
    ``speed``: samples in proportion to the hardware profile's ``relative_speed``, full-size micro-batches,
    uneven counts (the strongest colocated plan on mixed devices; needs a backend that reduces once per
    step, e.g. LoRA's ddp); ``speed-lockstep``: samples and micro-batch size in proportion to speed, the
    same number of micro-batch steps on every rank (for FSDP2 / ZeRO-2/3)."""

    split: str = field(default="equal", metadata=among(COLOCATED_SPLITS))


@dataclass
class EngineConfig:
    """``colocated-engine`` (veRL-style hybrid engine, docs/design.md §4): ``offload`` moves the trainer's
    states (optimizer state, gradients; with ``trainer.mode=full`` the weights too) to host memory while the
    generation copy of the policy generates, and the generation copy to host memory while the trainer
    trains; false keeps both on the device (needs room for both, checked at startup)."""

    # colocated-engine: the trainer's states go to host memory while the generation copy generates, and back
    offload: bool = True


#: The smallest ``runtime.timeout_s`` a run accepts: it bounds every distributed wait, the process group's
#: start included, while ranks still import, build their models and meet in c10d's rendezvous seconds apart,
#: and the hang watchdog declares a rank hung after a third of it (digenrl/runtime/faults/watchdog.py): 1 s
#: killed a healthy run during setup, 0.001 s failed inside c10d.
MIN_TIMEOUT_S = 10.0
_TIMEOUT_WHY = (
    "it bounds every distributed wait, including the start of the process group while the ranks still "
    "import, build their models and meet in c10d's rendezvous, and the hang watchdog declares a rank hung "
    "after a third of it"
)


@dataclass
class RuntimeConfig:
    """Distributed runtime knobs."""

    # None = the hardware profile's backend (nccl on GPUs, gloo on CPUs)
    backend: str | None = field(default=None, metadata=among(RUNTIME_BACKENDS))
    # every distributed wait fails after this, naming rank and peer (at most a week)
    timeout_s: float = field(default=300.0, metadata=within(MIN_TIMEOUT_S, 604800.0, why=_TIMEOUT_WHY))
    # a real-size model (not tiny-*) on a CPU device is refused at startup with its memory estimate unless
    # this is true (digenrl/validation.py validate_devices)
    allow_large_cpu_model: bool = False
    # a rank whose real device is not the profile's (an H100 under profile=h200-1, a CPU under a GPU profile)
    # is refused at startup unless this is true: then a warning in the banner, in every metrics.jsonl record
    # (profile_mismatch) and the closing summary, and the bound uses the real device's numbers
    allow_profile_mismatch: bool = False
    # several ranks of one job on one GPU (docs/operations.md, "Shared-device mode"): every rank builds its
    # models on the GPU, collectives run on gloo, point-to-point transfers stage through pinned host memory.
    # For testing every CUDA path of the schedules on one GPU; its timings are not a multi-GPU result.
    share_device: bool = False
    # deterministic kernels (torch.use_deterministic_algorithms, docs/operations.md "Reproducible runs"):
    # two runs, or two schedules, then round alike; slower, and an op without a deterministic kernel raises
    deterministic: bool = False
    # write out_dir/batches/rank<r>.jsonl: which samples each forward, decode and micro-batch ran on, in
    # order (digenrl/runtime/reproducibility/batch_ledger.py), to check that two schedules compute on the same
    # batches
    record_batches: bool = False
    # profile this iteration on every rank with torch.profiler: device time per phase and kind of kernel in
    # out_dir/profile/rank<r>.{json,md} and the trace (docs/operations.md, "Profiling an iteration")
    profile_iteration: int | None = field(default=None, metadata=within(0, 10_000_000))
    # the startup memory checks (memory_check below; shared-device mode's) price each rank's activations from
    # the measured cost file <costs_dir>/<device>-<model>.json (experiments/results/costs in a checkout);
    # None = activations not counted, and no memory_check
    costs_dir: str | None = None
    # on GPUs, refuse at startup a run whose planner estimate of a rank's peak (digenrl/planning/memory.py,
    # from costs_dir's cost file) is above its device's memory, and warn above the usable share; false: no
    # check (digenrl/validation.py check_device_memory)
    memory_check: bool = True
    # system=colocated-overlap: the background scorer decodes and scores on its own CUDA stream, after the
    # generation of its sub-batch, so that GPU work overlaps the next sub-batch's generation instead of
    # queueing behind it on the default stream (digenrl/systems/colocated_overlap.py); no effect on a CPU
    score_stream: bool = True


@dataclass
class ResumeConfig:
    """Continue the run in ``out_dir`` from a checkpoint (docs/operations.md, "Runs: resume, overwrite and
    the lock"); ``resume=true`` is shorthand for ``resume.enabled=true``."""

    enabled: bool = False
    # the checkpoint to resume (step_<step>); None = the one ``latest`` names
    step: int | None = field(default=None, metadata=within(0, 10_000_000))


@dataclass
class CheckpointConfig:
    """What a checkpoint holds beyond the trainer state (``checkpoint_every`` / ``checkpoint_keep`` say
    when and how many)."""

    # LoRA runs: also write the adapter in diffusers' format into every checkpoint, step_<n>/lora_diffusers/
    # (and lora_diffusers_ema/ with trainer.ema_decay > 0), loadable with ``pipe.load_lora_weights(dir)``
    # (docs/export.md)
    export_lora: bool = False


@dataclass
class EvalConfig:
    """Evaluation on held-out prompts (``data.eval_prompts``) during training (docs/operations.md, "Reading a
    run"; digenrl/rollout/evaluate.py): at the start of every ``every``-th iteration and after the last, with
    the same initial noise every time, each result in ``metrics.jsonl`` (``eval_*``) and as a captioned grid
    in ``out_dir/samples/``."""

    # iterations between evaluations (iteration 0, every N-th, and the final policy); 0 = off
    every: int = field(default=0, metadata=within(0, 10_000_000))
    # denoising steps; None = the model's evaluation default (FlowGRPO: 40 for SD3, 28 for FLUX, 50 for
    # Qwen-Image and Wan; docs/algorithm.md, "Rollout settings")
    num_steps: int | None = field(default=None, metadata=within(2, 1000))
    # false = the deterministic ODE sampler (noise_level 0, as FlowGRPO evaluates); true = the training SDE
    sde: bool = False
    # evaluate the EMA of the weights (needs trainer.ema_decay > 0) instead of the trained weights
    use_ema: bool = False
    # the first N prompts of data.eval_prompts, one sample each
    num_prompts: int = field(default=8, metadata=within(1, 100_000))
    # samples per rollout call on one rank; 0 = the rank's whole share at once
    batch_size: int = field(default=0, metadata=_NON_NEGATIVE_COUNT)


WANDB_MODES = ("online", "offline")


@dataclass
class LoggerConfig:
    """Where metrics and sample grids go besides ``metrics.jsonl`` and ``samples/`` (TensorBoard: automatic
    when installed). Weights & Biases is optional (``pip install -e ".[wandb]"``), never imported unless
    ``wandb`` is true."""

    wandb: bool = False
    wandb_project: str = "digenrl"
    wandb_run_name: str | None = None  # None = the out_dir's name
    # offline writes out_dir/wandb/ only (``wandb sync`` uploads it later)
    wandb_mode: str = field(default="online", metadata=among(WANDB_MODES))


@dataclass
class Config:
    """One experiment."""

    system: str = field(default="colocated-sync", metadata=among(SYSTEMS))
    # auto: this node's devices (digenrl/runtime/hardware/profiles.py auto_profile); multi-node or mixed
    # clusters name a profile (hardware_profiles/*.yaml) or a YAML file
    profile: str = "auto"
    iterations: int = field(default=10, metadata=within(1, 10_000_000))
    seed: int = field(default=0, metadata=_SEED)
    out_dir: str = "runs/tiny"
    # iterations between checkpoints (and always one at the end); 0 = end only
    checkpoint_every: int = field(default=10, metadata=within(0, 10_000_000))
    # newest complete checkpoints kept; older ones go once a new one is published; 0 = all
    checkpoint_keep: int = field(default=2, metadata=_NON_NEGATIVE_COUNT)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    resume: ResumeConfig = field(default_factory=ResumeConfig)
    overwrite: bool = False  # a fresh run into an out_dir that holds a run deletes that run's files first
    model: ModelConfig = field(default_factory=ModelConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    data: DataConfig = field(default_factory=DataConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    pools: PoolConfig = field(default_factory=PoolConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    asynchrony: AsyncConfig = field(default_factory=AsyncConfig)
    residency: ResidencyConfig = field(default_factory=ResidencyConfig)
    colocated: ColocatedConfig = field(default_factory=ColocatedConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    gap: GapConfig = field(default_factory=GapConfig)
    tsp: TspConfig = field(default_factory=TspConfig)
    tag: TagConfig = field(default_factory=TagConfig)
    tcss: TcssConfig = field(default_factory=TcssConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def declared_fields(cfg: Config) -> Iterator[tuple[str, Any, Mapping[str, Any]]]:
    """Every leaf key of ``cfg`` as ``(dotted key, value, field metadata)``: what :func:`within` and
    :func:`among` declared for it (empty for names, paths and switches)."""
    for section in dataclasses.fields(cfg):
        value = getattr(cfg, section.name)
        if dataclasses.is_dataclass(value):
            for leaf in dataclasses.fields(value):
                yield f"{section.name}.{leaf.name}", getattr(value, leaf.name), leaf.metadata
        else:
            yield section.name, value, section.metadata


# --------------------------------------------------------------------------- parsing


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check/convert ``value`` to the annotated type ``tp``; errors name ``key``."""
    inner, optional = _unwrap_optional(tp)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{key} may not be null")
    origin = typing.get_origin(inner)
    if inner is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    if inner is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    if inner is float:
        if isinstance(value, int | float | str) and not isinstance(value, bool):
            try:  # YAML 1.1 reads "1e-3" (no dot) as a string
                return float(value)
            except ValueError:
                pass
            except OverflowError:  # an integer beyond float range; the range check names the key's bounds
                return math.inf if value > 0 else -math.inf
        raise ConfigError(f"{key} must be a number, got {value!r}")
    if inner is str:
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key} must be a string, got {value!r}")
    if origin is list:
        (item_tp,) = typing.get_args(inner)
        if not isinstance(value, list):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        return [_coerce(f"{key}[{i}]", v, item_tp) for i, v in enumerate(value)]
    if origin is dict:
        key_tp, val_tp = typing.get_args(inner)
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping, got {value!r}")
        return {_coerce(f"{key} key", k, key_tp): _coerce(f"{key}.{k}", v, val_tp) for k, v in value.items()}
    raise ConfigError(f"{key}: unsupported type {inner!r}")  # pragma: no cover - programming error


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _set(obj: Any, path: list[str], value: Any, full_key: str) -> list[str]:
    """Set ``path`` below ``obj``; returns the dotted leaf keys it set (a mapping value sets several)."""
    types_ = _field_types(type(obj))
    name = path[0]
    if name not in types_:
        prefix = full_key[: len(full_key) - len(".".join(path))]
        allowed = ", ".join(prefix + n for n in types_)
        raise ConfigError(f"unknown config key {full_key!r}; allowed keys here: {allowed}")
    current = getattr(obj, name)
    if dataclasses.is_dataclass(current):
        if len(path) == 1:
            if isinstance(value, dict):
                nested = [_set(current, [str(k)], v, f"{full_key}.{k}") for k, v in value.items()]
                return [key for keys in nested for key in keys]
            if "name" in _field_types(type(current)):
                # ``model=tiny-flux`` is shorthand for ``model.name=tiny-flux``.
                return _set(current, ["name"], value, f"{full_key}.name")
            if "enabled" in _field_types(type(current)) and isinstance(value, bool):
                # ``gap=false`` is shorthand for ``gap.enabled=false``.
                return _set(current, ["enabled"], value, f"{full_key}.enabled")
            raise ConfigError(f"{full_key} is a section; set its keys as {full_key}.<key>=value")
        return _set(current, path[1:], value, full_key)
    if len(path) > 1:
        raise ConfigError(
            f"{'.'.join(full_key.split('.')[: -len(path) + 1])} is not a section (in {full_key!r})"
        )
    setattr(obj, name, _coerce(full_key, value, types_[name]))
    return [full_key]


def _record(cfg: Config, keys: list[str], source: str) -> None:
    """Remember that ``keys`` were set by the user, and where (for :func:`explicit_keys`)."""
    explicit = cfg.__dict__.setdefault("_explicit", {})
    for key in keys:
        explicit[key] = source


def explicit_keys(cfg: Config) -> dict[str, str]:
    """The dotted keys the user set, each with where it was set (a YAML path or "the command line").

    Defaults are not listed: a system may ignore a section at its defaults, but a knob somebody set and
    the system does not honour is an error (:mod:`digenrl.validation`). A Config built in code has none.
    """
    return dict(cfg.__dict__.get("_explicit", {}))


ALIASES = {"tsp_stages": "tsp.stages"}
"""Top-level spellings of nested keys, as the mechanisms are usually written (``tsp_stages=2``); they work
on the command line and at the top level of a YAML file alike."""


def parse_override(text: str) -> tuple[str, Any]:
    """``"algo.group_size=8"`` → ``("algo.group_size", 8)``; values are parsed as YAML scalars."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key=value")
    key, raw = text.split("=", 1)
    key = ALIASES.get(key.strip(), key.strip())
    if not key:
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"cannot parse the value of {key}: {raw!r} ({exc})") from exc
    if key.split(".")[-1] in _STRING_KEYS and value is not None and not isinstance(value, str):
        value = raw  # names like ``profile=1`` or ``out_dir=2024`` stay strings
    return key, value


_STRING_KEYS = {
    "name",
    "system",
    "profile",
    "out_dir",
    "pretrained_path",
    "weights_path",
    "prompts",
    "eval_prompts",
    "url",
    "wandb_project",
    "wandb_run_name",
    "costs_dir",
}


COMMAND_LINE = "the command line"
"""Where :func:`explicit_keys` says an override was set; a config file is named by its path."""


def apply_overrides(
    cfg: Config, overrides: dict[str, Any] | list[str], *, source: str = COMMAND_LINE
) -> Config:
    items = [parse_override(o) for o in overrides] if isinstance(overrides, list) else list(overrides.items())
    for key, value in items:
        _record(cfg, _set(cfg, key.split("."), value, key), source)
    return cfg


def load_config(
    path: str | Path | None = None, overrides: list[str] | dict[str, Any] | None = None
) -> Config:
    """Build a :class:`Config` from a YAML file (optional) and overrides; does not validate names
    (:func:`digenrl.validation.validate_config` does).

    A run's resolved ``config.yaml`` (first line ``# run_id: …``, :func:`save_config`) lists every key, read
    or not, of a run that passed validation: none of them counts as set by the user, so the file loads and
    validates as the config of the same run (``--config runs/a/config.yaml``) instead of tripping the knob
    rules; command-line overrides on top still count."""
    cfg = Config()
    if path is not None:
        data = read_yaml(path, "config file", "--config") or {}  # an empty file: the defaults
        if not isinstance(data, dict):
            raise ConfigError(f"config file {str(path)!r} must hold a mapping at top level")
        set_here: dict[str, str] = {}
        for spelled, value in data.items():
            key = ALIASES.get(str(spelled), str(spelled))
            for leaf in _set(cfg, key.split("."), value, key):
                if leaf in set_here:
                    raise ConfigError(
                        f"config file {path} sets {leaf} twice (as {set_here[leaf]} and as {spelled}); "
                        "keep one"
                    )
                set_here[leaf] = str(spelled)
        if not (_is_resolved_config(path) and _lists_every_key(data)):  # a forged header is not enough
            _record(cfg, list(set_here), str(path))
    if overrides:
        apply_overrides(cfg, overrides)
    return cfg


def _lists_every_key(data: dict[str, Any]) -> bool:
    """Whether ``data`` sets every declared key, as a run's resolved ``config.yaml`` does."""
    for name, _, _ in declared_fields(Config()):
        node: Any = data
        for part in name.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
    return True


def _is_resolved_config(path: str | Path) -> bool:
    """Whether ``path`` is a run's resolved config (its first line names the run, :func:`save_config`)."""
    with open(path, encoding="utf-8", errors="replace") as stream:
        return stream.readline().startswith(RUN_ID_HEADER)


# --------------------------------------------------------------------------- files named by keys


def read_text_file(path: str | Path, key: str) -> str:
    """The UTF-8 text of the file ``key`` names; a :class:`ConfigError` naming the key and the file if it
    is missing, unreadable, binary or in another encoding (never a bare ``UnicodeDecodeError``)."""
    path = Path(path)
    if not path.is_file():
        what = "a directory" if path.is_dir() else "not an existing file"
        raise ConfigError(f"{key}={str(path)!r} is {what}")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{key}={str(path)!r} cannot be read: {exc.strerror or exc}") from None
    if b"\0" in raw:
        raise ConfigError(
            f"{key}={str(path)!r} is a binary file (a NUL byte at offset {raw.index(0)}); it must be text"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{key}={str(path)!r} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
            "save it as UTF-8"
        ) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a mapping holding a key twice is an error (PyYAML keeps the last
    one silently, so a config would run with a value its author may not see)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[tuple[str, str], yaml.Node] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                seen = first.setdefault((key_node.tag, key_node.value), key_node)
                if seen is not key_node:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"duplicate key {key_node.value!r} (first on line {seen.start_mark.line + 1})",
                        key_node.start_mark,
                    )
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path, what: str, key: str) -> Any:
    """The YAML document in the file ``key`` names (``what``: how messages call it, e.g. "config file"):
    a :class:`ConfigError` naming the file, line and column for malformed YAML or a duplicate key."""
    text = read_text_file(path, key)
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: builds plain data only
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}, line {mark.line + 1}, column {mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        if problem.startswith("duplicate key"):
            raise ConfigError(f"{what} {where}: {problem}; a key may appear once in a mapping") from None
        raise ConfigError(f"{what} {where}: not valid YAML ({problem})") from None


#: The first line of a run's resolved config.yaml, before the run's id.
RUN_ID_HEADER = "# run_id: "


def save_config(cfg: Config, path: str | Path, *, run_id: str | None = None) -> None:
    """Write ``cfg`` as YAML (atomically: a crash leaves the old file or the new one). ``run_id`` goes into
    a leading comment, so the file still loads as a config (``--config out_dir/config.yaml``)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(config_yaml(cfg, run_id=run_id))
    tmp.replace(path)


def config_yaml(cfg: Config, *, run_id: str | None = None) -> str:
    """``cfg`` as the YAML text :func:`save_config` writes, every key in declaration order (a run's own
    ``config.yaml`` is written from it without following links, digenrl/runtime/run_folder/run_files.py; also
    what ``run_train.py --print-config`` prints)."""
    header = f"{RUN_ID_HEADER}{run_id}\n" if run_id else ""
    return header + yaml.safe_dump(cfg.to_dict(), sort_keys=False)


# --------------------------------------------------------------------------- run identity

RESUMABLE_KEYS = (
    "iterations",
    "resume",  # the section: resume.enabled, resume.step
    "overwrite",
    "out_dir",
    "checkpoint_every",
    "checkpoint_keep",
    "checkpoint",  # the section: checkpoint.export_lora
    "trainer.checkpoint_format",
    "runtime.timeout_s",
    "eval",  # the section: evaluation reads the policy, never changes it
    "logger",
)
"""Keys a resumed run may set differently from the checkpoint it continues (docs/operations.md, "Runs: resume,
overwrite and the lock"): how long the run goes on, where, how often and in which format it saves (the loader
reads the format from the checkpoint), how long a wait may take. Everything else defines what the run computes
(the system, the model, the algorithm, the layout), so a resume that changes it is refused instead of mixing
two runs' data in one out_dir."""


def dotted_items(tree: dict[str, Any]) -> dict[str, Any]:
    """A ``Config.to_dict()`` as the dotted keys a user types: ``{"trainer": {"lr": 1}}`` →
    ``{"trainer.lr": 1}`` (mapping-valued fields such as ``reward.weights`` stay one value)."""
    sections = {name for name, tp in _field_types(Config).items() if dataclasses.is_dataclass(tp)}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if key in sections and isinstance(value, dict):
            out.update({f"{key}.{sub}": item for sub, item in value.items()})
        else:
            out[key] = value
    return out


class _Absent:
    """A key one of two configs does not have (written by another version of the package)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Absent)

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "(absent)"


@dataclass(frozen=True)
class _AbsentAtDefault:
    """A key the checkpoint does not have, standing for its default (equal to it)."""

    default: Any

    def __eq__(self, other: object) -> bool:
        return self.default == other

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return f"(absent, so its default {self.default!r})"


def config_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Every key outside :data:`RESUMABLE_KEYS` (a section there covers its keys, and a checkpoint's
    ``resume: true`` of before it was a section) whose value differs between two ``Config.to_dict()``s,
    as ``"key: <saved> in the checkpoint, <current> now"`` lines (empty: the run may resume).

    A key the checkpoint does not have (a newer version of the package added it) counts as its default
    there: the older run computed what the default computes, so only a non-default value now differs."""
    old, new = dotted_items(saved), dotted_items(current)
    defaults = dotted_items(Config().to_dict())
    old = {**{k: _AbsentAtDefault(v) for k, v in defaults.items() if k not in old and k in new}, **old}
    absent = _Absent()
    return [
        f"{key}: {old.get(key, absent)!r} in the checkpoint, {new.get(key, absent)!r} now"
        for key in sorted(old.keys() | new.keys())
        if key not in RESUMABLE_KEYS
        and key.partition(".")[0] not in RESUMABLE_KEYS
        and old.get(key, absent) != new.get(key, absent)
    ]
