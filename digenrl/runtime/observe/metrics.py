"""Per-iteration metrics: ``out_dir/metrics.jsonl`` (rank 0), one progress line per iteration, and the same
numbers (with the evaluation's sample grid, digenrl/runtime/observe/sample_grid.py) in TensorBoard when it is
installed and in Weights & Biases when ``logger.wandb=true``.

One line per iteration, always: a resumed run first cuts the file back to the iterations before its
checkpoint (atomically: a temporary file replaces it), so the iterations a crash made it redo are not
written twice. Iterations are numbered as in the metrics everywhere (0-based): the progress line of
iteration 0 of 20 reads ``[digenrl] iteration 0 (1/20) …``.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from pathlib import Path
from typing import Any, Protocol, TextIO

from digenrl.config import LoggerConfig
from digenrl.runtime.observe.json_lines import read_json_lines
from digenrl.runtime.observe.span_phases import Phase
from digenrl.runtime.run_folder.run_files import ensure_dir, open_append, write_atomic

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"  # what ``wandb.init(dir=out_dir)`` creates there

REQUIRED_KEYS = (
    "iteration",
    "policy_version",
    "reward_mean",
    "reward_std",
    "loss",
    "ratio_mean",
    "update_norm",
    "samples_per_s",
    "wall_s",
)


class ScalarWriter(Protocol):
    """What :class:`MetricsWriter` needs of a TensorBoard ``SummaryWriter``."""

    def add_scalar(self, tag: str, scalar_value: float, global_step: int) -> None: ...

    def add_image(self, tag: str, img_tensor: Any, global_step: int, *, dataformats: str) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


def open_tensorboard(out_dir: str | Path, start_iteration: int = 0) -> ScalarWriter | None:
    """A ``SummaryWriter`` on ``out_dir/tensorboard`` when TensorBoard is installed, else None (said once).

    TensorBoard is optional (not a dependency of the package): ``torch.utils.tensorboard`` imports the
    ``tensorboard`` package and raises ImportError without it. ``purge_step`` makes TensorBoard drop what
    an earlier process logged at or after the resumed iteration, as ``metrics.jsonl`` is cut back."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as error:
        log.info("TensorBoard not installed (%s): metrics go to metrics.jsonl only", error)
        return None
    return SummaryWriter(str(Path(out_dir) / TENSORBOARD_DIR), purge_step=start_iteration or None)


class WandbRun(Protocol):
    """What :class:`MetricsWriter` needs of a ``wandb`` run (``wandb.init``'s result)."""

    def log(self, data: dict[str, Any], step: int) -> None: ...

    def finish(self) -> None: ...


def open_wandb(
    logger: LoggerConfig, out_dir: str | Path, run_id: str | None, config: dict[str, Any]
) -> WandbRun | None:
    """A Weights & Biases run when ``logger.wandb=true`` (``wandb`` is imported only then; startup validation
    has checked it is installed), else None. ``wandb_mode=offline`` writes ``out_dir/wandb/`` without any
    connection; the run's id is DigenRL's ``run_id``, so a resumed run continues the same W&B run."""
    if not logger.wandb:
        return None
    import wandb

    return wandb.init(
        project=logger.wandb_project,
        name=logger.wandb_run_name or Path(out_dir).resolve().name,
        mode=logger.wandb_mode,
        dir=str(out_dir),
        id=run_id,
        resume="allow",
        config=config,
    )


