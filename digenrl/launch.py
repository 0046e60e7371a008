"""Command-line entry: parse config, validate at startup, start the process group, run a system.

A failing rank prints its failure once, publishes it on torchrun's store and ends its process at once, so
peers blocked in a collective do not hang; a heartbeat watchdog names a rank that stops answering, with
its role and phase, before the backend's timeout (``digenrl/runtime/faults/watchdog.py``, docs/design.md §2).
A config error is printed once (per node), before any worker process or process group exists. A plain
``python run_train.py`` (or ``python -m digenrl.launch``) of a multi-rank profile starts torchrun itself
(:func:`launch_torchrun`, whose workers run ``python -m digenrl.launch``): its workers run in the user's
working directory, and a signal to the command stops torchrun and every worker
(``digenrl/runtime/launch/job.py``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from digenrl.config import ConfigError, config_yaml, load_config, parse_override
from digenrl.dependency_logs import quiet_dependency_logs
from digenrl.validation import hardware_profile, validate_config, validate_devices

if TYPE_CHECKING:
    from digenrl.runtime.comm.distributed import DistContext


def parse_args(argv: list[str]) -> argparse.Namespace:
    from digenrl.runtime.launch.knob_help import knob_help

    parser = argparse.ArgumentParser(
        prog="run_train.py",
        description="DigenRL FlowGRPO training; overrides are key=value, e.g. iterations=5.",
        epilog=knob_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", help="YAML experiment config (default: built-in defaults)")
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the config the run would use (every key, validated) as YAML and exit",
    )
    parser.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR from its checkpoint with its saved config.yaml "
        "(= --config RUN_DIR/config.yaml out_dir=RUN_DIR resume=true); overrides may follow",
    )
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. algo.group_size=8")
    args = parser.parse_args(argv)
    args.config, args.overrides = run_folder_config(args.config, args.overrides, args.resume)
    return args


def run_folder_config(
    config: str | None, overrides: list[str], resume_dir: str | None
) -> tuple[str | None, list[str]]:
    """The config file and overrides a resume from a run folder stands for: ``--resume RUN_DIR``, or
    ``resume=true out_dir=RUN_DIR`` without ``--config``, reads ``RUN_DIR/config.yaml`` (the resolved config
    the run saved), so resuming needs nothing but the folder."""
    if resume_dir is not None:
        saved = Path(resume_dir) / "config.yaml"
        if config is not None:
            raise SystemExit(f"--resume {resume_dir} reads {saved}; drop --config {config}")
        if not saved.is_file():
            raise SystemExit(f"--resume {resume_dir}: {saved} does not exist (not a run folder)")
        return str(saved), [f"out_dir={resume_dir}", "resume=true", *overrides]
    if config is None:
        try:
            parsed = dict(parse_override(o) for o in overrides)
        except ConfigError:
            return config, overrides  # load_config reports it, naming the key
        resume = parsed.get("resume") is True or parsed.get("resume.enabled") is True
        out_dir = parsed.get("out_dir")
        if resume and out_dir and (Path(str(out_dir)) / "config.yaml").is_file():
            return str(Path(str(out_dir)) / "config.yaml"), overrides
    return config, overrides


def _world_size_from_env() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def auto_cpu_ranks(cfg) -> int | None:
    """``profile=auto`` on a machine without a GPU: the CPU ranks a plain run starts (the pools' sum when
    given, else the fewest the system runs on: one colocated, a trainer and each TSP stage's generator
    otherwise); None where the profile is not ``auto`` on a CPU."""
    from digenrl.config import COLOCATED_SYSTEMS
    from digenrl.runtime.hardware.profiles import AUTO

    if cfg.profile != AUTO or "RANK" in os.environ:
        return None
    import torch

    if torch.cuda.device_count() > 0:
        return None
    pools = cfg.pools.trainers + cfg.pools.generators + cfg.pools.scorers
    return pools or (1 if cfg.system in COLOCATED_SYSTEMS else 1 + max(1, cfg.tsp.stages))


def planned_ranks(cfg) -> int:
    """The ranks ``cfg`` describes: the pools' sum when given, else every device of its profile (what
    ``--print-config`` validates against without looking at this machine's devices)."""
    return cfg.pools.trainers + cfg.pools.generators + cfg.pools.scorers or hardware_profile(cfg).world_size


