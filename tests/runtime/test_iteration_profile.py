"""``runtime.profile_iteration``: device time per phase and kind of kernel, from the profiler's trace."""

from __future__ import annotations

import json

import pytest

from digenrl.runtime.observe.iteration_profile import format_summary, kernel_kind, summarise_trace
from tests.systems.launcher import run_train


def _x(cat: str, name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


#: a Kineto-style trace: host ranges (user_annotation), their GPU-side ranges (gpu_user_annotation, later
#: than the host's: kernels run after their launch) and device events; times in µs
TRACE = {
    "traceEvents": [
        _x("user_annotation", "digenrl/generate", 0, 1000),
        _x("gpu_user_annotation", "digenrl/generate", 50, 1000),
        _x("kernel", "sm90_xmma_gemm_bf16bf16_bf16f32", 60, 300),
        _x("kernel", "flash_fwd_kernel<...>", 400, 200),
        _x("user_annotation", "digenrl/score", 1000, 500),  # nested in nothing: a phase of its own
        _x("gpu_user_annotation", "digenrl/score", 1050, 500),
        _x("kernel", "sm90_xmma_fprop_implicit_gemm_bf16", 1100, 100),
        _x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 1300, 50),
        _x("user_annotation", "digenrl/train", 2000, 3000),
        _x("gpu_user_annotation", "digenrl/train", 2000, 3000),
        _x("kernel", "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", 2100, 700),
        _x("kernel", "triton_poi_fused_add_mul_0", 2900, 100),
        _x("kernel", "void at::native::vectorized_elementwise_kernel<4>", 3100, 100),
        _x("kernel", "sm90_xmma_gemm_bf16bf16_bf16f32", 3300, 1200),
        _x("kernel", "ncclKernel_AllReduce", 6000, 10),  # after every phase
        _x("cpu_op", "aten::mm", 10, 5),  # host ops are not device time
        # launched in the last µs of generate, run after its GPU-side range: the launch decides
        {**_x("cuda_runtime", "cudaLaunchKernel", 990, 5), "args": {"correlation": 7}},
        {**_x("kernel", "flash_fwd_kernel<...>", 1060, 20), "args": {"correlation": 7}},
        {"ph": "i", "cat": "kernel", "name": "instant", "ts": 0},  # not a complete event
    ]
}


def test_kernel_kinds_follow_the_names():
    assert kernel_kind("flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel") == "attention backward"
    assert kernel_kind("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma") == "attention backward"
    assert kernel_kind("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma") == "attention forward"
    assert kernel_kind("sm90_xmma_fprop_implicit_gemm_bf16") == "convolution"  # not a matmul
    assert kernel_kind("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_TNT") == "matmul"
    assert kernel_kind("triton_red_fused_native_layer_norm_0") == "fused (inductor)"
    assert kernel_kind("Memcpy HtoD", "gpu_memcpy") == "memcpy"
    assert kernel_kind("ncclKernel_AllReduce") == "communication"
    assert kernel_kind("some_custom_kernel") == "other"


def test_trace_summary_attributes_every_device_event_to_its_phase():
    s = summarise_trace(TRACE, wall_s=0.01)
    assert s["device_events"] == 10 and s["device_busy_s"] == pytest.approx(2.78e-3)
    assert s["busy_fraction"] == pytest.approx(0.278)
    gen, score, train = (s["phases"][p] for p in ("generate", "score", "train"))
    assert gen["busy_by_kind_s"] == pytest.approx({"matmul": 3e-4, "attention forward": 2.2e-4})
    assert gen["wall_s"] == pytest.approx(1e-3) and gen["idle_s"] == pytest.approx(4.8e-4)
    assert score["busy_by_kind_s"] == pytest.approx({"convolution": 1e-4, "memcpy": 5e-5})
    assert train["busy_by_kind_s"] == pytest.approx(
        {
            "matmul": 1.2e-3,
            "attention backward": 7e-4,
            "fused (inductor)": 1e-4,
            "element-wise / reduction": 1e-4,
        }
    )
    assert list(train["busy_by_kind_s"]) == sorted(
        train["busy_by_kind_s"], key=lambda k: -train["busy_by_kind_s"][k]
    )
    outside = s["phases"]["(outside any phase)"]
    assert outside["wall_s"] is None and outside["busy_by_kind_s"] == {"communication": pytest.approx(1e-5)}
    top = s["top_kernels"][0]
    assert top["name"] == "sm90_xmma_gemm_bf16bf16_bf16f32" and top["calls"] == 2
    assert top["seconds"] == pytest.approx(1.5e-3)
    table = format_summary(s, "t")
    assert "| train | 0.003 | 0.002 | 0.001 | matmul 0.001, attention backward 0.001 |" in table
    assert "| `Memcpy DtoH (Device -> Pinned)` | memcpy | 0.0001 | 1 |" in table


