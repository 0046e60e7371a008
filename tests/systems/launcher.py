"""Run ``experiments/run_train.py`` for system tests: plainly in a subprocess, under torchrun, or on ranks
forked from a preloaded fork server (``tests/systems/preloaded_launch.py``: the same entry point and
elastic agent, without each worker's ~5 s of imports; the default for multi-rank runs)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUN_TRAIN = REPO / "experiments" / "run_train.py"
TINY = REPO / "experiments" / "configs" / "tiny.yaml"
#: metrics an exactly resumed run reproduces bit for bit
RESUME_KEYS = (
    "reward_mean",
    "reward_std",
    "loss",
    "ratio_mean",
    "update_norm",
    "grad_norm",
    "policy_version",
)


def train_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", DIGENRL_THREADS="1", PYTHONUNBUFFERED="1", TORCH_CPP_LOG_LEVEL="ERROR")
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


def with_eval_default(overrides: list[str], evaluate: bool = False) -> list[str]:
    """``overrides`` plus ``eval.every=0`` unless they set an ``eval.*`` key or ``evaluate`` keeps the config
    file's evaluation: the main job evaluates (tiny.yaml), but the tests of other mechanisms run without it,
    as before, so their timelines (TAG's idle time, GAP's overlap) and the suite's duration stay as they were;
    tests/systems/test_eval_runs.py tests evaluation in every system."""
    if evaluate or any(o.startswith("eval.") or o.startswith("eval=") for o in overrides):
        return list(overrides)
    return [*overrides, "eval.every=0"]


def train_command(overrides: list[str], nproc: int = 0) -> list[str]:
    """``nproc=0``: a plain single process; otherwise ``torchrun --standalone --nproc_per_node``. Without
    evaluation unless the overrides ask (:func:`with_eval_default`)."""
    overrides = with_eval_default(overrides)
    if nproc:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    else:
        cmd = [sys.executable]
    return [*cmd, str(RUN_TRAIN), "--config", str(TINY), *overrides]


LAUNCHERS = ("preloaded", "command")


def run_train(
    overrides: list[str],
    *,
    nproc: int = 0,
    timeout_s: float = 240,
    check: bool = True,
    launcher: str = "preloaded",
    evaluate: bool = False,
) -> subprocess.CompletedProcess:
    """Run ``run_train.py`` with ``overrides`` to the end, failing the test if it hangs past ``timeout_s``.

    ``nproc=0``: one process, as ``python run_train.py`` runs; otherwise ``nproc`` ranks under torch's
    elastic agent. ``launcher="preloaded"`` forks the processes from a server that imported the heavy
    packages once (tests/systems/preloaded_launch.py); ``"command"`` runs the user's command line in a
    subprocess (``python run_train.py`` / ``torchrun --standalone``): for tests of what torchrun itself
    prints or does when a rank fails, and of what a user's command prints once. ``evaluate``: keep the
    config file's evaluation (else off unless the overrides set ``eval.*``: :func:`with_eval_default`)."""
    overrides = with_eval_default(overrides, evaluate)
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher={launcher!r}; allowed: {', '.join(LAUNCHERS)}")
    if launcher == "preloaded":
        from tests.systems.preloaded_launch import run_preloaded, run_preloaded_single

        argv = ["--config", str(TINY), *overrides]
        if nproc:
            proc = run_preloaded(argv, nproc, train_env(), timeout_s)
        else:
            proc = run_preloaded_single(argv, train_env(), timeout_s)
    else:
        proc = _run_subprocess(train_command(overrides, nproc), timeout_s)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(proc.args)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    out_dirs = [o.split("=", 1)[1] for o in overrides if o.startswith("out_dir=")]
    if proc.returncode == 0 and out_dirs:
        assert_plan_recorded(Path(out_dirs[-1]))
    return proc


def assert_plan_recorded(run_dir: Path) -> None:
    """A run that started (its ``config.yaml`` is written) recorded the schedule it executed: ``plan.json``
    is its config's plan on the ranks it ran on (digenrl/systems/base.py: every system builds its plan once
    and runs it; issue 33)."""
    from digenrl.config import load_config
    from digenrl.plan import RunPlan
    from digenrl.trainer.run_dir import PLAN_FILE, run_profile

    if not (run_dir / "config.yaml").is_file():
        return  # the run ended before it started (--print-config, a refused config)
    assert (run_dir / PLAN_FILE).is_file(), f"{run_dir} has a config.yaml but no {PLAN_FILE}"
    cfg = load_config(run_dir / "config.yaml")
    plan = RunPlan.load(run_dir / PLAN_FILE)
    expected = RunPlan.from_config(cfg, run_profile(run_dir, cfg.profile), world_size=plan.world_size)
    assert plan == expected, f"{run_dir}/{PLAN_FILE}: {plan} is not the config's plan {expected}"


