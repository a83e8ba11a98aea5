"""A Megatron-Core GPT pre-training loop, written as a GPU user writes one.

Megatron-Core's wheel ships no training script (Megatron-LM's `pretrain_gpt.py` and
`megatron/training` live only in the Megatron-LM repository and need its full argument parser,
data pipeline and compiled dataset helpers). This is a stand-in for that script, built the way
Megatron-LM's `examples/run_simple_mcore_train_loop.py` and `megatron/training/training.py`
drive megatron.core, with public megatron.core APIs only: GPTModel with the local
(non-Transformer-Engine) layer spec or Transformer Engine's (`--transformer-impl
transformer_engine`, with FP8 through `--fp8-format`/`--fp8-recipe`),
`parallel_state.initialize_model_parallel(tp, pp)`, `model_parallel_cuda_manual_seed`, bf16 through `Float16Module`, Megatron DDP with the
distributed optimizer (`overlap_grad_reduce`, `overlap_param_gather`), `get_megatron_optimizer`,
and `get_forward_backward_func` over several microbatches. The data are random token ids made
on the CPU (a stand-in for a tokenized corpus; nothing is downloaded).

It runs unchanged under torchrun on real GPUs:

    torchrun --nproc-per-node 8 pretrain_gpt.py --tp 2 --pp 2 --num-microbatches 4

and prints Megatron's per-iteration figures (its `training_log` line: elapsed time per
iteration, throughput, loss, grad norm, skipped iterations) from the last rank.
"""

from __future__ import annotations

import argparse
import os
import time
from functools import partial
from typing import Iterator

import torch

