"""Process-group setup for one-process-per-device runs launched by ``torchrun`` (docs/design.md §2).

``init_distributed`` turns torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, LOCAL_RANK) into an
initialised default process group and a ``DistContext``; without those variables it returns a plain
single-process context, so the same entry point runs under ``python`` for debugging. NCCL is chosen when
CUDA is available, gloo otherwise (CPU tests and CI), unless the caller overrides it.

``barrier`` is a barrier with a timeout that says who is missing: gloo's ``monitored_barrier`` names the
ranks that did not arrive (on rank 0); other backends use the store-based barrier of ``ControlPlane``,
which names them on every rank. NCCL's own ``barrier`` has no per-call timeout and hangs instead.

``disable_nvlink_multicast`` is the project's one place that turns NVLink multicast off (see its docstring);
``init_distributed`` applies it before any process group exists, ``launch.launch_torchrun`` to the
environment of the processes it starts.

``global_sum`` sums a scalar over a process group (metrics, pool-wide checks); ``comm_device`` says where a
collective's tensors live for a group's backend; ``named_collective`` makes a collective that fails — gloo's
"Timed out waiting 300000ms for recv operation" names nobody — say which rank waited for what, with whom.

Shared-device mode (``runtime.share_device=true``, docs/operations.md "Shared-device mode"): several ranks
of one job on the same GPU. NCCL refuses two ranks on one GPU, so the group runs on gloo while every rank
computes on ``cuda:(LOCAL_RANK mod visible GPUs)``; gloo moves CUDA tensors in collectives but not in
send/recv, which :mod:`digenrl.runtime.comm.transfer` stages through pinned host memory.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from digenrl.config import RUNTIME_BACKENDS
from digenrl.runtime.comm.control_plane import ControlPlane
from digenrl.runtime.comm.errors import DistributedTimeoutError

TORCHRUN_ENV_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR")
THREADS_ENV_VAR = "DIGENRL_THREADS"
#: Variables that keep NCCL, PyTorch symmetric memory and NVSHMEM off NVLink multicast (NVLS).
NVLINK_MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

#: Namespace of the store barrier's keys inside torchrun's store.
_BARRIER_NAMESPACE = "digenrl-barrier"
_store_barrier_plane: ControlPlane | None = None


@dataclass
class DistContext:
    """Who this process is in the run and which device it drives."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    is_distributed: bool
    share_device: bool = False

    def barrier(self, name: str, timeout_s: float) -> None:
        """All ranks meet here; raises ``DistributedTimeoutError`` naming ``name`` after ``timeout_s``."""
        barrier(self, name, timeout_s)


def init_distributed(
    backend: str | None = None, timeout_s: float = 300.0, *, share_device: bool = False
) -> DistContext:
    """Initialise the default process group from torchrun's environment, or return a single-process context.

    Args:
        backend: "gloo" or "nccl"; None picks nccl when CUDA is available, gloo otherwise. gloo means CPU
            devices (the CPU hardware profiles), also in a single process on a machine with GPUs.
        timeout_s: the process group's collective timeout (also the store's).
        share_device: shared-device mode (module docstring): gloo, and every rank on a GPU, several ranks
            per GPU when there are more ranks than GPUs. Needs CUDA and refuses backend="nccl".

    If a default process group already exists (e.g. a test initialised one on a ``FileStore``), it is
    reused and described, not re-created. NVLink multicast is switched off first
    (``disable_nvlink_multicast``), so ``torchrun experiments/run_*.py`` gets it without a wrapper script.
    """
    disable_nvlink_multicast()
    _apply_thread_setting()
    if backend is not None and backend not in RUNTIME_BACKENDS:
        raise ValueError(f"backend must be one of {list(RUNTIME_BACKENDS)} or None, got {backend!r}")
    if not isinstance(timeout_s, int | float) or isinstance(timeout_s, bool) or timeout_s <= 0:
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")

    if share_device:
        if backend == "nccl":
            raise ValueError("share_device needs the gloo backend: NCCL refuses two ranks on one GPU")
        if not torch.cuda.is_available():
            raise ValueError("share_device puts ranks on a shared GPU, but CUDA is not available")
        backend = "gloo"
    if dist.is_available() and dist.is_initialized():
        return _context_of_initialised_group(share_device)

    present = [name for name in TORCHRUN_ENV_VARS if name in os.environ]
    if not present:
        # gloo asked for (a CPU hardware profile): the CPU, even where CUDA exists
        on_gpu = torch.cuda.is_available() and (backend != "gloo" or share_device)
        device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        return DistContext(0, 1, 0, device, backend or "none", False, share_device)
    if len(present) != len(TORCHRUN_ENV_VARS):
        missing = [name for name in TORCHRUN_ENV_VARS if name not in os.environ]
        raise ValueError(
            f"torchrun environment is incomplete: {present} set but {missing} missing; launch with torchrun "
            f"or set all of {list(TORCHRUN_ENV_VARS)}"
        )

    chosen = resolve_backend(backend, cuda_available=torch.cuda.is_available())
    if chosen == "nccl" and not torch.cuda.is_available():
        raise ValueError("backend 'nccl' needs CUDA, which is not available; use backend='gloo'")
    rank = int(os.environ["RANK"])
    local_rank = _local_rank(rank, cuda=chosen == "nccl")
    kwargs: dict = {"backend": chosen, "timeout": timedelta(seconds=timeout_s)}
    if chosen == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        kwargs["device_id"] = device  # binds the group to this GPU and lets NCCL initialise eagerly
    dist.init_process_group(**kwargs)
    return _context_of_initialised_group(share_device)


