"""Test-wide settings: one CPU thread per process (CI has 2 cores; distributed tests start several)."""

import os

import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)
