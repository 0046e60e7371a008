"""Reward functions for DigenRL: contract, registry, built-in rewards and non-finite handling.

Built-in rewards (``available_rewards()``; formulas, sources and weight layouts in docs/rewards.md):
``jpeg-compressibility``, ``jpeg-incompressibility``, ``brightness``, ``colorfulness`` (no weights);
``pickscore``, ``aesthetic`` (local CLIP weights via ``reward.weights_path``); ``clipscore``, ``hpsv2.1``,
``imagereward``, ``ocr`` and ``vlm-judge`` (local weights via ``reward.weights_path``, or random weights
at their real size without one; each with a ``tiny-*`` twin for CPU tests); ``remote`` (a reward server
over HTTP, :mod:`digenrl.rewards.serve`). Reward modules are imported on first registry lookup, so
importing this package does not import transformers.
"""

from digenrl.rewards.base import NonFiniteRewardError, RewardFunction
from digenrl.rewards.nonfinite import NONFINITE_POLICIES, check_finite_rewards
from digenrl.rewards.registry import CompositeReward, available_rewards, build_reward, register_reward

__all__ = [
    "NONFINITE_POLICIES",
    "CompositeReward",
    "NonFiniteRewardError",
    "RewardFunction",
    "available_rewards",
    "build_reward",
    "check_finite_rewards",
    "register_reward",
]