def _t(event: dict, tid: int, correlation: int | None = None) -> dict:
    out = {**event, "tid": tid}
    return out if correlation is None else {**out, "args": {"correlation": correlation}}


def test_nested_phases_count_once_and_threads_keep_their_own_kernels():
    trace = {
        "traceEvents": [
            _t(_x("user_annotation", "digenrl/generate", 0, 1000), 1),
            _t(_x("user_annotation", "digenrl/transfer", 600, 200), 1),  # nested in generate
            _t(_x("user_annotation", "digenrl/score", 100, 300), 2),  # another thread, overlapping
            _t(_x("cuda_runtime", "cudaLaunchKernel", 150, 5), 1, correlation=1),  # generate's, not score's
            _t(_x("cuda_runtime", "cudaLaunchKernel", 160, 5), 2, correlation=2),
            _t(_x("cuda_runtime", "cudaLaunchKernel", 650, 5), 1, correlation=3),
            _t(_x("kernel", "gemm_a", 170, 100), 7, correlation=1),
            _t(_x("kernel", "gemm_b", 280, 50), 7, correlation=2),
            _t(_x("kernel", "Memcpy", 700, 80), 7, correlation=3),
        ]
    }
    phases = summarise_trace(trace, wall_s=0.001)["phases"]
    assert phases["generate"]["wall_s"] == pytest.approx(8e-4)  # 1000 µs less the nested 200
    assert phases["transfer"]["wall_s"] == pytest.approx(2e-4)
    assert phases["generate"]["busy_by_kind_s"] == {"matmul": pytest.approx(1e-4)}
    assert phases["score"]["busy_by_kind_s"] == {"matmul": pytest.approx(5e-5)}
    assert phases["transfer"]["device_busy_s"] == pytest.approx(8e-5)


def test_a_launch_from_a_thread_without_ranges_belongs_to_the_phase_open_then():
    # autograd's device thread launches the backward (and, under activation checkpointing, the recomputed
    # forward) that train's loss.backward() waits for: on an H200 Qwen-Image profile 17.8 s of training
    # kernels were reported outside any phase before this rule
    trace = {
        "traceEvents": [
            _t(_x("user_annotation", "digenrl/train", 0, 1000), 1),
            _t(_x("user_annotation", "digenrl/optimizer", 1000, 100), 1),
            _t(_x("cuda_runtime", "cudaLaunchKernel", 200, 5), 3, correlation=1),  # autograd thread
            _t(_x("cuda_runtime", "cudaLaunchKernel", 1050, 5), 3, correlation=2),
            _t(_x("cuda_runtime", "cudaLaunchKernel", 2000, 5), 3, correlation=3),  # after every phase
            _t(_x("kernel", "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", 210, 300), 7, correlation=1),
            _t(_x("kernel", "void at::native::vectorized_elementwise_kernel<4>", 1060, 20), 7, correlation=2),
            _t(_x("kernel", "gemm_c", 2010, 40), 7, correlation=3),
        ]
    }
    phases = summarise_trace(trace, wall_s=0.003)["phases"]
    assert phases["train"]["busy_by_kind_s"] == {"attention backward": pytest.approx(3e-4)}
    assert phases["optimizer"]["device_busy_s"] == pytest.approx(2e-5)
    assert phases["(outside any phase)"]["busy_by_kind_s"] == {"matmul": pytest.approx(4e-5)}


