#!/usr/bin/env bash
# Megatron-LM's pretrain_gpt.py on 1 simulated H200, in the configurations that
# benchmarks/groundtruth/device_probe_2026_11_29.sh ran on a lent H200 VM (real iteration times in
# tests/data/groundtruth/h200_vm/megatron/; docs/host-time.md compares them).
#
#   benchmarks/host/megatron_lm_1gpu.sh small|gpt|small_llama OUT_DIR [phantora trace options...]
#
# PHANTORA_MEGATRON_LM: a Megatron-LM checkout at core_v0.19.0 with its dataset helpers built;
# PHANTORA_MEGATRON_LM_PYTHON: Python 3.12 with the CUDA build of torch and WITHOUT Apex and
# Transformer Engine, as the VM had (with them, Megatron picks their optimizer and norms: another
# program). One way: a venv whose site-packages links every package of the usual one but those.
# Prints Megatron's logged iteration times (iteration, ms); the trace is OUT_DIR/NAME.json.
set -eu
name=$1 out=$2; shift 2
: "${PHANTORA_MEGATRON_LM:?a Megatron-LM checkout}" "${PHANTORA_MEGATRON_LM_PYTHON:?its Python 3.12}"
here=$(cd "$(dirname "$0")/../.." && pwd)
. "$here/benchmarks/host/megatron_lm_configs.sh"
case $name in
  small) args="$MLM_SMALL";; gpt) args="$MLM_GPT";; small_llama) args="$MLM_SMALL $MLM_LLAMA";;
  *) echo "unknown configuration $name: small, gpt or small_llama" >&2; exit 2;;
esac
mkdir -p "$out"
cd "$PHANTORA_MEGATRON_LM"
CUDA_DEVICE_MAX_CONNECTIONS=1 PYTHONPATH=$here python3 -m phantora.cli trace --gpu h200 "$@" -o "$out/$name.json" -- \
  "$PHANTORA_MEGATRON_LM_PYTHON" -m torch.distributed.run --nproc-per-node 1 pretrain_gpt.py $MLM_COMMON $args \
  > "$out/$name.log" 2>&1
grep -oE "iteration +[0-9]+/ +[0-9]+ .*elapsed time per iteration \(ms\): [0-9.]+" "$out/$name.log" | awk '{print $2, $NF}'
