#!/usr/bin/env bash
# Where the host time of Megatron-LM's training loop goes on a real GPU (issue 37), for a lent
# session: device_probe_2026_11_29.sh measured pretrain_gpt.py's `small` config (4 layers, width
# 256, 16 micro-batches of 1 x 256 tokens) at ~308 ms an iteration on a lent H200 VM, where
# phantora's counted host predicts 191.5 ms (-38%) and its GPU is busy ~16 ms: host-bound, and
# ~7 ms a micro-batch that neither the counted Python nor the per-op costs explain. Each variant
# below removes one suspect; the profiled run gives per-op CPU time and Python stacks.
#   1. as measured (DataLoader with 2 workers and a pin-memory thread, NaN/Inf loss checks);
#   2. --num-workers 0 (batches made in the training thread: no worker hand-over, no pin thread);
#   3. --no-check-for-nan-in-loss-and-grad (no per-micro-batch validate_result syncs);
#   4. as 1, under torch.profiler for iterations 6-7 (Megatron's --profile --use-pytorch-profiler,
#      record_shapes and with_stack): a Chrome trace of CPU ops, kernels and Python frames;
#   5. phantora's own kernel sweep cases (strided elementwise, misaligned GEMMs, non-causal SDPA);
# and first, benchmarks/host/pure_python.py's call-heavy rows on the VM itself (the counted host's
# cost per frame, docs/host-time.md) and benchmarks/host/function_apply.py on the GPU.
# Carry .dev/ as device_probe_2026_11_29.sh does. Results: $OUT/results.tar.gz, $OUT/log.txt.
set -u
ROOT=$(pwd)
W=/tmp/w; mkdir -p $W
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:$ROOT/.dev/site
command -v python3-config >/dev/null || export PATH=$PATH:$ROOT/.dev/bin
pack() { tar czf $OUT/results.tar.gz -C $W . 2>/dev/null; }
ITERS=10 . benchmarks/host/megatron_lm_configs.sh
COMMON="$MLM_COMMON $MLM_SMALL"
megatron() {  # name, limit, args...
  local name=$1 limit=$2; shift 2; echo "=== megatron $name $(date +%T)"
  (cd .dev/mlm && touch megatron/core/datasets/helpers_cpp*.so && CUDA_DEVICE_MAX_CONNECTIONS=1 \
   timeout $limit python3 -m torch.distributed.run --nproc-per-node 1 pretrain_gpt.py $COMMON "$@") \
   > $W/megatron_$name.log 2>&1
  echo "rc $?" >> $W/megatron_$name.log
  grep -oE "iteration +[0-9]+/ +[0-9]+ .*elapsed time per iteration \(ms\): [0-9.]+|rc [0-9]+" $W/megatron_$name.log \
    | awk '{print $2, $NF}' | tr '\n' ' '; echo; pack
}
echo "=== pure-Python rows on this host (docs/host-time.md: 'run it on the lent VM')"
timeout 120 python3 benchmarks/host/pure_python.py --json $W/pure_python.json > $W/pure_python.log 2>&1; tail -12 $W/pure_python.log; pack
echo "=== custom autograd.Function overhead"
timeout 60 python3 benchmarks/host/function_apply.py --device cuda > $W/function_apply.json 2>&1; cat $W/function_apply.json; pack
megatron base 90
megatron workers0 90 --num-workers 0
megatron nocheck 90 --no-check-for-nan-in-loss-and-grad
megatron profiled 150 --profile --use-pytorch-profiler --profile-step-start 6 --profile-step-end 8 \
  --pytorch-profiler-collect-callstack --pytorch-profiler-collect-shapes --tensorboard-dir $W/tb/tb
ls -la $W/tb/torch_profile 2>/dev/null; pack
# 5. the kernel cases phantora added after the lent H200 (kernel_sweep.extra_cases, 2026-11-30):
#    strided elementwise by dimensions and dtype, GEMMs with one misaligned matrix, non-causal
#    attention (the rows of the script's ops that these --only names also select come along)
echo "=== kernel sweep, phantora's cases $(date +%T)"
timeout 240 python3 -m phantora.cli calibrate --grid sweep --only strided_elementwise,mm,mm_nt,sdpa_fwd_bwd \
  -o $W/sweep_extra.jsonl > $W/sweep_extra.log 2>&1; tail -3 $W/sweep_extra.log; pack
echo "=== done $(date +%T)"
