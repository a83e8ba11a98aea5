"""Hugging Face Transformers' Trainer and Accelerate run unmodified under `phantora trace`,
launched as their docs tell a GPU user (python, torchrun, `accelerate launch`), and what they
print is simulated and agrees with the trace.

The training scripts in tests/frameworks/huggingface/ are stand-ins for a user's script (the
Hub's run_clm.py cannot download a model or a data set here): models are built with
`from_config` and the data are synthetic token ids. The larger configurations (8 ranks, FSDP1,
Accelerate on 1 GPU) are in benchmarks/frameworks/huggingface.py.

What each test checks, as a user would:
- exit 0 and no error printed, also at interpreter exit;
- the framework's own log lines: one per step with a finite loss and a finite, positive
  gradient norm (the placeholder values steer nothing: no step is skipped);
- Trainer's `train_runtime` / `train_samples_per_second` are simulated: they agree with the
  trace's step times, not with the wall clock; Accelerate loop step times equal the trace's;
- the optimizer's kernels run in every step of every rank (torch's fused AdamW);
- peak memory is what torch.cuda.max_memory_allocated() printed, and lies between a hand count
  of parameters, gradients and Adam state and that plus a bound on activations;
- Accelerate's shuffled loader: the ranks' orders together are one permutation of the data set
  (the ranks agreed on the sampler's seed, which Accelerate broadcasts from rank 0).
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from phantora.query import load
from phantora.query.summary import TraceSummary, summarize

ROOT = Path(__file__).resolve().parents[2]
HF = Path(__file__).resolve().parent / "huggingface"
BIN = Path(sys.executable).parent
GIB = 1 << 30


# --- hand counts (from the configs in the scripts, not from the code under test) ------------------
def gpt2_params(layers: int, hidden: int = 768, vocab: int = 50257, positions: int = 1024) -> int:
    """wte + wpe + per block (2 LayerNorms, c_attn, attn c_proj, c_fc, mlp c_proj) + ln_f; the LM
    head is tied to wte."""
    h = hidden
    return vocab * h + positions * h + layers * (12 * h * h + 13 * h) + 2 * h


def llama_params(layers: int, hidden: int, inter: int, kv_heads: int, heads: int, vocab: int = 32000) -> int:
    """embeddings + untied LM head + per layer (q, k, v, o without bias, gate/up/down, 2 RMSNorms)
    + final norm."""
    kv = hidden // heads * kv_heads
    return 2 * vocab * hidden + layers * (2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inter + 2 * hidden) + hidden


# fp32 parameter, fp32 gradient, Adam's exp_avg and exp_avg_sq (bf16 autocast keeps fp32 masters)
STATE_BYTES_PER_PARAM = 16
ADAM_BYTES_PER_PARAM = 28  # one AdamW update: 3 fp32 tensors read and written, the fp32 gradient read


def activation_bound(batch: int, seq: int, hidden: int, vocab: int, layers: int) -> int:
    """A generous bound on activations and temporaries: the LM head's logits in bf16 and fp32,
    their log-softmax and its gradient (at most 8 fp32 copies of batch x seq x vocab), plus 64
    bf16 values per token and hidden unit per layer (Korthikanti et al. count 34 without
    recomputation)."""
    return 8 * 4 * batch * seq * vocab + layers * 64 * 2 * batch * seq * hidden


# --- running --------------------------------------------------------------------------------------
@dataclass
class Run:
    proc: subprocess.CompletedProcess
    trace: Path
    summary: TraceSummary
    ranks: int

    @property
    def out(self) -> str:
        return self.proc.stdout + self.proc.stderr


def trace(tmp_path: Path, command: list[str], ranks: int, env: dict[str, str] | None = None,
          timeout: float = 600) -> Run:
    out = tmp_path / "run.json"
    # phantora from this checkout (the run's working directory is tmp_path, for the scripts' outputs)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    full_env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=path, **(env or {}))
    proc = subprocess.run([sys.executable, "-m", "phantora.cli", "trace", "-o", str(out), "--", *command],
                          cwd=tmp_path, capture_output=True, text=True, timeout=timeout, env=full_env)
    detail = f"\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-6000:]}"
    assert proc.returncode == 0, f"exit {proc.returncode}{detail}"
    for bad in ("Traceback", "Exception ignored", "Error:"):
        assert bad not in proc.stdout + proc.stderr, f"{bad!r} printed{detail}"
    with load(out, engine="builtin") as db:
        summary = summarize(db)
    return Run(proc, out, summary, ranks)


def torchrun(ranks: int) -> list[str]:
    return [str(BIN / "torchrun"), "--nproc-per-node", str(ranks)]


def accelerate_launch(*args: str) -> list[str]:
    return [str(BIN / "accelerate"), "launch", *args]


# --- reading the trace ----------------------------------------------------------------------------
def step_durations(run: Run) -> dict[int, list[float]]:
    """rank -> its step times in seconds, from the trace's step markers (optimizer.step)."""
    assert run.summary.steps.source == "step markers", run.summary.steps
    return {r.rank: [d / 1e9 for d in r.durations_ns] for r in run.summary.steps.per_rank}


