"""Lightning 2.6 runs unmodified under phantora (issue 15, point 5).

The user program is tests/frameworks/lightning/train_llama.py (a stand-in for a user's project: a
small Llama-style LightningModule on random token ids, `Trainer(accelerator="gpu",
precision="bf16-mixed")`, Lightning's ThroughputMonitor and CSVLogger, a step-timing Callback).
Each test starts it the way Lightning's docs tell a GPU user to, and checks what that user would:
exit 0; the Callback's step times, ThroughputMonitor's tokens/s and MFU and the progress bar's
it/s equal the trace's simulated steps; AdamW's update kernel in every step on every rank,
covering all of the rank's parameters; loss and throughput finite; peak memory between hand
counts of what must and what may be alive at the peak.

Sizes are the smallest that keep the logits (the largest activation) dominant and countable; the
larger configurations are in benchmarks/frameworks/lightning.py.
"""

from __future__ import annotations

import csv
import math
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from phantora.query import load
from phantora.query.summary import summarize

pytest.importorskip("lightning")
import torch  # noqa: E402  (lightning's FLOPs table is keyed by torch dtypes)
from lightning.fabric.utilities.throughput import _CUDA_FLOPS  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "lightning" / "train_llama.py"
STEPS = 4
VOCAB, DIM, LAYERS, SEQ, BATCH = 8192, 256, 2, 256, 4  # train_llama.py's defaults
HIDDEN = 768  # 256 * ceil(8 * DIM / 3 / 256): the SwiGLU width train_llama.py derives
TOKENS = BATCH * SEQ
# parameters: embedding and head (untied), per block two RMSNorm weights, qkv + proj (4 d^2),
# gate_up + down (3 d h); the final RMSNorm
PARAMS = 2 * VOCAB * DIM + LAYERS * (2 * DIM + 4 * DIM * DIM + 3 * DIM * HIDDEN) + DIM
# FLOPs torch's FlopCounterMode counts for one training step (Lightning's measure_flops):
# 6 per matmul parameter and token (embedding lookups are not matmuls), plus attention at
# full (not causal) size: forward 2 bmm, backward 4 bmm, each 2 b t^2 d
MATMUL_PARAMS = LAYERS * (4 * DIM * DIM + 3 * DIM * HIDDEN) + DIM * VOCAB
FLOPS_PER_BATCH = 6 * MATMUL_PARAMS * TOKENS + LAYERS * 12 * BATCH * SEQ * SEQ * DIM
H100_BF16 = _CUDA_FLOPS["h100 sxm"][torch.bfloat16]  # what ThroughputMonitor divides by
MiB = 2**20


@dataclass
class Run:
    proc: subprocess.CompletedProcess
    trace: Path
    logs: Path

    def detail(self) -> str:
        return f"\n--- stdout\n{self.proc.stdout[-4000:]}\n--- stderr\n{self.proc.stderr[-6000:]}"