from megatron.core import parallel_state, tensor_parallel
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.models.gpt.gpt_layer_specs import (get_gpt_layer_local_spec,
                                                      get_gpt_layer_with_transformer_engine_spec)
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.rerun_state_machine import get_rerun_state_machine
from megatron.core.transformer.module import Float16Module
from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig
from megatron.core.utils import get_batch_on_this_cp_rank


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tp", type=int, default=1, help="tensor model parallel size")
    p.add_argument("--pp", type=int, default=1, help="pipeline model parallel size")
    p.add_argument("--context-parallel-size", dest="cp", type=int, default=1,
                   help="context parallel size (the sequence split over ranks; Transformer Engine's layer spec)")
    p.add_argument("--virtual-pipeline-model-parallel-size", dest="vp", type=int, default=None,
                   help="model chunks per pipeline rank (interleaved 1F1B)")
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--hidden-size", type=int, default=512)
    p.add_argument("--num-attention-heads", type=int, default=8)
    p.add_argument("--ffn-hidden-size", type=int, default=None)
    p.add_argument("--seq-length", type=int, default=512)
    p.add_argument("--vocab-size", type=int, default=32000)
    p.add_argument("--micro-batch-size", type=int, default=2)
    p.add_argument("--num-microbatches", type=int, default=4)
    p.add_argument("--train-iters", type=int, default=5)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--no-overlap-grad-reduce", dest="overlap_grad_reduce", action="store_false")
    p.add_argument("--no-overlap-param-gather", dest="overlap_param_gather", action="store_false")
    p.add_argument("--no-check-for-nan-in-loss-and-grad", dest="check_for_nan_in_loss_and_grad",
                   action="store_false", help="as in Megatron-LM, the check is on by default")
    p.add_argument("--num-experts", type=int, default=None, help="MoE: routed experts per layer (Megatron's "
                   "--num-experts); SequentialMLP experts on the local spec")
    p.add_argument("--moe-router-topk", type=int, default=2)
    p.add_argument("--moe-permute-fusion", action="store_true",
                   help="Transformer Engine's fused token permutation for the dispatcher")
    p.add_argument("--moe-router-fusion", action="store_true",
                   help="Transformer Engine's fused top-k router and auxiliary loss kernels")
    p.add_argument("--moe-grouped-gemm", action="store_true",
                   help="the experts as one grouped GEMM (TEGroupedMLP with the TE spec)")
    p.add_argument("--moe-token-dispatcher-type", default="alltoall", choices=["allgather", "alltoall"])
    p.add_argument("--expert-model-parallel-size", dest="ep", type=int, default=1)
    p.add_argument("--expert-tensor-parallel-size", dest="etp", type=int, default=None,
                   help="tensor parallel size within each expert (Megatron's default: --tp)")
    p.add_argument("--sequence-parallel", action="store_true")
    p.add_argument("--masked-softmax-fusion", action="store_true",
                   help="Megatron's fused scale-mask-softmax kernels (Apex's scaled_*softmax_cuda; on by default "
                        "in Megatron-LM, which has --no-masked-softmax-fusion)")
    p.add_argument("--gradient-accumulation-fusion", action="store_true",
                   help="weight gradients accumulated into main_grad by Apex's fused_weight_gradient_mlp_cuda "
                        "(on by default in Megatron-LM, which has --no-gradient-accumulation-fusion)")
    p.add_argument("--persist-layer-norm", action="store_true",
                   help="Apex's persistent LayerNorm kernel for the hidden sizes it supports, with Apex installed "
                        "(on by default in Megatron-LM, which has --no-persist-layer-norm)")
    p.add_argument("--transformer-impl", default="local", choices=["local", "transformer_engine"],
                   help="the layer spec: Megatron-Core's own modules (get_gpt_layer_local_spec) or Transformer "
                        "Engine's (get_gpt_layer_with_transformer_engine_spec; Megatron-LM's default)")
    p.add_argument("--fp8-format", default=None, choices=["e4m3", "hybrid"],
                   help="FP8 training through Transformer Engine (hybrid: E4M3 forward, E5M2 gradients)")
    p.add_argument("--fp8-recipe", default="delayed", choices=["tensorwise", "delayed", "mxfp8", "blockwise"],
                   help="FP8 scaling: delayed (amax history), tensorwise (current scaling), mxfp8, blockwise")
    p.add_argument("--fp8-amax-history-len", type=int, default=1)
    p.add_argument("--fp8-amax-compute-algo", default="most_recent", choices=["most_recent", "max"])
    p.add_argument("--multi-latent-attention", action="store_true",
                   help="DeepSeek's multi-latent attention (MLATransformerConfig; Transformer Engine's layer spec)")
    p.add_argument("--q-lora-rank", type=int, default=None, help="MLA: rank of the query's low-rank projection")
    p.add_argument("--kv-lora-rank", type=int, default=32, help="MLA: rank of the keys' and values' low-rank projection")
    p.add_argument("--qk-head-dim", type=int, default=128, help="MLA: query/key head dimension without RoPE's part")
    p.add_argument("--qk-pos-emb-head-dim", type=int, default=64, help="MLA: the RoPE part of each query/key head")
    p.add_argument("--v-head-dim", type=int, default=128, help="MLA: value head dimension")
    p.add_argument("--tp-comm-overlap", action="store_true",
                   help="Transformer Engine's userbuffers: the TP all-gathers and reduce-scatters overlapped with "
                        "the GEMMs (needs --sequence-parallel and the TE spec)")
    p.add_argument("--tp-comm-bootstrap-backend", default="nccl", choices=["nccl", "mpi", "gloo"])
    p.add_argument("--ddp-bucket-size", type=int, default=None,
                   help="parameters per gradient bucket (Megatron's default: max(40M, 1M x DP size))")
    p.add_argument("--window-size", default=None,
                   help="sliding-window attention 'left,right' (GPT-OSS: 127,0), as Megatron-LM's flag")
    p.add_argument("--window-attn-skip-freq", type=int, default=None,
                   help="every Nth layer full attention, the others windowed (GPT-OSS: 2)")
    p.add_argument("--softmax-type", default="vanilla", choices=["vanilla", "off-by-one", "learnable"],
                   help="attention softmax; learnable: a learned offset per head (GPT-OSS's attention sinks)")
    return p.parse_args()


def initialize_distributed(tp: int, pp: int, vp: int | None, ep: int = 1, etp: int | None = None,
                           cp: int = 1) -> None:
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    torch.distributed.init_process_group(backend="nccl", rank=int(os.environ["RANK"]),
                                         world_size=int(os.environ["WORLD_SIZE"]))
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                             virtual_pipeline_model_parallel_size=vp, context_parallel_size=cp,
                                             expert_model_parallel_size=ep, expert_tensor_parallel_size=etp)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)


