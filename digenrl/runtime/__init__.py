"""Runtime layer: torch.distributed setup, hardware profiles, the c10d-store control plane, profiling.

Modules: ``profiles`` (testbed YAML), ``distributed`` (init / barrier), ``control_plane`` (tickets, flags,
versions, failure reports on torchrun's store), ``events`` (per-rank span logs, clock origin, trace and
summary exports), ``telemetry`` (NVML sampling). Import the module you need; nothing is re-exported here
so importing one piece never pulls in the others.
"""
