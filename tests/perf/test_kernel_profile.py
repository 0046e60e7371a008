"""profile_call: where one call's time goes (top operators, busy fraction on a GPU)."""

from __future__ import annotations

import pytest
import torch

from digenrl.perf.kernel_profile import format_profile, profile_call


def test_cpu_profile_ranks_the_matmul_first_and_reports_no_device_numbers():
    a, b = torch.randn(384, 384), torch.randn(384, 384)
    small = torch.randn(8)

    def work():
        for _ in range(4):
            a @ b
        small.add(1.0)

    summary = profile_call(work, torch.device("cpu"), top=5)
    assert summary["wall_ms"] > 0
    assert summary["device_busy_ms"] is None and summary["busy_fraction"] is None
    assert summary["kernel_launches"] is None and summary["top_kernels"] == []
    top = summary["top_ops"]
    assert 1 <= len(top) <= 5
    assert top[0]["name"] in ("aten::mm", "aten::matmul") and top[0]["calls"] == 4
    shares = [op["share"] for op in top]
    assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1.0 + 1e-9
    text = format_profile(summary, "matmuls")
    assert text.startswith("**matmuls**: wall") and "aten::mm" in text


def test_top_must_be_positive():
    with pytest.raises(ValueError, match="top"):
        profile_call(lambda: None, torch.device("cpu"), top=0)
