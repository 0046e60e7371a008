"""The batch ledger: which samples each batched computation of a rank ran on, in order.

Two schedules compute the same numbers bit for bit only if they run the same operations on the same
shapes in the same order: a batched kernel (a convolution, a matmul) may round a sample's result
differently when the batch around it has another size, and a gradient summed over micro-batches in
another grouping or order rounds differently in its last bits (docs/operations.md, "Reproducible runs").
Whether that holds on one CPU or GPU is luck; whether the *batches* are the same is not. With
``runtime.record_batches=true`` every rank writes ``out_dir/batches/rank<r>.jsonl``, one line per batched
computation::

    {"op": "rollout", "iteration": 0, "steps": [0, 8], "samples": [[0, 0], [0, 1], ...]}
    {"op": "decode", "iteration": 0, "samples": [[0, 0], ...]}
    {"op": "train", "iteration": 0, "units": [[0, 0, 3], ...]}

A sample is ``[group id, index in group]``, a training unit ``[group id, index in group, step index]``.
``rollout`` is one transformer forward's batch (the same at every step of ``steps``), ``decode`` one VAE
decode + reward call, ``train`` one micro-batch in the order its gradient was accumulated.
:func:`read_batch_ledger` reads the ledgers of a run back; tests/systems/test_exact_equivalence.py compares
two schedules' ledgers, so a change of batch shape fails on every machine, not only where it rounds
differently.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

LEDGER_DIR = "batches"
#: the batched computations a ledger records (see the module docstring)
LEDGER_OPS = ("rollout", "decode", "train")


class BatchLedger:
    """Appends this rank's batched computations to ``out_dir/batches/rank<r>.jsonl`` (one line each,
    flushed as written, like the event log)."""

    def __init__(self, out_dir: str | Path, rank: int, *, append: bool = False):
        folder = Path(out_dir) / LEDGER_DIR
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"rank{rank}.jsonl"
        self._file = self.path.open("a" if append else "w", encoding="utf-8")

    def record(self, op: str, iteration: int, key: str, rows: Sequence[Sequence[int]], **extra: Any) -> None:
        if op not in LEDGER_OPS:
            raise ValueError(f"unknown ledger op {op!r}; allowed: {list(LEDGER_OPS)}")
        line = {"op": op, "iteration": int(iteration), **extra, key: [[int(v) for v in row] for row in rows]}
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def sample_keys(prompt_ids: Sequence[int], sample_ids: Sequence[int]) -> list[list[int]]:
    """``[group id, index in group]`` of every sample of a batch."""
    return [[int(p), int(s)] for p, s in zip(prompt_ids, sample_ids, strict=True)]


def read_batch_ledger(out_dir: str | Path) -> dict[int, list[dict[str, Any]]]:
    """Every rank's ledger of the run in ``out_dir``: rank -> its lines in order."""
    folder = Path(out_dir) / LEDGER_DIR
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} does not exist: run with runtime.record_batches=true")
    ledgers = {}
    for path in sorted(folder.glob("rank*.jsonl")):
        rank = int(path.stem.removeprefix("rank"))
        with path.open(encoding="utf-8") as fh:
            ledgers[rank] = [json.loads(line) for line in fh if line.strip()]
    return ledgers