def optimizer_kernels_per_step(run: Run) -> dict[int, list[tuple[int, float]]]:
    """rank -> (the number of fused AdamW kernels its host launched inside each step, the bytes
    they move)."""
    with load(run.trace, engine="builtin") as db:
        names = dict(db.query("SELECT upid, name FROM process WHERE name LIKE 'rank %'").rows)
        rank_of = {upid: int(re.match(r"rank (\d+)", n).group(1)) for upid, n in names.items()}
        steps = db.query("SELECT th.upid, s.ts, s.dur FROM slice s JOIN thread_track tt ON s.track_id = tt.id "
                         "JOIN thread th ON th.utid = tt.utid WHERE th.name = 'steps (optimizer.step)' "
                         "ORDER BY th.upid, s.ts").rows
        launches = db.query("SELECT th.upid, h.ts, EXTRACT_ARG(k.arg_set_id, 'args.bytes') FROM slice k "
                            "JOIN flow f ON f.slice_in = k.id "
                            "JOIN slice h ON h.id = f.slice_out JOIN thread_track tt ON h.track_id = tt.id "
                            "JOIN thread th ON th.utid = tt.utid WHERE k.category = 'kernel' "
                            "AND EXTRACT_ARG(k.arg_set_id, 'args.op') LIKE 'aten::_fused_adamw_%'").rows
    counts: dict[int, list[tuple[int, float]]] = {}
    for upid, ts, dur in steps:
        mine = [float(b) for u, t, b in launches if u == upid and ts <= t < ts + dur]
        counts.setdefault(rank_of[upid], []).append((len(mine), sum(mine)))
    return counts


def peak_allocated(run: Run) -> dict[int, float]:
    return {m.rank: m.allocated_bytes for m in run.summary.memory if m.allocated_bytes is not None}


# --- reading the framework's log ------------------------------------------------------------------
def trainer_logs(text: str) -> list[dict[str, float]]:
    """The dicts Trainer prints through its progress bar: one per logging step, then the
    final metrics (values printed as strings)."""
    logs = []
    for m in re.finditer(r"\{'(?:loss|train_runtime)'[^{}]*\}", text):
        logs.append({k: float(v) for k, v in ast.literal_eval(m.group(0)).items()})
    return logs


def check_common(run: Run, steps: int, params: int, shards: int, activations: int) -> None:
    # The optimizer steps on every rank in every step: fused AdamW kernels in each step's slice,
    # over every parameter of the rank's shard once: AdamW reads and writes the fp32 parameter,
    # exp_avg and exp_avg_sq and reads the fp32 gradient, 28 bytes per parameter. (With every
    # FakeTensor's data_ptr() 0, Accelerate's FSDP2 prepare once handed the optimizer one
    # parameter N times: the kernels ran, over the wrong tensors.)
    kernels = optimizer_kernels_per_step(run)
    assert sorted(kernels) == list(range(run.ranks)), kernels
    for rank, per_step in kernels.items():
        assert len(per_step) == steps and min(n for n, _ in per_step) >= 1 and len(set(per_step)) == 1, (rank, per_step)
        assert per_step[0][1] == pytest.approx(ADAM_BYTES_PER_PARAM * params / shards, rel=0.01), (rank, per_step)
    # peak memory: what the script read from torch, and plausible against a hand count
    printed = [int(m) for m in re.findall(r"max_memory_allocated (\d+)", run.proc.stdout)]
    assert len(printed) == run.ranks, run.proc.stdout[-2000:]
    peaks = peak_allocated(run)
    state = STATE_BYTES_PER_PARAM * params / shards
    for rank, peak in peaks.items():
        assert any(abs(peak - p) < 1 << 20 for p in printed), (rank, peak, printed)
        assert state < peak < state + activations, (rank, peak / GIB, state / GIB, activations / GIB)


