"""index_on: a host index on its device without a host sync (digenrl/data/device_index.py).

The copy's asynchrony is a CUDA property; the CUDA test runs where a GPU is (the GPU machine's test run) and
says why it skips elsewhere. On the CPU: the values, dtype and placement every caller relies on."""

from __future__ import annotations

import pytest
import torch

from digenrl.data.device_index import index_on
from digenrl.data.text_condition import TextCondition

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA device is needed for a stream sync")


def test_a_host_index_stays_the_host_tensor_on_the_cpu():
    host = torch.tensor([3, 1, 2])
    assert index_on(host, "cpu") is host
    got = index_on([2, 0], torch.device("cpu"))
    assert got.dtype == torch.long and got.tolist() == [2, 0]
    assert index_on(torch.tensor([1, 0], dtype=torch.int32), "cpu").dtype == torch.long


def test_a_condition_takes_the_rows_and_their_host_lengths_with_or_without_a_device_index():
    mask = torch.arange(5).expand(4, 5) < torch.tensor([[5], [2], [3], [1]])  # 5, 2, 3, 1 real tokens
    cond = TextCondition(torch.randn(4, 5, 3), None, mask)
    cond = cond.with_lengths()
    rows = torch.tensor([2, 0, 2])
    a = cond.index_select(rows)
    b = cond.index_select(rows, device_index=index_on(rows, cond.device))
    assert a.lengths == b.lengths == (3, 5, 3)
    torch.testing.assert_close(a.embeds, cond.embeds[rows], rtol=0, atol=0)
    torch.testing.assert_close(b.embeds, a.embeds, rtol=0, atol=0)


def test_a_device_index_on_another_device_is_refused():
    cond = TextCondition(torch.randn(2, 3, 4), None, None)
    with pytest.raises(ValueError, match="device_index is on meta"):
        cond.index_select([0], device_index=torch.tensor([0], device="meta"))


@CUDA
def test_the_copy_and_the_gathers_make_no_stream_sync():
    """torch.cuda.set_sync_debug_mode("error") raises on any synchronising call, a blocking copy included."""
    device = torch.device("cuda")
    cond = TextCondition(torch.randn(4, 5, 3, device=device), None, None)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        rows = index_on([3, 1], device)
        picked = cond.index_select(torch.tensor([3, 1]))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert rows.device.type == "cuda" and rows.tolist() == [3, 1]
    torch.testing.assert_close(picked.embeds, cond.embeds[[3, 1]], rtol=0, atol=0)
