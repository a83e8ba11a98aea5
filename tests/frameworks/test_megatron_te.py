"""Megatron-Core 0.19.2 with Transformer Engine 2.20.2's layer spec and FP8 under phantora
(issue 38, item 4).

The stand-in training script (tests/frameworks/megatron/pretrain_gpt.py) with Megatron-LM's
`--transformer-impl transformer_engine` (`get_gpt_layer_with_transformer_engine_spec`),
`--fp8-format hybrid --fp8-recipe delayed` and its default fused kernels (`--gradient-accumulation-fusion`:
TE's wgrad GEMMs accumulate into Megatron's fp32 main_grad), tensor parallel 2 with sequence
parallelism, in the
environment of the `megatron_te_python` fixture (Megatron-Core and TE's Python layer on the CUDA
build of torch; TE's extension is phantora's virtual one). One traced run, the smallest model of
the other Megatron tests (2 layers, width 256). Besides what every Megatron run is checked for
(exit 0, no unknown op, every iteration logged and its step taken, logged times equal the trace's,
memory against a hand count), it checks by hand count per layer and microbatch TE's FP8 GEMMs,
its casts and transposes, and the FP8 and BF16 collectives of sequence parallelism.

It has its own file so that pytest-xdist (--dist loadfile) runs it beside test_megatron.py.
"""

from __future__ import annotations

from collections import Counter

import pytest

from tests.frameworks.megatron_run import GPTConfig, gpt_params, run_megatron
from tests.frameworks.test_megatron import check_moe_run, check_run, compute_kernels, nccl, step_windows, trace_events

pytestmark = pytest.mark.slow

# With TE importable Megatron-Core's optimizer is TE's FusedAdam: one multi_tensor_adam launch per
# parameter group (with and without weight decay) per step.
TE_ADAM = ("cuda_extension::multi_tensor_adam",)
FP8 = {"float8_e4m3fn", "float8_e5m2"}


