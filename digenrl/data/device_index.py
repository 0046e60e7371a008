"""Host index tensors moved to a GPU without stalling the host.

A blocking host-to-GPU copy (``index.to("cuda")``, ``torch.as_tensor(list, device="cuda")``) ends in a
``cudaStreamSynchronize``: the host waits until every queued kernel has run, and the device then idles while
the host launches the next ones. The trainer's micro-batch gather made a dozen such copies a micro-batch
(the round-5 Qwen-Image kernel profile of issue 37: 235 ``cudaStreamSynchronize in aten::copy_`` in one
training phase, and 0.46 s of idle gaps behind ``aten::to``). A copy from page-locked memory with
``non_blocking=True`` is queued on the stream like a kernel; PyTorch's caching host allocator keeps the
page-locked block until that copy has run (it records an event on the stream), so the block is never
reused early and repeated pinning costs no ``cudaHostAlloc`` after the first (torch docs, "CUDA semantics:
use pinned memory buffers").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["index_on"]


def index_on(index: Tensor | Sequence[int], device: torch.device | str) -> Tensor:
    """``index`` (a host tensor or a sequence of ints) as an int64 tensor on ``device``, queued on the
    device's current stream instead of synchronising with it. A tensor already on ``device`` is returned as
    is; on the CPU the host tensor itself."""
    device = torch.device(device)
    if isinstance(index, Tensor) and index.device.type != "cpu":
        return index.to(device=device, dtype=torch.long)
    host = torch.as_tensor(index, dtype=torch.long)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
