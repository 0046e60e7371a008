"""The one place that reads figure inputs: run directories (spans, metrics, config) and results tables.

A *run directory* is what ``experiments/run_*.py`` writes (README.md, "Outputs in out_dir"): ``config.yaml``,
``metrics.jsonl`` and ``events/rank<r>.jsonl``. Span records are parsed by the library's own reader
(``digenrl.runtime.event_records``), so the figures and the runtime can never disagree on the format.

A *results table* is a CSV or JSON file of rows, one per (model, system[, GPU count / split]) measurement or
simulation; the columns are documented in ``paper_figures/README.md`` and validated here with errors that
name the file, the row and the key.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from digenrl.runtime.event_records import EVENTS_SUBDIR, load_events
from digenrl.runtime.metrics import read_metrics

THROUGHPUT_METRICS = ("samples_per_s", "images_per_gpu_s")
SOURCES = ("measured", "simulated")
EXPERIMENTS = ("main", "ablation", "scaling", "split")
_KNOWN_COLUMNS = {
    "model",
    "system",
    "source",
    "experiment",
    "gpus",
    "generators",
    "trainers",
    *THROUGHPUT_METRICS,
    *(f"{metric}_std" for metric in THROUGHPUT_METRICS),
}


# --------------------------------------------------------------------------------------------- run dirs


@dataclass
class RunLog:
    """Everything the figures read from one run directory. Missing parts are empty, not errors."""

    path: Path
    config: dict[str, Any]
    spans: list[dict[str, Any]]
    counters: list[dict[str, Any]]
    roles: dict[int, str]
    metrics: list[dict[str, Any]]

    @property
    def ranks(self) -> list[int]:
        return sorted(self.roles)

    @property
    def span_iterations(self) -> list[int]:
        """Iteration tags present on spans, ascending."""
        return sorted({int(s["iteration"]) for s in self.spans if s.get("iteration") is not None})

    @property
    def metric_iterations(self) -> list[int]:
        return [int(record["iteration"]) for record in self.metrics]

    @property
    def label(self) -> str:
        """Legend label: the system from config.yaml (if any) and the directory name."""
        system = self.config.get("system")
        return f"{system} ({self.path.name})" if system else self.path.name


def has_events(run_dir: str | Path) -> bool:
    return any((Path(run_dir) / EVENTS_SUBDIR).glob("rank*.jsonl"))


def has_metrics(run_dir: str | Path) -> bool:
    return (Path(run_dir) / "metrics.jsonl").is_file()


def is_run_dir(path: str | Path) -> bool:
    return Path(path).is_dir() and (has_events(path) or has_metrics(path))


def find_run_dirs(root: str | Path) -> list[Path]:
    """Every run directory at or below ``root`` (sorted), found by its ``metrics.jsonl`` or event logs."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"logs root '{root}' is not a directory")
    candidates = {path.parent for path in root.rglob("metrics.jsonl")}
    candidates |= {path.parent.parent for path in root.rglob(f"{EVENTS_SUBDIR}/rank*.jsonl")}
    return sorted(path for path in candidates if is_run_dir(path))


def load_config(run_dir: str | Path) -> dict[str, Any]:
    """The resolved ``config.yaml`` of a run, or ``{}`` when the run did not write one."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return {}
    loaded = yaml.safe_load(path.read_text())
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ValueError(f"{path} must hold a mapping, got {type(loaded).__name__}")
    return loaded


def load_spans(run_dir: str | Path) -> list[dict[str, Any]]:
    """All ``span`` records of every rank (library reader: a torn last line is dropped)."""
    return [record for record in load_events(run_dir) if record["type"] == "span"]


def load_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Per-iteration metrics sorted by iteration. After ``resume=true`` a re-run iteration appears twice in
    the append-only file; the later record wins, since it is the one the resumed run continued from."""
    by_iteration: dict[int, dict[str, Any]] = {}
    for number, record in enumerate(read_metrics(run_dir), start=1):
        if "iteration" not in record:
            raise ValueError(f"{Path(run_dir) / 'metrics.jsonl'}:{number} lacks key 'iteration'")
        by_iteration[int(record["iteration"])] = record
    return [by_iteration[k] for k in sorted(by_iteration)]


def load_run(run_dir: str | Path) -> RunLog:
    """Read a run directory. Raises ValueError if it holds neither event logs nor ``metrics.jsonl``."""
    path = Path(run_dir)
    if not is_run_dir(path):
        raise ValueError(
            f"run_dir '{path}' is not a run directory: it holds neither metrics.jsonl nor "
            f"{EVENTS_SUBDIR}/rank<r>.jsonl"
        )
    records = load_events(path) if has_events(path) else []
    roles: dict[int, str] = {}
    for record in records:
        roles.setdefault(int(record["rank"]), str(record["role"]))
    return RunLog(
        path=path,
        config=load_config(path),
        spans=[r for r in records if r["type"] == "span"],
        counters=[r for r in records if r["type"] == "counter"],
        roles=roles,
        metrics=load_metrics(path) if has_metrics(path) else [],
    )


# --------------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class ResultRow:
    """One row of a results table, validated and typed. ``throughput`` maps metric name -> value for every
    throughput column the row fills; ``std`` likewise for the optional ``<metric>_std`` columns."""

    model: str
    system: str
    source: str
    experiment: str
    throughput: Mapping[str, float]
    std: Mapping[str, float] = field(default_factory=dict)
    gpus: int | None = None
    generators: int | None = None
    trainers: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    origin: str = ""

    @property
    def is_simulated(self) -> bool:
        return self.source == "simulated"


