#!/usr/bin/env bash
# The engine on one GPU in under 10 minutes: its invariant, cost and batching tests on CUDA in bf16,
# then the bench on Llama-3.1-8B's geometry (random bf16 weights, no hub) at 16k, 32k and 64k,
# rho=0.9, and batch 8 against batch 1 at 8k.
# Run from the repository root in the project's environment:
#     bash scripts/gpu_check.sh 2>&1 | tee gpu_check.txt
set -euo pipefail
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
EVICTBENCH_TEST_DEVICE=cuda timeout 240 python -m pytest -q -p no:cacheprovider -m "not slow" \
    tests/test_engine.py tests/test_engine_cost.py tests/test_batching.py -k "not run"
timeout 300 python -m harness.bench --model random_llama31_8b --lengths 16384 32768 65536 --new-tokens 128 \
    --methods full inertia inertia_lazy score_free tova
timeout 100 python -m harness.bench --model random_llama31_8b --lengths 8192 --new-tokens 64 \
    --methods full inertia --batch-sizes 1 8 --skip-single
