"""The committed figures: every figure ``paper_figures/make_all.py`` can make from ``experiments/results``,
downsampled to a small PNG, plus (optionally) a trimmed copy of one real run so a real timeline is drawn.

    python experiments/make_figures.py --real-run runs/validation/digenrl-gap-f4 --iterations 1:4
    python experiments/make_figures.py                     # re-render from what is under experiments/results

``--real-run DIR`` first rebuilds ``DIR/trace.json`` from its event logs when it is missing or older than
them (a run that crashed before merging them), then copies ``DIR``'s ``config.yaml``, the
``reward``/``wall_s`` fields of its ``metrics.jsonl`` and the event records of iterations
``--iterations A:B`` (plus each rank's meta line) into ``experiments/results/runs/<name>/`` (a few KB; the
first ``--logs`` folder's ``runs/``). ``--logs`` takes several folders (``make_all`` draws the runs and
tables of each). Then ``make_all`` renders into ``--out`` at its default dpi and every PNG is resampled to
``--dpi`` (default 100) so committed figures stay small.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from digenrl.runtime.observe.chrome_trace import merge_chrome_trace, trace_is_stale  # noqa: E402
from paper_figures.make_all import make_all  # noqa: E402
from paper_figures.style import DEFAULT_DPI  # noqa: E402

RESULTS = REPO / "experiments" / "results"
METRIC_KEYS = ("iteration", "reward_mean", "reward_std", "wall_s", "samples", "busy_fraction")


def trim_run(src: Path, dst: Path, first: int, last: int) -> Path:
    """Copy a real run directory, keeping only iterations ``[first, last]`` of its event logs."""
    events = sorted((src / "events").glob("rank*.jsonl"))
    if not events:
        raise ValueError(f"--real-run {src} has no events/rank<r>.jsonl")
    (dst / "events").mkdir(parents=True, exist_ok=True)
    for path in events:
        kept = []
        for line in path.read_text().splitlines():
            record = json.loads(line)
            it = record.get("iteration")
            if record.get("type") != "span" or (it is not None and first <= int(it) <= last):
                kept.append(json.dumps(record, separators=(",", ":")))
        (dst / "events" / path.name).write_text("\n".join(kept) + "\n")
    if (src / "config.yaml").is_file():
        shutil.copy(src / "config.yaml", dst / "config.yaml")
    if (src / "metrics.jsonl").is_file():
        lines = []
        for line in (src / "metrics.jsonl").read_text().splitlines():
            record = json.loads(line)
            kept = {k: record[k] for k in METRIC_KEYS if k in record}
            lines.append(json.dumps(kept, separators=(",", ":")))
        (dst / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return dst


def shrink_pngs(folder: Path, dpi: int) -> list[Path]:
    """Resample every PNG under ``folder`` from make_all's dpi to ``dpi`` (same inches, fewer pixels) and
    store it with a 256-colour palette."""
    from PIL import Image

    done = []
    for path in sorted(folder.glob("*.png")):
        with Image.open(path) as image:
            size = (round(image.width * dpi / DEFAULT_DPI), round(image.height * dpi / DEFAULT_DPI))
            small = image.convert("RGB").resize(size, Image.LANCZOS)
        # 256-colour palette: the plots use a few flat colours, so this is visually lossless and ~3x smaller
        small = small.quantize(colors=256, method=Image.Quantize.MEDIANCUT)
        small.save(path, format="PNG", dpi=(dpi, dpi), optimize=True)
        done.append(path)
    return done


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--logs", type=Path, nargs="+", default=[RESULTS], help="folder(s) searched for runs and tables"
    )
    p.add_argument("--out", type=Path, default=RESULTS / "figures")
    p.add_argument("--real-run", type=Path, default=None, help="a real run directory to copy (trimmed)")
    p.add_argument("--name", default=None, help="folder name under runs/ (default: cpu-2-<run name>)")
    p.add_argument("--iterations", default="1:4", help="A:B, iterations of the real run kept")
    p.add_argument("--dpi", type=int, default=100, help="dpi of the committed PNGs (<= make_all's 150)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not 0 < args.dpi <= DEFAULT_DPI:
        raise SystemExit(f"--dpi must be in (0, {DEFAULT_DPI}], got {args.dpi}")
    if args.real_run is not None:
        try:
            first, last = (int(v) for v in args.iterations.split(":"))
        except ValueError:
            raise SystemExit(f"--iterations must be A:B, got {args.iterations!r}") from None
        if trace_is_stale(args.real_run):
            print(f"rebuilt {merge_chrome_trace(args.real_run)} from the event logs of {args.real_run}")
        name = args.name or f"cpu-2-{args.real_run.name}"
        dst = trim_run(args.real_run, args.logs[0] / "runs" / name, first, last)
        print(f"copied {args.real_run} (iterations {first}-{last}) to {dst}")
    report = make_all(args.logs, args.out)
    shrink_pngs(args.out, args.dpi)
    print(f"{len(report.made)} figure(s) in {args.out} at {args.dpi} dpi; {len(report.skipped)} skipped")
    return 0 if report.made else 1


if __name__ == "__main__":
    raise SystemExit(main())
