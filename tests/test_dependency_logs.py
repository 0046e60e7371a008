"""digenrl/dependency_logs.py: the dependency log lines a user cannot act on (torchao's import noise) are
dropped one by one, every other record of the same loggers still shows; and a real import of diffusers
with torchao installed prints none of them once the filters are in (without them, it does)."""

from __future__ import annotations

import enum
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from digenrl.dependency_logs import KNOWN_NOISE, quiet_dependency_logs

REPO = Path(__file__).resolve().parents[1]


class Other(enum.Enum):
    A = 1


class KernelPreference(enum.Enum):
    """Stands for torchao's enum of that name (torchao.quantization)."""

    A = 1


KernelPreference.__module__ = "torchao.quantization"


def _record(name: str, msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, args or None, None)


def _kept(record: logging.LogRecord) -> bool:
    return all(f.filter(record) for f in logging.getLogger(record.name).filters)


def test_each_known_line_is_dropped_and_nothing_else() -> None:
    quiet_dependency_logs()
    quiet_dependency_logs()  # idempotent
    # one filter of ours per logger (diffusers may add its own rank-zero filter to its loggers)
    ours = [
        [f for f in logging.getLogger(n).filters if type(f).__name__ == "_DropKnownNoise"]
        for n in KNOWN_NOISE
    ]
    assert all(len(filters) == 1 for filters in ours), ours
    so = "/x/site-packages/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so"
    assert not _kept(_record("torchao", f"Failed to load {so}: Could not load this library"))
    assert not _kept(_record("torchao", "Failed to load /x/torchao/_C_cutlass_90a.abi3.so: nope"))
    assert _kept(_record("torchao", "Failed to load /x/torchao/_C.abi3.so: nope"))  # a kernel it may need
    assert _kept(_record("torchao", "something else"))
    assert not _kept(_record("torchao.kernel.intmm", "Warning: Detected no triton, on systems without ..."))
    enum_msg = "%s is an Enum subclass and is now natively supported by torch.compile ..."
    assert not _kept(_record("torch.utils._pytree", enum_msg, KernelPreference))
    assert _kept(_record("torch.utils._pytree", enum_msg, Other))  # someone else's enum still warns
    quantizer = "diffusers.quantizers.torchao.torchao_quantizer"
    assert not _kept(_record(quantizer, "Unable to import `torchao` Tensor objects. This may affect ..."))
    assert _kept(_record(quantizer, "another warning"))


SNIPPET = """
import logging, sys
logging.basicConfig(format="%(name)s: %(message)s")
if sys.argv[1] == "quiet":
    from digenrl.dependency_logs import quiet_dependency_logs
    quiet_dependency_logs()
import diffusers
from diffusers import SD3Transformer2DModel
"""


def test_importing_diffusers_with_torchao_prints_none_of_them() -> None:
    pytest.importorskip("torchao")
    needles = ("Detected no triton", "is an Enum subclass", "Unable to import `torchao` Tensor objects")

    def stderr(mode: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", SNIPPET, mode], cwd=REPO, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
        return done.stderr

    quiet = stderr("quiet")
    assert not [n for n in needles if n in quiet], quiet
    assert "_C_mxfp8" not in quiet and "_C_cutlass_90a" not in quiet
    loud = stderr("loud")  # the control: this machine's torchao does print them without the filters
    assert any(n in loud for n in needles), loud