def test_a_run_writes_the_profile_of_the_asked_iteration(tmp_path):
    out = tmp_path / "run"
    run_train(
        [
            "system=colocated-sync",
            "profile=cpu-1",
            "iterations=2",
            "runtime.profile_iteration=1",
            f"out_dir={out}",
        ]
    )
    summary = json.loads((out / "profile" / "rank0.json").read_text())
    assert summary["iteration"] == 1 and summary["rank"] == 0
    assert {"generate", "score", "train"} <= set(summary["phases"])  # the run's phases, with their wall time
    assert all(summary["phases"][p]["wall_s"] > 0 for p in ("generate", "score", "train"))
    assert (out / "profile" / "rank0.md").is_file() and (
        out / "profile" / "rank0.trace.json"
    ).stat().st_size > 0


def test_an_iteration_the_run_never_reaches_is_refused_at_startup():
    from digenrl.config import ConfigError, load_config
    from digenrl.validation import validate_config

    validate_config(load_config(None, ["iterations=3", "runtime.profile_iteration=2"]))
    with pytest.raises(ConfigError, match=r"runtime.profile_iteration=3 is never reached.*iterations=3"):
        validate_config(load_config(None, ["iterations=3", "runtime.profile_iteration=3"]))


def test_idle_gaps_are_named_by_the_host_work_that_caused_them():
    # train: a kernel, then an .item() (the host blocks in cudaStreamSynchronize until the kernel ends at
    # 1200 µs, then spends 800 µs before its next launch); the autograd thread busy in a backward function
    # while the device idles 100 µs; a 10 µs launch gap. score: the host's work at its start before its
    # first kernel is score's idle, not train's (the gap is clipped to score's range)
    trace = {
        "traceEvents": [
            _t(_x("user_annotation", "digenrl/train", 0, 4000), 1),
            _t(_x("user_annotation", "digenrl/score", 5000, 1000), 1),
            _t(_x("cuda_runtime", "cudaLaunchKernel", 100, 5), 1, correlation=1),
            _t(_x("kernel", "gemm_a", 200, 1000), 7, correlation=1),
            _t(_x("cpu_op", "aten::item", 290, 920), 1),
            _t(_x("cpu_op", "aten::_local_scalar_dense", 295, 910), 1),
            _t(_x("cuda_runtime", "cudaStreamSynchronize", 300, 905), 1),
            _t(_x("cpu_op", "aten::mm", 1995, 10), 1),
            _t(_x("cuda_runtime", "cudaLaunchKernel", 2000, 5), 1, correlation=2),
            _t(_x("kernel", "gemm_b", 2010, 490), 7, correlation=2),
            _t(_x("cpu_op", "autograd::engine::evaluate_function: MmBackward0", 2400, 300), 3),
            _t(_x("cpu_op", "aten::mm", 2580, 20), 3),
            _t(_x("cuda_runtime", "cudaLaunchKernel", 2590, 5), 3, correlation=3),
            _t(_x("kernel", "gemm_c", 2600, 400), 7, correlation=3),
            _t(_x("cuda_runtime", "cudaLaunchKernel", 2700, 5), 1, correlation=4),
            _t(_x("kernel", "gemm_d", 3010, 100), 7, correlation=4),
            _t(_x("cuda_runtime", "cudaLaunchKernel", 5500, 5), 1, correlation=5),
            _t(_x("kernel", "conv_e", 5600, 100), 7, correlation=5),
        ]
    }
    s = summarise_trace(trace, wall_s=0.006)
    train, score = s["phases"]["train"], s["phases"]["score"]
    gaps = train["idle_gaps"]
    assert gaps["count"] == 2 and gaps["seconds"] == pytest.approx(9.1e-4)
    assert gaps["short_gaps_seconds"] == pytest.approx(1e-5)
    assert gaps["causes"] == [
        {
            "name": "after cudaStreamSynchronize in aten::_local_scalar_dense",
            "seconds": pytest.approx(8.1e-4),
            "count": 1,
        },
        {
            "name": "host in autograd::engine::evaluate_function: MmBackward0",
            "seconds": pytest.approx(1e-4),
            "count": 1,
        },
    ]
    assert train["host_syncs"]["count"] == 1 and train["host_syncs"]["seconds"] == pytest.approx(9.05e-4)
    assert train["host_syncs"]["where"][0]["name"] == "cudaStreamSynchronize in aten::_local_scalar_dense"
    assert score["idle_gaps"]["count"] == 1 and score["idle_gaps"]["seconds"] == pytest.approx(6e-4)
    assert score["idle_gaps"]["causes"][0]["name"] == "python (between operators)"
    assert score["host_syncs"]["count"] == 0
    # a sync made between phases keeps a row of its own (no wall time: no range holds it)
    between = _t(_x("cuda_runtime", "cudaDeviceSynchronize", 4500, 100), 1)
    outside = summarise_trace({"traceEvents": [*trace["traceEvents"], between]}, wall_s=0.006)["phases"]
    assert outside["(outside any phase)"]["host_syncs"]["count"] == 1
    assert outside["(outside any phase)"]["wall_s"] is None
    table = format_summary(s, "t")
    assert (
        "| train | 0.001 (2) | 0.000 | after cudaStreamSynchronize in aten::_local_scalar_dense 0.001 (1);"
        in table
    )