def ranks_to_start(cfg) -> int:
    """How many worker processes a plain ``python run_train.py`` starts for ``cfg``: the pools' sum when
    given, else every device of a one-node profile (a multi-node profile needs torchrun on each node);
    ``profile=auto`` on a CPU: :func:`auto_cpu_ranks`, which every process of the job then reads from
    the environment (digenrl/runtime/hardware/profiles.py ``AUTO_WORKERS_ENV``)."""
    cpu_ranks = auto_cpu_ranks(cfg)
    if cpu_ranks is not None:
        from digenrl.runtime.hardware.profiles import AUTO_WORKERS_ENV

        os.environ[AUTO_WORKERS_ENV] = str(cpu_ranks)
    profile = hardware_profile(cfg)
    wanted = planned_ranks(cfg)
    if profile.num_nodes > 1 or wanted == 1:
        return 1
    if profile.backend == "nccl" and not cfg.runtime.share_device:
        import torch

        if torch.cuda.device_count() < wanted:
            raise ConfigError(
                f"profile={cfg.profile!r} runs {wanted} ranks on GPUs but this machine has "
                f"{torch.cuda.device_count()}; use torchrun on a machine that has them, a smaller profile, "
                "or runtime.share_device=true to test the schedule with several ranks per GPU"
            )
    return wanted


#: Seconds a rank other than local rank 0 waits before it exits on a config error (see ``main``).
CONFIG_ERROR_GRACE_S = 10.0


