"""Safe choice of the diffusers attention backend: never run a (backend, torch, cuDNN, direction) combination
known to fail.

Why a table: the same attention call can be fine in a generator (forward only) and broken in a trainer
(backward), and the failure depends on the installed torch / cuDNN pair, not on this project's code. Since
torch 2.11, PyTorch's SDPA picks the cuDNN fused kernel by default on H100/H200 (pytorch/pytorch#196678), so
diffusers' ``native`` backend (a plain ``F.scaled_dot_product_attention``) reaches cuDNN without asking.

The remedies are the ecosystem's own switches: ``torch.backends.cuda.enable_cudnn_sdp(False)`` takes cuDNN
out of SDPA's dispatch (flash / memory-efficient kernels remain; the workaround named in
pytorch/pytorch#122695, #134001 and #196678), and a backend with no usable backward falls back to
``native``. Every fallback is logged with the reason.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from digenrl.config import CUDNN_SDPA_SETTINGS
from digenrl.models.flow_model import FlowModel, available_attention_backends, set_attention_backend

log = logging.getLogger(__name__)

DIRECTIONS = ("forward", "backward", "both")
REMEDIES = ("disable-cudnn-sdp", "fallback")
FALLBACK_BACKEND = "native"

#: Backends that run on a CPU (torch SDPA's own CPU kernels); every other one needs an accelerator.
CPU_BACKENDS = frozenset({"native", "_native_math"})
#: Backends of other accelerators (Ascend NPU, XLA): never usable on a CUDA GPU or a CPU.
FOREIGN_DEVICE_BACKENDS = frozenset({"_native_npu", "_native_xla"})
SAGE_BACKENDS = (
    "sage",
    "sage_varlen",
    "_sage_qk_int8_pv_fp8_cuda",
    "_sage_qk_int8_pv_fp8_cuda_sm90",
    "_sage_qk_int8_pv_fp16_cuda",
    "_sage_qk_int8_pv_fp16_triton",
)


@dataclass(frozen=True)
class AttentionShape:
    """What of a model's attention decides whether a shape-bound row applies: its head dim and whether its
    keys are masked (Qwen-Image and HunyuanVideo mask padded text tokens; SD3, FLUX and Wan do not)."""

    head_dim: int
    masked: bool

    @classmethod
    def of(cls, flow_model: FlowModel) -> AttentionShape | None:
        """From the model's spec; None when its config names no head dim (every row then applies)."""
        head_dim = flow_model.spec.transformer_config.get("attention_head_dim")
        if head_dim is None:
            return None
        text_encoder = getattr(flow_model.spec, "text_encoder", None)
        return cls(int(head_dim), bool(getattr(text_encoder, "uses_mask", True)))


@dataclass(frozen=True)
class KnownBadAttention:
    """One combination seen (or reported) to fail. Versions are inclusive (major, minor) ranges; ``None``
    matches any version (also a missing cuDNN). ``masked_only``: the failure needs an attention mask, so a
    model without one is exempt. ``verified_head_dims``: unmasked head dims this (torch, cuDNN) pair ran
    through the backward regression check (digenrl/perf/backward_check.py) with the gradients of the safe
    kernels; a model of such a shape is exempt. A model of unknown shape matches every row."""

    backends: tuple[str, ...]
    direction: str  # forward | backward | both
    remedy: str  # disable-cudnn-sdp: keep the backend, take cuDNN out of SDPA; fallback: use "native"
    reason: str
    device_type: str = "cuda"
    torch_versions: tuple[tuple[int, int], tuple[int, int]] | None = None
    cudnn_versions: tuple[tuple[int, int], tuple[int, int]] | None = None
    masked_only: bool = False
    verified_head_dims: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction={self.direction!r}; allowed: {DIRECTIONS}")
        if self.remedy not in REMEDIES:
            raise ValueError(f"remedy={self.remedy!r}; allowed: {REMEDIES}")

    def matches(
        self,
        backend: str,
        *,
        needs_backward: bool,
        device_type: str,
        torch_version: tuple[int, int],
        cudnn_version: tuple[int, int] | None,
        shape: AttentionShape | None = None,
    ) -> bool:
        if backend not in self.backends or device_type != self.device_type:
            return False
        if shape is not None and self.masked_only and not shape.masked:
            return False
        if shape is not None and not shape.masked and shape.head_dim in self.verified_head_dims:
            return False
        if self.direction == "backward" and not needs_backward:
            return False
        if not _in_range(torch_version, self.torch_versions):
            return False
        if self.cudnn_versions is None:
            return True
        return cudnn_version is not None and _in_range(cudnn_version, self.cudnn_versions)