def test_transformer_engine_spec_fp8_delayed_scaling_tp2_sequence_parallel(tmp_path, megatron_te_python):
    cfg = GPTConfig(tp=2, sequence_parallel=True, transformer_impl="transformer_engine", fp8_format="hybrid",
                    fp8_recipe="delayed", fused_kernels=True)
    run = run_megatron(tmp_path, megatron_te_python, 2, cfg)
    check_run(run, cfg, world=2, adam_ops=TE_ADAM)
    # TE's LayerNormLinear holds the layer norm Megatron's local spec keeps apart: same parameters
    for r in range(2):
        assert f"model parallel rank ({r}, 0): {gpt_params(cfg, 0)}" in run.proc.stdout

    events = trace_events(run)
    h, tp = cfg.hidden, cfg.tp
    tokens = cfg.micro_batch * cfg.seq  # a microbatch's tokens; TE's linears see all of them (gathered)
    microbatches = cfg.microbatches * cfg.iters
    layer_mbs = cfg.layers * microbatches  # one layer's forward and backward on one microbatch
    # this rank's linear weights per layer: column-parallel QKV [3h/tp, h] and FC1 [4h/tp, h],
    # row-parallel projection [h, h/tp] and FC2 [h, 4h/tp]
    linear_weights = (3 * h * h + h * h + 4 * h * h + 4 * h * h) // tp
    for rank in range(2):
        kernels = compute_kernels(events, rank)
        ops = Counter(k["args"]["op"].split(".")[0] for k in kernels)

        # FP8 GEMMs: 4 linears x (fprop, dgrad, wgrad) per layer and microbatch, all through TE's
        # cuBLASLt GEMM; hybrid format: fprop E4M3 x E4M3, dgrad and wgrad take the E5M2 gradient
        gemms = [k for k in kernels if k["args"]["op"].startswith("nvte::cublas_gemm")]
        operands = Counter(tuple(sorted(k["args"]["dtypes"][:2])) for k in gemms)
        assert operands == {("float8_e4m3fn", "float8_e4m3fn"): 4 * layer_mbs,
                            ("float8_e4m3fn", "float8_e5m2"): 8 * layer_mbs}, (rank, operands)
        # their FLOPs: forward plus two backward GEMMs over all tokens of every linear weight
        assert sum(k["args"]["flops"] for k in gemms) == 3 * 2 * tokens * linear_weights * layer_mbs
        # gradient accumulation fusion: the wgrad GEMMs write the fp32 main_grad, the others BF16
        outputs = Counter(k["args"]["dtypes"][2] for k in gemms)
        assert outputs == {"float32": 4 * layer_mbs, "bfloat16": 8 * layer_mbs}, (rank, outputs)
        # the output layer is Megatron's own ColumnParallelLinear: BF16 fprop and dgrad, its
        # wgrad through Apex's fused_weight_gradient_mlp_cuda
        assert ops["aten::mm"] == 2 * microbatches and ops["apex::wgrad_gemm_accum"] == microbatches, ops

        # FP8 casts (TE's cast_transpose family): each weight once per step (the first
        # microbatch's; TE caches it for the others); per layer and microbatch the projection's
        # and FC2's inputs in forward (QKV's and FC1's come out of the fused LayerNorm), and the
        # four gradients in backward (QKV's with its bias gradient)
        casts = Counter(k["name"] for k in kernels if k["args"]["op"].startswith("nvte::cast_transpose"))
        assert sum(casts.values()) == 4 * cfg.layers * cfg.iters + 6 * layer_mbs, casts
        assert casts["transformer_engine::cast_transpose_dbias_kernel"] == layer_mbs, casts
        # sequence parallel: what is all-gathered in FP8 (QKV's and FC1's inputs, the projection's
        # and FC2's gradients) is transposed after the gather, for the wgrad GEMM
        assert ops["nvte::fp8_transpose"] == 4 * layer_mbs, ops
        # delayed scaling: the amax history and scales updated at the end of each forward and
        # backward FP8 region (Megatron's fp8 context around the transformer block)
        assert ops["nvte::amax_and_scale_update"] == 2 * microbatches, ops
        # TE's LayerNorms (two per layer, in LayerNormLinear and LayerNormMLP, and the final one);
        # attention is cuDNN's fused attention, in BF16 (FP8 attention is TE's fp8_dpa, off), as
        # TE chooses on an H100: not its unfused path's softmax
        assert ops["nvte::layernorm_fwd"] == ops["nvte::layernorm_bwd"] == (2 * cfg.layers + 1) * microbatches
        assert ops["nvte::fused_attn_fwd"] == ops["nvte::fused_attn_bwd"] == layer_mbs, ops
        assert ops["nvte::softmax_fwd"] == ops["nvte::softmax_bwd"] == 0, ops
        # gradient clipping with TE's multi-tensor kernels, once per step
        assert ops["nvte::multi_tensor_l2norm"] == ops["nvte::multi_tensor_scale"] == cfg.iters, ops

        # tensor + sequence parallel collectives of one microbatch's hidden states [b*s, h]
        tp_group = Counter((k["args"]["op"], k["args"]["dtype"], k["args"]["bytes"]) for k in nccl(events, rank)
                           if k["args"]["group ranks"] == [0, 1])
        # per layer: QKV's and FC1's FP8 inputs gathered in forward and again for wgrad, the
        # projection's and FC2's FP8 gradients gathered in backward
        assert tp_group[("all_gather", "uint8", tokens * h)] == 6 * layer_mbs, tp_group
        # per layer: the projection's and FC2's outputs in forward, QKV's and FC1's input
        # gradients in backward; per microbatch the output layer's input gradient
        assert tp_group[("reduce_scatter", "bfloat16", 2 * tokens * h)] == (4 * cfg.layers + 1) * microbatches, \
            tp_group
        # per microbatch: the output layer's input forward and again for wgrad, the embedding's
        # gradient (its forward all-reduces, then splits the sequence)
        assert tp_group[("all_gather", "bfloat16", 2 * tokens * h)] == 3 * microbatches, tp_group
        assert tp_group[("all_reduce", "bfloat16", 2 * tokens * h)] == microbatches, tp_group


