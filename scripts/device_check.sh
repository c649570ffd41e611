#!/usr/bin/env bash
# The checks that need a GPU, in one run, for a CUDA machine that has python3 with torch, triton,
# transformers, peft and pytest but no network and no copy of the model weights:
#   1. the Triton kernel tests and the tiny-model engine and LoRA tests, with the kernels compiled and the
#      engines on the GPU (LORAPLEX_TEST_DEVICE=cuda, see tests/device.py);
#   2. bench/lora.py (Workload A) on a random-weight model of SmolLM2-135M's shape (bench/random_model.py),
#      loraplex against Hugging Face + peft on the same GPU.
# Usage: bash scripts/device_check.sh LOGS_DIR WORKLOAD_DIR MODEL_FILES_DIR [WHEELS_DIR]
#   WORKLOAD_DIR: ../shared/bench (workload.py, make_adapters.py); MODEL_FILES_DIR: the default model's
#   config.json and tokenizer files; WHEELS_DIR: wheels of test plugins missing there (pytest-asyncio).
#   $PYTHON (default python3), $LORAPLEX_TEST_DEVICE (default cuda) and $BENCH_ARGS (default
#   "--repeats 3") allow a quick rehearsal of the script on a CPU machine.
set -uo pipefail
cd "$(dirname "$0")/.."
logs=$1 workload=$2 model_files=$3 wheels=${4:-}
mkdir -p "$logs"
work=$(mktemp -d)
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 LORAPLEX_CACHE_DIR="$work/cache" LORAPLEX_WORKLOAD_DIR="$workload"

# loraplex without pip (nothing to download there): its package folders linked under one import root.
mkdir -p "$work/site/loraplex"
for d in engine kernels adapters grammar platform migrations; do ln -s "$PWD/$d" "$work/site/loraplex/$d"; done
if [ -n "$wheels" ] && ls "$wheels"/*.whl >/dev/null 2>&1; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --target "$work/site" "$wheels"/*.whl
fi
export PYTHONPATH="$work/site:$PWD"
# tests/conftest.py's tiny models take their tokenizer from the default model's folder; no weights needed.
mkdir -p "$LORAPLEX_CACHE_DIR/models/SmolLM2-135M-Instruct"
cp "$model_files"/* "$LORAPLEX_CACHE_DIR/models/SmolLM2-135M-Instruct/"

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$py" -c 'import torch, triton, transformers, peft; print("torch", torch.__version__, "triton", triton.__version__,
"transformers", transformers.__version__, "peft", peft.__version__)'; } 2>&1 | tee "$logs/versions.txt"

echo "== 1. tests on the GPU"
LORAPLEX_TEST_DEVICE=${LORAPLEX_TEST_DEVICE:-cuda} timeout 240 "$py" -m pytest -q -p no:cacheprovider -rfE \
    tests/kernels/test_kernel_lora.py tests/kernels/test_kernel_attention.py tests/kernels/test_kernel_bitmask.py \
    tests/lora/test_lora_context.py tests/engine/test_engine_tiny.py tests/lora/test_lora_api.py \
    tests/lora/test_lora_churn.py tests/lora/test_lora_failures.py tests/lora/test_lora_dtype.py \
    2>&1 | tee "$logs/pytest.txt"
tests_rc=${PIPESTATUS[0]}

echo "== 2. Workload A on the GPU (random weights of SmolLM2-135M's shape)"
"$py" -m bench.random_model "$model_files" "$work/smol-random" >/dev/null
# shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
timeout 240 "$py" -m bench.lora --model "$work/smol-random" --bench-dir "$workload" --adapters "$work/adapters" \
    ${BENCH_ARGS:---repeats 3} 2>&1 | tee "$logs/bench_lora.txt"
bench_rc=${PIPESTATUS[0]}
echo "tests rc=$tests_rc, bench rc=$bench_rc"
rm -rf "$work"
[ "$tests_rc" = 0 ] && [ "$bench_rc" = 0 ]