def _in_range(version: tuple[int, int], bounds: tuple[tuple[int, int], tuple[int, int]] | None) -> bool:
    return bounds is None or bounds[0] <= version <= bounds[1]


_CUDNN_SDPA_BACKWARD_FLUX = (
    "cuDNN fused SDPA backward fails on FLUX-size attention blocks with torch 2.11 + cuDNN 9.19 (measured on "
    "an H200 by this project; experiments/measure.py trainer --regression re-checks it)"
)
_CUDNN_SDPA_BACKWARD_MASK_NAN = (
    "cuDNN SDPA backward returns NaN dQ with an attention mask when seq_len % 128 == 64 on H100/H200, the "
    "default SDPA kernel since torch 2.11 (pytorch/pytorch#196678; seen with cuDNN 9.19 and 9.20)"
)

_VERIFIED_UNMASKED_HEAD_DIMS = (64,)
"""SD3.5-medium's blocks (24 heads of 64, no mask) at 512² and 1024²: cuDNN SDPA backward ran with finite
gradients matching the flash kernel's on an H200, torch 2.11 + cuDNN 9.19 (experiments/results/gpu/loops/)."""

KNOWN_BAD_ATTENTION: tuple[KnownBadAttention, ...] = (
    KnownBadAttention(
        backends=("native",),
        direction="backward",
        remedy="disable-cudnn-sdp",
        reason=_CUDNN_SDPA_BACKWARD_FLUX,
        torch_versions=((2, 11), (2, 11)),
        cudnn_versions=((9, 19), (9, 19)),
        verified_head_dims=_VERIFIED_UNMASKED_HEAD_DIMS,
    ),
    KnownBadAttention(
        backends=("_native_cudnn",),
        direction="backward",
        remedy="fallback",
        reason=_CUDNN_SDPA_BACKWARD_FLUX,
        torch_versions=((2, 11), (2, 11)),
        cudnn_versions=((9, 19), (9, 19)),
        verified_head_dims=_VERIFIED_UNMASKED_HEAD_DIMS,
    ),
    KnownBadAttention(
        backends=("native",),
        direction="backward",
        remedy="disable-cudnn-sdp",
        reason=_CUDNN_SDPA_BACKWARD_MASK_NAN,
        torch_versions=((2, 11), (2, 13)),
        cudnn_versions=((9, 19), (9, 20)),
        masked_only=True,
    ),
    KnownBadAttention(
        backends=("_native_cudnn",),
        direction="backward",
        remedy="fallback",
        reason=_CUDNN_SDPA_BACKWARD_MASK_NAN,
        torch_versions=((2, 11), (2, 13)),
        cudnn_versions=((9, 19), (9, 20)),
        masked_only=True,
    ),
    KnownBadAttention(
        backends=SAGE_BACKENDS,
        direction="backward",
        remedy="fallback",
        reason="SageAttention is inference-only: diffusers' _sage_attention_backward_op raises "
        "NotImplementedError (diffusers models/attention_dispatch.py)",
    ),
)
"""The table :func:`select_attention_backend` consults; add a row when a new combination is seen to fail."""