def test_transformer_engine_spec_context_parallel_two_ranks(tmp_path, megatron_te_python):
    """Context parallel 2 (Megatron's default p2p ring, through TE's attention): each rank holds
    2 of the sequence's 4 chunks (load-balanced for the causal mask: rank 0 chunks 0 and 3, rank 1
    chunks 1 and 2), attends over its own chunks and then over the other rank's K/V, which goes
    round the ring once forward and, with its gradient, once more in backward; the weights'
    gradients are reduced over the two ranks (one data-parallel x context-parallel group)."""
    cfg = GPTConfig(cp=2, transformer_impl="transformer_engine")
    run = run_megatron(tmp_path, megatron_te_python, 2, cfg)
    check_run(run, cfg, world=2, adam_ops=TE_ADAM)
    events = trace_events(run)
    layer_mbs = cfg.layers * cfg.microbatches * cfg.iters
    chunk = cfg.seq // (2 * cfg.cp)  # 64 tokens
    heads, d = cfg.heads, cfg.hidden // cfg.heads
    kv_bytes = 2 * (2 * chunk) * cfg.micro_batch * heads * d * 2  # K and V of a rank's 128 tokens, bf16
    for rank in (0, 1):
        kernels = compute_kernels(events, rank)
        # (query tokens, key tokens) of each forward: q [tokens, b, heads, d], k likewise
        fwd = Counter((k["args"]["shapes"][0][0], k["args"]["shapes"][1][0])
                      for k in kernels if k["args"]["op"] == "nvte::fused_attn_fwd.default")
        # per layer and microbatch: the diagonal step (own 128 queries over own 128 keys, causal),
        # and the step over the other rank's keys: rank 0's later chunk (3) sees all of rank 1's
        # (64 queries x 128 keys); all of rank 1's queries see rank 0's first chunk (128 x 64)
        off_diagonal = (chunk, 2 * chunk) if rank == 0 else (2 * chunk, chunk)
        assert fwd == Counter({(2 * chunk, 2 * chunk): layer_mbs, off_diagonal: layer_mbs}), (rank, fwd)
        ops = Counter(k["args"]["op"].split(".")[0] for k in kernels)
        assert ops["nvte::fused_attn_bwd"] == 2 * layer_mbs and ops["nvte::softmax_fwd"] == 0, ops
        ring = Counter((k["args"]["op"], k["args"]["bytes"]) for k in nccl(events, rank)
                       if k["args"]["op"] in ("send", "recv"))
        assert ring == Counter({("send", kv_bytes): 3 * layer_mbs, ("recv", kv_bytes): 3 * layer_mbs}), ring
        grads = [k for k in nccl(events, rank) if k["args"]["op"] == "reduce_scatter"]
        assert len(grads) == cfg.iters and all(k["args"]["group ranks"] == [0, 1] for k in grads), grads