def check_trainer(run: Run, steps: int, batch: int, params: int, shards: int, activations: int) -> None:
    logs = trainer_logs(run.out)
    step_logs = [log for log in logs if "loss" in log]
    final = [log for log in logs if "train_runtime" in log]
    assert len(step_logs) == steps, logs  # rank 0 logs, every step (logging_steps=1)
    for log in step_logs:
        assert math.isfinite(log["loss"]) and 0 < log["grad_norm"] < math.inf, log
    assert final, run.out[-3000:]
    metrics = json.loads(re.search(r"train_result (\{[^{}]*\})", run.proc.stdout).group(1))
    runtime, samples_per_s = metrics["train_runtime"], metrics["train_samples_per_second"]
    assert final[0]["train_runtime"] == pytest.approx(runtime, abs=1e-4)
    # Trainer times train() from before its first step to after the last step's loss was read
    # (a sync): the later steps' simulated times, plus the first step's work after setup, plus
    # the last step's tail. So it lies between the later steps and all of them plus one step.
    durations = step_durations(run)
    for rank, d in durations.items():
        assert len(d) == steps, (rank, d)
        later, one = sum(d[1:]), min(d[1:])
        assert later + 0.5 * one < runtime < sum(d) + one, (rank, runtime, d)
    # samples/s is the samples of all ranks over that simulated runtime
    assert samples_per_s == pytest.approx(steps * batch * run.ranks / runtime, rel=2e-3)
    check_common(run, steps, params, shards, activations)


# --- Trainer --------------------------------------------------------------------------------------
TRAINER = str(HF / "train_trainer.py")
GPT2_LAYERS, LLAMA = 2, dict(layers=2, hidden=1024, inter=2816, kv_heads=4, heads=16)


def test_trainer_gpt2_one_gpu(tmp_path: Path) -> None:
    """`CUDA_VISIBLE_DEVICES=0 python train.py`: Trainer on one GPU, bf16 autocast."""
    run = trace(tmp_path, [sys.executable, TRAINER, "--model", "gpt2", "--steps", "3"], 1,
                env={"CUDA_VISIBLE_DEVICES": "0"})
    check_trainer(run, 3, 4, gpt2_params(GPT2_LAYERS), 1, activation_bound(4, 512, 768, 50257, GPT2_LAYERS))


def test_trainer_llama_gradient_checkpointing_cuda_build(tmp_path: Path, frameworks_cuda_python: str) -> None:
    """The same on the CUDA build of torch (no GPU, no driver): a Llama with gradient
    checkpointing on one GPU."""
    run = trace(tmp_path, [frameworks_cuda_python, TRAINER, "--model", "llama", "--steps", "3",
                           "--gradient-checkpointing"], 1, env={"CUDA_VISIBLE_DEVICES": "0"})
    n = llama_params(**LLAMA)
    check_trainer(run, 3, 4, n, 1, activation_bound(4, 512, 1024, 32000, LLAMA["layers"]))
    with load(run.trace, engine="builtin") as db:
        recomputed = db.query("SELECT COUNT(*) FROM slice WHERE name = 'python: checkpoint'").scalar()
    assert recomputed, "no checkpointed forward in the trace"


def test_trainer_gpt2_ddp(tmp_path: Path) -> None:
    """torchrun, 2 ranks: Trainer wraps the model in DDP with its default
    find_unused_parameters (True without gradient checkpointing)."""
    run = trace(tmp_path, [*torchrun(2), TRAINER, "--model", "gpt2", "--steps", "3"], 2)
    check_trainer(run, 3, 4, gpt2_params(GPT2_LAYERS), 1, activation_bound(4, 512, 768, 50257, GPT2_LAYERS)
                  + 4 * gpt2_params(GPT2_LAYERS))  # DDP's fp32 gradient buckets
    nccl = [k.name for k in run.summary.top_kernels if k.name.startswith("ncclDevKernel_AllReduce")]
    assert nccl, [k.name for k in run.summary.top_kernels]


def test_trainer_llama_fsdp2_gradient_checkpointing(tmp_path: Path) -> None:
    """torchrun, 2 ranks: Trainer's `fsdp="full_shard auto_wrap"` with FSDP2 (its default
    version) per decoder layer, and gradient checkpointing."""
    run = trace(tmp_path, [*torchrun(2), TRAINER, "--model", "llama", "--steps", "3", "--gradient-checkpointing",
                           "--fsdp", "full_shard auto_wrap", "--fsdp-version", "2"], 2)
    n = llama_params(**LLAMA)
    check_trainer(run, 3, 4, n, 2, activation_bound(4, 512, 1024, 32000, LLAMA["layers"]) + 2 * n)
    with load(run.trace, engine="builtin") as db:
        gathers = db.query("SELECT COUNT(*) FROM slice WHERE name LIKE 'ncclDevKernel_AllGather%'").scalar()
        recomputed = db.query("SELECT COUNT(*) FROM slice WHERE name = 'python: checkpoint'").scalar()
    assert gathers and recomputed, (gathers, recomputed)


