#!/usr/bin/env bash
# What benchmarks/frameworks/megatron_lm.py needs, set up once: a Megatron-LM checkout at
# core_v0.19.0 with its dataset helpers built, and a Python 3.12 environment (Megatron-LM's
# requirement) with the CUDA build of torch 2.14, phantora's runtime and `te` extra (Transformer
# Engine's Python layer), and Apex's Python layer (no CUDA extensions: phantora stands in for them).
# The clones need network access; pass existing checkouts to skip them.
#
#   benchmarks/frameworks/setup_megatron_lm.sh MEGATRON_DIR APEX_DIR [PYTHON3.12]
#   export PHANTORA_MEGATRON_LM=MEGATRON_DIR PHANTORA_MEGATRON_LM_PYTHON=MEGATRON_DIR/.venv/bin/python
set -euo pipefail
megatron=$1 apex=$2 python=${3:-python3.12}
root=$(cd "$(dirname "$0")/../.." && pwd)
[ -d "$megatron/megatron" ] || git clone --branch core_v0.19.0 --depth 1 https://github.com/NVIDIA/Megatron-LM "$megatron"
[ -d "$apex/apex" ] || git clone --depth 1 https://github.com/NVIDIA/apex "$apex"
"$python" -m venv "$megatron/.venv"
pip="$megatron/.venv/bin/python -m pip install --quiet"
$pip torch==2.14.1 "$root[te]" "packaging>=24.2" pybind11 einops tiktoken sentencepiece transformers omegaconf
$pip --no-build-isolation --no-deps "$apex"  # the Python layer only, as without --cpp_ext --cuda_ext
PATH="$megatron/.venv/bin:$PATH" make -C "$megatron/megatron/core/datasets"  # helpers_cpp, with this Python
echo "export PHANTORA_MEGATRON_LM=$megatron PHANTORA_MEGATRON_LM_PYTHON=$megatron/.venv/bin/python"