def configured_backend(runtime_backend: str | None, profile_backend: str, *, share_device: bool) -> str:
    """The backend a run's ranks start with: ``runtime.backend`` when set, else gloo in shared-device mode
    (NCCL refuses two ranks on one GPU), else the hardware profile's."""
    if runtime_backend is not None:
        return runtime_backend
    return "gloo" if share_device else profile_backend


def resolve_backend(backend: str | None, *, cuda_available: bool) -> str:
    """The backend a process group gets: ``backend`` (``runtime.backend``), else nccl with CUDA, gloo
    without."""
    return backend or ("nccl" if cuda_available else "gloo")


def planned_device_type(
    backend: str | None, *, distributed: bool, cuda_available: bool, share_device: bool = False
) -> str:
    """The device type :func:`init_distributed` will give this process: a single process takes the GPU
    when there is one unless gloo was asked for (a CPU hardware profile); a rank of a process group is on a
    GPU exactly when its backend is nccl (gloo ranks compute on the CPU) or in shared-device mode. Start-up
    validation asks this before any process group exists."""
    if share_device:
        return "cuda" if cuda_available else "cpu"
    if not distributed:
        return "cuda" if cuda_available and backend != "gloo" else "cpu"
    return "cuda" if resolve_backend(backend, cuda_available=cuda_available) == "nccl" else "cpu"