def test_transformer_engine_spec_multi_latent_attention_tp2(tmp_path, megatron_te_python):
    """DeepSeek's multi-latent attention (`--multi-latent-attention`, MLATransformerConfig, TE's
    spec) with tensor parallel 2: queries go through a low-rank down-projection (h -> q_lora) and
    an up-projection to each head's q_head_dim = qk_head_dim + qk_pos_emb_head_dim, keys and
    values through one shared latent (h -> kv_lora + the RoPE part); the down-projections are whole
    on each rank, the up-projections split the heads. Hand counts: the parameters per rank, TE's
    fused attention on this rank's 2 of 4 heads with head dims 96 (q, k) and 64 (v), 7 linears x
    3 GEMMs per layer and microbatch, and the TP all-reduces of the two latents' input gradients
    (the up-projections' inputs are whole, their outputs split)."""
    q_lora, kv_lora, qk, pos, v = 64, 32, 64, 32, 64
    cfg = GPTConfig(tp=2, transformer_impl="transformer_engine", mla=(q_lora, kv_lora, qk, pos, v))
    run = run_megatron(tmp_path, megatron_te_python, 2, cfg)
    check_run(run, cfg, world=2, adam_ops=TE_ADAM)
    for r in range(2):
        assert f"model parallel rank ({r}, 0): {gpt_params(cfg, 0)}" in run.proc.stdout
    events = trace_events(run)
    layer_mbs = cfg.layers * cfg.microbatches * cfg.iters
    tokens = cfg.seq * cfg.micro_batch
    heads = cfg.heads // cfg.tp
    for rank in range(2):
        kernels = compute_kernels(events, rank)
        ops = Counter(k["args"]["op"].split(".")[0] for k in kernels)
        fwd = Counter((tuple(k["args"]["shapes"][0]), tuple(k["args"]["shapes"][2])) for k in kernels
                      if k["args"]["op"] == "nvte::fused_attn_fwd.default")
        assert fwd == Counter({((cfg.seq, cfg.micro_batch, heads, qk + pos), (cfg.seq, cfg.micro_batch, heads, v)):
                               layer_mbs}), (rank, fwd)
        assert ops["nvte::fused_attn_bwd"] == layer_mbs, ops
        # q down/up, kv down/up, output projection, FC1, FC2: forward, input and weight gradients
        assert ops["nvte::cublas_gemm"] == 7 * 3 * layer_mbs, ops
        reduces = Counter(k["args"]["bytes"] for k in nccl(events, rank) if k["args"]["op"] == "all_reduce")
        assert reduces[tokens * q_lora * 2] == layer_mbs and reduces[tokens * kv_lora * 2] == layer_mbs, reduces


