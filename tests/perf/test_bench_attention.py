"""The attention-kernel benchmark (``experiments/measure.py attention``) on tiny CPU shapes: rows per backend
and direction, masked cases with a batch larger than the numerics check's slice, and the winners table."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def bench():
    from digenrl.perf import bench_attention

    return bench_attention


def test_cpu_rows_are_checked_against_float32_math_and_name_a_winner(bench, tmp_path):
    out = tmp_path / "attn.json"
    argv = ["--device", "cpu", "--batch", "4", "--iters", "1", "--warmup", "0", "--ceiling-size", "64"]
    argv += ["--backends", "current,native,_native_math,_native_flash", "--out", str(out)]
    assert bench.main(argv) == 0
    report = json.loads(out.read_text())
    rows = {(r["case"], r["direction"], r["backend"]): r for r in report["results"]}
    assert len(rows) == 2 * 2 * 4  # tiny, tiny-masked × forward, forward+backward × 4 backends
    for case in ("tiny", "tiny-masked"):
        for direction in bench.DIRECTIONS:
            for backend in ("current", "native", "_native_math"):
                row = rows[(case, direction, backend)]
                # the batch (4) is larger than the checked slice (2): the mask must be cut with it
                assert row["ok"], row
                assert max(row["errors"].values()) < 1e-5  # float32 kernels against float32 math
                assert row["ms"] > 0 and row["tflops"] > 0 and "fraction_of_ceiling" in row
            assert set(rows[(case, direction, "native")]["errors"]) == (
                {"out", "dq", "dk", "dv"} if direction == "forward+backward" else {"out"}
            )
            assert "ms" not in rows[(case, direction, "_native_flash")]  # a GPU-only kernel is skipped
    assert rows[("tiny", "forward", "current")]["current"] == {"backend": "native", "cudnn_sdp": None}
    fwd_bwd = rows[("tiny", "forward+backward", "native")]
    assert fwd_bwd["flops"] == bench.FWD_BWD_FACTOR * report["cases"]["tiny"]["forward_flops"]
    assert set(report["winners"]) == {"tiny", "tiny-masked"}
    assert "fastest ok backend" in out.with_suffix(".md").read_text()


def test_a_wrong_kernel_is_not_ok(bench):
    """The numerics check fails a kernel that computes another function (here: the mask ignored)."""
    case = bench.CASES["tiny-masked"]
    inputs = bench.Inputs(case, bench.torch.device("cpu"), bench.torch.float32)
    ref = bench.reference(inputs)
    unmasked = bench.attention_fn(
        "native", bench.Inputs(bench.CASES["tiny"], inputs.device, inputs.q.dtype), compiled=False
    )
    errors = bench.check_numerics(unmasked, inputs, ref)
    assert max(errors.values()) > 1e-2
    nan = bench.check_numerics(lambda q, k, v: q * float("nan"), inputs, {"out": ref["out"]})
    assert nan["out"] != nan["out"]  # NaN: never ok


def test_bad_arguments_are_usage_errors(bench):
    for argv in (["--cases", "nope"], ["--backends", "nope"], ["--directions", "sideways"], ["--batch", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(argv)
