#!/usr/bin/env bash
# One device call on a lent H200: the whole test suite on a GPU machine (tests must pass where users run them,
# not only on CI's CPU), with DeepSpeed installed from .whl/ds/ as the `test` extra installs it on CI.
#
#   device run (kind nvidia-h200, carry [".whl"], timeout 600):
#     bash experiments/gpu/h200_suite.sh            # the whole suite (~400 s of the call)
#     bash experiments/gpu/h200_suite.sh tests/systems tests/trainer/test_trainer_backends.py   # a part
#
# Results under $OUT: log.txt, summary.md, pytest.txt (experiments/gpu/steps.sh).
OUT=${OUT:-/tmp/h200_suite_out} WORK=/tmp/h200_suite DEADLINE_S=${DEADLINE_S:-575}
source experiments/gpu/steps.sh
gpu_setup
if compgen -G ".whl/ds/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/ds/*.whl || echo "## WARNING: deepspeed wheel install failed"
fi

# 12 workers (pytest-xdist is on the image; every multi-process test picks free ports and its own tmp dirs).
# The CPU tests run as on CI; tests that pick a device by "auto" meet CUDA here. -v writes one line per finished
# test, so a run cut short by the budget still names every failure so far.
step tests 520 bash -c "python3 -m pytest -v -n 12 -p no:cacheprovider -p no:benchmark --durations=15 -rfEs $* \
    >$OUT/pytest.txt 2>&1; rc=\$?; grep -E ' (FAILED|ERROR) ' $OUT/pytest.txt; tail -n 40 $OUT/pytest.txt; exit \$rc"
step failures 25 bash -c "grep -E '(FAILED|ERROR)' $OUT/pytest.txt | sort -u"

finish