class MetricsWriter:
    """Appends one JSON object per iteration; only the writer rank touches the file.

    ``start_iteration``: the iteration this process starts at; lines of that iteration and later are cut
    from an existing file (0: the file starts empty). ``run_id`` is added to every record. ``tensorboard``:
    a writer the records' numbers also go to (:func:`open_tensorboard`), or None; ``wandb`` likewise
    (:func:`open_wandb`). An evaluation's grid goes to both as an image (:meth:`log`'s ``image``).
    """

    def __init__(
        self,
        out_dir: str | Path,
        *,
        is_writer: bool,
        stream: TextIO | None = None,
        start_iteration: int = 0,
        run_id: str | None = None,
        tensorboard: ScalarWriter | None = None,
        wandb: WandbRun | None = None,
    ):
        self.path = Path(out_dir) / METRICS_FILE
        self.is_writer = is_writer
        self.stream = stream if stream is not None else sys.stdout
        self.run_id = run_id
        self.tensorboard = tensorboard if is_writer else None
        self.wandb = wandb if is_writer else None
        if is_writer:
            ensure_dir(self.path.parent)
            kept = (
                [r for r in read_metrics(out_dir) if r["iteration"] < start_iteration]
                if start_iteration
                else []
            )
            _replace(self.path, kept)

    def log(self, record: dict[str, Any], image: Path | None = None) -> None:
        """Write ``record`` (an iteration's metrics) everywhere; ``image``: the evaluation's sample grid of
        this iteration, shown by TensorBoard and W&B under ``eval/samples``."""
        if not self.is_writer:
            return
        missing = [k for k in REQUIRED_KEYS if k not in record]
        if missing:
            raise KeyError(f"metrics record lacks {missing}")
        record = {**record, "run_id": self.run_id} if self.run_id is not None else record
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        with open_append(self.path) as f:
            f.write((json.dumps(clean) + "\n").encode())
        numbers = {
            k: v
            for k, v in clean.items()
            if k != "iteration" and isinstance(v, int | float) and not isinstance(v, bool)
        }
        if self.tensorboard is not None:
            for key, value in numbers.items():
                self.tensorboard.add_scalar(key, value, record["iteration"])
            if image is not None:
                self.tensorboard.add_image(
                    IMAGE_TAG, _read_png(image), record["iteration"], dataformats="HWC"
                )
            self.tensorboard.flush()
        if self.wandb is not None:
            import wandb

            extra = {IMAGE_TAG: wandb.Image(str(image))} if image is not None else {}
            self.wandb.log({**numbers, **extra}, step=record["iteration"])
        self.stream.write(progress_line(record) + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None


#: The tag the evaluation's sample grid goes under in TensorBoard and W&B.
IMAGE_TAG = "eval/samples"


def _read_png(path: Path) -> Any:
    """An image file as an HWC uint8 array (what ``SummaryWriter.add_image`` takes)."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as picture:
        return np.asarray(picture.convert("RGB"))


def progress_line(r: dict[str, Any]) -> str:
    """``[digenrl] iteration 3 (4/20) …``: the metrics' 0-based iteration, then how far the run is."""
    total = r.get("iterations")
    it = (
        f"iteration {r['iteration']} ({r['iteration'] + 1}/{total})"
        if total
        else f"iteration {r['iteration']}"
    )
    skipped = " NON-FINITE STEP SKIPPED" if r.get("nonfinite_skipped") else ""
    return (
        f"[digenrl] {it} v{r['policy_version']} reward {r['reward_mean']:+.4f}±{r['reward_std']:.4f} "
        f"loss {r['loss']:+.3e} ratio {r['ratio_mean']:.6f} |Δθ| {r['update_norm']:.3e} "
        f"{r['samples_per_s']:.2f} samples/s {r['wall_s']:.2f}s{skipped}{eval_text(r)}"
    )


def eval_text(r: dict[str, Any]) -> str:
    """`` | eval v<k> <mean>±<std>`` for a record that holds an evaluation (``eval_*``), else ""."""
    if "eval_reward_mean" not in r:
        return ""
    mean, std = r["eval_reward_mean"], r.get("eval_reward_std")
    shown = "non-finite" if mean is None or not math.isfinite(mean) else f"{mean:+.4f}±{std or 0.0:.4f}"
    return f" | eval v{r['eval_policy_version']} {shown}"


def read_metrics(out_dir: str | Path) -> list[dict[str, Any]]:
    """The records of ``out_dir/metrics.jsonl`` ([] when there is none). A damaged line (torn, not JSON,
    not a record with an integer ``iteration``) is skipped with a warning naming its line number
    (:mod:`digenrl.runtime.observe.json_lines`), so a resume, an ``overwrite`` and the closing summary still
    work."""
    path = Path(out_dir) / METRICS_FILE
    if not path.is_file():
        return []
    return read_json_lines(path, _metrics_problem)


def _metrics_problem(record: Any) -> str:
    if not isinstance(record, dict):
        return f"a {type(record).__name__}, not a record"
    iteration = record.get("iteration")
    if isinstance(iteration, bool) or not isinstance(iteration, int):
        return f"iteration={iteration!r} is not an integer"
    return ""


def _replace(path: Path, records: list[dict[str, Any]]) -> None:
    """Write ``records`` as the whole file, atomically."""
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in records))


def add_event_summary(out_dir: str | Path) -> None:
    """Fold the merged event logs into ``metrics.jsonl`` (:func:`with_event_summary`). Runs once, on rank 0,
    after every rank has closed its event log; the file is replaced atomically."""
    path = Path(out_dir) / METRICS_FILE
    if path.is_file():
        _replace(path, with_event_summary(read_metrics(out_dir), out_dir))


def with_event_summary(records: list[dict[str, Any]], out_dir: str | Path) -> list[dict[str, Any]]:
    """``records`` with, per iteration, the busy fraction of each pool (role), the seconds each role spent
    per phase and the bubble-free bound, from ``summarize_events`` over ``out_dir``'s event logs; with the
    run's model FLOPs and ceiling in the record, each loop phase's fraction of its bound too."""
    from digenrl.runtime.observe.event_summary import summarize_events

    summary = summarize_events(out_dir)
    out = []
    for record in records:
        per_iteration = summary.get(record["iteration"]) or summary.get(str(record["iteration"]))
        if per_iteration:
            record = {
                **record,
                "busy_fraction": per_iteration["busy_fraction"],
                "phase_seconds": per_iteration["phase_seconds"],
                "bubble_free_bound_s": per_iteration["bubble_free_bound_s"],
            }
            if record.get("flops") and record.get("ceiling_tflops"):
                record["fraction_of_bound_by_phase"] = fractions_by_phase(
                    record["flops"], record["phase_seconds"], record["ceiling_tflops"]
                )
        out.append(record)
    return out


#: The loop phases whose model FLOPs and fraction of the bound a run reports (digenrl/costs/flops.py), and
#: the event-log phases each one sums.
LOOP_PHASES: dict[str, tuple[str, ...]] = {
    "rollout": (Phase.GENERATE,),
    "score": (Phase.SCORE,),
    "train": (Phase.TRAIN,),
    "optimizer": (Phase.OPTIMIZER,),
    "sync": (Phase.SYNC,),
}


def fractions_by_phase(
    flops: dict[str, float], phase_seconds: dict[str, dict[str, float]], ceiling_tflops: float
) -> dict[str, float | None]:
    """Per loop phase: its model FLOPs / (the device-seconds of its spans, summed over roles and ranks, x the
    ceiling in TFLOP/s); None for a phase that took no time."""
    out: dict[str, float | None] = {}
    for phase, spans in LOOP_PHASES.items():
        seconds = sum(by.get(s, 0.0) for by in phase_seconds.values() for s in spans)
        out[phase] = flops.get(phase, 0.0) / (seconds * ceiling_tflops * 1e12) if seconds > 0 else None
    return out