def test_a_gap_the_host_spent_in_one_cuda_call_names_the_call():
    # round 5/6's ~20 ms stalls in aten::contiguous: was the host allocating (cudaMalloc, with the driver's
    # cuMemAlloc nested in it) or doing the operator's own work? A call that covers at least half of the gap
    # is named beside the operator; the short launch at a gap's end is not
    trace = {
        "traceEvents": [
            _t(_x("user_annotation", "digenrl/train", 0, 10000), 1),
            _t(_x("cuda_runtime", "cudaLaunchKernel", 100, 5), 1, correlation=1),
            _t(_x("kernel", "gemm_a", 200, 800), 7, correlation=1),
            _t(_x("cpu_op", "aten::contiguous", 900, 3200), 1),
            _t(_x("cuda_runtime", "cudaMalloc", 1000, 3000), 1),
            _t(_x("cuda_driver", "cuMemAlloc_v2", 1010, 2980), 1),
            _t(_x("cuda_runtime", "cudaLaunchKernel", 4050, 5), 1, correlation=2),
            _t(_x("kernel", "copy_b", 4100, 100), 7, correlation=2),
            _t(_x("cpu_op", "aten::to", 4200, 400), 1),
            _t(_x("cuda_runtime", "cudaLaunchKernel", 4580, 5), 1, correlation=3),
            _t(_x("kernel", "copy_c", 4600, 100), 7, correlation=3),
        ]
    }
    causes = summarise_trace(trace, wall_s=0.01)["phases"]["train"]["idle_gaps"]["causes"]
    assert [(c["name"], c["count"]) for c in causes] == [
        ("host in aten::contiguous (cudaMalloc)", 1),
        ("host in aten::to", 1),
    ]
    assert causes[0]["seconds"] == pytest.approx(3.1e-3)


def test_the_innermost_range_steps_over_ended_siblings_to_the_enclosing_one():
    from digenrl.runtime.observe.trace_ranges import by_thread, innermost_at

    siblings = [(f"op{i}", 10.0 + 10 * i, 15.0 + 10 * i, 1) for i in range(1000)]  # ended before t
    index = by_thread([("outer", 0.0, 100_000.0, 1), *siblings, ("late", 200_000.0, 200_010.0, 1)])[1]
    assert innermost_at(10_007.0, index)[0] == "outer"  # after 1000 ended siblings, still inside outer
    assert innermost_at(12.0, index)[0] == "op0"
    assert innermost_at(150_000.0, index) is None  # between outer and late: nothing holds it
    assert innermost_at(-1.0, index) is None
