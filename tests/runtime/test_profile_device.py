"""A run's hardware profile against the hardware it runs on (digenrl/runtime/hardware/profiles.py, "the real
devices"): device families from driver names, the mismatch check at startup (an error naming both devices
and the fix, or with runtime.allow_profile_mismatch a warning kept in the metrics and the summary),
``profile=auto`` and ``measure.py device``'s profile."""

from __future__ import annotations

import json

import pytest

from digenrl.config import ConfigError, load_config
from digenrl.costs.flops import loop_ceiling
from digenrl.perf.measure_device import write_profile
from digenrl.runtime.hardware.profiles import (
    AUTO_WORKERS_ENV,
    DetectedDevice,
    auto_profile,
    device_family,
    device_mismatch,
    known_device_type,
    load_profile,
    profile_from_dict,
    profile_to_dict,
    type_matches,
)
from digenrl.runtime.observe.events import EventLogger
from digenrl.runtime.observe.run_report import closing_summary
from digenrl.validation import check_profile_device, validate_config, validate_devices
from tests.systems.launcher import TINY

H100 = DetectedDevice("NVIDIA H100 80GB HBM3", memory_gib=79.2)
H200 = DetectedDevice("NVIDIA H200", memory_gib=139.8)


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA H800", "h800"),
        ("NVIDIA H20", "h20"),
        ("NVIDIA L40S", "l40s"),
        ("Tesla V100-SXM2-16GB", "v100"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("cpu", "cpu"),
    ],
)
def test_device_family_from_the_driver_name(name, family):
    assert device_family(name) == family


def test_a_type_name_matches_its_family_as_a_word():
    assert (
        type_matches("h100", "h100")
        and type_matches("h100-sxm", "h100")
        and type_matches("nvidia_h100", "h100")
    )
    assert not type_matches("h200", "h20")  # an H20 is not an H200
    assert not type_matches("h100", "h200") and not type_matches("cpu-worker", "h100")
    assert (
        type_matches("cpu-worker", "cpu")
        and type_matches("cpu-fast", "cpu")
        and not type_matches("h200", "cpu")
    )


def test_mismatch_names_both_devices_and_memory_counts():
    profile = load_profile("h200-1")
    assert device_mismatch(profile, 0, H200) is None
    message = device_mismatch(profile, 0, H100)
    assert "profile='h200-1'" in message and "h200" in message and "H100" in message
    assert "runs on the CPU" in device_mismatch(profile, 0, DetectedDevice("cpu"))
    # same family, another board: an H100 NVL (94 GB) is not the 80 GB SXM the hetero profile describes
    hetero = load_profile("hetero-h100-a100-16")
    assert device_mismatch(hetero, 0, H100) is None
    nvl = device_mismatch(hetero, 0, DetectedDevice("NVIDIA H100 NVL", memory_gib=93.6))
    assert "93.6 GiB" in nvl and "79.6 GiB" in nvl
    assert "a100" in device_mismatch(hetero, 8, H100)  # rank 8 is on the A100 node


def test_a_gpu_profile_on_this_cpu_machine_is_refused_naming_the_fix():
    cfg = load_config(TINY, ["profile=h200-1", "system=colocated-sync"])
    with pytest.raises(ConfigError) as info:
        validate_devices(cfg, 1, distributed=False)
    message = str(info.value)
    for needle in (
        "profile='h200-1'",
        "h200",
        "the CPU",
        "profile=auto",
        "profile=cpu-1",
        "allow_profile_mismatch",
    ):
        assert needle in message, (needle, message)


def test_the_override_turns_the_error_into_a_note(capsys):
    cfg = load_config(
        TINY, ["profile=h200-1", "system=colocated-sync", "runtime.allow_profile_mismatch=true"]
    )
    validate_devices(cfg, 1, distributed=False)
    assert "WARNING" in capsys.readouterr().err
    note = check_profile_device(cfg, "cpu", computes_here=True, gpus=0)
    assert note and "h200" in note
    # a launcher that only starts workers reads no device: its workers check their own
    assert check_profile_device(cfg, "cpu", computes_here=False, gpus=0) is None


def test_matching_cpu_profiles_pass():
    for profile in ("cpu-1", "auto"):
        cfg = load_config(TINY, [f"profile={profile}", "system=colocated-sync"])
        validate_devices(cfg, 1, distributed=False)
        assert check_profile_device(cfg, "cpu", computes_here=True, gpus=0) is None