@dataclass(frozen=True)
class AttentionChoice:
    """What :func:`select_attention_backend` decided, for logs and benchmark reports."""

    requested: str
    backend: str
    needs_backward: bool
    device_type: str
    torch_version: str
    cudnn_version: str | None
    disable_cudnn_sdp: bool
    reasons: tuple[str, ...]  # why the backend changed or cuDNN SDPA was turned off; empty if neither

    def to_dict(self) -> dict[str, object]:
        return {
            "requested": self.requested,
            "backend": self.backend,
            "needs_backward": self.needs_backward,
            "device_type": self.device_type,
            "torch": self.torch_version,
            "cudnn": self.cudnn_version,
            "disable_cudnn_sdp": self.disable_cudnn_sdp,
            "reasons": list(self.reasons),
        }


def parse_torch_version(text: str) -> tuple[int, int]:
    """``"2.11.0+cu130"`` → ``(2, 11)``."""
    parts = text.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise ValueError(f"cannot read a torch version from {text!r}") from None


def parse_cudnn_version(number: int | None) -> tuple[int, int] | None:
    """``torch.backends.cudnn.version()`` → (major, minor): 91900 → (9, 19) (cuDNN ≥ 9 encodes
    major·10000 + minor·100 + patch), 8902 → (8, 9) (cuDNN 8: major·1000 + minor·100 + patch)."""
    if number is None:
        return None
    if number >= 90000:
        return number // 10000, (number % 10000) // 100
    return number // 1000, (number % 1000) // 100


def _installed_cudnn() -> int | None:
    try:
        return torch.backends.cudnn.version()
    except Exception:  # pragma: no cover - a torch build without cuDNN
        return None


def _requirement_problem(backend: str) -> str | None:
    """diffusers' own check of the kernel package a backend needs (flash-attn, sageattention, ...)."""
    try:
        from diffusers.models.attention_dispatch import (
            AttentionBackendName,
            _check_attention_backend_requirements,
        )
    except ImportError:  # pragma: no cover - diffusers moved its private checker
        return None
    try:
        _check_attention_backend_requirements(AttentionBackendName(backend))
    except (RuntimeError, ImportError) as exc:
        return str(exc)
    return None


#: ``select_attention_backend(cudnn_version=INSTALLED_CUDNN)``: read the installed cuDNN (None: no cuDNN)
INSTALLED_CUDNN = -1


