"""How ranks talk: process-group setup (HSDP's shard groups too), the c10d-store control plane and its
errors, batch transfers, weight sync and the policy version each rank holds.

Import the module you need; nothing is re-exported here.
"""
