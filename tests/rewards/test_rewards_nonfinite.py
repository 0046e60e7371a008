"""Non-finite reward policies: abort raises with sample details, drop-group masks whole groups."""

from __future__ import annotations

import logging

import pytest
import torch

from digenrl.rewards import NonFiniteRewardError, check_finite_rewards

PROMPTS = ["a red fox", "a red fox", "blue sky", "blue sky", "green tea", "green tea"]
GROUPS = [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize("policy", ["abort", "drop-group"])
def test_all_finite_keeps_everything(policy: str) -> None:
    rewards = torch.randn(6)
    out, keep = check_finite_rewards(rewards, PROMPTS, GROUPS, policy)
    assert keep.dtype == torch.bool and keep.all()
    torch.testing.assert_close(out, rewards)


@pytest.mark.parametrize("bad_value", [float("nan"), float("inf"), float("-inf")])
def test_abort_raises_naming_index_prompt_and_value(
    bad_value: float, caplog: pytest.LogCaptureFixture
) -> None:
    rewards = torch.randn(6)
    rewards[3] = bad_value
    with caplog.at_level(logging.ERROR), pytest.raises(NonFiniteRewardError) as info:
        check_finite_rewards(rewards, PROMPTS, GROUPS, "abort")
    message = str(info.value)
    assert "sample 3" in message and "'blue sky'" in message and str(bad_value) in message
    assert "sample 2" not in message
    assert "blue sky" in caplog.text


def test_drop_group_masks_every_sample_of_affected_groups(caplog: pytest.LogCaptureFixture) -> None:
    rewards = torch.randn(6)
    rewards[1] = float("nan")
    rewards[4] = float("inf")
    with caplog.at_level(logging.WARNING):
        out, keep = check_finite_rewards(rewards, PROMPTS, torch.tensor(GROUPS), "drop-group")
    assert keep.tolist() == [False, False, True, True, False, False]
    assert torch.isfinite(out).all()
    assert out[1] == 0 and out[4] == 0
    torch.testing.assert_close(out[keep], rewards[keep])
    assert "a red fox" in caplog.text and "green tea" in caplog.text and "sample 4" in caplog.text


def test_drop_group_with_non_contiguous_groups() -> None:
    rewards = torch.randn(5)
    rewards[0] = float("nan")
    _, keep = check_finite_rewards(rewards, ["p", "q", "p", "r", "p"], [7, 3, 7, 5, 7], "drop-group")
    assert keep.tolist() == [False, True, False, True, False]


def test_unknown_policy_names_the_setting() -> None:
    with pytest.raises(ValueError, match=r"reward\.nonfinite_policy.*drop-group.*abort"):
        check_finite_rewards(torch.zeros(2), ["a", "b"], [0, 0], "ignore")  # type: ignore[arg-type]


def test_bad_group_ids_and_prompts_are_rejected() -> None:
    with pytest.raises(ValueError, match="group_ids"):
        check_finite_rewards(torch.zeros(3), ["a", "b", "c"], [0, 1], "abort")
    with pytest.raises(ValueError, match="group_ids"):
        check_finite_rewards(torch.zeros(2), ["a", "b"], [0.0, 1.0], "abort")
    with pytest.raises(ValueError, match="prompts"):
        check_finite_rewards(torch.zeros(2), ["a"], [0, 1], "abort")