def select_attention_backend(
    requested: str,
    *,
    needs_backward: bool,
    device: torch.device | str,
    torch_version: str | None = None,
    cudnn_version: int | None = INSTALLED_CUDNN,
    known_bad: tuple[KnownBadAttention, ...] = KNOWN_BAD_ATTENTION,
    shape: AttentionShape | None = None,
    cudnn_sdpa: str = "auto",
) -> AttentionChoice:
    """The diffusers attention backend to use instead of ``requested`` (``model.attention_backend``).

    Falls back to ``native`` (logging a warning with the reason) when the requested backend cannot run on
    ``device``, its kernel package is missing, or ``known_bad`` lists it for this direction and these
    versions. When the final backend dispatches through torch SDPA and a row says cuDNN SDPA fails here,
    ``torch.backends.cuda.enable_cudnn_sdp(False)`` is called (a process-wide switch, so a colocated rank's
    generation also loses the cuDNN forward kernel). ``torch_version`` / ``cudnn_version`` default to the
    installed ones (tests pass others; ``cudnn_version=None`` means "no cuDNN", not "the installed one").
    ``shape`` (:meth:`AttentionShape.of`) exempts the model from rows bound to other shapes; ``cudnn_sdpa``
    is ``model.cudnn_sdpa`` (``auto``: the rows decide per shape; ``disabled``: cuDNN SDPA off on every rank
    whatever the rows say, an A/B switch and an escape hatch for a new failure). Raises ValueError for a
    name diffusers does not know or a ``cudnn_sdpa`` outside :data:`CUDNN_SDPA_SETTINGS`.
    """
    if cudnn_sdpa not in CUDNN_SDPA_SETTINGS:
        raise ValueError(f"model.cudnn_sdpa={cudnn_sdpa!r}; allowed: {', '.join(CUDNN_SDPA_SETTINGS)}")
    allowed = available_attention_backends()
    if requested not in allowed:
        raise ValueError(
            f"model.attention_backend={requested!r} is not a diffusers attention backend usable offline; "
            f"allowed: {', '.join(allowed)}"
        )
    device_type = torch.device(device).type
    torch_text = torch_version or torch.__version__
    torch_v = parse_torch_version(torch_text)
    cudnn_number = _installed_cudnn() if cudnn_version == INSTALLED_CUDNN else cudnn_version
    cudnn_v = parse_cudnn_version(cudnn_number)
    reasons: list[str] = []
    backend = requested

    def fall_back(why: str) -> None:
        nonlocal backend
        reasons.append(f"{backend} -> {FALLBACK_BACKEND}: {why}")
        backend = FALLBACK_BACKEND

    if backend in FOREIGN_DEVICE_BACKENDS:
        fall_back(f"it runs only on its own accelerator, not on {device_type}")
    elif device_type != "cuda" and backend not in CPU_BACKENDS:
        fall_back(f"it needs a CUDA device, this is {device_type}")
    if backend != FALLBACK_BACKEND:
        problem = _requirement_problem(backend)
        if problem is not None:
            fall_back(problem)
    disable_cudnn = False
    for _ in range(2):  # a fallback lands on "native", which may carry its own row
        rows = [
            row
            for row in known_bad
            if row.matches(
                backend,
                needs_backward=needs_backward,
                device_type=device_type,
                torch_version=torch_v,
                cudnn_version=cudnn_v,
                shape=shape,
            )
        ]
        fallback_rows = [row for row in rows if row.remedy == "fallback"]
        if fallback_rows and backend != FALLBACK_BACKEND:
            fall_back(fallback_rows[0].reason)
            continue
        for row in rows:
            if row.remedy == "disable-cudnn-sdp":
                disable_cudnn = True
                reasons.append(f"cuDNN SDPA disabled: {row.reason}")
        break
    if cudnn_sdpa == "disabled" and device_type == "cuda":
        disable_cudnn = True
        reasons.append("cuDNN SDPA disabled: model.cudnn_sdpa=disabled")
    if disable_cudnn:
        torch.backends.cuda.enable_cudnn_sdp(False)
    for reason in reasons:
        log.warning("attention backend %r (%s): %s", requested, _direction(needs_backward), reason)
    cudnn_text = None if cudnn_v is None else f"{cudnn_v[0]}.{cudnn_v[1]}"
    return AttentionChoice(
        requested=requested,
        backend=backend,
        needs_backward=needs_backward,
        device_type=device_type,
        torch_version=torch_text,
        cudnn_version=cudnn_text,
        disable_cudnn_sdp=disable_cudnn,
        reasons=tuple(reasons),
    )


def _direction(needs_backward: bool) -> str:
    return "training: forward + backward" if needs_backward else "inference: forward only"


def process_attention_backend() -> str | None:
    """diffusers' process-wide active backend: attention processors without their own setting use it, and
    every ``ModelMixin.set_attention_backend`` call changes it (diffusers models/modeling_utils.py), so one
    model's choice leaks into every model built later in the process. None if diffusers has no registry."""
    try:
        from diffusers.models.attention_dispatch import _AttentionBackendRegistry
    except ImportError:  # pragma: no cover - diffusers moved its private registry
        return None
    backend = _AttentionBackendRegistry.get_active_backend()[0]
    return str(getattr(backend, "value", backend))


def apply_attention_backend(flow_model: FlowModel, backend: str) -> None:
    """Route ``flow_model``'s attention through ``backend`` *and* make diffusers' process-wide default agree.

    :func:`digenrl.models.flow_model.set_attention_backend` skips ``native`` when the processors look unset,
    but an unset processor follows the process-wide default, which an earlier call may have changed (e.g.
    to ``_native_cudnn``); a safe choice must hold whatever ran before it.
    """
    set_attention_backend(flow_model, backend)
    active = process_attention_backend()
    setter = getattr(flow_model.transformer, "set_attention_backend", None)
    if active is not None and active != backend and setter is not None:
        setter(backend)
