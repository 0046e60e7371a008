"""Starting a job: the processes a launcher starts, which rank plays which role, the help that run_train.py
prints.

Import the module you need; nothing is re-exported here.
"""
