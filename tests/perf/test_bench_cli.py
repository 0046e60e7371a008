"""The benchmarks' shared flags (digenrl/perf/bench_cli.py): each benchmark defines them through bench_cli,
so they parse and refuse alike."""

from __future__ import annotations

import importlib

import pytest
import torch

from digenrl.data.dtypes import TORCH_DTYPES
from digenrl.perf import bench_cli

BENCHES = ["bench_generator", "bench_trainer", "bench_reward", "bench_backends"]


def _parse(name: str, argv: list[str]):
    return importlib.import_module(f"digenrl.perf.{name}").parse_args(argv)


@pytest.mark.parametrize("name", BENCHES)
def test_timing_flags_are_checked_alike(name, capsys):
    args = _parse(name, ["--device", "cpu", "--warmup", "0", "--iters", "1"])
    assert (args.device, args.warmup, args.iters, args.out, args.time_budget_s) == ("cpu", 0, 1, None, 0.0)
    with pytest.raises(SystemExit) as exit_:
        _parse(name, ["--iters", "0"])
    assert exit_.value.code == 2 and "--iters must be >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["bench_generator", "bench_trainer", "bench_reward"])
def test_dtype_choices_are_the_model_dtypes(name, capsys):
    assert _parse(name, ["--dtype", "bfloat16"]).dtype == "bfloat16"
    with pytest.raises(SystemExit):
        _parse(name, ["--dtype", "float64"])
    err = capsys.readouterr().err
    assert "invalid choice: 'float64'" in err and all(repr(d) in err for d in TORCH_DTYPES)


def test_auto_dtype_is_bf16_on_cuda_only():
    assert bench_cli.resolve_dtype("auto", torch.device("cpu")) == "float32"
    assert bench_cli.resolve_dtype("auto", torch.device("cuda", 1)) == "bfloat16"
    assert bench_cli.resolve_dtype("float16", torch.device("cpu")) == "float16"