def initialize_tp_communicators(args: argparse.Namespace) -> None:
    """megatron/training/initialize.py's _initialize_tp_communicators: one userbuffer per TP GEMM of
    a layer, for a [sequence x micro-batch, hidden] input, with TE's default configuration."""
    from transformer_engine.pytorch import module as te_module

    mode = te_module.base.UserBufferQuantizationMode
    te_module.base.initialize_ub(
        shape=[args.seq_length * args.micro_batch_size // args.cp, args.hidden_size], tp_size=args.tp,
        quantization_modes=[mode.FP8 if args.fp8_format else mode.NONE], ub_cfgs={},
        bootstrap_backend=args.tp_comm_bootstrap_backend)


def model_provider(args: argparse.Namespace) -> tuple[list[GPTModel], TransformerConfig]:
    """One model chunk per virtual pipeline stage (one without interleaving), as
    megatron/training/training.py's get_model builds them."""
    mla = dict(q_lora_rank=args.q_lora_rank, kv_lora_rank=args.kv_lora_rank, qk_head_dim=args.qk_head_dim,
               qk_pos_emb_head_dim=args.qk_pos_emb_head_dim, v_head_dim=args.v_head_dim,
               rope_type="rope") if args.multi_latent_attention else {}
    config = (MLATransformerConfig if args.multi_latent_attention else TransformerConfig)(
        **mla,
        num_layers=args.num_layers,
        hidden_size=args.hidden_size,
        num_attention_heads=args.num_attention_heads,
        ffn_hidden_size=args.ffn_hidden_size,
        tensor_model_parallel_size=args.tp,
        pipeline_model_parallel_size=args.pp,
        virtual_pipeline_model_parallel_size=args.vp,
        context_parallel_size=args.cp,
        bf16=True,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        autocast_dtype=torch.bfloat16,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        num_moe_experts=args.num_experts,
        moe_grouped_gemm=args.moe_grouped_gemm,
        moe_permute_fusion=args.moe_permute_fusion,
        moe_router_fusion=args.moe_router_fusion,
        moe_router_topk=args.moe_router_topk,
        moe_token_dispatcher_type=args.moe_token_dispatcher_type,
        expert_model_parallel_size=args.ep,
        expert_tensor_parallel_size=args.etp,
        sequence_parallel=args.sequence_parallel,
        tp_comm_overlap=args.tp_comm_overlap,
        moe_aux_loss_coeff=1e-2 if args.num_experts else 0.0,
        masked_softmax_fusion=args.masked_softmax_fusion,
        gradient_accumulation_fusion=args.gradient_accumulation_fusion,
        persist_layer_norm=args.persist_layer_norm,
        fp8=args.fp8_format,
        fp8_recipe=args.fp8_recipe,
        fp8_amax_history_len=args.fp8_amax_history_len,
        fp8_amax_compute_algo=args.fp8_amax_compute_algo,
        window_size=tuple(int(n) for n in args.window_size.split(",")) if args.window_size else None,
        window_attn_skip_freq=args.window_attn_skip_freq,
        softmax_type=args.softmax_type,
    )
    if args.transformer_impl == "transformer_engine":
        layer_spec = get_gpt_layer_with_transformer_engine_spec(num_experts=args.num_experts,
                                                                moe_grouped_gemm=args.moe_grouped_gemm,
                                                                multi_latent_attention=args.multi_latent_attention)
    else:
        layer_spec = get_gpt_layer_local_spec(num_experts=args.num_experts, moe_grouped_gemm=args.moe_grouped_gemm)
    chunks = []
    for vp_stage in range(args.vp or 1):
        vp = vp_stage if args.vp else None
        chunks.append(GPTModel(
            config=config,
            transformer_layer_spec=layer_spec,
            vocab_size=args.vocab_size,
            max_sequence_length=args.seq_length,
            pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=args.vp is None, vp_stage=vp),
            post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=args.vp is None, vp_stage=vp),
            vp_stage=vp,
        ))
    for chunk in chunks:
        for param in chunk.parameters():
            tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(param)
    return chunks, config