def disable_nvlink_multicast(env: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Turn NVLink multicast (NVLS) off in NCCL, PyTorch and NVSHMEM unless the variable is already set.

    Why: multicast objects are not available on the shared multi-GPU machines this project is measured
    on (a program that creates them can put the host's GPUs, which others use, out of service), and NVLS
    set-up can hang where multicast is unavailable. The variables are read when the library
    initialises (``NCCL_NVLS_ENABLE``: NCCL user guide, "Environment Variables";
    ``TORCH_SYMM_MEM_DISABLE_MULTICAST``: PyTorch ``c10d/symm_mem``; ``NVSHMEM_DISABLE_NVLS``: NVSHMEM
    environment variables), so this must run before the first process group / communicator exists.

    ``setdefault`` semantics: a value the user exported wins (``export NCCL_NVLS_ENABLE=1`` turns NVLS
    back on where it is known to be safe). Args: ``env`` — the mapping to update (default ``os.environ``;
    launchers pass the environment of the processes they start). Returns the values now in force.
    """
    target = os.environ if env is None else env
    for name, value in NVLINK_MULTICAST_OFF.items():
        target.setdefault(name, value)
    return {name: target[name] for name in NVLINK_MULTICAST_OFF}


def shutdown_distributed() -> None:
    """Destroy the default process group if one exists (safe to call twice, or when never initialised)."""
    global _store_barrier_plane
    _store_barrier_plane = None
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier(ctx: DistContext, what: str, timeout_s: float) -> None:
    """Barrier over all ranks that fails after ``timeout_s`` with a message naming this rank and ``what``.

    gloo: ``dist.monitored_barrier(wait_all_ranks=True)``; rank 0's error lists every missing rank.
    Other backends: the ``ControlPlane`` store barrier, whose error lists the missing ranks on every rank.
    """
    if not ctx.is_distributed:
        return
    if ctx.backend == "gloo":
        try:
            dist.monitored_barrier(timeout=timedelta(seconds=timeout_s), wait_all_ranks=True)
        except RuntimeError as error:
            raise DistributedTimeoutError(
                f"rank {ctx.rank} timed out after {timeout_s:g} s in barrier '{what}' "
                f"(world size {ctx.world_size}): {error}"
            ) from error
        return
    _barrier_plane(ctx).barrier(what, range(ctx.world_size), timeout_s=timeout_s)


@contextmanager
def named_collective(description: str, *, passthrough: tuple[type[Exception], ...] = ()) -> Iterator[None]:
    """Re-raise a collective's failure inside the block prefixed with ``description`` (the waiting rank,
    what it waited for, the group's members): a ``DistributedTimeoutError`` when the backend timed out (the
    group's timeout, ``runtime.timeout_s``), else a ``RuntimeError``. ``passthrough``: this code's own
    errors, raised unchanged."""
    try:
        yield
    except passthrough:
        raise
    except RuntimeError as error:
        message = f"{description}: {error}"
        if "timed out" in str(error).lower():
            raise DistributedTimeoutError(message) from error
        raise RuntimeError(message) from error


def comm_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """Where a collective's tensors must live: the current CUDA device for NCCL, the CPU for gloo."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def global_sum(value: float | int, group: dist.ProcessGroup | None = None) -> float:
    """Sum a scalar over ``group`` (identity in a single process)."""
    if not (dist.is_available() and dist.is_initialized()):
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64, device=comm_device(group))
    dist.all_reduce(t, group=group)
    return float(t.item())


def _barrier_plane(ctx: DistContext) -> ControlPlane:
    """One store-barrier plane per process group, so barrier generations count consistently."""
    global _store_barrier_plane
    if _store_barrier_plane is None:
        store = dist.distributed_c10d._get_default_store()
        _store_barrier_plane = ControlPlane(
            store, ctx.rank, "all-ranks barrier", namespace=_BARRIER_NAMESPACE
        )
    return _store_barrier_plane


def _context_of_initialised_group(share_device: bool = False) -> DistContext:
    rank = dist.get_rank()
    backend = str(dist.get_backend())
    local_rank = _local_rank(rank, cuda=backend == "nccl")
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    elif share_device:  # several ranks per GPU: round-robin over the visible GPUs
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    return DistContext(rank, dist.get_world_size(), local_rank, device, backend, True, share_device)


def _local_rank(rank: int, *, cuda: bool) -> int:
    """This process's index on its node: ``LOCAL_RANK`` (torchrun sets it on every node).

    Without it the global rank is an index on the node only in a single-node run; on a second node it
    names a GPU that does not exist (rank 9 of 2 x 8), so an NCCL run refuses to guess.
    """
    raw = os.environ.get("LOCAL_RANK")
    if raw is not None:
        return int(raw)
    if cuda and rank >= torch.cuda.device_count():
        raise ValueError(
            f"LOCAL_RANK is not set and RANK={rank} is not a GPU index on this node "
            f"({torch.cuda.device_count()} visible); launch with torchrun or set LOCAL_RANK per process"
        )
    return rank


def _apply_thread_setting() -> None:
    """``DIGENRL_THREADS`` caps intra-op threads: several CPU workers on one host must not oversubscribe."""
    raw = os.environ.get(THREADS_ENV_VAR)
    if raw is None:
        return
    try:
        threads = int(raw)
    except ValueError:
        threads = 0
    if threads <= 0:
        raise ValueError(f"environment variable {THREADS_ENV_VAR} must be a positive int, got {raw!r}")
    torch.set_num_threads(threads)
