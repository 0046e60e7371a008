"""How much memory a device has free right now (memory accounting for work that needs more of it)."""

from __future__ import annotations

import torch


def free_device_bytes(device: torch.device) -> int:
    """Free bytes on ``device``: the CUDA allocator's view of the GPU, or the host's available memory."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    import psutil  # an accelerate dependency, installed with the package

    return int(psutil.virtual_memory().available)
