"""Performance measurement on real model sizes: roofline numbers (achieved FLOP/s against a measured matmul
ceiling), numerical agreement of optimised vs eager generator paths, and the attention-backward regression
check, the benchmarks themselves (bench_generator.py, bench_trainer.py: ``experiments/measure.py
generator|trainer``) and the system ablation (ablation.py); nothing here is imported by the training
runtime."""
