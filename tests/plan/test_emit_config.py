"""The planner hands out runnable plans: ``simulate.py plan --emit-config PATH`` writes a config that
``run_train.py --config PATH`` runs as exactly the planned plan (the run's plan.json equals the planner's
``--json``), and the printed "run it" line is a complete command."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

from digenrl.plan import RunPlan
from digenrl.trainer.run_dir import PLAN_FILE
from experiments import simulate
from tests.systems.launcher import REPO, RUN_TRAIN, TINY, train_env

COSTS = str(simulate.FOLDERS.results / "costs" / "cpu-tiny-sd3.json")
PLAN = ["plan", "--profile", "cpu-1", "--costs", COSTS, "--config", str(TINY), "--prompts", "2"]


def test_the_emitted_config_runs_the_planned_plan(tmp_path, capsys):
    assert simulate.main([*PLAN, "--json"]) == 0
    planned = RunPlan.from_json(json.loads(capsys.readouterr().out))
    emitted = tmp_path / "planned.yaml"
    assert simulate.main([*PLAN, "--emit-config", str(emitted)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "run it:" in x)
    assert line.split("run it: ")[1] == f"python experiments/run_train.py --config {emitted}"
    out = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            str(RUN_TRAIN),
            "--config",
            str(emitted),
            f"out_dir={out}",
            "iterations=1",
            "eval.every=0",
        ],
        cwd=REPO,
        env=train_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert RunPlan.load(out / PLAN_FILE) == planned
    assert json.loads((out / PLAN_FILE).read_text())["profile"] == "cpu-1"


def test_the_run_line_is_a_complete_command(capsys):
    assert simulate.main(PLAN) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "run it:" in x)
    words = shlex.split(line.split("run it: ")[1])
    assert words[:4] == ["python", "experiments/run_train.py", "--config", str(TINY)]
    overrides = dict(w.split("=", 1) for w in words[4:])
    assert overrides["profile"] == "cpu-1" and overrides["algo.prompts_per_iteration"] == "2"
    assert overrides["system"] in ("colocated-sync", "colocated-overlap")