def mock_batches(args: argparse.Namespace) -> Iterator[dict[str, torch.Tensor]]:
    """Random token ids in place of a tokenized corpus (same shapes and dtypes as
    Megatron's GPTDataset samples)."""
    g = torch.Generator().manual_seed(1234 + parallel_state.get_data_parallel_rank())
    b, s = args.micro_batch_size, args.seq_length
    position_ids = torch.arange(s, dtype=torch.long).unsqueeze(0).expand(b, -1)
    while True:
        text = torch.randint(0, args.vocab_size, (b, s + 1), generator=g)
        yield {"tokens": text[:, :-1].contiguous(), "labels": text[:, 1:].contiguous(),
               "loss_mask": torch.ones(b, s, dtype=torch.float), "position_ids": position_ids}


def forward_step(data_iterator: Iterator, model: torch.nn.Module, check_for_nan: bool = True):
    data = next(data_iterator)
    tokens = data["tokens"].cuda(non_blocking=True)
    labels = data["labels"].cuda(non_blocking=True)
    loss_mask = data["loss_mask"].cuda(non_blocking=True)
    position_ids = data["position_ids"].cuda(non_blocking=True)
    if parallel_state.get_context_parallel_world_size() > 1:
        # pretrain_gpt.py's get_batch: this rank's two chunks of the sequence (load-balanced for
        # the causal mask)
        part = get_batch_on_this_cp_rank({"tokens": tokens, "labels": labels, "loss_mask": loss_mask,
                                          "position_ids": position_ids, "cu_seqlens": None}, is_hybrid_cp=False,
                                         cp_group=parallel_state.get_context_parallel_group())
        tokens, labels, loss_mask, position_ids = (part[k] for k in ("tokens", "labels", "loss_mask", "position_ids"))
    # Both layer specs build the causal mask themselves (attn_mask_type=causal).
    output_tensor = model(tokens, position_ids, None, labels=labels)

    def loss_func(output_tensor: torch.Tensor):
        losses = output_tensor.float().view(-1)
        mask = loss_mask.view(-1)
        loss = torch.sum(losses * mask) / mask.sum()
        if check_for_nan:  # as pretrain_gpt.py's loss_func does
            rerun_state_machine = get_rerun_state_machine()
            rerun_state_machine.validate_result(result=loss, rejection_func=torch.isnan,
                                                message="found NaN in local forward loss calculation",
                                                tolerance=0.0, fatal=True)
            rerun_state_machine.validate_result(result=loss, rejection_func=torch.isinf,
                                                message="found Inf in local forward loss calculation",
                                                tolerance=0.0, fatal=True)
        return loss, {"lm loss": loss.detach()}

    return output_tensor, loss_func


def num_floating_point_operations(args: argparse.Namespace, batch_size: int) -> float:
    """Model FLOPs of one iteration, as megatron/training/training.py counts them for a dense GPT
    (no SwiGLU, one query group per head): forward + weight and data gradients (3x) of the
    QKV/output projections, the MLP, causal core attention and the logits."""
    h, s, n_layers = args.hidden_size, args.seq_length, args.num_layers
    ffn = args.ffn_hidden_size or 4 * h
    # MoE: each token runs top-k experts' MLPs, plus the router's [h, experts] projection
    mlp = 2 * h * ffn * (args.moe_router_topk if args.num_experts else 1) + h * (args.num_experts or 0)
    per_token = 3 * 2 * (n_layers * (h * 3 * h + h * h + mlp + h * s) + h * args.vocab_size)
    return float(batch_size * s * per_token)


