"""Silence the dependency log lines a DigenRL user cannot act on, one by one, at the entry points.

Importing diffusers or transformers imports torchao when it is installed (the ``fp8`` and ``test``
extras), and every command then printed, on every rank (found with ``python experiments/run_train.py
--config experiments/configs/tiny.yaml``, torchao 0.18, diffusers 0.42, torch 2.13, CPU):

* ``torchao``: ``Failed to load .../torchao/_C_mxfp8...so`` and ``..._C_cutlass_90a.abi3.so`` (torchao's
  ``__init__`` loads every bundled extension; these two hold MX-format and sm90a CUTLASS kernels that
  DigenRL never calls: ``model.fp8`` uses ``torchao.float8``, whose import is checked at start-up,
  digenrl/models/fp8.py);
* ``torchao.kernel.intmm``: ``Warning: Detected no triton, ...`` (CPU machines have no triton; the int-mm
  kernels are unused);
* ``torch.utils._pytree``: ``<enum 'KernelPreference'> is an Enum subclass ... register_constant() ...
  deprecated`` (and ``ScaleCalculationMode``): a deprecation inside torchao's own import
  (torchao/utils.py ``register_as_pytree_constant``);
* ``diffusers.quantizers.torchao.torchao_quantizer``: ``Unable to import `torchao` Tensor objects. This
  may affect loading checkpoints serialized with `torchao``` (diffusers looks for classes this torchao
  version moved; DigenRL loads no torchao-serialized checkpoint).

Each is dropped by a :class:`logging.Filter` on exactly that logger, matching its message and, where the
message is generic, what it is about (the two extension files, torchao's enums); every other record of
those loggers, and every Python ``warnings`` warning, still shows. :func:`quiet_dependency_logs` runs where
DigenRL's commands start (digenrl/launch.py for training and its ranks, experiments/*.py, the reward
server), before the dependencies are imported.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

#: torchao's bundled extensions that fail to load off their target hardware and that DigenRL never uses.
UNUSED_TORCHAO_EXTENSIONS = ("_C_mxfp8", "_C_cutlass_90a")


def _torchao_extension(record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return message.startswith("Failed to load ") and any(n in message for n in UNUSED_TORCHAO_EXTENSIONS)


def _torchao_enum_constant(record: logging.LogRecord) -> bool:
    cls = record.args[0] if isinstance(record.args, tuple) and record.args else None
    return (
        isinstance(record.msg, str)
        and record.msg.startswith("%s is an Enum subclass and is now natively supported")
        and getattr(cls, "__module__", "").startswith("torchao")
    )


def _message_starts(prefix: str) -> Callable[[logging.LogRecord], bool]:
    return lambda record: record.getMessage().startswith(prefix)


#: logger name → the test a record of it must pass to be dropped (module docstring).
KNOWN_NOISE: dict[str, Callable[[logging.LogRecord], bool]] = {
    "torchao": _torchao_extension,
    "torchao.kernel.intmm": _message_starts("Warning: Detected no triton"),
    "torch.utils._pytree": _torchao_enum_constant,
    "diffusers.quantizers.torchao.torchao_quantizer": _message_starts(
        "Unable to import `torchao` Tensor objects"
    ),
}


class _DropKnownNoise(logging.Filter):
    """Drops the records of one logger that its test in :data:`KNOWN_NOISE` recognises."""

    def __init__(self, test: Callable[[logging.LogRecord], bool]) -> None:
        super().__init__()
        self.test = test

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.test(record)


def quiet_dependency_logs() -> None:
    """Install the filters (idempotent: a second call adds none)."""
    for name, test in KNOWN_NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropKnownNoise) for f in logger.filters):
            logger.addFilter(_DropKnownNoise(test))
