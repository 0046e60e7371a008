#!/usr/bin/env bash
# One device call on a lent H200: (1) the whole test suite on a GPU machine (tests must pass where users run
# them, not only on CI's CPU); (2) the SD3.5-medium LoRA trainer, eager vs the optimised path and CFG
# training gradient cond vs both, side by side in one benchmark on the current code (the trainer
# claims in experiments/results/README.md and algo.cfg_grad's speedup come from this one call).
#
#   device run (kind nvidia-h200, carry [".whl"], timeout 600):
#     bash experiments/gpu/h200_tests_cfg_claims.sh
#
# Results under $OUT: log.txt, summary.md, results.tgz (experiments/gpu/steps.sh), pytest.txt.
OUT=${OUT:-/tmp/h200_tests_cfg_out} WORK=/tmp/h200_tests_cfg DEADLINE_S=${DEADLINE_S:-570}
source experiments/gpu/steps.sh
gpu_setup

# 1. The suite, 6 workers (pytest-xdist is on the image; every multi-process test picks free ports and its
#    own tmp dirs). The CPU tests run as on CI; tests that pick a device by "auto" meet CUDA here.
step tests 230 bash -c "python3 -m pytest -q -n 6 -p no:cacheprovider --durations=10 2>&1 | tee $OUT/pytest.txt"

# 2. SD3.5-medium LoRA trainer: 16 samples x 1 trained step; micro-batches 8 and 16; CFG off and on; with CFG
#    both gradients (cond splits off the unconditional pass from 8 samples per micro-batch on, the library's
#    threshold); eager (diffusers + torch defaults, cuDNN SDPA included) and optimised (safe attention +
#    regional compile + 16-bit autocast) in the same run.
step trainer-sd35 300 python3 experiments/measure.py trainer --model sd3.5-medium --modes lora \
    --micro-batch-sizes 8,16 --samples 16 --train-steps 1 --cfg both --cfg-grad cond,both \
    --paths optimized,eager --compile --autocast --warmup 1 --iters 3 --time-budget-s 280 --out "$WORK"

finish
