"""Hardware profiles (testbed YAMLs in hardware_profiles/, shipped as package data) and free device memory.

Import the module you need; nothing is re-exported here.
"""