def main(argv: list[str]) -> int:
    quiet_dependency_logs()
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"[rank {rank}] %(levelname)s %(name)s: %(message)s",
    )
    under_torchrun = "RANK" in os.environ
    try:
        cfg = load_config(args.config, args.overrides)
        if args.print_config:
            # the config's own world, not this machine's devices: a GPU config prints on a laptop
            validate_config(cfg, world_size=_world_size_from_env() if under_torchrun else planned_ranks(cfg))
            print(config_yaml(cfg), end="")
            return 0
        world = _world_size_from_env() if under_torchrun else ranks_to_start(cfg)
        validate_config(cfg, world_size=world)
        validate_devices(cfg, world, distributed=under_torchrun or world > 1)
        if not under_torchrun and world > 1:
            from digenrl.runtime.run_folder.run_lock import TOKEN_ENV, acquire_run_lock
            from digenrl.trainer.run_dir import plan_run_start

            # one job per out_dir: held until this launcher exits; its workers inherit it by the token
            lock, lock_note = acquire_run_lock(cfg.out_dir)
            os.environ[TOKEN_ENV] = lock.info["token"]
            if lock_note:
                print(f"[digenrl] {lock_note}", flush=True)
            plan_run_start(cfg)  # refuse before any worker starts (read-only: the workers' rank 0 decides)
    except ConfigError as exc:
        # Every rank of a node finds the same error: say it once. Each node says it (files and devices may
        # differ between nodes, and a node that stays silent would hide its own error). The other ranks wait
        # before they exit: a rank that exits first makes torchrun stop local rank 0 before it has printed
        # (seen on a 16-core machine); local rank 0's exit stops them during the wait instead, and one still
        # here after it found an error local rank 0 did not, so it says it itself.
        if int(os.environ.get("LOCAL_RANK", "0")) != 0:
            time.sleep(CONFIG_ERROR_GRACE_S)
            print(f"config error{_node_suffix()} (rank {rank}): {exc}", file=sys.stderr)
        else:
            print(f"config error{_node_suffix()}: {exc}", file=sys.stderr)
        return 2
    if not under_torchrun and world > 1:
        # One command for a multi-process run: start the workers under torchrun, output streamed here.
        print(f"[digenrl] starting {world} worker processes (torchrun --nproc_per_node={world})", flush=True)
        from digenrl.runtime.launch.job import LaunchInterrupted

        try:
            launch_torchrun(args.overrides, nproc=world, config=args.config, stream=True, timeout_s=None)
        except SystemExit as exc:
            print(exc, file=sys.stderr)
            return 1
        except LaunchInterrupted as exc:  # torchrun and every worker are gone (digenrl/runtime/launch/job.py)
            print(f"[digenrl] {exc}", file=sys.stderr)
            return 128 + exc.signum
        return 0

    from digenrl.runtime.comm.distributed import configured_backend, init_distributed, shutdown_distributed
    from digenrl.runtime.faults.fault_injection import inject_delay
    from digenrl.runtime.faults.stop_request import STOP
    from digenrl.runtime.faults.watchdog import end_process, start_watchdog
    from digenrl.runtime.hardware.profiles import load_profile
    from digenrl.runtime.launch.job import exit_with_launcher
    from digenrl.runtime.run_folder.run_lock import TOKEN_ENV, register_worker, release_run_locks
    from digenrl.systems import get_system
    from digenrl.trainer.run_dir import agree_run_start

    if os.environ.get(TOKEN_ENV):  # a worker of this launcher: live only while it lives, and say so
        exit_with_launcher()
        register_worker(cfg.out_dir)
    # the hardware profile says what the devices are: a CPU profile runs gloo on CPUs even where CUDA exists
    if cfg.runtime.deterministic:  # before any CUDA work: cuBLAS reads its workspace setting once
        from digenrl.runtime.reproducibility.determinism import use_deterministic_kernels

        use_deterministic_kernels()
    share = cfg.runtime.share_device
    backend = configured_backend(cfg.runtime.backend, load_profile(cfg.profile).backend, share_device=share)
    ctx = init_distributed(backend, timeout_s=cfg.runtime.timeout_s, share_device=share)
    watchdog = start_watchdog(ctx, cfg.runtime.timeout_s)  # None in a single process
    try:
        try:  # rank 0 decides how the run uses out_dir before anything is written (run_dir.py)
            run = agree_run_start(cfg, ctx)
        except ConfigError as exc:
            if ctx.rank == 0:
                print(f"config error: {exc}", file=sys.stderr)
            shutdown_distributed()
            return 2
        _require_shared_out_dir(cfg.out_dir, ctx, cfg.runtime.timeout_s)
        system = get_system(cfg.system)(cfg, ctx, run)
        if watchdog is not None:
            watchdog.follow(system.parts.events)
        STOP.install()  # SIGTERM: a checkpoint at the end of the iteration, then the end (stop_request.py)
        system.run()
        inject_delay(ctx.rank, "exit")  # robustness tests only: a rank that finishes last
    except BaseException as exc:
        message = f"[rank {ctx.rank}] FAILED: {type(exc).__name__}: {exc}"
        if watchdog is not None:
            # Do not tear the process group down politely: peers may sit in a collective that will never
            # complete. Publish the reason (peers' watchdogs and store waits end with it), then exit, which
            # lets torchrun's agent stop every other worker of the job at once.
            reason = f"{type(exc).__name__}: {exc}"
            end_process(message, traceback.format_exc(), lambda: watchdog.report_own_failure(reason))
        print(message, file=sys.stderr)
        traceback.print_exc()
        sys.stderr.flush()
        return 1
    if watchdog is not None:
        watchdog.stop()  # before the process group goes: a finished rank is not a hung one
    shutdown_distributed()
    release_run_locks()  # a clean end (also at interpreter exit; explicit for processes that os._exit)
    STOP.uninstall()
    return 0 if STOP.signum is None else 128 + STOP.signum


def _node_suffix() -> str:
    """Where a config error comes from in a run over several nodes, each printing its own: " on <host>"."""
    if int(os.environ.get("LOCAL_WORLD_SIZE", "1")) >= _world_size_from_env():
        return ""
    import socket

    return f" on {socket.gethostname()}"


#: Seconds a rank keeps looking for rank 0's marker in ``out_dir`` before it calls ``out_dir`` unshared.
_SHARED_CHECK_WAIT_S = 30.0