def run_lightning(tmp_path: Path, *args: str, launcher: tuple[str, ...] = (), devices: int = 1,
                  progress_bar: str = "tqdm") -> Run:
    """`phantora trace -o run.json -- [launcher] train_llama.py ...`; without a launcher the
    script is started with plain `python`, as a Lightning user does (Lightning's own launcher then
    starts the other local ranks)."""
    trace, logs = tmp_path / "run.json", tmp_path / "logs"
    starter = launcher or (sys.executable,)
    cmd = [sys.executable, "-m", "phantora.cli", "trace", "-o", str(trace), "--", *starter, str(SCRIPT),
           "--devices", str(devices), "--steps", str(STEPS), "--root", str(logs), "--progress-bar", progress_bar,
           *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    return Run(proc, trace, logs)


def torchrun(nproc: int) -> tuple[str, ...]:
    return (str(Path(sys.executable).with_name("torchrun")), "--nproc-per-node", str(nproc))


def timer_steps(stdout: str) -> dict[int, dict[int, float]]:
    """rank -> step -> ms, from the StepTimer callback's lines (not anchored: ranks share stdout
    with the progress bar, which writes no newline)."""
    out: dict[int, dict[int, float]] = {}
    for rank, step, ms in re.findall(r"rank (\d+) step (\d+): time ([\d.]+) ms", stdout):
        out.setdefault(int(rank), {})[int(step)] = float(ms)
    return out


def throughput_rows(logs: Path) -> list[dict[str, str]]:
    """ThroughputMonitor's rows of rank 0's CSVLogger file (one per training batch)."""
    (metrics,) = logs.glob("llama/version_*/metrics.csv")
    with metrics.open() as f:
        return [row for row in csv.DictReader(f) if row["train/time"]]


def optimizer_kernels(trace: Path) -> dict[tuple[str, str], list[float]]:
    """(process name, ProfilerStep#N) -> args.flops (elements updated) of each kernel launched
    by AdamW's foreach addcdiv (its parameter update) within that optimizer step."""
    sql = """
        select p.name, step.name, extract_arg(k.arg_set_id, 'args.flops')
        from slice step
        join thread_track st on step.track_id = st.id join thread sth on st.utid = sth.utid
        join process p on sth.upid = p.upid
        join slice h on h.name = 'aten::_foreach_addcdiv_' and h.ts >= step.ts and h.ts < step.ts + step.dur
        join thread_track ht on h.track_id = ht.id join thread hth on ht.utid = hth.utid and hth.upid = sth.upid
        join flow f on f.slice_out = h.id join slice k on k.id = f.slice_in and k.category = 'kernel'
        where step.name like 'ProfilerStep#%'"""
    out: dict[tuple[str, str], list[float]] = {}
    with load(trace) as db:
        for proc_name, step, flops in db.query(sql).rows:
            out.setdefault((proc_name, step), []).append(flops)
    return out


def check(run: Run, ranks: int, shards: int, grad_buckets: bool = False,
          main_trains: bool = True) -> dict[int, list[float]]:
    """The checks every configuration shares; returns rank -> the trace's step times in ms.

    shards: how many ways parameters, gradients and optimizer state are split (1: replicated).
    grad_buckets: DDP's gradient buckets, one more gradient-sized buffer.
    main_trains: the process the user started is rank 0 (not with ddp_spawn, whose main process
    only starts the ranks)."""
    assert run.proc.returncode == 0, f"exit {run.proc.returncode}{run.detail()}"
    out = run.proc.stdout
    assert f"simulated {ranks} rank(s)" in run.proc.stderr, run.detail()
    assert f"FLOPs per batch per device: {FLOPS_PER_BATCH:,}" in out, run.detail()

    with load(run.trace) as db:
        summary = summarize(db)
    assert summary.steps.source == "step markers"
    trace_ms = {r.rank: [d / 1e6 for d in r.durations_ns] for r in summary.steps.per_rank}
    assert sorted(trace_ms) == list(range(ranks)) and all(len(v) == STEPS for v in trace_ms.values()), trace_ms

    # The Callback synchronizes and reads perf_counter at each batch end; from step 3 on the
    # interval between two of those is exactly the interval between two optimizer steps (step 2
    # differs by step 1's different launch time after its optimizer step: optimizer state init)
    timer = timer_steps(out)
    assert sorted(timer) == list(range(ranks)), run.detail()
    for rank in range(ranks):
        assert sorted(timer[rank]) == list(range(2, STEPS + 1)), timer
        for step in range(3, STEPS + 1):
            assert timer[rank][step] == pytest.approx(trace_ms[rank][step - 1], abs=1.5e-3), (rank, step, timer, trace_ms)

    # ThroughputMonitor (window of 2 batches): its per-device tokens/s and MFU over each step
    rows = throughput_rows(run.logs)
    assert [int(r["step"]) for r in rows] == list(range(STEPS))
    for row in rows[2:]:
        step_s = trace_ms[0][int(row["step"])] / 1e3
        assert float(row["train/device/items_per_sec"]) == pytest.approx(TOKENS / step_s, rel=1e-4), row
        assert float(row["train/device/mfu"]) == pytest.approx(FLOPS_PER_BATCH / step_s / H100_BF16, rel=1e-4), row
    losses = [float(r["loss"]) for r in csv.DictReader(next(run.logs.glob("llama/version_*/metrics.csv")).open())
              if r["loss"]]
    assert len(losses) == STEPS and all(math.isfinite(x) for x in losses), losses

    # AdamW updates every local parameter element in every step, on every rank
    kernels = optimizer_kernels(run.trace)
    local = PARAMS // shards
    for rank in range(ranks):
        proc_name = next(p for p, _ in kernels if p.startswith(f"rank {rank} "))
        for step in range(STEPS):
            assert kernels.get((proc_name, f"ProfilerStep#{step}")) == [float(local)], (rank, step, kernels)

    # Peak memory against hand counts. Always alive: fp32 parameters, gradients and AdamW's two
    # moments (16 bytes per local parameter), DDP's bucket copy of the gradients, and at the
    # cross-entropy the bf16 logits, their fp32 copy and its log-softmax. At most also: a bf16
    # copy of every weight (autocast's cache, FSDP's gathered parameters), three more fp32
    # logit-sized tensors (gradients of the softmax and the cast), the blocks' activations.
    logits32 = TOKENS * VOCAB * 4
    static = 16 * PARAMS / shards + (4 * PARAMS if grad_buckets else 0)
    lower = static + 2.5 * logits32
    upper = static + 2 * PARAMS + 5.5 * logits32 + 32 * MiB
    for peak in summary.memory:
        assert lower <= peak.allocated_bytes <= upper, (peak, lower, upper)
    # the script's own max_memory_allocated() reads the simulated allocator's peak: at its end,
    # or (ddp_spawn) in rank 0's last StepTimer line
    if main_trains:
        reported = float(re.search(r"peak memory ([\d.]+) GiB", out).group(1))
    else:
        reported = float(re.findall(r"rank 0 step \d+: time [\d.]+ ms, [\d,]+ tokens/s, max memory ([\d.]+) GiB",
                                    out)[-1])
    assert reported == pytest.approx(summary.memory[0].allocated_bytes / 2**30, abs=1e-3)
    return trace_ms


def bar_rate(stdout: str) -> float:
    """The last it/s figure of the progress bar (TQDM's or Rich's)."""
    rates = re.findall(r"([\d.]+)it/s", stdout)
    assert rates, stdout[-3000:]
    return float(rates[-1])


def check_bar(run: Run, trace_ms: list[float]) -> None:
    # the bar's rate is a moving average since the epoch started (the first step included);
    # read from wall time it would be a few it/s, simulated it is about 1 / step
    rate = bar_rate(run.proc.stdout)
    assert rate == pytest.approx(1e3 / (sum(trace_ms) / len(trace_ms)), rel=0.25), (rate, trace_ms)


def test_one_gpu_tqdm_progress_bar(tmp_path: Path) -> None:
    run = run_lightning(tmp_path, progress_bar="tqdm")
    trace_ms = check(run, ranks=1, shards=1)
    assert "Epoch 0: 100%" in run.proc.stdout  # TQDMProgressBar's line
    check_bar(run, trace_ms[0])


def test_one_gpu_default_progress_bar(tmp_path: Path) -> None:
    # Lightning's default bar is RichProgressBar when rich is importable, which phantora's own
    # dependencies make it in a shared environment (TQDMProgressBar otherwise: test above)
    run = run_lightning(tmp_path, progress_bar="default")
    trace_ms = check(run, ranks=1, shards=1)
    assert "Epoch 0/" in run.proc.stdout and "Epoch 0:" not in run.proc.stdout  # Rich's, not TQDM's
    check_bar(run, trace_ms[0])


def test_ddp_lightning_launcher(tmp_path: Path) -> None:
    """`python train_llama.py --devices 2`: Lightning's _SubprocessScriptLauncher re-runs the script
    for local rank 1 with LOCAL_RANK / NODE_RANK / WORLD_SIZE set; phantora traces both processes
    as ranks. Gradient clipping by norm on: the norm is finite, the step is not skipped."""
    run = run_lightning(tmp_path, "--clip", "1.0", devices=2)
    trace_ms = check(run, ranks=2, shards=1, grad_buckets=True)
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in run.proc.stderr
    check_bar(run, trace_ms[0])


def test_ddp_torchrun(tmp_path: Path) -> None:
    """`torchrun --nproc-per-node 2 train_llama.py --devices 2`: Lightning sees torchrun's
    environment and launches nothing itself."""
    run = run_lightning(tmp_path, devices=2, launcher=torchrun(2))
    trace_ms = check(run, ranks=2, shards=1, grad_buckets=True)
    check_bar(run, trace_ms[0])


def test_fsdp(tmp_path: Path) -> None:
    """strategy="fsdp": Lightning's FSDPStrategy (FSDP1, one flat parameter sharded two ways,
    bf16 gathers and reductions from its bf16-mixed precision plugin)."""
    run = run_lightning(tmp_path, "--strategy", "fsdp", devices=2)
    check(run, ranks=2, shards=2)


def test_fsdp2_model_parallel_strategy(tmp_path: Path) -> None:
    """ModelParallelStrategy with configure_model calling fully_shard per block (FSDP2)."""
    run = run_lightning(tmp_path, "--strategy", "model_parallel", devices=2)
    check(run, ranks=2, shards=2)


def test_ddp_spawn(tmp_path: Path) -> None:
    """strategy="ddp_spawn": torch.multiprocessing.spawn starts both ranks from the process the
    user started, pickling the Trainer and the LightningModule, whose tensors are virtual
    (interpose/distributed/pickling.py); each spawned child becomes a rank at init_process_group. The main
    process trains nothing itself, as on a GPU: its trainer's step count is not sent back by
    Lightning, and it never touched a GPU."""
    run = run_lightning(tmp_path, "--strategy", "ddp_spawn", devices=2)
    trace_ms = check(run, ranks=2, shards=1, grad_buckets=True, main_trains=False)
    assert "trained 0 steps; peak memory 0.000 GiB" in run.proc.stdout, run.detail()
    check_bar(run, trace_ms[0])
