"""Megatron-Core 0.19.2 runs unmodified under phantora (issue 15, point 2).

The user program is tests/frameworks/megatron/pretrain_gpt.py, a stand-in for Megatron-LM's
pretrain_gpt.py (the megatron-core wheel ships no training script): GPTModel with the local layer
spec, bf16, Megatron DDP with the distributed optimizer and overlapped gradient reduce-scatter
and parameter all-gather, get_forward_backward_func over 4 microbatches, launched with torchrun
on the CUDA build of torch 2.14 (the `frameworks_cuda_python` fixture). Each test checks what a
user would: exit 0; the script's own iteration lines with simulated times equal to the trace's
steps; every optimizer step taken (update_successful, finite grad norm, Adam's kernels in every
step); the parallelism's collectives; peak memory against a hand count of parameters, gradients
and optimizer state. 8-rank configurations (TP x PP x DP) are in benchmarks/frameworks/megatron.py.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest

from phantora.query import load
from phantora.query.summary import summarize
from phantora.trace.check import load_chrome_trace
from tests.frameworks.megatron_run import (GPTConfig, Run, activation_bytes, gpt_params, logged_peak_gib,
                                           run_megatron, static_bytes)

pytestmark = pytest.mark.slow

SMALL = GPTConfig()  # 2 layers, width 256, 4 heads, sequence 256, vocab 32000, micro-batch 2 x 4, 3 iterations
# Adam (torch.optim.AdamW, foreach: Megatron falls back to it without Apex/Transformer Engine)
# launches these once per parameter group per step; Megatron makes two groups (with and
# without weight decay).
ADAM_OPS = ("aten::_foreach_lerp_", "aten::_foreach_addcmul_", "aten::_foreach_addcdiv_")
ADAM_GROUPS = 2
MiB = 1 << 20


def trace_events(run: Run) -> list[dict]:
    return load_chrome_trace(run.trace)["traceEvents"]


def pid_of(rank: int) -> int:
    return rank + 1  # phantora's trace: one process per rank, pid = rank + 1


def nccl(events: list[dict], rank: int) -> list[dict]:
    return [e for e in events if e.get("ph") == "X" and e["pid"] == pid_of(rank)
            and e["name"].startswith("ncclDevKernel")]


def step_windows(events: list[dict], rank: int) -> list[tuple[float, float]]:
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                   if e.get("ph") == "X" and e["pid"] == pid_of(rank) and e["name"].startswith("ProfilerStep#"))
    return steps


def compute_kernels(events: list[dict], rank: int) -> list[dict]:
    return [e for e in events if e.get("ph") == "X" and e["pid"] == pid_of(rank) and e.get("cat") == "kernel"]


def check_run(run: Run, cfg: GPTConfig, world: int, adam_ops: tuple[str, ...] = ADAM_OPS) -> None:
    """What holds for every configuration. `adam_ops`: the ops the optimizer launches once per
    parameter group per step (torch's foreach AdamW by default)."""
    proc = run.proc
    detail = f"\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-5000:]}"
    assert proc.returncode == 0, f"exit {proc.returncode}{detail}"
    assert "unknown ops: none" in proc.stderr, detail

    # the script's own log: one line per iteration, every optimizer step taken
    its = run.iterations
    assert [i.n for i in its] == list(range(1, cfg.iters + 1)), detail
    for i in its:
        assert i.update_successful and i.skipped == 0, i
        assert math.isfinite(i.grad_norm) and i.grad_norm > 0, i
        assert math.isfinite(i.loss), i
        # time.time() and CUDA events read the same simulated clock
        assert i.event_ms == pytest.approx(i.elapsed_ms, abs=0.15), i

    events = trace_events(run)
    summary = summarize(load(run.trace))
    last = world - 1  # Megatron logs from the last rank
    steps = next(r for r in summary.steps.per_rank if r.rank == last).durations_ns
    assert len(steps) == cfg.iters
    # the logged iteration times are the trace's steps (the step markers run from one
    # optimizer.step to the next, so they also hold the logging between iterations: 3%)
    logged = sum(i.elapsed_ms for i in its[1:]) / (cfg.iters - 1)
    traced = sum(steps[1:]) / (cfg.iters - 1) / 1e6
    assert logged == pytest.approx(traced, rel=0.03), (logged, steps)
    # simulated, not this machine's time: a step here takes far longer in wall time
    assert run.wall_s / cfg.iters > 5 * traced / 1e3

    dp = world // (cfg.tp * cfg.pp)
    for rank in range(world):
        windows = step_windows(events, rank)
        assert len(windows) == cfg.iters
        # Adam's update is launched in every step on every rank (each rank steps its own shard)...
        launches = Counter()
        for e in events:
            if e.get("ph") == "X" and e["pid"] == pid_of(rank) and e.get("cat") == "cpu_op" and e["name"] in adam_ops:
                step = next(k for k, (a, b) in enumerate(windows) if a <= e["ts"] < b)
                launches[(step, e["name"])] += 1
        expected = Counter({(k, op): ADAM_GROUPS for k in range(cfg.iters) for op in adam_ops})
        assert launches == expected, (rank, launches)
        # ... and each launch ran its kernel on the GPU
        kernels = Counter(e["args"]["op"].split(".")[0] for e in compute_kernels(events, rank))
        for op in adam_ops:
            assert kernels[op] == ADAM_GROUPS * cfg.iters, (rank, op, kernels[op])

        # peak memory: at least parameters, gradients and optimizer state and the last stage's
        # bf16 logits; at most that plus Adam's temporary (sqrt of the second moment, fp32, this
        # rank's shard), every in-flight microbatch's activations (1F1B keeps up to pp), 64 MiB
        stage = rank // (world // cfg.pp)  # parallel_state's default order: tp fastest, then dp, pp
        peak = next(m.allocated_bytes for m in summary.memory if m.rank == rank)
        low = static_bytes(cfg, stage, dp)
        if stage == cfg.pp - 1:
            low += 2 * cfg.micro_batch * (cfg.seq // cfg.cp) * cfg.vocab // cfg.tp  # context parallel: its share
        high = (static_bytes(cfg, stage, dp) + 4 * math.ceil(gpt_params(cfg, stage) / dp)
                + min(cfg.pp, cfg.microbatches) * activation_bytes(cfg, stage) + 64 * MiB)
        assert low <= peak <= high, (rank, low / MiB, peak / MiB, high / MiB)
    # the script's own torch.cuda.max_memory_allocated() reads phantora's figure
    last_peak = next(m.allocated_bytes for m in summary.memory if m.rank == last)
    assert logged_peak_gib(proc.stdout) == pytest.approx(last_peak / 2**30, abs=0.001)


def test_single_gpu_with_megatron_lm_fused_kernels(tmp_path, frameworks_cuda_python):
    """Megatron-LM's defaults masked_softmax_fusion and gradient_accumulation_fusion, whose
    kernels are Apex's (scaled_upper_triang_masked_softmax_cuda, fused_weight_gradient_mlp_cuda;
    phantora's stand-ins, interpose/device/apex_kernels.py): causal attention's softmax is one
    fused kernel forward and one backward per layer and microbatch, with no torch softmax left;
    every linear layer's weight gradient is one GEMM accumulating into the fp32 main_grad."""
    cfg = GPTConfig(fused_kernels=True)
    run = run_megatron(tmp_path, frameworks_cuda_python, 1, cfg)
    check_run(run, cfg, world=1)
    assert f"number of parameters on (tensor, pipeline) model parallel rank (0, 0): {gpt_params(cfg, 0)}" \
        in run.proc.stdout
    kernels = compute_kernels(trace_events(run), 0)
    ops = Counter(k["args"]["op"].split(".")[0] for k in kernels)
    per_layer = cfg.layers * cfg.microbatches * cfg.iters
    assert ops["apex::scaled_upper_triang_masked_softmax_forward"] == per_layer, ops
    assert ops["apex::scaled_upper_triang_masked_softmax_backward_"] == per_layer, ops
    assert not any("softmax" in op for op in ops if op.startswith("aten::")), ops
    # QKV, projection, FC1, FC2 per layer and the output layer, once per microbatch
    assert ops["apex::wgrad_gemm_accum"] == (4 * cfg.layers + 1) * cfg.microbatches * cfg.iters, ops
    wgrad = [k for k in kernels if k["args"]["op"].startswith("apex::wgrad_gemm_accum")]
    assert {k["name"] for k in wgrad} == {"sm90_xmma_gemm_bf16bf16_f32f32"}


def test_data_parallel_overlaps_reduce_scatter_with_backward_and_all_gather_with_forward(
        tmp_path, frameworks_cuda_python):
    # 1M-parameter buckets (Megatron's --ddp-bucket-size) so that the 18M-parameter model has
    # several: the output layer, the transformer layers, the embeddings
    cfg = GPTConfig(bucket_size=1_000_000)
    run = run_megatron(tmp_path, frameworks_cuda_python, 2, cfg)
    check_run(run, cfg, world=2)
    p = gpt_params(cfg, 0)
    events = trace_events(run)
    for rank in range(2):
        ks = [k for k in nccl(events, rank) if k["args"]["group ranks"] == [0, 1]]
        rs = [k for k in ks if k["args"]["op"] == "reduce_scatter"]
        ag = [k for k in ks if k["args"]["op"] == "all_gather" and "bf16" in k["name"]]
        # distributed optimizer: fp32 gradients reduce-scattered, bf16 parameters all-gathered,
        # each bucket once per step, together the whole model (buckets padded to a multiple of dp)
        assert len(rs) == len(ag) == 3 * cfg.iters, (len(rs), len(ag))
        assert 4 * p * cfg.iters <= sum(k["args"]["bytes"] for k in rs) <= 4 * p * cfg.iters * 1.01
        assert 2 * p * cfg.iters <= sum(k["args"]["bytes"] for k in ag) <= 2 * p * cfg.iters * 1.01
        # overlap: after the first iteration, compute kernels run between a step's first and
        # last bucket reduce-scatter (backward still running) and between its first and last
        # parameter all-gather (forward already running)
        compute = [k["ts"] for k in compute_kernels(events, rank)]
        for kind in (rs, ag):
            for step in range(1, cfg.iters):
                starts = sorted(k["ts"] for k in kind)[3 * step:3 * step + 3]
                between = [t for t in compute if starts[0] < t < starts[-1]]
                assert len(between) > 10, (rank, kind[0]["args"]["op"], step, starts)


def test_tensor_parallel(tmp_path, frameworks_cuda_python):
    cfg = GPTConfig(tp=2)
    run = run_megatron(tmp_path, frameworks_cuda_python, 2, cfg)
    check_run(run, cfg, world=2)
    for r in range(2):
        assert f"model parallel rank ({r}, 0): {gpt_params(cfg, 0)}" in run.proc.stdout
    events = trace_events(run)
    activation = cfg.micro_batch * cfg.seq * cfg.hidden * 2  # bf16 hidden states of one microbatch
    for rank in range(2):
        counts = Counter((k["args"]["op"], k["args"]["bytes"], k["args"]["dtype"]) for k in nccl(events, rank))
        # per microbatch: forward all-reduces after the vocab-parallel embedding and after each
        # layer's row-parallel projection and FC2; backward all-reduces the input gradient of
        # each layer's column-parallel QKV and FC1 and of the output layer
        assert counts[("all_reduce", activation, "bfloat16")] == cfg.iters * cfg.microbatches * (4 * cfg.layers + 2), \
            counts


def run_two_stages(tmp_path, python: str, cfg: GPTConfig) -> tuple[list[dict], int]:
    """A 2-stage pipeline run, checked as every run is and each stage's parameter count against a
    hand count; its trace events and the bytes of one microbatch's bf16 activation."""
    run = run_megatron(tmp_path, python, 2, cfg)
    check_run(run, cfg, world=2)
    for stage in range(2):
        assert f"model parallel rank (0, {stage}): {gpt_params(cfg, stage)}" in run.proc.stdout
    return trace_events(run), cfg.micro_batch * cfg.seq * cfg.hidden * 2


def test_pipeline_parallel_1f1b(tmp_path, frameworks_cuda_python):
    cfg = GPTConfig(pp=2)
    events, activation = run_two_stages(tmp_path, frameworks_cuda_python, cfg)
    for rank in range(2):
        ops = Counter(k["args"]["op"] for k in nccl(events, rank) if k["args"]["bytes"] == activation)
        # every microbatch's activation goes forward and its gradient back, once per step
        assert ops["send"] == ops["recv"] == cfg.microbatches * cfg.iters, (rank, ops)
    # 1F1B, not GPipe: in every step the first stage receives the gradient of its first
    # microbatch before it sends the activation of its last one
    p2p = sorted((k["ts"], k["args"]["op"]) for k in nccl(events, 0) if k["args"]["bytes"] == activation)
    n_p2p = 2 * cfg.microbatches
    for step in range(cfg.iters):
        ops = [op for _, op in p2p[step * n_p2p:(step + 1) * n_p2p]]
        assert ops.index("recv") < len(ops) - 1 - ops[::-1].index("send"), (step, ops)


def test_pipeline_parallel_interleaved(tmp_path, frameworks_cuda_python):
    # 4 layers in 4 chunks: rank 0 holds layers 0 and 2, rank 1 layers 1 and 3
    cfg = GPTConfig(pp=2, vp=2, layers=4)
    events, activation = run_two_stages(tmp_path, frameworks_cuda_python, cfg)
    for rank in range(2):
        ops = Counter(k["args"]["op"] for k in nccl(events, rank) if k["args"]["bytes"] == activation)
        # each microbatch crosses the 3 chunk boundaries (0-1, 1-2, 2-3), forward and backward:
        # every rank sends and receives 3 per microbatch per step
        assert ops["send"] == ops["recv"] == 3 * cfg.microbatches * cfg.iters, (rank, ops)


def check_moe_run(run: Run, cfg: GPTConfig) -> None:
    """What every MoE run is checked for (check_run's step windows do not fit it: the experts'
    optimizer is a second one): exit 0, no unknown op, every iteration stepped, and each layer's
    routing (the router's and the auxiliary loss's top-k) balanced over both ranks' tokens."""
    proc = run.proc
    detail = f"\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-5000:]}"
    assert proc.returncode == 0 and "unknown ops: none" in proc.stderr, detail
    assert [i.n for i in run.iterations] == list(range(1, cfg.iters + 1)), detail
    for i in run.iterations:
        assert i.update_successful and math.isfinite(i.grad_norm) and i.grad_norm > 0 and math.isfinite(i.loss), i
    routers = [line for line in proc.stderr.splitlines() if "TopKRouter" in line]
    assert len(routers) == 2 * cfg.layers, detail  # per layer: routing and the aux loss's top-k
    tokens = 2 * cfg.micro_batch * cfg.seq  # two ranks' micro-batches
    assert all(f"{cfg.experts} experts, top-{cfg.topk}, {tokens:,} tokens over 2 rank(s), max/mean 1.00" in r
               for r in routers), routers


def test_moe_expert_parallel(tmp_path, frameworks_cuda_python):
    """MoE layers (4 experts, top-2, SequentialMLP on the local spec, the alltoall token
    dispatcher) with expert parallel 2: Megatron reads the split sizes on the host (.numpy() of
    the gathered counts) and exchanges tokens with all_to_all of those sizes. Every iteration
    steps; each layer routes balanced (its router's top-k and the auxiliary loss's); every
    token dispatch moves the hand-counted rows: micro-batch 2 x 256 tokens x top-2 = 1,024 rows
    of 256 bf16, half to the experts of each rank."""
    cfg = GPTConfig(experts=4, topk=2, ep=2)
    run = run_megatron(tmp_path, frameworks_cuda_python, 2, cfg)
    check_moe_run(run, cfg)
    half = cfg.micro_batch * cfg.seq * cfg.topk // 2 * cfg.hidden * 2
    events = trace_events(run)
    for rank in (0, 1):
        splits = [e["args"].get("bytes sent to each member") for e in nccl(events, rank)
                  if e["args"]["op"] == "all_to_all"]
        # forward dispatch and combine, and both again in backward, per layer and microbatch
        assert splits.count([half, half]) == 4 * cfg.layers * cfg.microbatches * cfg.iters, (rank, splits[:8])
