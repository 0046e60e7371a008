"""What a run records and reports: span phase names, per-rank event logs, their summary and Chrome trace,
NVML telemetry, metrics.jsonl and loggers, the kernel profile of an iteration, sample grids, the start
banner and closing summary.

Import the module you need; nothing is re-exported here.
"""