def test_auto_on_a_cpu_is_as_many_cpu_workers_as_the_job_runs(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv(AUTO_WORKERS_ENV, raising=False)
    one = load_profile("auto")
    assert (one.backend, one.world_size, one.device_type(0).name) == ("gloo", 1, "cpu-worker")
    monkeypatch.setenv(AUTO_WORKERS_ENV, "2")
    cfg = load_config(TINY, ["profile=auto"])  # digenrl: 1 trainer + 1 generator
    validate_config(cfg, world_size=2)
    assert load_profile("auto").world_size == 2
    monkeypatch.setenv("WORLD_SIZE", "3")  # under torchrun every rank reads the job's size
    assert load_profile("auto").world_size == 3


def test_auto_refuses_a_multi_node_job_and_an_unknown_gpu(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    with pytest.raises(ValueError, match="multi-node job needs an explicit profile"):
        auto_profile(H100)
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    with pytest.raises(ValueError, match="no shipped profile describes a 'NVIDIA GeForce RTX 4090'"):
        auto_profile(DetectedDevice("NVIDIA GeForce RTX 4090", memory_gib=23.6))


def test_auto_on_gpus_takes_the_shipped_numbers_and_the_detected_memory(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    profile = auto_profile(DetectedDevice("NVIDIA H200", memory_gib=139.7, count=8))
    gpu = profile.device_type(7)
    assert (profile.world_size, profile.backend, gpu.name) == (8, "nccl", "h200")
    assert gpu.measured_bf16_tflops == load_profile("h200-1").device_type(0).measured_bf16_tflops
    assert gpu.memory_gib == 139.7 and "8 x NVIDIA H200" in profile.description
    h100 = auto_profile(H100)
    assert (
        h100.device_type(0).name == "h100" and h100.links.intra_node_gbps == 450.0
    )  # the H100 node's NVLink


def test_the_bound_uses_the_real_devices_ceiling_when_a_mismatch_is_allowed():
    h200 = load_profile("h200-1")
    assert loop_ceiling(h200, "cuda", H200)[0] == 790.0
    # the real device's own measured ceiling, from the shipped profile that has one (or none, said why)
    measured = known_device_type("h100")[0].measured_bf16_tflops
    ceiling, source = loop_ceiling(h200, "cuda", H100)
    if measured is None:
        assert ceiling is None and "NVIDIA H100" in source
    else:
        assert ceiling == measured and "the run's device" in source


def test_the_warning_stays_in_the_closing_summary(tmp_path):
    record = {
        "iteration": 0,
        "reward_mean": 0.5,
        "samples": 4,
        "wall_s": 1.0,
        "profile_mismatch": "profile='h200-1' says rank 0 runs on a h200 (139.8 GiB), but it runs on the CPU",
    }
    with EventLogger(tmp_path, 0, "colocated", 0.0) as events:  # the summary's bound reads the logs
        events.record_span("optimizer", 0.0, 1.0, iteration=0)
    summary = closing_summary([record], tmp_path)
    assert "WARNING: profile='h200-1'" in summary and "allow_profile_mismatch" in summary


def test_a_profile_round_trips_through_its_yaml_form():
    for name in ("cpu-2", "cpu-2-hetero", "h100-1", "hetero-h100-a100-16", "h800-32"):
        profile = load_profile(name)
        assert profile_from_dict(profile_to_dict(profile)) == profile, name


def test_measure_device_writes_a_profile_that_loads(tmp_path):
    result = {
        "family": "h100",
        "device_name": "NVIDIA H100 80GB HBM3",
        "memory_gib": 79.2,
        "environment": {"torch": "2.11.0"},
        "matmul": {"tflops": 781.4, "n": 8192, "dtype": "bfloat16"},
        "host_to_device_gbps": 53.1,
        "device_to_host_gbps": 50.2,
    }
    path = tmp_path / "h100-test.yaml"
    write_profile(result, path)
    gpu = load_profile(path).device_type(0)
    assert (gpu.name, gpu.memory_gib, gpu.measured_bf16_tflops) == ("h100", 79.2, 781.0)
    assert load_profile(path).links.host_device_gbps == 50.2
    text = path.read_text()
    assert "measured: torch total_memory" in text and "stated in profile" in text
    json.dumps(result)  # the JSON the command writes holds the same fields


@pytest.mark.slow
def test_a_run_under_a_wrong_profile_fails_at_startup_or_keeps_the_warning(tmp_path):
    """On this CPU machine: profile=h200-1 stops at startup (exit 2, the mismatch named); with the override
    the run goes on and every metrics record carries the mismatch; profile=auto runs as it is."""
    from digenrl.runtime.observe.metrics import read_metrics
    from digenrl.trainer.run_dir import PROFILE_FILE, run_profile
    from tests.systems.launcher import run_train

    base = ["system=colocated-sync", "iterations=1", "checkpoint_every=0"]
    refused = run_train([*base, "profile=h200-1", f"out_dir={tmp_path / 'a'}"], check=False)
    assert refused.returncode == 2 and "runs on the CPU" in refused.stderr, refused.stderr[-2000:]
    run_train([*base, "profile=h200-1", "runtime.allow_profile_mismatch=true", f"out_dir={tmp_path / 'b'}"])
    records = read_metrics(tmp_path / "b")
    assert records and all("runs on the CPU" in r["profile_mismatch"] for r in records)
    run_train([*base, "profile=auto", f"out_dir={tmp_path / 'c'}"])
    assert all("profile_mismatch" not in r for r in read_metrics(tmp_path / "c"))
    # what auto resolved to is recorded: a validation on another machine prices the run's devices
    recorded = run_profile(tmp_path / "c", "auto")
    assert (
        recorded == load_profile(tmp_path / "c" / PROFILE_FILE)
        and recorded.device_type(0).name == "cpu-worker"
    )
    assert run_profile(tmp_path / "b", "h200-1").name == "h200-1"  # a named profile needs no record
