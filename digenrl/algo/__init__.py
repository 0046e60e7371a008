"""Pure-math core of the FlowGRPO family: sigma grids, the flow-SDE step with log-prob, CFG,
group advantages (and their release once a split group is complete), the clipped policy loss / KL, and
train-timestep selection. No model code."""

from digenrl.algo.advantages import STD_MODES, AdvantageResult, gather_rewards, group_advantages
from digenrl.algo.group_completion import CompletedGroup, GroupCompletion
from digenrl.algo.guidance import apply_cfg, double_for_cfg, split_cfg_output
from digenrl.algo.loss import PolicyLossTerms, clipped_policy_loss, kl_to_reference
from digenrl.algo.sde_step import SDE_TYPES, StepResult, dance_step, euler_step, flow_sde_step
from digenrl.algo.sigmas import (
    dance_sigmas,
    dynamic_shift_sigmas,
    flow_sigmas,
    flux_time_shift_mu,
    shift_sigmas,
)
from digenrl.algo.timesteps import TRAIN_STEP_MODES, sde_step_mask, select_train_steps

__all__ = [
    "SDE_TYPES",
    "STD_MODES",
    "TRAIN_STEP_MODES",
    "AdvantageResult",
    "CompletedGroup",
    "GroupCompletion",
    "PolicyLossTerms",
    "StepResult",
    "apply_cfg",
    "clipped_policy_loss",
    "dance_sigmas",
    "dance_step",
    "double_for_cfg",
    "dynamic_shift_sigmas",
    "euler_step",
    "flow_sde_step",
    "flow_sigmas",
    "flux_time_shift_mu",
    "gather_rewards",
    "group_advantages",
    "kl_to_reference",
    "sde_step_mask",
    "select_train_steps",
    "shift_sigmas",
    "split_cfg_output",
]