def test_transformer_engine_spec_tp_comm_overlap_tp2(tmp_path, megatron_te_python):
    """`--tp-comm-overlap` (Megatron-LM's initialize_ub with TE's default userbuffer methods): the
    TP collectives of the transformer layers move inside TE's GEMMs, as the userbuffers' copies
    and kernels (transport "userbuffers"), and the GEMMs split around them. Counted by hand per
    layer and microbatch from TE's methods (module/base.py initialize_ub): ring exchange for the
    QKV and FC1 forward GEMMs and the projection's and FC2's dgrad (tp chunks, one ring step of
    send and receive per chunk after the first), pipeline for the projection's and FC2's forward
    (4 chunks, each reduce-scattered), bulk for QKV's and FC1's dgrad (the input all-gathered for
    wgrad beside it) and wgrad (dgrad reduce-scattered beside it)."""
    cfg = GPTConfig(tp=2, sequence_parallel=True, transformer_impl="transformer_engine", tp_comm_overlap=True)
    run = run_megatron(tmp_path, megatron_te_python, 2, cfg)
    check_run(run, cfg, world=2, adam_ops=TE_ADAM)

    events = trace_events(run)
    h, tp = cfg.hidden, cfg.tp
    tokens = cfg.micro_batch * cfg.seq
    microbatches = cfg.microbatches * cfg.iters
    layer_mbs = cfg.layers * microbatches
    linear_weights = (3 * h * h + h * h + 4 * h * h + 4 * h * h) // tp
    for rank in range(2):
        kernels = compute_kernels(events, rank)
        gemms = [k for k in kernels if k["args"]["op"].startswith("nvte::cublas_gemm")]
        # forward: 2 + 4 + 2 + 4 chunks; backward: 2 ring chunks + wgrad for the projection and
        # FC2, one bulk dgrad and one bulk wgrad for QKV and FC1
        assert len(gemms) == (12 + 10) * layer_mbs, (rank, len(gemms))
        # the chunks add up to the unsplit GEMMs' FLOPs
        assert sum(k["args"]["flops"] for k in gemms) == 3 * 2 * tokens * linear_weights * layer_mbs

        comm = Counter((k["args"]["op"], k["args"].get("transport", "nccl"), k["args"]["bytes"])
                       for k in nccl(events, rank) if set(k["args"]["group ranks"]) == {0, 1})
        ub = {key: n for key, n in comm.items() if key[1] == "userbuffers"}
        assert ub == {
            # one ring step per ring GEMM: this rank's chunk of the [tokens, h] BF16 buffer out, the other's in
            ("send", "userbuffers", 2 * tokens * h // tp): 4 * layer_mbs,
            ("recv", "userbuffers", 2 * tokens * h // tp): 4 * layer_mbs,
            # pipeline: each of the 4 output chunks [tokens, h / 4] reduce-scattered
            ("reduce_scatter", "userbuffers", 2 * tokens * h // 4): 8 * layer_mbs,
            # bulk: QKV's and FC1's inputs gathered for wgrad, their input gradients reduce-scattered
            ("all_gather", "userbuffers", 2 * tokens * h): 2 * layer_mbs,
            ("reduce_scatter", "userbuffers", 2 * tokens * h): 2 * layer_mbs,
        }, (rank, ub)
        # NCCL keeps what lies outside TE's layers (the embedding's and the output layer's,
        # as in the test above), none of the transformer layers'
        assert comm[("reduce_scatter", "nccl", 2 * tokens * h)] == microbatches, comm
        assert comm[("all_gather", "nccl", 2 * tokens * h)] == 3 * microbatches, comm
        assert comm[("all_reduce", "nccl", 2 * tokens * h)] == microbatches, comm



def test_tp_comm_overlap_runs_with_one_representative_per_stage(tmp_path, megatron_te_python):
    """`--tp-comm-overlap` at TP 2 x PP 2 on 4 GPUs with the stage representatives `--ranks 0,2`:
    TE's userbuffers pass each ring GEMM's shard from TP rank 0 to rank 1 and back, and rank 1 and
    3 are mirrors. Each mirror's ring message goes to its own next rank (rank 1 sends to 0), where
    such a message used to be refused as a pipeline boundary between a representative and its
    mirror."""
    cfg = GPTConfig(tp=2, pp=2, sequence_parallel=True, transformer_impl="transformer_engine", tp_comm_overlap=True)
    run = run_megatron(tmp_path, megatron_te_python, 4, cfg, options=("--ranks", "0,2"))
    assert run.proc.returncode == 0, run.proc.stderr[-3000:]
    events = trace_events(run)  # Megatron logs on the last rank, a mirror here: the steps are the trace's
    assert len(step_windows(events, 0)) == len(step_windows(events, 2)) == cfg.iters
    for rep, mirror in ((0, 1), (2, 3)):
        sent = Counter(tuple(k["args"]["group ranks"]) for k in nccl(events, rep) if k["args"]["op"] == "send")
        mirrored = Counter(tuple(k["args"]["group ranks"]) for k in nccl(events, mirror) if k["args"]["op"] == "send")
        ring = sent[(rep, mirror)]
        assert ring > 0 and mirrored[(mirror, rep)] == ring, (sent, mirrored)  # the same ring steps, the other way

def test_transformer_engine_spec_moe_grouped_gemm_expert_parallel(tmp_path, megatron_te_python):
    """MoE on TE's layer spec with `--moe-grouped-gemm` (TEGroupedMLP: each rank's experts in TE's
    GroupedLinear, one grouped GEMM per projection and pass), `--moe-permute-fusion` (TE's token
    permutation, its own Triton kernels, autotuned at their first launch) and `--moe-router-fusion`
    (TE's fused top-k router and auxiliary loss kernels, whose routing map holds the routing
    model's balanced decision), expert parallel 2 over the alltoall dispatcher. By hand, per layer and microbatch: micro-batch 2 x 256 tokens x top-2 =
    1,024 rows routed from each rank, half to each rank's experts (balanced), so each rank's 2
    experts take 512 rows each; 6 grouped GEMMs (FC1 and FC2, forward, dgrad and wgrad) of 2 x 512
    x 256 x 1,024 x 2 FLOPs; 4 token exchanges (dispatch and combine, forward and backward) of 512
    rows of 256 BF16 each way; TE's permute and unpermute kernels in both passes."""
    cfg = GPTConfig(experts=4, topk=2, ep=2, grouped_gemm=True, permute_fusion=True, router_fusion=True,
                    transformer_impl="transformer_engine", microbatches=2, iters=2)  # the autotuning's compiles cost the CI most
    run = run_megatron(tmp_path, megatron_te_python, 2, cfg)
    check_moe_run(run, cfg)  # the fused router's decisions too: the routing model's
    events = trace_events(run)
    h, ffn = cfg.hidden, 4 * cfg.hidden
    layer_mbs = cfg.layers * cfg.microbatches * cfg.iters
    rows = cfg.micro_batch * cfg.seq * cfg.topk // 2  # per expert: this rank's half of each rank's rows
    for rank in (0, 1):
        kernels = compute_kernels(events, rank)
        grouped = [k for k in kernels if k["args"]["op"].startswith("nvte::grouped_gemm")]
        assert len(grouped) == 6 * layer_mbs, (rank, len(grouped))
        assert {k["args"]["flops"] for k in grouped} == {2 * 2 * rows * h * ffn}, rank
        exchanges = [k["args"].get("bytes sent to each member") for k in nccl(events, rank)
                     if k["args"]["op"] == "all_to_all"]
        assert exchanges.count([rows * h * 2, rows * h * 2]) == 4 * layer_mbs, (rank, exchanges[:8])
        # TE's Triton permutation: the tokens permuted before the dispatch and unpermuted after the
        # combine in forward, and the reverse in backward; counted after the first step, which also
        # holds the autotuner's trial launches
        later = step_windows(events, rank)[1][0]
        names = Counter(k["name"] for k in kernels if k["ts"] >= later)
        steady = cfg.layers * cfg.microbatches * (cfg.iters - 1)
        assert (names["_permute_kernel"], names["_unpermute_kernel"]) == (2 * steady, 2 * steady), names
        # the fused router: the top-k and the auxiliary loss's scores, forward and backward, and the
        # loss itself, once per layer and microbatch each; no unfused top-k left
        ops = Counter(k["args"]["op"].split(".")[0] for k in kernels)
        assert (ops["nvte::router_fwd"], ops["nvte::router_bwd"]) == (2 * layer_mbs, 2 * layer_mbs), ops
        assert (ops["nvte::aux_loss_fwd"], ops["nvte::aux_loss_bwd"]) == (layer_mbs, layer_mbs), ops
        assert ops["aten::topk"] == 0, ops


def test_sliding_window_attention_costs_the_window(tmp_path, megatron_te_python):
    """GPT-OSS's attention through Megatron-Core's TE spec: a 128-token window (`window_size`
    (127, 0)) on all layers but every second (`window_attn_skip_freq` 2: layers 1 and 3 of 4
    windowed, 2 and 4 full) and a learnable softmax offset per head (its attention sinks). Each
    fused attention's FLOPs are the score cells it computes, by hand over 1,024 tokens: windowed,
    1 + 2 + ... + 128 for the first 128 rows and 128 for each of the other 896 = 122,944 cells;
    full causal, 1,024 x 1,025 / 2 = 524,800. Before, every layer was costed as full causal."""
    cfg = GPTConfig(layers=4, seq=1024, iters=2, microbatches=2, transformer_impl="transformer_engine",
                    window=(127, 0), window_skip_freq=2, softmax_type="learnable")
    run = run_megatron(tmp_path, megatron_te_python, 1, cfg)
    check_run(run, cfg, world=1, adam_ops=TE_ADAM)
    fwd = [k for k in compute_kernels(trace_events(run), 0) if k["args"]["op"] == "nvte::fused_attn_fwd.default"]
    head_dim = cfg.hidden // cfg.heads
    per_cell = 2 * cfg.micro_batch * cfg.heads * 2 * head_dim  # QK^T and PV over every head
    half = cfg.layers // 2 * cfg.microbatches * cfg.iters
    assert Counter(k["args"]["flops"] for k in fwd) == {per_cell * 122_944: half, per_cell * 524_800: half}
    windowed = [k["dur"] for k in fwd if k["args"]["flops"] == per_cell * 122_944]
    full = [k["dur"] for k in fwd if k["args"]["flops"] == per_cell * 524_800]
    assert max(windowed) < 0.6 * min(full), (windowed, full)
