"""A run's folder: files opened safely inside out_dir, the one-run-per-folder lock, input fingerprints.

Import the module you need; nothing is re-exported here.
"""
