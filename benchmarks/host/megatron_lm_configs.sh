# Megatron-LM pretrain_gpt.py arguments of the 1-GPU host-time configurations (sourced, not run):
# the ones benchmarks/groundtruth/device_probe_2026_11_29.sh ran on the lent H200 VM (that script
# keeps its own copy, as the record of what ran). ITERS sets --train-iters (default 6).
# MLM_COMMON: local spec with Megatron's fused kernels off (the VM has no Apex or Transformer
# Engine) and mock data; MLM_SMALL / MLM_GPT: the models; MLM_LLAMA: added to MLM_SMALL for small_llama.
MLM_COMMON="--transformer-impl local --no-gradient-accumulation-fusion --no-masked-softmax-fusion
 --no-persist-layer-norm --no-bias-gelu-fusion --no-bias-dropout-fusion --no-rope-fusion --bf16 --mock-data
 --tokenizer-type NullTokenizer --vocab-size 32000 --lr 1e-4 --log-interval 1 --eval-iters 0 --eval-interval 100000"
MLM_SMALL="--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 256 --max-position-embeddings 256
 --micro-batch-size 1 --global-batch-size 16 --train-iters ${ITERS:-6}"
MLM_GPT="--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --max-position-embeddings 1024
 --micro-batch-size 2 --global-batch-size 16 --train-iters ${ITERS:-6}"
MLM_LLAMA="--normalization RMSNorm --swiglu --position-embedding-type rope --group-query-attention
 --num-query-groups 2 --disable-bias-linear --untie-embeddings-and-output-weights --use-distributed-optimizer"
