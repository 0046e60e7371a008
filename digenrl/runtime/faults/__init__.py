"""When things go wrong: the heartbeat watchdog that names a hung rank, SIGTERM ending a run with a
checkpoint, and faults injected on purpose for the robustness tests.

Import the module you need; nothing is re-exported here.
"""
