"""Runtime layer, one folder per job, each importing only those above it (docs/design.md §6):

- ``hardware/``: Hardware profiles (testbed YAMLs in hardware_profiles/, shipped as package data) and free
  device memory.
- ``run_folder/``: A run's folder: files opened safely inside out_dir, the one-run-per-folder lock, input
  fingerprints.
- ``reproducibility/``: Reproducible runs: deterministic kernels and the ledger of which samples each batched
  op ran on.
- ``launch/``: Starting a job: the processes a launcher starts, which rank plays which role, the help that
  run_train.py prints.
- ``comm/``: How ranks talk: process-group setup (HSDP's shard groups too), the c10d-store control plane and
  its errors, batch transfers, weight sync and the policy version each rank holds.
- ``faults/``: When things go wrong: the heartbeat watchdog that names a hung rank, SIGTERM ending a run with
  a checkpoint, and faults injected on purpose for the robustness tests.
- ``observe/``: What a run records and reports: span phase names, per-rank event logs, their summary and
  Chrome trace, NVML telemetry, metrics.jsonl and loggers, the kernel profile of an iteration, sample grids,
  the start banner and closing summary.

Import the module you need (``from digenrl.runtime.comm.control_plane import ControlPlane``); nothing
is re-exported, so importing one piece never pulls in the others.
"""