def main() -> None:
    args = parse_args()
    initialize_distributed(args.tp, args.pp, args.vp, args.ep, args.etp, args.cp)
    if args.tp_comm_overlap:
        initialize_tp_communicators(args)
    rank = torch.distributed.get_rank()
    world = torch.distributed.get_world_size()
    dp = parallel_state.get_data_parallel_world_size()

    chunks, config = model_provider(args)
    for chunk in chunks:
        chunk.cuda(torch.cuda.current_device())
    n_params = sum(p.numel() for chunk in chunks for p in chunk.parameters())
    if parallel_state.get_data_parallel_rank() == 0:
        print(f" > number of parameters on (tensor, pipeline) model parallel rank "
              f"({parallel_state.get_tensor_model_parallel_rank()}, "
              f"{parallel_state.get_pipeline_model_parallel_rank()}): {n_params}", flush=True)
    chunks = [Float16Module(config, chunk) for chunk in chunks]

    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=args.overlap_grad_reduce,
        overlap_param_gather=args.overlap_param_gather,
        use_distributed_optimizer=True,
        bucket_size=args.ddp_bucket_size,
        check_for_nan_in_grad=args.check_for_nan_in_loss_and_grad,
    )
    # training.py: bucketing only for the first chunk of the first pipeline rank
    chunks = [DistributedDataParallel(config=config, ddp_config=ddp_config, module=chunk,
                                      disable_bucketing=i > 0 or parallel_state.get_pipeline_model_parallel_rank() > 0)
              for i, chunk in enumerate(chunks)]
    model = chunks[0] if len(chunks) == 1 else chunks

    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=args.lr, weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.95,
                        clip_grad=1.0, bf16=True, params_dtype=torch.bfloat16,
                        use_distributed_optimizer=True, overlap_param_gather=args.overlap_param_gather),
        chunks,
    )

    # As megatron/training/training.py wires the schedule to DDP and the optimizer.
    config.grad_scale_func = optimizer.scale_loss
    def one_or_list(fns: list):
        return fns[0] if len(fns) == 1 else fns

    if args.overlap_grad_reduce:
        config.no_sync_func = one_or_list([c.no_sync for c in chunks])
        config.grad_sync_func = one_or_list([c.start_grad_sync for c in chunks])
    if args.overlap_param_gather:
        config.param_sync_func = one_or_list([c.start_param_sync for c in chunks])
    config.finalize_model_grads_func = finalize_model_grads

    forward_backward_func = get_forward_backward_func()
    data_iterator = mock_batches(args)
    if len(chunks) > 1:  # one iterator per chunk; the schedule reads the first and last chunk's
        data_iterator = [data_iterator] * len(chunks)
    global_batch = args.micro_batch_size * args.num_microbatches * dp
    tokens_per_iter = global_batch * args.seq_length
    flops_per_iter = num_floating_point_operations(args, global_batch)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    skipped = 0
    for iteration in range(1, args.train_iters + 1):
        torch.cuda.synchronize()
        t0 = time.time()
        start.record()

        for chunk in chunks:
            chunk.zero_grad_buffer()
        optimizer.zero_grad()
        losses_reduced = forward_backward_func(
            forward_step_func=partial(forward_step, check_for_nan=args.check_for_nan_in_loss_and_grad),
            data_iterator=data_iterator,
            model=model,
            num_microbatches=args.num_microbatches,
            seq_length=args.seq_length,
            micro_batch_size=args.micro_batch_size,
            decoder_seq_length=args.seq_length,
            forward_only=False,
        )
        update_successful, grad_norm, num_zeros_in_grad = optimizer.step()
        skipped += 0 if update_successful else 1

        end.record()
        torch.cuda.synchronize()
        elapsed_ms = (time.time() - t0) * 1000.0
        event_ms = start.elapsed_time(end)

        if parallel_state.is_pipeline_last_stage():
            loss = torch.stack([x["lm loss"] for x in losses_reduced]).mean()
            torch.distributed.all_reduce(loss, group=parallel_state.get_data_parallel_group())
            loss = loss.item() / dp
        if rank == world - 1:  # Megatron logs from the last rank (print_rank_last)
            print(f" [{time.strftime('%Y-%m-%d %H:%M:%S')}] iteration {iteration:8d}/{args.train_iters:8d} | "
                  f"elapsed time per iteration (ms): {elapsed_ms:.1f} | cuda event time (ms): {event_ms:.1f} | "
                  f"throughput per GPU (TFLOP/s/GPU): {flops_per_iter / (elapsed_ms / 1000.0) / world / 1e12:.1f} | "
                  f"tokens per second per GPU: {tokens_per_iter / (elapsed_ms / 1000.0) / world:.1f} | "
                  f"learning rate: {args.lr:.6E} | lm loss: {loss:.6E} | "
                  f"grad norm: {float(grad_norm):.3f} | update successful: {update_successful} | "
                  f"number of skipped iterations: {skipped:3d}", flush=True)

    if rank == world - 1:
        print(f" [after training] peak memory allocated (GiB): {torch.cuda.max_memory_allocated() / 2**30:.3f} | "
              f"reserved (GiB): {torch.cuda.max_memory_reserved() / 2**30:.3f}", flush=True)
    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