def _require_shared_out_dir(out_dir: str, ctx: DistContext, timeout_s: float) -> None:
    """A run on several nodes needs ``out_dir`` on a filesystem every node sees; fail at start otherwise.

    Every rank writes into it (``events/rank<r>.jsonl``, its RNG state into the checkpoint folder rank 0
    created) and reads from it (``resume=true``), and rank 0 merges all ranks' events into
    ``trace.json``. On a node-local ``out_dir`` that would fail mid-run or silently drop ranks from the
    trace. Rank 0 writes a marker with a fresh token, publishes the token in torchrun's store, and every
    rank looks for that marker. Single-node runs (LOCAL_WORLD_SIZE == WORLD_SIZE) skip the check.
    """
    if not ctx.is_distributed or int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world_size)) >= ctx.world_size:
        return
    import socket
    import uuid
    from pathlib import Path

    import torch.distributed as dist

    from digenrl.runtime.run_folder.run_files import ensure_dir, open_new

    store = dist.distributed_c10d._get_default_store()
    # One key per torchrun attempt: an elastic restart reuses the store and must not read an old token.
    key = f"digenrl/shared-out-dir-token/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    token = uuid.uuid4().hex if ctx.rank == 0 else ""
    marker = Path(out_dir) / f".shared-check-{token}"
    try:
        if ctx.rank == 0:
            ensure_dir(out_dir)
            with open_new(marker) as stream:
                stream.write(token.encode())
            store.set(key, token)
        else:
            marker = Path(out_dir) / f".shared-check-{store.get(key).decode()}"
            # NFS may cache "no such file" for a few seconds (attribute cache): look again until then.
            deadline = time.monotonic() + min(timeout_s, _SHARED_CHECK_WAIT_S)
            while not marker.is_file() and time.monotonic() < deadline:
                time.sleep(0.5)
            if not marker.is_file():
                raise ValueError(
                    f"out_dir={out_dir!r} is not shared: rank {ctx.rank} on host {socket.gethostname()} "
                    "does not see the file rank 0 wrote there; multi-node runs need out_dir on a "
                    "filesystem every node mounts (e.g. NFS), set out_dir to such a path"
                )
        ctx.barrier("every rank checked that out_dir is shared", timeout_s)
    finally:
        if ctx.rank == 0:
            marker.unlink(missing_ok=True)


