"""Reproducible runs: deterministic kernels and the ledger of which samples each batched op ran on.

Import the module you need; nothing is re-exported here.
"""
