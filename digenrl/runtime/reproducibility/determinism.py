"""Deterministic kernels for a run (``runtime.deterministic``; docs/operations.md, "Reproducible runs").

Two runs on the same GPU with the same seed and configuration compute the same trajectories, but not
always the same gradients: some CUDA kernels accumulate with atomics, whose order changes from run to
run. The one that matters for FlowGRPO is the flash-attention backward, which PyTorch runs in its
non-deterministic mode unless ``torch.use_deterministic_algorithms(True)`` is set without ``warn_only``
(aten/src/ATen/native/transformers/cuda/attention_backward.cu: "Flash Attention defaults to a
non-deterministic algorithm"). A last-bit difference in a gradient then grows: AdamW's first steps move a
weight by about ``lr`` whatever the gradient's size, so an entry whose gradient is near zero can move
either way, and the next rollout differs. Comparing two schedules for the same update therefore needs
this mode on both sides (experiments/gpu/h200_equivalence.sh).

The switch is PyTorch's own: ``torch.use_deterministic_algorithms(True)`` plus the cuBLAS workspace
setting it requires (``CUBLAS_WORKSPACE_CONFIG=:4096:8``, set before the first cuBLAS call, so this runs
before the process group and any model is built). An operation without a deterministic implementation
then raises PyTorch's own error naming it. Deterministic kernels can be slower: the mode is for
reproducibility and equivalence checks, not for throughput numbers.
"""

from __future__ import annotations

import os

import torch

#: cuBLAS needs a fixed workspace to be deterministic (CUDA's "Results reproducibility" notes); ":4096:8"
#: is the larger of the two values the PyTorch reproducibility notes give
CUBLAS_WORKSPACE_CONFIG = ":4096:8"


#: the banner's line for a run in this mode (digenrl/runtime/observe/run_report.py)
BANNER = (
    "deterministic kernels (runtime.deterministic=true): torch.use_deterministic_algorithms(True), "
    "CUBLAS_WORKSPACE_CONFIG set; for reproducibility and equivalence checks, not for throughput numbers"
)


def use_deterministic_kernels() -> None:
    """Switch this process to deterministic kernels (before any CUDA work: cuBLAS reads its setting once)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
