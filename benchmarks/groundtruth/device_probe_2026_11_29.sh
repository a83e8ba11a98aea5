#!/usr/bin/env bash
# One lent-GPU session's measurements (2026-11-29, a lent H200 VM), in priority order, each under
# its own time limit so that one that hangs leaves time for the rest:
#   1. host speed of the VM (startup_probe.py: pure-Python benchmark, first-CUDA-work costs);
#   2. Megatron-LM's own pretrain_gpt.py on 1 GPU (local spec, no Apex / TE: the VM has neither),
#      a host-bound and a GPU-bound small GPT: Megatron's logged iteration times (issue 37);
#   3. real steps and kernels of bench_llama_families.py's Llama shapes (issue 40);
#   4. the examples' real steps and kernels (issues 37 and 40);
#   5. the kernel sweep on this GPU (`phantora calibrate --grid sweep`, issue 40);
#   6. host_probe.py's host phases on this VM (issue 37); 7. Lightning GPT-124M.
# Needs, carried in .dev/ (ignored): mlm/ (Megatron-LM core_v0.19.0's megatron/, pretrain_gpt.py,
# gpt_builders.py, model_provider.py, dataset helpers built for CPython 3.12), site/ (pure-Python and
# cp312 packages the VM lacks: orjson, omegaconf, pydantic...), bin/python3-config (Megatron's
# Makefile only asks it for the extension suffix). Results: $OUT/results.tar.gz, $OUT/log.txt.
set -u
ROOT=$(pwd)
W=/tmp/w; mkdir -p $W
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:$ROOT/.dev/site
command -v python3-config >/dev/null || export PATH=$PATH:$ROOT/.dev/bin
pack() { tar czf $OUT/results.tar.gz -C $W . 2>/dev/null; }
step() { echo "=== $1 $(date +%T)"; }

step info
{ nvidia-smi -L; lscpu | grep -E "Model name|^CPU\(s\)|MHz"; python3 -V; python3 -c "import torch; print(torch.__version__)"; } > $W/info.txt 2>&1
cat $W/info.txt
timeout 60 python3 benchmarks/groundtruth/startup_probe.py > $W/startup.jsonl 2>&1; tail -3 $W/startup.jsonl; pack

MLM_COMMON="--transformer-impl local --no-gradient-accumulation-fusion --no-masked-softmax-fusion
 --no-persist-layer-norm --no-bias-gelu-fusion --no-bias-dropout-fusion --no-rope-fusion --bf16 --mock-data
 --tokenizer-type NullTokenizer --vocab-size 32000 --lr 1e-4 --log-interval 1 --eval-iters 0 --eval-interval 100000"
MLM_SMALL="--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 256 --max-position-embeddings 256
 --micro-batch-size 1 --global-batch-size 16 --train-iters 15"
MLM_GPT="--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --max-position-embeddings 1024
 --micro-batch-size 2 --global-batch-size 16 --train-iters 8"
MLM_LLAMA="--normalization RMSNorm --swiglu --position-embedding-type rope --group-query-attention
 --num-query-groups 2 --disable-bias-linear --untie-embeddings-and-output-weights --use-distributed-optimizer"
megatron() {  # name, limit, args...
  local name=$1 limit=$2; shift 2; step "megatron $name"
  (cd .dev/mlm && touch megatron/core/datasets/helpers_cpp*.so && CUDA_DEVICE_MAX_CONNECTIONS=1 \
   timeout $limit python3 -m torch.distributed.run --nproc-per-node 1 pretrain_gpt.py $MLM_COMMON "$@") \
   > $W/megatron_$name.log 2>&1
  echo "rc $?" >> $W/megatron_$name.log
  grep -E "elapsed time per iteration|Error|rc " $W/megatron_$name.log | tail -20; pack
}
megatron small 120 $MLM_SMALL
megatron gpt 120 $MLM_GPT

step llama
timeout 150 python3 benchmarks/groundtruth/examples_probe.py $W/llama llama_1b,llama_8b_accum2,llama_1b_seq8k,llama_3b_ckpt \
  > $W/llama.log 2>&1; cat $W/llama.log; pack

step examples
timeout 150 python3 benchmarks/groundtruth/examples_probe.py $W/examples gpt_small_b8_t512,gpt_124m_b8,gpt_124m_b4_ckpt,cnn_b128_img128 \
  > $W/examples.log 2>&1; cat $W/examples.log; pack

step sweep
timeout 130 python3 -m phantora.cli calibrate --grid sweep -o $W/h200_sxm_sweep.jsonl > $W/sweep.log 2>&1
tail -3 $W/sweep.log; pack

megatron small_llama 90 $MLM_SMALL $MLM_LLAMA

step host_probe
timeout 100 python3 benchmarks/groundtruth/host_probe.py $W/host > $W/host_probe.log 2>&1; cat $W/host_probe.log; pack

step lightning
timeout 60 python3 benchmarks/host/lightning_gpt.py --steps 8 --root /tmp/lgpt > $W/lightning.log 2>&1
tail -12 $W/lightning.log; pack
step done
