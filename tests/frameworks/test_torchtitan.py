"""TorchTitan 0.3.0 (torch 2.14, CUDA build) runs unmodified under phantora: its own entry point
(`torchrun ... -m torchtitan.train --module llama3 --config llama3_debugmodel`, as run_train.sh),
its own step log lines printing simulated figures that agree with the trace.

The wheel ships no tokenizer or dataset; tests/frameworks/torchtitan/assets.py generates
stand-ins (a BPE tokenizer trained with `tokenizers`, a synthetic c4_test JSON file) in each
run's working directory. The larger configurations (8 ranks, TP, PP, Llama 3 8B) are in
benchmarks/frameworks/torchtitan.py.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from phantora.trace.check import load_chrome_trace
from tests.frameworks.torchtitan.run import GiB, Run, StepLine, optimizer_kernel_ends_us, peak_memory, torchtitan

STEPS = 4
# llama3_debugmodel (torchtitan/models/llama3/__init__.py _debugmodel), counted by hand: dim 256,
# 6 layers, 16 heads (no GQA: fused wqkv is 256 x 768), FFN hidden 768 (2/3 * 4 * 256 rounded up
# to a multiple of 256), vocabulary 2048, untied embedding and output.
DIM, LAYERS, VOCAB, FFN = 256, 6, 2048, 768
PARAMS = LAYERS * (DIM * 3 * DIM + DIM * DIM + 3 * DIM * FFN + 2 * DIM) + 2 * VOCAB * DIM + DIM
BATCH, SEQ = 8, 2048  # the config's local batch and sequence length
TOKENS = BATCH * SEQ


def _assert_trained(run: Run, ranks: int, non_dp: int = 1) -> list[StepLine]:
    """What a user checks in TorchTitan's output and the trace: every step logged on every rank,
    finite figures, the optimizer's kernels in every step, and the logged throughput equal to
    the step period the trace shows."""
    assert run.proc.returncode == 0, f"exit {run.proc.returncode}{run.detail()}"
    assert "unknown ops: none" in run.output, run.detail()
    lines = run.steps()
    assert sorted(s.step for s in lines) == sorted(list(range(1, STEPS + 1)) * ranks), run.detail()
    for s in lines:
        # placeholders must not steer the run: the gradient norm TorchTitan clips by is finite and
        # positive, so clipping and the optimizer step happen as on a healthy GPU run
        assert 0 < s.grad_norm < math.inf and math.isfinite(s.loss)
        # step 1's interval starts before the first GPU work (real host time loading the data)
        assert s.tps > 0 and (0 < s.mfu < 100 or s.step == 1) and s.memory_gib > 0
    steps = {s.step: s for s in lines}
    events = load_chrome_trace(run.trace)["traceEvents"]
    for rank in range(ranks):
        ends = optimizer_kernel_ends_us(run.trace, rank)
        assert len(ends) == STEPS, f"rank {rank}: {len(ends)} fused AdamW kernels for {STEPS} steps"
        # its optimizer steps (an OptimizersContainer) are the trace's training steps
        marked = [e["name"] for e in events if e.get("ph") == "X" and e["pid"] == rank + 1 and e["tid"] == 2]
        assert marked == [f"ProfilerStep#{k}" for k in range(STEPS)], (rank, marked)
        # TorchTitan's tps is tokens / (time between two log lines * non-data-parallel degree);
        # from step 3 on (after warm-up and CUDA-graph capture) every step is the same, so the step
        # period it implies equals the distance between two optimizer kernels in the trace
        for k in range(3, STEPS + 1):
            logged_ms = TOKENS / (steps[k].tps * non_dp) * 1e3
            traced_ms = (ends[k - 1] - ends[k - 2]) / 1e3
            assert logged_ms == pytest.approx(traced_ms, rel=0.01), (rank, k, logged_ms, traced_ms)
    return lines


def _assert_memory(run: Run, lines: list[StepLine], dp: int) -> None:
    """TorchTitan's `memory:` (max reserved, from torch.cuda.memory_stats) is the trace's peak, and
    the peak is plausible against a hand count."""
    # TorchTitan resets the peak after each log line, so the run's peak is the largest it logged;
    # every rank of these configurations holds the same, so one figure covers them all
    logged = max(s.memory_gib for s in lines)
    for rank, allocated, reserved in peak_memory(run.trace):
        assert logged == pytest.approx(reserved / GiB, abs=0.006), (rank, logged, reserved / GiB)
        # fp32 parameters, gradients and AdamW's two moments, sharded over dp ranks (FSDP2) ...
        state = 16 * PARAMS / dp
        # ... plus at most: every block's bf16 parameters and gradients unsharded at once, all
        # layers' activations without any checkpointing (34 bytes per token and hidden unit for a
        # bf16 transformer layer, Korthikanti et al. 2022) and fp32 logits with their gradient
        bound = state + 4 * PARAMS + LAYERS * 34 * TOKENS * DIM + 8 * TOKENS * VOCAB
        assert state < allocated < bound, (rank, allocated, state, bound)


def test_debug_model_one_gpu_default_config(tmp_path: Path, frameworks_cuda_python: str) -> None:
    """llama3_debugmodel as shipped: selective activation checkpointing, FSDP2 wrapping on one rank,
    and CUDA graphs (on by default in 0.3.0: the forward+backward step is captured at step 2 and
    replayed from then on)."""
    run = torchtitan(tmp_path, frameworks_cuda_python, 1, "--training.steps", str(STEPS))
    lines = _assert_trained(run, ranks=1)
    assert "Recorded CUDA graph" in run.output
    events = load_chrome_trace(run.trace)["traceEvents"]
    launches = [e for e in events if e.get("ph") == "X" and e["name"] == "cudaGraphLaunch"]
    assert len(launches) >= STEPS - 2, "steps 3.. replay the captured forward+backward"
    _assert_memory(run, lines, dp=1)


def test_debug_model_fsdp_two_gpus(tmp_path: Path, frameworks_cuda_python: str) -> None:
    """FSDP2 over 2 GPUs (TorchTitan shards over every rank by default) with CUDA graphs at their
    default: step 1 runs eagerly, step 2 captures the forward+backward, FSDP's all-gathers and
    reduce-scatters included, and replays it; steps 3.. replay it. Each replay runs the captured
    collectives again, matched across the ranks (phantora/engine/graphs.py)."""
    run = torchtitan(tmp_path, frameworks_cuda_python, 2, "--training.steps", str(STEPS))
    lines = _assert_trained(run, ranks=2)
    assert "dp_shard=2" in run.output and "Recorded CUDA graph" in run.output
    events = load_chrome_trace(run.trace)["traceEvents"]
    replays = STEPS - 1
    for pid in (1, 2):
        nccl = [e for e in events if e.get("ph") == "X" and e.get("pid") == pid and e["name"].startswith("ncclDevKernel")]
        replayed = [e for e in nccl if "of CUDA graph" in e["args"]["call site"]]
        eager = [e for e in nccl if e not in replayed]
        assert len([e for e in events if e.get("pid") == pid and e.get("name") == "cudaGraphLaunch"]) == replays
        # each step gathers every FSDP unit's parameters and reduce-scatters its gradients: step 1
        # eagerly, steps 2.. from the graph, the same reduce-scatters in each
        rs = [e for e in eager if e["args"]["op"] == "reduce_scatter"]
        assert len(rs) >= LAYERS + 1, eager
        ops = [e["args"]["op"] for e in replayed]
        assert ops.count("reduce_scatter") == replays * len(rs), ops
        assert ops.count("all_gather") >= replays * (LAYERS + 1) and ops.count("all_gather") % replays == 0, ops
        # every replayed collective ran within its step: before that step's optimizer kernel
        ends = optimizer_kernel_ends_us(run.trace, pid - 1)
        per_replay = len(replayed) // replays
        for k, e in enumerate(sorted(replayed, key=lambda e: e["ts"])):
            step = 2 + k // per_replay
            assert ends[step - 2] < e["ts"] and e["ts"] + e["dur"] <= ends[step - 1], (k, e)
    _assert_memory(run, lines, dp=2)


# --- Mixture-of-Experts with expert parallelism (docs/moe.md) --------------------------------------
# deepseek_v3_debugmodel (torchtitan/models/deepseek_v3/__init__.py _debugmodel): dim 256, 6 layers of
# which 5 are MoE, 8 routed experts, top-3; local batch 8 x 2048 = 16,384 tokens per rank (TOKENS).
# qwen3_moe_debug (models/qwen3 debugmodel_moe): dim 256, 64 experts, top-8; batch 4 x 4096 tokens.
MOE = {"deepseek_v3": ("deepseek_v3_debugmodel", 5, 8, 3), "qwen3": ("qwen3_moe_debug", 8, 64, 8)}
EP_DIM = 256


def _a2a_sends(trace: Path, rank: int) -> list[list[int]]:
    """Bytes each all_to_all of `rank` sends to each member, in call order."""
    events = load_chrome_trace(trace)["traceEvents"]
    mine = [e for e in events if e.get("ph") == "X" and e.get("pid") == rank + 1
            and e.get("args", {}).get("op") == "all_to_all" and "bytes sent to each member" in e["args"]]
    return [e["args"]["bytes sent to each member"] for e in sorted(mine, key=lambda e: e["ts"])]


@pytest.mark.parametrize("module", sorted(MOE))
def test_moe_expert_parallel_two_gpus(tmp_path: Path, frameworks_cuda_python: str, module: str) -> None:
    """DeepSeek-V3 and Qwen3-MoE debug models with expert parallel 2 over FSDP 2 (the experts
    split over the two ranks), TorchTitan's all-to-all token dispatcher, eager (TorchTitan asks for
    --training.disable_cuda_graphs with this dispatcher, which reads split sizes on the host):
    every step trains on every rank, each MoE layer routes balanced by default, and the
    dispatch all_to_all moves the hand-counted rows."""
    config, moe_layers, experts, top_k = MOE[module]
    run = torchtitan(tmp_path, frameworks_cuda_python, 2, "--training.steps", str(STEPS),
                     "--parallelism.expert_parallel_degree", "2", "--training.disable_cuda_graphs",
                     module=module, config=config)
    _assert_trained(run, ranks=2)
    routed = re.findall(r"L(\d+) TokenChoiceTopKRouter \(moe\.py:\d+\): (\d+) experts, top-(\d+), ([\d,]+) tokens over 2 "
                        r"rank\(s\), max/mean ([\d.]+)", run.output)
    assert [int(r[0]) for r in routed] == list(range(moe_layers)), run.detail()
    assert all((int(e), int(k), int(t.replace(",", "")), float(m)) == (experts, top_k, 2 * TOKENS, 1.0)
               for _, e, k, t, m in routed), routed
    # each rank routes TOKENS x top_k rows, half to the experts of each rank: rows of dim bf16
    half = TOKENS * top_k // 2 * EP_DIM * 2
    for rank in (0, 1):
        sends = _a2a_sends(run.trace, rank)
        assert sends.count([half, half]) >= 2 * moe_layers * STEPS, (rank, sends[:12])  # dispatch + combine


def test_moe_skewed_routing_makes_expert_parallel_ranks_uneven(tmp_path: Path, frameworks_cuda_python: str) -> None:
    """--routing zipf:1.5: the experts of one rank get more tokens; both ranks send the same split
    (routing does not depend on the rank), so one rank receives more rows than it sends."""
    config, moe_layers, experts, top_k = MOE["deepseek_v3"]
    run = torchtitan(tmp_path, frameworks_cuda_python, 2, "--training.steps", "2",
                     "--parallelism.expert_parallel_degree", "2", "--training.disable_cuda_graphs",
                     module="deepseek_v3", config=config, phantora_options=("--routing", "zipf:1.5"))
    assert run.proc.returncode == 0, run.detail()
    ratios = [float(m) for m in re.findall(r"L\d TokenChoiceTopKRouter .* max/mean ([\d.]+)", run.output)]
    assert len(ratios) == moe_layers and all(r > 1.5 for r in ratios), ratios
    total = TOKENS * top_k * EP_DIM * 2
    dispatch = [s for s in _a2a_sends(run.trace, 0) if sum(s) == total]
    assert dispatch == [s for s in _a2a_sends(run.trace, 1) if sum(s) == total], "ranks route alike"
    assert len(dispatch) >= moe_layers and all(a != b for a, b in dispatch), dispatch[:5]
