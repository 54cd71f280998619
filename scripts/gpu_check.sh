#!/usr/bin/env bash
# The decode engine's acceptance test on one GPU, in under 10 minutes. Every step runs whatever an
# earlier one gave, and a summary ends the output:
#   1. the engine's invariant, cost, steady-step and batching tests on CUDA in bf16 (device- and dtype-aware);
#   2. scripts/gpu_check.py on Llama-3.1-8B's geometry (random bf16 weights, no hub): steady steps under
#      torch.cuda.set_sync_debug_mode("error"), profiler kernels per step, the bf16-vs-fp32 kept-set
#      Jaccard, decode speed at 64k (a warm-up, then 3 repeats) against inertia >= 0.9x full@B, peak
#      memory, and h2o / tova_decode / adakv_ea / kvzip at 64k;
#   3. batch 8 against batch 1 at 8k.
# Run from the repository root in the project's environment:
#     bash scripts/gpu_check.sh 2>&1 | tee gpu_check.txt
set -uo pipefail
declare -a summary
step() {
    local name=$1 limit=$2
    shift 2
    echo "=== $name"
    timeout "$limit" "$@"
    local rc=$?
    summary+=("$( [ $rc -eq 0 ] && echo PASS || echo "FAIL (exit $rc)" )  $name")
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
step "engine tests on CUDA, bf16" 150 env EVICTBENCH_TEST_DEVICE=cuda python -m pytest -q -p no:cacheprovider \
    -m "not slow" tests/test_engine.py tests/test_engine_cost.py tests/test_steady.py tests/test_batching.py -k "not run"
step "steady steps, kernels, precision, speed at 64k" 330 python scripts/gpu_check.py --length 65536 --short 8192
step "batch 8 against batch 1 at 8k" 90 python -m harness.bench --model random_llama31_8b --lengths 8192 \
    --new-tokens 64 --methods full inertia --batch-sizes 1 8 --skip-single
echo
echo "summary"
printf '  %s\n' "${summary[@]}"
