"""Name → reward registry and the weighted-sum composite reward.

Rewards register themselves with :func:`register_reward`; the built-in modules are imported lazily on
first lookup so that ``import digenrl.rewards`` stays cheap (no transformers import) and so that reward
modules can import this one without a cycle. Multiple rewards combine as a weighted sum, as FlowGRPO's
``multi_score`` does (flow_grpo/rewards.py: ``score_dict`` of name → weight).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch
from torch import Tensor

from digenrl.rewards.base import PromptMetadata, RewardFunction

REMOTE = "remote"  # the registry name of digenrl/rewards/remote.py's reward

_BUILTIN_MODULES = (
    "digenrl.rewards.jpeg",
    "digenrl.rewards.image_stats",
    "digenrl.rewards.pickscore",
    "digenrl.rewards.aesthetic",
    "digenrl.rewards.vlm_judge",
    "digenrl.rewards.clipscore",
    "digenrl.rewards.hpsv2",
    "digenrl.rewards.imagereward",
    "digenrl.rewards.ocr",
    "digenrl.rewards.geneval",
    "digenrl.rewards.video",
    "digenrl.rewards.remote",
)

_REGISTRY: dict[str, type[RewardFunction]] = {}
_builtins_loaded = False

R = TypeVar("R", bound=type[RewardFunction])


def register_reward(name: str) -> Callable[[R], R]:
    """Class decorator: register a :class:`RewardFunction` subclass under ``name`` (sets ``cls.name``)."""

    def decorate(cls: R) -> R:
        if not (isinstance(cls, type) and issubclass(cls, RewardFunction)):
            raise TypeError(f"register_reward({name!r}) must decorate a RewardFunction subclass, got {cls!r}")
        existing = _REGISTRY.get(name)
        if existing is not None and existing.__qualname__ != cls.__qualname__:
            raise ValueError(f"reward name {name!r} is already registered by {existing.__qualname__}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorate


def _load_builtins() -> None:
    global _builtins_loaded
    if not _builtins_loaded:
        for module in _BUILTIN_MODULES:
            importlib.import_module(module)
        _builtins_loaded = True


def available_rewards() -> list[str]:
    """Sorted names accepted by :func:`build_reward`."""
    _load_builtins()
    return sorted(_REGISTRY)


def reward_class(name: str) -> type[RewardFunction]:
    """The class registered as ``name`` (its constructor's keyword arguments are the reward's settings)."""
    _load_builtins()
    if name not in _REGISTRY:
        raise ValueError(f"unknown reward {name!r}; allowed values: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def reward_needs_weights(name: str) -> bool:
    """Whether reward ``name`` runs a model (and so could live on scorer ranks), whether or not its weights
    are optional (``RewardFunction.weights_optional``)."""
    return bool(reward_class(name).needs_weights)


def whole_group_rewards(names: list[str]) -> list[str]:
    """Those of ``names`` that score a prompt group's samples together (``RewardFunction.needs_whole_group``:
    a group split over fragments cannot be scored piece by piece)."""
    return [name for name in names if reward_class(name).needs_whole_group]


def build_reward(
    name: str,
    *,
    weights_path: str | None = None,
    device: torch.device | str = "cpu",
    **kwargs: Any,
) -> RewardFunction:
    """Instantiate the reward registered as ``name``.

    ``weights_path`` is the LOCAL directory of a reward that needs weights (``needs_weights``); it is
    passed to the reward's constructor. A reward with ``weights_optional`` also builds without it (random
    weights at its real size, for cost measurements; the VLM judge), so it receives ``None``. Rewards
    without weights reject a ``weights_path`` so that a misconfigured run fails at start-up rather than
    silently ignoring the path.
    """
    _load_builtins()
    cls = _REGISTRY.get(name)
    if cls is None:
        raise ValueError(f"unknown reward {name!r}; allowed values: {', '.join(sorted(_REGISTRY))}")
    if cls.needs_weights:
        if cls.weights_optional:
            return cls(weights_path=weights_path or None, device=device, **kwargs)
        if not weights_path:
            raise ValueError(
                f"reward {name!r} needs weights: set reward.weights_path to a local directory "
                f"(model hubs are not contacted)"
            )
        return cls(weights_path=weights_path, device=device, **kwargs)
    if weights_path is not None:
        raise ValueError(f"reward {name!r} takes no weights; leave reward.weights_path unset for it")
    return cls(device=device, **kwargs)


def build_configured_reward(
    name: str,
    weights: Mapping[str, float] | None,
    weights_path: str | None,
    device: torch.device | str,
    *,
    remote: Mapping[str, Any] | None = None,
) -> RewardFunction:
    """The reward of a run's ``reward.*`` config: ``reward.name``, or the weighted sum ``reward.weights``
    (whose one part with a model gets ``reward.weights_path``). A reward without a model ignores
    ``reward.weights_path``, as a weighted sum without one does: startup validation has rejected the key
    unless a command-line override chose the reward (digenrl/validation.py KNOB_RULES). ``remote``: the
    ``remote`` reward's settings (``RewardConfig.remote_settings``: url, timeout_s, retries), given to it
    wherever it appears."""
    remote_kwargs = {REMOTE: dict(remote or {})}
    if not weights:
        path = weights_path if reward_needs_weights(name) else None
        return build_reward(name, weights_path=path, device=device, **remote_kwargs.get(name, {}))
    with_models = [n for n in weights if reward_needs_weights(n)]
    if len(with_models) > 1 and weights_path:
        raise ValueError(
            f"reward.weights has several rewards with models ({', '.join(with_models)}) but one "
            "reward.weights_path: a weighted sum can take the weights of one of them"
        )
    paths = {with_models[0]: weights_path} if with_models and weights_path else {}
    kwargs = {n: remote_kwargs[n] for n in weights if n in remote_kwargs}
    return CompositeReward.from_spec(weights, weights_paths=paths, device=device, reward_kwargs=kwargs)


class CompositeReward(RewardFunction):
    """Weighted sum ``Σ_k w_k · r_k`` of rewards (FlowGRPO ``multi_score``, flow_grpo/rewards.py).

    Because the sum is linear, summing per-frame scores and then averaging frames (what the base class
    does for videos) equals averaging each part over frames first. A NaN in any part makes the sum NaN,
    so non-finite handling sees it.
    """

    name = "composite"

    def __init__(self, parts: list[tuple[RewardFunction, float]], device: torch.device | str = "cpu") -> None:
        super().__init__(device)
        if not parts:
            raise ValueError("CompositeReward parts must contain at least one (reward, weight) pair")
        for reward, weight in parts:
            if not isinstance(reward, RewardFunction):
                raise ValueError(f"CompositeReward parts must hold RewardFunction instances, got {reward!r}")
            if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight):
                raise ValueError(
                    f"CompositeReward weight for {reward.name!r} must be a finite number, got {weight!r}"
                )
        self.parts = [(reward, float(weight)) for reward, weight in parts]
        self.needs_weights = any(reward.needs_weights for reward, _ in self.parts)
        self.name = "+".join(f"{weight:g}*{reward.name}" for reward, weight in self.parts)

    def modules(self) -> list[torch.nn.Module]:
        """Every part's models (a weighted sum parks and counts all of them)."""
        return [m for reward, _ in self.parts for m in reward.modules()]

    @classmethod
    def from_spec(
        cls,
        spec: Mapping[str, float],
        *,
        weights_paths: Mapping[str, str] | None = None,
        device: torch.device | str = "cpu",
        reward_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> CompositeReward:
        """Build from ``{"jpeg-compressibility": 1.0, "brightness": 0.5}``.

        ``weights_paths`` maps reward name → local weights directory (only for rewards that need weights);
        ``reward_kwargs`` maps reward name → extra constructor kwargs (e.g. ``{"jpeg-compressibility":
        {"scale": 1 / 500}}``).
        """
        if not isinstance(spec, Mapping) or not spec:
            raise ValueError(f"reward spec must be a non-empty mapping of reward name → weight, got {spec!r}")
        weights_paths = dict(weights_paths or {})
        reward_kwargs = dict(reward_kwargs or {})
        for key in [*weights_paths, *reward_kwargs]:
            if key not in spec:
                raise ValueError(
                    f"reward {key!r} has weights_paths/reward_kwargs but is not in the spec {list(spec)}"
                )
        parts = [
            (
                build_reward(
                    name,
                    weights_path=weights_paths.get(name),
                    device=device,
                    **dict(reward_kwargs.get(name, {})),
                ),
                weight,
            )
            for name, weight in spec.items()
        ]
        return cls(parts, device=device)

    def score_images(self, images: Tensor, prompts: list[str]) -> Tensor:
        return self.score_batch(images, prompts, [{} for _ in prompts])

    def score_batch(self, images: Tensor, prompts: list[str], metadata: list[PromptMetadata]) -> Tensor:
        total = torch.zeros(images.shape[0], dtype=torch.float32, device=images.device)
        for reward, weight in self.parts:
            part = reward.score_batch(images, prompts, metadata)
            total = total + weight * part.to(images.device, torch.float32)
        return total

    def __call__(
        self, images: Tensor, prompts: list[str], metadata: list[PromptMetadata] | None = None
    ) -> Tensor:
        """``Σ_k w_k · r_k(images)``, each part called whole, so a part that scores a video's frames together
        (``scores_whole_videos``) gets the video, not its frames."""
        parts = [weight * reward(images, prompts, metadata) for reward, weight in self.parts]
        return torch.stack(parts).sum(dim=0)

    def score_parts(
        self, images: Tensor, prompts: list[str], metadata: list[PromptMetadata] | None = None
    ) -> dict[str, Tensor]:
        """Unweighted per-part rewards ``{name: Tensor[B]}`` for logging."""
        return {reward.name: reward(images, prompts, metadata) for reward, _ in self.parts}

    def to(self, device: torch.device | str) -> CompositeReward:
        for reward, _ in self.parts:
            reward.to(device)
        return super().to(device)