def _run_subprocess(cmd: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    # Own session, so a hung run is killed with all its torchrun workers, not just the launcher.
    popen = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=train_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = popen.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(popen.pid, signal.SIGKILL)
        stdout, stderr = popen.communicate()
        raise hung_run(cmd, timeout_s, stdout, stderr) from None
    return subprocess.CompletedProcess(cmd, popen.returncode, stdout, stderr)


def hung_run(cmd: list[str], timeout_s: float, stdout: str, stderr: str) -> AssertionError:
    """The test failure for a run still going after ``timeout_s`` (killed), with what it printed."""
    return AssertionError(f"{' '.join(cmd)} hung for {timeout_s} s\nstdout:\n{stdout}\nstderr:\n{stderr}")


def resume_from_copy(
    run_dir: Path,
    dst: Path,
    step: int,
    overrides: list[str],
    *,
    nproc: int = 0,
    timeout_s: float = 240,
    launcher: str = "preloaded",
) -> subprocess.CompletedProcess:
    """Copy a finished run, roll the copy back to checkpoint ``step`` as if the run had crashed after it
    (later checkpoints gone; its metrics and event logs still hold the later iterations), then resume it
    with ``overrides`` (the run's own, plus ``resume=true``)."""
    shutil.copytree(run_dir, dst)
    checkpoints = dst / "checkpoints"
    for path in checkpoints.glob("step_*"):
        if int(path.name.removeprefix("step_")) > step:
            shutil.rmtree(path)
    (checkpoints / "latest").write_text(f"step_{step}\n")
    return run_train(
        [*overrides, "resume=true", f"out_dir={dst}"], nproc=nproc, timeout_s=timeout_s, launcher=launcher
    )


def assert_resumed_exactly(
    full: Path,
    resumed: Path,
    keys: tuple[str, ...] = RESUME_KEYS,
    *,
    copied: bool = True,
    logs: bool = True,
) -> None:
    """The resumed run equals the uninterrupted one: one metrics line per iteration with the same values,
    the same final weights, optimizer state and EMA, one run id (the copied run's, when ``copied``), and (with
    ``logs``) a second process segment in every log."""
    import torch

    from digenrl.runtime.observe.event_records import load_events
    from digenrl.runtime.observe.metrics import read_metrics
    from digenrl.trainer.checkpoint import full_trainer_state, load_latest_checkpoint

    a, b = read_metrics(full), read_metrics(resumed)
    assert [r["iteration"] for r in b] == [r["iteration"] for r in a], [r["iteration"] for r in b]
    for x, y in zip(a, b, strict=True):
        for key in keys:
            assert x[key] == y[key], (x["iteration"], key, x[key], y[key])
    assert len({r["run_id"] for r in b}) == 1 and (b[0]["run_id"] == a[0]["run_id"]) == copied
    sa, sb = load_latest_checkpoint(full), load_latest_checkpoint(resumed)
    assert sa["step"] == sb["step"] and sa["format"] == sb["format"]
    ta, tb = full_trainer_state(sa), full_trainer_state(sb)  # either checkpoint format
    assert len(ta["model"]) > 0
    for name, tensor in ta["model"].items():
        assert torch.equal(tensor, tb["model"][name]), name
    for name, state in ta["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(tb["optimizer"]["state"][name][key]))
    assert ("ema" in ta) == ("ema" in tb)
    if "ema" in ta:  # trainer.ema_decay > 0: the EMA of the weights and its update count
        assert (
            ta["ema"]["updates"] == tb["ema"]["updates"] and ta["ema"]["weights"].keys() == ta["model"].keys()
        )
        for name, tensor in ta["ema"]["weights"].items():
            assert torch.equal(tensor, tb["ema"]["weights"][name]), name
    if not logs:
        return
    metas = [r for r in load_events(resumed) if r["type"] == "meta"]
    ranks = {r["rank"] for r in metas}
    assert len(metas) == 2 * len(ranks), "every rank's log holds the first process and the resumed one"
