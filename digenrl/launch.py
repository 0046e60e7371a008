"""Command-line entry: parse config, validate at startup, start the process group, run a system.

Failures are reported once, with the rank that failed, and the process group is torn down so that
peers blocked in a collective fail by their own timeout instead of hanging (DESIGN.md §2).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback

from digenrl.config import ConfigError, load_config, validate_config


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="run_train.py",
        description="DigenRL FlowGRPO training; overrides are key=value, e.g. iterations=5.",
    )
    parser.add_argument("--config", help="YAML experiment config (default: built-in defaults)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. algo.group_size=8")
    return parser.parse_args(argv)


def _world_size_from_env() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"[rank {rank}] %(levelname)s %(name)s: %(message)s",
    )
    try:
        cfg = load_config(args.config, args.overrides)
        validate_config(cfg, world_size=_world_size_from_env())
    except ConfigError as exc:
        print(f"[rank {rank}] config error: {exc}", file=sys.stderr)
        return 2

    from digenrl.runtime.distributed import init_distributed, shutdown_distributed
    from digenrl.systems import get_system

    ctx = init_distributed(cfg.runtime.backend, timeout_s=cfg.runtime.timeout_s)
    try:
        system = get_system(cfg.system)(cfg, ctx)
        system.run()
    except BaseException as exc:
        print(f"[rank {ctx.rank}] FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        traceback.print_exc()
        sys.stderr.flush()
        sys.stdout.flush()
        if ctx.is_distributed:
            # Do not tear the process group down politely: peers may sit in a collective that will never
            # complete. Exiting lets torchrun's agent stop every other worker of the job at once.
            os._exit(1)
        return 1
    shutdown_distributed()
    return 0


def launch_torchrun(
    overrides: list[str],
    *,
    nproc: int,
    config: str | os.PathLike,
    threads: int = 1,
    timeout_s: float = 900,
    label: str = "run",
) -> float:
    """Run ``experiments/run_train.py`` under ``torchrun --standalone`` in a subprocess — how the
    benchmark scripts launch real runs side by side. Returns wall seconds (launch included); a
    failing run raises SystemExit with the tail of its stderr."""
    import subprocess
    import time
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        str(repo / "experiments" / "run_train.py"),
        "--config",
        str(config),
        *overrides,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", DIGENRL_THREADS=str(threads), PYTHONUNBUFFERED="1")
    print(f"[{label}] {' '.join(cmd[5:])}", flush=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise SystemExit(f"[{label}] failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return time.perf_counter() - start