# --- Accelerate -----------------------------------------------------------------------------------
ACCELERATE = str(HF / "train_accelerate.py")


def seeded_order(samples: int, seed: int) -> list[int]:
    """The order a DataLoader(shuffle=True, generator=torch.Generator().manual_seed(seed)) gives
    on a GPU, computed here on real tensors: the loader's iterator draws its base seed from the
    generator, then the RandomSampler draws one permutation from it."""
    import torch

    g = torch.Generator().manual_seed(seed)
    torch.empty((), dtype=torch.int64).random_(generator=g)
    return torch.randperm(samples, generator=g).tolist()


def check_accelerate(run: Run, samples: int, batch: int, shards: int, seed: int | None = None) -> None:
    lines = re.findall(r"rank (\d+) step (\d+): loss (\S+) grad_norm (\S+) time (\S+) ms", run.proc.stdout)
    steps = samples // (batch * run.ranks)
    assert len(lines) == steps * run.ranks, run.proc.stdout[-3000:]
    durations = step_durations(run)
    for rank, step, loss, norm, ms in lines:
        assert math.isfinite(float(loss)) and 0 < float(norm) < math.inf
        # The loop's clock reads simulated time: its step (from one loss.item() to the next) is
        # the trace's (from one optimizer.step to the next) but for the host work between the
        # two points, which the first steps' warm-up shifts; steady steps agree within 2%.
        if int(step) > 2:
            assert float(ms) == pytest.approx(durations[int(rank)][int(step) - 1] * 1e3, rel=0.02), (rank, step, ms)
    # the shuffled loader: each rank's order, together one permutation of the data set. torchrun
    # runs workers as `python -u`, so print's text and its newline are two writes and another
    # rank's line can land between them, as on a GPU: a list ends at its own bracket.
    orders = {int(r): json.loads(o) for r, o in re.findall(r"rank (\d+) order (\[[^\]]*\])", run.proc.stdout)}
    assert sorted(orders) == list(range(run.ranks)), orders
    assert sorted(i for o in orders.values() for i in o) == list(range(samples)), orders
    assert all(len(o) == samples // run.ranks for o in orders.values()), orders
    if seed is not None:  # batches of the one order go to the ranks in turn (BatchSamplerShard)
        expected = seeded_order(samples, seed)
        for rank, order in orders.items():
            mine = [i for b in range(rank * batch, samples, batch * run.ranks) for i in expected[b:b + batch]]
            assert order == mine, (rank, order, mine)
    n = llama_params(2, 1024, 2816, 4, 16)
    check_common(run, steps, n, shards, activation_bound(batch, 512, 1024, 32000, 2) + 4 * n)


def test_accelerate_launch_ddp(tmp_path: Path) -> None:
    """`accelerate launch --multi_gpu --num_processes 2`: an Accelerator loop (prepare,
    backward, clip, step) with a shuffled DataLoader, DDP; the loader's generator is seeded, so
    each rank's order is the one a GPU run gives."""
    run = trace(tmp_path, [*accelerate_launch("--multi_gpu", "--num_processes", "2", "--mixed_precision", "bf16"),
                           ACCELERATE, "--samples", "24", "--data-seed", "1234"], 2)
    check_accelerate(run, 24, 4, 1, seed=1234)


def test_accelerate_launch_fsdp2(tmp_path: Path) -> None:
    """`accelerate launch --config_file fsdp2.yaml`: the same loop with FSDP2 per decoder layer,
    from a config file as Accelerate's FSDP guide shows."""
    run = trace(tmp_path, [*accelerate_launch("--config_file", str(HF / "fsdp2.yaml")), ACCELERATE, "--samples", "24"], 2)
    check_accelerate(run, 24, 4, 2)


# --- Mixture-of-Experts models (docs/moe.md) --------------------------------------------------------
# The configs of train_trainer.py: Mixtral's shape (8 experts, top-2) and Qwen3-MoE's (64 small
# experts, top-8), 2 layers each, width 1024, 16 heads of 64, 4 KV heads, vocabulary 32000.
def mixtral_params(layers: int = 2, h: int = 1024, inter: int = 2048, experts: int = 8, kv: int = 256,
                   vocab: int = 32000) -> int:
    """embeddings + untied LM head + per layer (q, o: h x h; k, v: h x kv; the router: h x experts;
    each expert's gate, up and down: 3 x h x inter; 2 RMSNorms) + final norm."""
    return 2 * vocab * h + layers * (2 * h * h + 2 * h * kv + h * experts + experts * 3 * h * inter + 2 * h) + h


def qwen3_moe_params(layers: int = 2, h: int = 1024, inter: int = 384, experts: int = 64, kv: int = 256,
                     head_dim: int = 64, vocab: int = 32000) -> int:
    """As Mixtral's, with Qwen3's per-head q and k RMSNorms (head_dim each) in every layer."""
    return mixtral_params(layers, h, inter, experts, kv, vocab) + layers * 2 * head_dim


def moe_activation_bound(batch: int, seq: int, layers: int, top_k: int, inter: int) -> int:
    """The dense bound plus each token's top-k expert intermediates (gate, up, their product and
    the activation: 4 fp32 values per intermediate unit) and its routing tensors."""
    return activation_bound(batch, seq, 1024, 32000, layers) + layers * batch * seq * top_k * inter * 4 * 4


@pytest.mark.parametrize("model, experts_impl, top_k, inter", [("mixtral", "eager", 2, 2048),
                                                               ("qwen3_moe", "grouped_mm", 8, 384)])
def test_trainer_moe_one_gpu(tmp_path: Path, model: str, experts_impl: str, top_k: int, inter: int) -> None:
    """Trainer on one GPU with an MoE model from its config, each of Transformers' experts
    implementations: the eager loop (torch.where per expert, index_add_) and grouped_mm (a grouped
    GEMM over tokens sorted by a histc of the routed ids; fp32 weights under bf16 autocast take
    CUDA's per-group fallback)."""
    run = trace(tmp_path, [sys.executable, TRAINER, "--model", model, "--steps", "3",
                           "--experts-implementation", experts_impl], 1, env={"CUDA_VISIBLE_DEVICES": "0"})
    params = mixtral_params() if model == "mixtral" else qwen3_moe_params()
    check_trainer(run, 3, 4, params, 1, moe_activation_bound(4, 512, 2, top_k, inter))
    layers = re.findall(r"L\d (\w+)TopKRouter .*: (\d+) experts, top-(\d+), ([\d,]+) tokens .* max/mean ([\d.]+)",
                        run.proc.stderr)
    assert len(layers) == 2 and all((int(e), int(k), t, float(m)) == ((8 if model == "mixtral" else 64), top_k, "2,048",
                                                                     1.0) for _, e, k, t, m in layers), layers


@pytest.mark.parametrize("model, experts_impl, top_k, inter", [("mixtral", "grouped_mm", 2, 2048),
                                                               ("qwen3_moe", "eager", 8, 384)])
def test_trainer_moe_fsdp2(tmp_path: Path, model: str, experts_impl: str, top_k: int, inter: int) -> None:
    """torchrun, 2 ranks: Trainer's FSDP2 per decoder layer over an MoE model (bf16 parameters in
    compute: grouped_mm takes CUTLASS's grouped kernel)."""
    run = trace(tmp_path, [*torchrun(2), TRAINER, "--model", model, "--steps", "3", "--experts-implementation",
                           experts_impl, "--fsdp", "full_shard auto_wrap", "--fsdp-version", "2"], 2)
    params = mixtral_params() if model == "mixtral" else qwen3_moe_params()
    check_trainer(run, 3, 4, params, 2, moe_activation_bound(4, 512, 2, top_k, inter) + 2 * params)
    with load(run.trace, engine="builtin") as db:
        grouped = [r[0] for r in db.query("SELECT EXTRACT_ARG(arg_set_id, 'args.flops') FROM slice "
                                          "WHERE name LIKE 'cutlass_grouped_gemm%'").rows]
        gathers = db.query("SELECT COUNT(*) FROM slice WHERE name LIKE 'ncclDevKernel_AllGather%'").scalar()
    assert gathers, "no FSDP all-gather"
    assert bool(grouped) == (experts_impl == "grouped_mm"), grouped
    if grouped:
        # the group offsets come from the routed counts: the gate/up GEMM's groups hold every
        # routed row, 4 x 512 tokens x top-k, each [1024] x [1024, 2 x inter]
        gate_up = 2.0 * 4 * 512 * top_k * 1024 * 2 * inter
        assert grouped.count(gate_up) >= 2 * 3, sorted(set(grouped))
