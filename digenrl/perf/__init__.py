"""Performance measurement on real model sizes: roofline numbers (achieved FLOP/s against a measured matmul
ceiling), numerical agreement of optimised vs eager generator paths, and the attention-backward regression
check. Used by experiments/bench_generator.py and experiments/bench_trainer.py; nothing here is imported by
the training runtime."""