def launch_torchrun(
    overrides: list[str],
    *,
    nproc: int,
    config: str | os.PathLike | None,
    threads: int = 1,
    timeout_s: float | None = 900,
    label: str = "run",
    nnodes: int = 1,
    rdzv_port: int | None = None,
    log_dir: str | os.PathLike | None = None,
    stream: bool = False,
) -> float:
    """Run ``python -m digenrl.launch`` (the :func:`main` that ``experiments/run_train.py`` calls) under
    torchrun in subprocesses — how the benchmark scripts launch real runs side by side, and how a plain
    ``python run_train.py`` starts its workers; nothing of the checkout is needed. Returns wall
    seconds (launch included); a failing run raises SystemExit with the tail of its stderr (``stream``:
    the workers write to this process's stdout / stderr as they go; ``timeout_s`` None = no limit; a run
    past it is stopped and raises SystemExit).

    ``nnodes=1``: one ``torchrun --standalone --nproc_per_node=nproc``. ``nnodes>1``: a multi-node run
    on this host (``_launch_nodes``): ``nnodes`` torchrun groups of ``nproc`` processes that
    meet through torchrun's c10d rendezvous on ``127.0.0.1:rdzv_port`` (a free port when None).
    ``log_dir``: also keep each group's stdout + stderr as ``node<i>.log`` there. The child environment
    has NVLink multicast off (``disable_nvlink_multicast``) unless the caller exported otherwise.

    The workers run in the caller's working directory, so a relative ``config``, ``out_dir``,
    ``data.prompts`` or model path means what it meant to the caller (and to its startup validation).
    Nothing outlives the launch: SIGTERM, SIGINT or SIGHUP to this process, a timeout or an error stops
    torchrun and every worker, then raises (``digenrl/runtime/launch/job.py``).
    """
    import subprocess
    from pathlib import Path

    from digenrl.runtime.comm.distributed import disable_nvlink_multicast
    from digenrl.runtime.launch.job import Job

    for name, value in (("nproc", nproc), ("nnodes", nnodes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    script = ["-m", "digenrl.launch"]  # torchrun's --module: each worker runs `python -m digenrl.launch`
    script += ["--config", str(config)] if config is not None else []
    script += overrides
    env = dict(os.environ, OMP_NUM_THREADS="1", DIGENRL_THREADS=str(threads), PYTHONUNBUFFERED="1")
    disable_nvlink_multicast(env)
    if nnodes > 1:
        return _launch_nodes(
            script,
            nnodes=nnodes,
            nproc=nproc,
            env=env,
            timeout_s=timeout_s,
            label=label,
            rdzv_port=rdzv_port,
            log_dir=log_dir,
        )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        *script,
    ]
    start = time.perf_counter()
    if not stream:
        print(f"[{label}] {' '.join(cmd[5:])}", flush=True)
    with Job() as job:
        if stream:
            proc = job.start(cmd, env=env)
        else:
            proc = job.start(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            job.stop()
            raise SystemExit(f"[{label}] did not finish within {timeout_s:g} s; stopped") from None
    if stream:
        if proc.returncode != 0:
            raise SystemExit(
                f"[{label}] the workers failed (exit {proc.returncode}); see their messages above"
            )
        return time.perf_counter() - start
    if log_dir is not None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        (Path(log_dir) / "node0.log").write_text(stdout + stderr)
    if proc.returncode != 0:
        raise SystemExit(f"[{label}] failed ({proc.returncode}):\n{stderr[-4000:]}")
    return time.perf_counter() - start


# ------------------------------------------------------------------------------ several nodes, one host

#: Seconds the other groups get to exit by themselves after the first failure, so a peer that fails
#: because of it is reported with it instead of being killed silently.
_PEER_EXIT_GRACE_S = 3.0
#: Characters of log tail in a failure report (split over at most ``_TAILS_SHOWN`` failed nodes).
_TAIL_CHARS = 4000
_TAILS_SHOWN = 4


def _launch_nodes(
    script: list[str],
    *,
    nnodes: int,
    nproc: int,
    env: dict[str, str],
    timeout_s: float | None,
    label: str,
    rdzv_port: int | None,
    log_dir: str | os.PathLike | None,
) -> float:
    """Start ``nnodes`` torchrun groups on this host as one job and wait for all of them.

    Each group is what one node of a cluster runs: ``--nnodes=N --nproc_per_node=nproc
    --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:PORT --rdzv-id=ID`` (torchrun's documented multi-node
    launch, docs.pytorch.org/docs/stable/elastic/run.html). Group 0 hosts the c10d store
    (``--rdzv-conf=is_host=1``; the others ``is_host=0``) instead of the hostname guess, which matches
    every group on one host. ``--node_rank`` is not passed: torchrun ignores it for c10d (it warns) and
    orders nodes by their address (``dynamic_rendezvous.py``: ranks = enumerate(sorted(participants)));
    group i therefore gets ``--local-addr=127.0.0.<100+i>`` (loopback, any 127/8 address reaches this
    host on Linux), so it holds global ranks ``[i*nproc, (i+1)*nproc)`` as node i of a hardware profile
    does. Group i sees GPUs ``[i*nproc, (i+1)*nproc)`` of ``CUDA_VISIBLE_DEVICES`` (all GPUs if unset),
    so ``LOCAL_RANK`` indexes its own GPUs as on a real node.

    The first group that exits non-zero fails the job: the others get ``_PEER_EXIT_GRACE_S`` to exit by
    themselves, are then stopped, and SystemExit names the failed node(s), the failure line of every
    rank that reported one, and the log tails (``_failure_report``). A timeout, a signal to this process or
    an error stops every group and its workers (``digenrl/runtime/launch/job.py``).
    """
    import socket
    import tempfile
    import uuid
    from pathlib import Path

    from digenrl.runtime.launch.job import Job

    if nnodes > 155:
        raise ValueError(f"nnodes must be at most 155 on one host (127.0.0.100-254), got {nnodes}")
    if rdzv_port is None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            rdzv_port = probe.getsockname()[1]
    elif isinstance(rdzv_port, bool) or not isinstance(rdzv_port, int) or not 0 < rdzv_port < 65536:
        raise ValueError(f"rdzv_port must be an int in [1, 65535] or None, got {rdzv_port!r}")
    devices = _visible_devices(env.get("CUDA_VISIBLE_DEVICES"), nnodes * nproc)
    run_id = f"digenrl-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    scratch = None if log_dir is not None else tempfile.TemporaryDirectory(prefix="digenrl-nodes-")
    logs = Path(log_dir if log_dir is not None else scratch.name)  # type: ignore[union-attr]
    logs.mkdir(parents=True, exist_ok=True)
    print(
        f"[{label}] {nnodes} nodes x {nproc}, rendezvous 127.0.0.1:{rdzv_port}: {' '.join(script)}",
        flush=True,
    )

    start = time.perf_counter()
    try:
        with Job() as job:
            for node in range(nnodes):
                cmd = [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    f"--nnodes={nnodes}",
                    f"--nproc_per_node={nproc}",
                    "--rdzv-backend=c10d",
                    f"--rdzv-endpoint=127.0.0.1:{rdzv_port}",
                    f"--rdzv-id={run_id}",
                    f"--rdzv-conf=is_host={int(node == 0)}",
                    f"--local-addr=127.0.0.{100 + node}",
                    *script,
                ]
                node_env = dict(env)
                if devices is not None:
                    node_env["CUDA_VISIBLE_DEVICES"] = ",".join(devices[node * nproc : (node + 1) * nproc])
                with (logs / f"node{node}.log").open("w") as log:
                    job.start(cmd, env=node_env, stdout=log, stderr=log)
            deadline = time.monotonic() + (float("inf") if timeout_s is None else timeout_s)
            failed = _wait_for_nodes(job.procs, deadline=deadline)
            if failed is None:
                job.stop()
                raise SystemExit(f"[{label}] {nnodes} nodes did not finish within {timeout_s:g} s; stopped")
            if failed:
                job.stop()
                codes = [proc.returncode for proc in job.procs]
                raise SystemExit(_failure_report(label, failed, codes, logs))
        return time.perf_counter() - start
    finally:
        if scratch is not None:
            scratch.cleanup()


def _failure_report(label: str, failed: list[int], codes: list, logs: os.PathLike) -> str:
    """Which nodes failed, what their ranks said (``main``'s "[rank r] FAILED:" lines) and log tails.

    Exit order does not tell the root cause: a rank that raises takes its peers' connections down, and
    their node's agent may exit first. The ranks' own failure lines, side by side, do tell it.
    """
    import re
    from pathlib import Path

    texts = {node: (Path(logs) / f"node{node}.log").read_text(errors="replace") for node in failed}
    order = ", ".join(f"node {node} (exit {codes[node]})" for node in failed)
    lines = [f"[{label}] {len(failed)} of {len(codes)} nodes failed, in order of exit: {order}"]
    said = [
        f"  node {node}: {match[:300]}"
        for node in failed
        for match in re.findall(r"^\[rank \d+\] FAILED: .*$", texts[node], flags=re.MULTILINE)
    ]
    if said:
        lines += ["failures the ranks reported:", *said]
    shown = failed[:_TAILS_SHOWN]
    for node in shown:
        lines.append(f"--- node {node} log tail:\n{texts[node][-_TAIL_CHARS // len(shown) :]}")
    return "\n".join(lines)


def _visible_devices(inherited: str | None, needed: int) -> list[str] | None:
    """The GPU ids to hand out to the groups: ``CUDA_VISIBLE_DEVICES`` split, or 0..needed-1 if unset."""
    if inherited is None:
        return [str(index) for index in range(needed)]
    devices = [item.strip() for item in inherited.split(",") if item.strip()]
    if not devices:
        return None  # explicitly no GPUs: leave it so in every group
    if len(devices) < needed:
        raise ValueError(
            f"CUDA_VISIBLE_DEVICES={inherited!r} lists {len(devices)} devices but nnodes * nproc = {needed} "
            "processes need one each"
        )
    return devices


def _wait_for_nodes(procs: list, *, deadline: float) -> list[int] | None:
    """[] when every group exited 0; the failed groups (first observed first) as soon as one fails;
    None at the deadline."""

    while True:
        codes = [proc.poll() for proc in procs]
        first = [node for node, code in enumerate(codes) if code not in (None, 0)]
        if first:
            failed = list(first)
            grace_end = min(deadline, time.monotonic() + _PEER_EXIT_GRACE_S)
            while time.monotonic() < grace_end and any(proc.poll() is None for proc in procs):
                time.sleep(0.1)
            failed += [
                node for node, proc in enumerate(procs) if node not in failed and proc.poll() not in (None, 0)
            ]
            return failed
        if all(code == 0 for code in codes):
            return []
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


if __name__ == "__main__":  # python -m digenrl.launch: what torchrun's workers run (launch_torchrun)
    sys.exit(main(sys.argv[1:]))
