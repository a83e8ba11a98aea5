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
COMMON="--transformer-impl local --no-gradient-accumulation-fusion --no-masked-softmax-fusion
 --no-persist-layer-norm --no-bias-gelu-fusion --no-bias-dropout-fusion --no-rope-fusion --bf16 --mock-data
 --tokenizer-type NullTokenizer --vocab-size 32000 --lr 1e-4 --log-interval 1 --eval-iters 0 --eval-interval 100000"
SMALL="--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 256 --max-position-embeddings 256
 --micro-batch-size 1 --global-batch-size 16 --train-iters 6"
GPT="--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --max-position-embeddings 1024
 --micro-batch-size 2 --global-batch-size 16 --train-iters 6"
LLAMA="--normalization RMSNorm --swiglu --position-embedding-type rope --group-query-attention
 --num-query-groups 2 --disable-bias-linear --untie-embeddings-and-output-weights --use-distributed-optimizer"
case $name in
  small) args="$SMALL";; gpt) args="$GPT";; small_llama) args="$SMALL $LLAMA";;
  *) echo "unknown configuration $name: small, gpt or small_llama" >&2; exit 2;;
esac
mkdir -p "$out"
here=$(cd "$(dirname "$0")/../.." && pwd)
cd "$PHANTORA_MEGATRON_LM"
CUDA_DEVICE_MAX_CONNECTIONS=1 PYTHONPATH=$here python3 -m phantora.cli trace --gpu h200 "$@" -o "$out/$name.json" -- \
  "$PHANTORA_MEGATRON_LM_PYTHON" -m torch.distributed.run --nproc-per-node 1 pretrain_gpt.py $COMMON $args \
  > "$out/$name.log" 2>&1
grep -oE "iteration +[0-9]+/ +[0-9]+ .*elapsed time per iteration \(ms\): [0-9.]+" "$out/$name.log" | awk '{print $2, $NF}'