def read_results_table(path: str | Path) -> list[ResultRow]:
    """Rows of a ``.csv`` (header line; lines starting with ``#`` are comments) or ``.json`` table (a list
    of row objects, or an object whose ``rows`` key is that list; other keys such as ``_comment`` ignored)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".csv":
        text = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
        raw_rows: list[Any] = list(csv.DictReader(io.StringIO(text)))
    elif suffix == ".json":
        try:
            loaded = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not valid JSON: {error}") from error
        if isinstance(loaded, dict):
            if "rows" not in loaded:
                raise ValueError(
                    f"{path}: a JSON results table is a list of rows or an object with key 'rows'"
                )
            loaded = loaded["rows"]
        if not isinstance(loaded, list):
            raise ValueError(f"{path}: 'rows' must be a list of objects, got {type(loaded).__name__}")
        raw_rows = loaded
    else:
        raise ValueError(f"results table '{path}' must end in .csv or .json")
    if not raw_rows:
        raise ValueError(f"results table '{path}' has no rows")
    return parse_result_rows(raw_rows, origin=str(path))


def parse_result_rows(rows: Iterable[Any], origin: str = "<rows>") -> list[ResultRow]:
    """Validate raw row mappings (CSV strings or JSON values) into ``ResultRow``s."""
    parsed = []
    for index, raw in enumerate(rows, start=1):
        where = f"{origin} row {index}"
        if not isinstance(raw, Mapping):
            raise ValueError(f"{where}: a row must be an object/mapping, got {type(raw).__name__}")
        parsed.append(_parse_row(raw, where))
    return parsed


def _parse_row(raw: Mapping[str, Any], where: str) -> ResultRow:
    values = {str(k).strip(): v for k, v in raw.items() if k is not None and not _blank(v)}
    for key in ("model", "system", "source"):
        if key not in values:
            raise ValueError(f"{where}: missing required key '{key}'")
    source = str(values["source"]).strip().lower()
    if source not in SOURCES:
        raise ValueError(f"{where}: source={values['source']!r}; allowed: {list(SOURCES)}")
    experiment = str(values.get("experiment", "main")).strip().lower()
    if experiment not in EXPERIMENTS:
        raise ValueError(f"{where}: experiment={values['experiment']!r}; allowed: {list(EXPERIMENTS)}")
    throughput = {m: _non_negative(values[m], m, where) for m in THROUGHPUT_METRICS if m in values}
    if not throughput:
        raise ValueError(f"{where}: needs one of the throughput keys {list(THROUGHPUT_METRICS)}")
    std = {
        m: _non_negative(values[f"{m}_std"], f"{m}_std", where)
        for m in THROUGHPUT_METRICS
        if f"{m}_std" in values
    }
    gpus, generators, trainers = (
        _positive_int(values.get(k), k, where) for k in ("gpus", "generators", "trainers")
    )
    if experiment == "scaling" and gpus is None:
        raise ValueError(f"{where}: experiment 'scaling' needs key 'gpus'")
    if experiment == "split" and (generators is None or trainers is None):
        raise ValueError(f"{where}: experiment 'split' needs keys 'generators' and 'trainers'")
    return ResultRow(
        model=str(values["model"]).strip(),
        system=str(values["system"]).strip(),
        source=source,
        experiment=experiment,
        throughput=throughput,
        std=std,
        gpus=gpus,
        generators=generators,
        trainers=trainers,
        extra={k: v for k, v in values.items() if k not in _KNOWN_COLUMNS},
        origin=where,
    )


def rows_for(rows: Sequence[ResultRow], experiment: str) -> list[ResultRow]:
    """The rows of one experiment kind (``main`` | ``ablation`` | ``scaling`` | ``split``)."""
    if experiment not in EXPERIMENTS:
        raise ValueError(f"experiment={experiment!r}; allowed: {list(EXPERIMENTS)}")
    return [row for row in rows if row.experiment == experiment]


def experiment_rows(
    rows: Sequence[ResultRow] | str | Path, experiment: str, metric: str | None = None
) -> tuple[list[ResultRow], str]:
    """The rows of one experiment (from rows or a table path) and the metric to draw; a table with
    no such rows is a ValueError naming the experiment."""
    rows = read_results_table(rows) if isinstance(rows, str | Path) else list(rows)
    selected = rows_for(rows, experiment)
    if not selected:
        raise ValueError(f"the table has no rows with experiment={experiment}")
    return selected, choose_metric(selected, metric)


def choose_metric(rows: Sequence[ResultRow], metric: str | None = None) -> str:
    """The throughput column a figure plots: ``metric`` if given, else the first of ``THROUGHPUT_METRICS``
    that every row fills. One figure never mixes metrics, since their units differ."""
    if not rows:
        raise ValueError("no result rows to plot")
    candidates = [metric] if metric is not None else list(THROUGHPUT_METRICS)
    if metric is not None and metric not in THROUGHPUT_METRICS:
        raise ValueError(f"metric={metric!r}; allowed: {list(THROUGHPUT_METRICS)}")
    for candidate in candidates:
        if all(candidate in row.throughput for row in rows):
            return candidate
    lacking = [row.origin for row in rows if not any(c in row.throughput for c in candidates)][:3]
    raise ValueError(
        f"rows do not share a throughput metric (wanted one of {candidates}); "
        f"e.g. {lacking or rows[0].origin}"
    )


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _non_negative(value: Any, key: str, where: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {key}={value!r} is not a number") from None
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{where}: {key}={value!r} must be a finite number >= 0")
    return number


def _positive_int(value: Any, key: str, where: str) -> int | None:
    if _blank(value):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {key}={value!r} is not an integer") from None
    if not number.is_integer() or number < 1:
        raise ValueError(f"{where}: {key}={value!r} must be a positive integer")
    return int(number)
