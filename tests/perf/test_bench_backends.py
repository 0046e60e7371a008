"""``experiments/measure.py backends`` on the tiny model, CPU: FSDP2 (one-rank mesh) and DeepSpeed ZeRO-2 /
ZeRO-3 train the same batch from the same weights, and the first update agrees (fp32: to rounding); the
report holds every row. Runs in a subprocess: the benchmark starts its own one-rank process group."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from digenrl.perf import bench_backends

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_backends.main(["--help"])
    assert exit_.value.code == 0 and "--backends" in capsys.readouterr().out


def test_unknown_backend_is_a_usage_error_naming_the_flag(capsys):
    with pytest.raises(SystemExit):
        bench_backends.parse_args(["--backends", "fsdp2,zero9"])
    assert "--backends" in capsys.readouterr().err


def test_setting_up_the_report_leaves_deepspeed_unimported():
    """Importing ``deepspeed`` fixes its accelerator (CUDA on a GPU machine): the report's version field
    must not import it before ``require_deepspeed`` has asked for the CPU accelerator of a CPU run."""
    code = (
        "import sys; from digenrl.perf.bench_backends import Bench, parse_args; "
        "Bench(parse_args(['--device', 'cpu'])); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'deepspeed'))"
    )
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]"


@pytest.mark.needs("deepspeed")
def test_fsdp2_zero2_zero3_agree_on_the_first_update(tmp_path):
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    cmd = [
        sys.executable, str(ROOT / "experiments/measure.py"), "backends", "--device", "cpu",
        "--modes", "full,lora", "--warmup", "0", "--iters", "1", "--out", str(tmp_path),
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "backends-tiny-sd3.json").read_text())
    rows = {(r["mode"], r["backend"]): r for r in report["results"]}
    assert set(rows) == {(m, b) for m in ("full", "lora") for b in ("fsdp2", "deepspeed-2", "deepspeed-3")}
    for (mode, backend), row in rows.items():
        assert "error" not in row and row["s_per_unit"] > 0, row
        assert row["backend_class"] == ("FSDP2Backend" if backend == "fsdp2" else "DeepSpeedBackend")
        if backend != "fsdp2":
            assert row["init_max_abs_diff"] == 0.0, (mode, backend)
            assert row["max_abs_diff"] < 1e-6 and row["update_rel_diff"] < 1e-4, (mode, backend, row)
            assert row["grad_norm"] == pytest.approx(rows[(mode, "fsdp2")]["grad_norm"], rel=1e-5)
    assert "| full | deepspeed-3 |" in (tmp_path / "backends-tiny-sd3.md").read_text()
