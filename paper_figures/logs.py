"""The one place that reads figure inputs: run directories (spans, metrics, config) and results tables.

A *run directory* is what ``experiments/run_train.py`` writes (docs/operations.md, "Reading a run"):
``config.yaml``, ``metrics.jsonl`` and ``events/rank<r>.jsonl``. Span records are parsed by the library's own
reader (``digenrl.runtime.observe.event_records``), so the figures and the runtime can never disagree on the
format.

A *results table* is a CSV or JSON file of rows, one per (model, system[, GPU count / split]) measurement or
simulation; the columns are documented in ``paper_figures/README.md`` and validated here with errors that
name the file, the row and the key. The JSON that ``experiments/measure.py ablation`` writes (``meta`` and
rows keyed by ``variant``) is read as a table of ``experiment=ablation`` rows, one panel per profile.
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

from digenrl.runtime.observe.event_records import EVENTS_SUBDIR, load_events
from digenrl.runtime.observe.metrics import read_metrics

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
    "samples_per_s_runs",
    "bubble_free_samples_per_s",
    "staleness_allowed",
    "stale_fraction",
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
    name: str = ""  # how figures name the run (make_all: its path below --logs); default the folder's name

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
        """Legend label and title: the system from config.yaml (if any) and the run's name."""
        system, name = self.config.get("system"), self.name or self.path.name
        return f"{system} ({name})" if system else name


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


def load_run(run_dir: str | Path, name: str = "") -> RunLog:
    """Read a run directory (``name``: how figures call it). Raises ValueError if it holds neither event
    logs nor ``metrics.jsonl``."""
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
        name=name,
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
    # Optional ablation columns (what experiments/measure.py ablation measures, all about samples_per_s): the
    # samples/s of each repeated run, the bubble-free bound, the staleness the variant allows and the
    # fraction of trained samples that were stale.
    runs: tuple[float, ...] = ()
    bubble_free: float | None = None
    staleness: int | None = None
    stale_fraction: float | None = None
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
        if isinstance(loaded, dict) and is_ablation_file(loaded):
            loaded = ablation_file_rows(loaded, str(path))
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


def is_ablation_file(loaded: Mapping[str, Any]) -> bool:
    """Whether a JSON object is what ``experiments/measure.py ablation`` writes: rows named by ``variant``."""
    rows = loaded.get("rows")
    return (
        isinstance(rows, list)
        and bool(rows)
        and all(isinstance(r, Mapping) and "variant" in r and "model" not in r for r in rows)
    )


def ablation_file_rows(loaded: Mapping[str, Any], origin: str) -> list[dict[str, Any]]:
    """``measure.py ablation``'s rows as results-table rows: ``experiment=ablation``, ``model`` = the profile
    (one panel per profile), ``system`` = the variant, measured.

    Both formats the script has written are read: the current one (``samples_per_s_runs``,
    ``bubble_free_samples_per_s``, ``busy`` per pool, ``staleness_allowed``, ``stale_fraction``,
    ``tag_fragments``) and the first one (one run per variant, ``busy_<pool>`` keys, no staleness column:
    its variants were synchronous, so the staleness is read from the overrides, which name every knob that
    allows any)."""
    meta = loaded.get("meta")
    if not isinstance(meta, Mapping) or _blank(meta.get("profile")):
        raise ValueError(f"{origin}: an ablation file (rows keyed by 'variant') needs key 'meta.profile'")
    nproc, trainers = meta.get("nproc"), meta.get("trainers")
    rows = []
    for raw in loaded["rows"]:
        overrides = [str(o) for o in raw.get("overrides") or []]
        colocated = any(o.startswith("system=colocated") for o in overrides)
        busy = raw.get("busy")
        if busy is None:  # first format: busy_trainer, busy_generator
            busy = {k.removeprefix("busy_"): v for k, v in raw.items() if k.startswith("busy_")}
        row = {
            "experiment": "ablation",
            "model": str(meta["profile"]),
            "system": raw["variant"],
            "source": "measured",
            "samples_per_s": raw.get("samples_per_s"),
            "samples_per_s_runs": raw.get("samples_per_s_runs"),
            "bubble_free_samples_per_s": raw.get("bubble_free_samples_per_s"),
            "staleness_allowed": raw.get("staleness_allowed", staleness_of_overrides(overrides)),
            "stale_fraction": raw.get("stale_fraction"),
            "tag_fragments": raw.get("tag_fragments"),
            "busy": busy,
            "date": meta.get("date"),
            "hardware": meta.get("hardware"),
        }
        if not colocated and isinstance(nproc, int) and isinstance(trainers, int) and 0 < trainers < nproc:
            row["trainers"], row["generators"] = trainers, nproc - trainers
        rows.append({k: v for k, v in row.items() if v is not None})
    return rows


def staleness_of_overrides(overrides: Sequence[str]) -> int:
    """Policy versions a variant lets a trained sample lag, from its ``key=value`` overrides (the last value
    of a key wins, as in digenrl.config): TCSS allows one (docs/design.md §3 "TCSS"),
    ``asynchrony.max_staleness=N`` allows N, anything else none."""
    values = dict(override.partition("=")[::2] for override in overrides)
    tcss = 1 if values.get("tcss", "").strip().lower() == "true" else 0
    return max(tcss, int(values.get("asynchrony.max_staleness", 0)))


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
    runs = _run_values(values.get("samples_per_s_runs"), where)
    bubble_free = values.get("bubble_free_samples_per_s")
    if bubble_free is not None:
        bubble_free = _non_negative(bubble_free, "bubble_free_samples_per_s", where)
    staleness = values.get("staleness_allowed")
    stale_fraction = values.get("stale_fraction")
    if stale_fraction is not None:
        stale_fraction = _non_negative(stale_fraction, "stale_fraction", where)
        if stale_fraction > 1:
            raise ValueError(f"{where}: stale_fraction={stale_fraction!r} must be in [0, 1]")
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
        runs=runs,
        bubble_free=bubble_free,
        staleness=None if staleness is None else _non_negative_int(staleness, "staleness_allowed", where),
        stale_fraction=stale_fraction,
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


def _run_values(value: Any, where: str) -> tuple[float, ...]:
    """``samples_per_s_runs``: a JSON list, or in a CSV cell the values separated by spaces or ';'."""
    if _blank(value):
        return ()
    items = value.replace(";", " ").split() if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        raise ValueError(f"{where}: samples_per_s_runs={value!r} must be a list of numbers")
    return tuple(_non_negative(item, "samples_per_s_runs", where) for item in items)


def _non_negative_int(value: Any, key: str, where: str) -> int:
    number = _non_negative(value, key, where)
    if not number.is_integer():
        raise ValueError(f"{where}: {key}={value!r} must be an integer >= 0")
    return int(number)


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
