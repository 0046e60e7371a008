"""Runtime smoke run under a real ``torchrun`` (TCPStore, env:// rendezvous): gloo on CPU, NCCL on GPUs.

Launched by ``test_runtime_torchrun.py``; also by hand on a GPU machine::

    torchrun --standalone --nproc_per_node=<gpus> tests/runtime/torchrun_smoke.py --out /tmp/smoke

Every rank writes ``<out>/result_rank<r>.json``; rank 0 also merges the trace and the summary.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from digenrl.runtime.comm.control_plane import ControlPlane
from digenrl.runtime.comm.distributed import barrier, init_distributed, shutdown_distributed
from digenrl.runtime.observe.events import (
    EventLogger,
    agree_clock_origin,
    merge_chrome_trace,
    summarize_events,
)
from digenrl.runtime.observe.telemetry import GpuTelemetry


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--busy-s", type=float, default=0.2, help="length of the fake work span")
    args = parser.parse_args()
    out = Path(args.out)

    ctx = init_distributed(timeout_s=120)
    role = "trainer" if ctx.rank == 0 else "generator"
    origin = agree_clock_origin(ctx)
    plane = ControlPlane.from_default_group(role, default_timeout_s=60, namespace="smoke").scoped("iter0")
    logger = EventLogger(out, ctx.rank, role, origin)
    telemetry = GpuTelemetry(logger, interval_s=0.05).start()
    result: dict = {
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "backend": ctx.backend,
        "device": str(ctx.device),
        "origin": origin,
        "telemetry_enabled": telemetry.enabled,
        "telemetry_disabled_reason": telemetry.disabled_reason,
    }

    with logger.span("iteration", iteration=0):
        result["ticket"] = plane.ticket("fragments")
        with logger.span("generate" if role == "generator" else "train", iteration=0, samples=2):
            x = torch.randn(512, 512, device=ctx.device)
            deadline = time.perf_counter() + args.busy_s
            while time.perf_counter() < deadline:
                x = torch.tanh(x @ x.T / 512)
            if ctx.device.type == "cuda":
                torch.cuda.synchronize()
        plane.publish(f"done/{ctx.rank}", ctx.rank * 10)
        peer = (ctx.rank + 1) % ctx.world_size
        with logger.span("wait_request", iteration=0):
            result["peer_value"] = int(
                plane.wait_for(f"done/{peer}", peer=peer, what="peer's work", timeout_s=60)
            )
        if ctx.rank == 0:
            plane.publish_version("policy", 1)
        result["policy_version_seen"] = plane.wait_version("policy", 1, peer=0, timeout_s=60)
        plane.barrier("store-barrier", range(ctx.world_size), timeout_s=60)
        barrier(ctx, "all ranks at the end of iteration 0", timeout_s=60)

    telemetry.stop()
    logger.close()
    result["counter_records"] = sum(
        1 for line in logger.path.read_text().splitlines() if json.loads(line)["type"] == "counter"
    )
    (out / f"result_rank{ctx.rank}.json").write_text(json.dumps(result))
    barrier(ctx, "all logs closed", timeout_s=60)
    if ctx.rank == 0:
        merge_chrome_trace(out)
        summary = summarize_events(out)
        (out / "summary.json").write_text(json.dumps(summary, default=str))
    shutdown_distributed()


if __name__ == "__main__":
    main()
