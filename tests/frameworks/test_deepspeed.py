"""DeepSpeed 0.19.8 runs unmodified under `phantora trace` (issue 15, point 3).

The user program (tests/frameworks/deepspeed/train.py, a stand-in for a user's script: a small
Llama-style model in plain torch) calls `deepspeed.initialize` with a ds_config JSON from
tests/frameworks/deepspeed/ and trains with `engine.backward(loss)` / `engine.step()`, launched
as DeepSpeed's docs show a GPU user: with `torchrun` and with DeepSpeed's own `deepspeed`
launcher. The configs keep DeepSpeed's defaults (FusedAdam, 5e8-element reduce buckets) and turn
on what a user turns on to see DeepSpeed's figures: steps_per_print, wall_clock_breakdown and
log_level info (for the throughput timer's SamplesPerSec line).

What a user checks after such a run, asserted per config: exit 0; DeepSpeed's own lines
(`step=N, skipped=0`, `CurrSamplesPerSec`, the wall-clock breakdown) present, with simulated
figures that agree with the trace's steps; the optimizer update (FusedAdam's multi_tensor_adam,
phantora's cost model for the CUDA extension DeepSpeed JIT-builds) in every step of every rank,
over this rank's ZeRO partition; no placeholder value steering control flow (no skipped step, a
finite positive gradient norm, the fp16 loss scale never lowered); the peak memory against a hand
count. The 8-rank configurations are in benchmarks/frameworks/deepspeed.py.
"""

from __future__ import annotations

import ast
import json
import math
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from phantora.query import load
from phantora.query.summary import summarize

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent / "deepspeed"
TRAIN = HERE / "train.py"
BIN = Path(sys.executable).parent  # torchrun and deepspeed: the console scripts of this environment
STEPS = 4
OPTIMIZER_OP = "cuda_extension::multi_tensor_adam"
OPTIMIZER_KERNEL = "multi_tensor_apply_kernel<AdamFunctor>"


@dataclass(frozen=True)
class RankReport:
    """What train.py prints per rank at the end (DeepSpeed's own counters)."""
    global_steps: int
    global_samples: int
    skipped_steps: int
    grad_norms: list[float]
    loss_scale: float
    peak_allocated: int


@dataclass
class DsRun:
    proc: subprocess.CompletedProcess
    trace: Path
    wall_s: float
    config: dict
    ranks: dict[int, RankReport] = field(default_factory=dict)
    progress: list[tuple[int, int]] = field(default_factory=list)  # DeepSpeed's (step, skipped)
    samples_per_sec: dict[int, float] = field(default_factory=dict)  # global step -> CurrSamplesPerSec
    breakdown_ms: list[dict[str, float]] = field(default_factory=list)  # fwd / bwd / step per step

    def detail(self) -> str:
        return f"\n--- stdout\n{self.proc.stdout[-5000:]}\n--- stderr\n{self.proc.stderr[-5000:]}"


_RANK = re.compile(r"rank (\d+): global_steps (\d+) global_samples (\d+) skipped_steps (\d+) grad_norms (\[[^\]]*\]) "
                   r"loss_scale (\S+) peak_allocated (\d+)")
_PROGRESS = re.compile(r"\[Rank 0\] step=(\d+), skipped=(\d+), lr=")
_SAMPLES = re.compile(r"global_step=(\d+), RunningAvgSamplesPerSec=\S+, CurrSamplesPerSec=([0-9.e+-]+),")
_BREAKDOWN = re.compile(r"\[Rank 0\] time \(ms\) \| fwd: ([0-9.]+) \| bwd: ([0-9.]+) \|.*\| step: ([0-9.]+)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_deepspeed(tmp: Path, config: str, ranks: int, launcher: str = "torchrun", model: tuple[str, ...] = (),
                  steps: int = STEPS, timeout: float = 900) -> DsRun:
    """`phantora trace -o tmp/run.json -- <launcher> ... train.py --deepspeed_config CONFIG`."""
    cfg = HERE / config
    args = [str(TRAIN), "--deepspeed_config", str(cfg), "--steps", str(steps), *model]
    port = str(_free_port())  # other test sessions may be running torchrun jobs on this machine
    if launcher == "torchrun":
        cmd = [str(BIN / "torchrun"), "--nproc-per-node", str(ranks), "--master-port", port, *args]
    elif launcher == "deepspeed":
        cmd = [str(BIN / "deepspeed"), "--num_gpus", str(ranks), "--master_port", port, *args]
    else:
        raise ValueError(launcher)
    out = tmp / "run.json"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "phantora.cli", "trace", "--quiet", "-o", str(out), "--", *cmd],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    run = DsRun(proc, out, time.monotonic() - t0, json.loads(cfg.read_text()))
    for m in _RANK.finditer(proc.stdout):
        run.ranks[int(m[1])] = RankReport(int(m[2]), int(m[3]), int(m[4]), ast.literal_eval(m[5]), float(m[6]),
                                          int(m[7]))
    run.progress = [(int(m[1]), int(m[2])) for m in _PROGRESS.finditer(proc.stdout)]
    run.samples_per_sec = {int(m[1]): float(m[2]) for m in _SAMPLES.finditer(proc.stdout)}
    run.breakdown_ms = [{"fwd": float(m[1]), "bwd": float(m[2]), "step": float(m[3])}
                        for m in _BREAKDOWN.finditer(proc.stdout)]
    return run


def optimizer_steps(trace: Path) -> dict[int, list[tuple[int, int, float]]]:
    """Per rank, per optimizer step (ProfilerStep slice): (multi_tensor_adam calls on the host,
    AdamFunctor kernels those calls launched, bytes the kernels moved)."""
    db = load(trace)
    rows = db.query("""
        select p.name, th.name, s.name, s.ts, s.dur, s.id, s.arg_set_id from slice s
        join thread_track tt on s.track_id = tt.id join thread th using(utid) join process p using(upid)
        where s.name like 'ProfilerStep#%' or s.name in ('{OPTIMIZER_OP}', '{OPTIMIZER_KERNEL}')""".format(
        OPTIMIZER_OP=OPTIMIZER_OP, OPTIMIZER_KERNEL=OPTIMIZER_KERNEL)).rows
    rank_of = {}
    for proc_name, *_ in rows:
        m = re.match(r"rank (\d+) ", proc_name)
        rank_of[proc_name] = int(m[1])
    kernel_bytes = dict(db.query(f"""
        select s.id, extract_arg(s.arg_set_id, 'args.bytes') from slice s
        where s.name = '{OPTIMIZER_KERNEL}'""").rows)
    kernel_launcher = dict(db.query(f"""
        select f.slice_in, f.slice_out from flow f join slice s on s.id = f.slice_in
        where s.name = '{OPTIMIZER_KERNEL}'""").rows)
    per_rank: dict[int, list[tuple[int, int, float]]] = {}
    for rank in sorted(set(rank_of.values())):
        mine = [r for r in rows if rank_of[r[0]] == rank]
        steps = sorted((r[3], r[3] + r[4]) for r in mine if r[2].startswith("ProfilerStep#"))
        calls = [r for r in mine if r[2] == OPTIMIZER_OP]
        result = []
        for start, end in steps:
            in_step = {r[5] for r in calls if start <= r[3] < end}
            kernels = [k for k, launcher in kernel_launcher.items() if launcher in in_step]
            result.append((len(in_step), len(kernels), sum(kernel_bytes[k] for k in kernels)))
        per_rank[rank] = result
    return per_rank


# --- the CI configurations ---------------------------------------------------------------------

# (config file, launcher): ZeRO 1, 2 and 3 in bf16 (the two launchers between them), and ZeRO-2
# in fp16 with dynamic loss scaling (DeepSpeed's overflow check and scale update run every step)
CONFIGS = [
    ("ds_zero1.json", "torchrun"),
    ("ds_zero2.json", "torchrun"),
    ("ds_zero3.json", "deepspeed"),
    ("ds_zero2_fp16.json", "torchrun"),
]
RANKS = 2
# train.py's defaults: vocab 8192, width 256, 2 layers, MLP hidden 768 (256 * ceil(8 * 256 / 3 / 256))
VOCAB, DIM, LAYERS, HIDDEN, SEQ = 8192, 256, 2, 768, 256
PARAMS = 2 * VOCAB * DIM + DIM + LAYERS * (2 * DIM + 4 * DIM * DIM + 3 * DIM * HIDDEN)


@pytest.fixture(scope="module", params=CONFIGS, ids=[f"{c.removesuffix('.json')}-{l}" for c, l in CONFIGS])
def ds_run(request, tmp_path_factory) -> DsRun:
    config, launcher = request.param
    return run_deepspeed(tmp_path_factory.mktemp(config.removesuffix(".json")), config, RANKS, launcher)


def test_runs_and_every_rank_takes_every_step(ds_run: DsRun) -> None:
    assert ds_run.proc.returncode == 0, f"exit {ds_run.proc.returncode}{ds_run.detail()}"
    assert sorted(ds_run.ranks) == list(range(RANKS)), ds_run.detail()
    micro = ds_run.config["train_micro_batch_size_per_gpu"]
    for rank, r in ds_run.ranks.items():
        assert r.global_steps == STEPS and r.skipped_steps == 0, (rank, r)
        assert r.global_samples == STEPS * micro * RANKS, (rank, r)
    # DeepSpeed's own progress line (steps_per_print 1), from the engine's counters
    assert ds_run.progress == [(0, 0)] + [(s, 0) for s in range(1, STEPS + 1)], ds_run.detail()


def test_no_placeholder_value_steers_the_loss_scale_or_the_gradient_norm(ds_run: DsRun) -> None:
    """Tensors on virtual GPUs hold no data: DeepSpeed's overflow vote, its loss-scale update
    and its gradient norm read phantora's values. A healthy run: no overflow, so no skipped step
    (above) and, in fp16, the dynamic scale stays at its initial 2^16 for the whole run (an
    overflow halves it); the norm is finite and positive."""
    fp16 = ds_run.config.get("fp16", {}).get("enabled", False)
    for rank, r in ds_run.ranks.items():
        assert len(r.grad_norms) == STEPS
        assert all(n is not None and math.isfinite(n) and n > 0 for n in r.grad_norms), (rank, r.grad_norms)
        if fp16:
            assert r.loss_scale == 2.0 ** ds_run.config["fp16"]["initial_scale_power"], (rank, r)
        else:
            assert r.loss_scale == 1.0, (rank, r)


def test_fused_adam_updates_this_ranks_partition_in_every_step(ds_run: DsRun) -> None:
    """FusedAdam's multi_tensor_adam (a CUDA extension DeepSpeed JIT-builds; phantora's stand-in
    issues cuda_extension::multi_tensor_adam, timed as torch's fused Adam) runs once per optimizer
    step on every rank, over this rank's 1/RANKS of the fp32 master weights: its kernels stream
    7 x 4 bytes per element (fp32 grads read; weights and both moments read and written)."""
    per_rank = optimizer_steps(ds_run.trace)
    assert sorted(per_rank) == list(range(RANKS))
    for rank, steps in per_rank.items():
        assert len(steps) == STEPS, (rank, steps)
        for i, (calls, kernels, nbytes) in enumerate(steps):
            assert calls == 1 and kernels >= 1, (rank, i, steps)
            # ZeRO pads each rank's partition a little for alignment: within 1%
            assert nbytes == pytest.approx(7 * 4 * PARAMS / RANKS, rel=0.01), (rank, i, nbytes)


def test_deepspeeds_own_timers_show_the_simulated_steps(ds_run: DsRun) -> None:
    """The throughput timer's CurrSamplesPerSec (train_batch_size over the time from the forward
    to the end of engine.step(), read with time.time()) and the wall-clock breakdown (fwd, bwd,
    step, CUDA-event-free timers that synchronize) report the simulated step: within the trace's
    step (optimizer.step to optimizer.step, which also holds the script's own input generation
    between DeepSpeed's timers) and at least 90% of it. On the machine's real clock these runs
    take seconds per step."""
    summary = summarize(load(ds_run.trace))
    steps_ns = summary.steps.overall_ns
    assert len(steps_ns) == STEPS and summary.steps.source == "step markers"
    batch = ds_run.config["train_micro_batch_size_per_gpu"] * RANKS
    # the timer reports from global step 3 on (its start_step is 2)
    assert sorted(ds_run.samples_per_sec) == list(range(3, STEPS + 1)), ds_run.detail()
    for step, sps in ds_run.samples_per_sec.items():
        timed_ms = 1e3 * batch / sps
        trace_ms = steps_ns[step - 1] / 1e6
        assert 0.9 * trace_ms <= timed_ms <= trace_ms * 1.001, (step, timed_ms, trace_ms)
    assert len(ds_run.breakdown_ms) == STEPS
    for i, b in enumerate(ds_run.breakdown_ms[1:], start=1):
        parts_ms = b["fwd"] + b["bwd"] + b["step"]
        assert 0.9 * steps_ns[i] / 1e6 <= parts_ms <= steps_ns[i] / 1e6 * 1.01, (i, b, steps_ns[i])


def test_peak_memory_against_a_hand_count(ds_run: DsRun) -> None:
    """DeepSpeed allocates its gradient reduce bucket at its default size, reduce_bucket_size =
    5e8 elements of the gradient dtype (1 GB in bf16/fp16), as it does on a GPU. Always alive
    beside it: this rank's ZeRO partition of the fp32 master weights and both Adam moments (12
    bytes per parameter / ranks) and of the bf16/fp16 weights (2 / ranks). At most, at the peak:
    the full bf16 weights, their gradients and one flattened copy of them for a collective (6
    bytes per parameter), the fp32 gradient partition and the bf16 partitions (6 / ranks), the
    logits in the compute dtype and in fp32 with their log-softmax and its gradient (16 bytes
    per logit bound them), and each layer's saved activations (10 x width + 5 x MLP width
    per token, in 4 bytes to bound them)."""
    summary = summarize(load(ds_run.trace))
    bucket = 5e8 * 2
    low = bucket + (12 + 2) * PARAMS / RANKS
    tokens = ds_run.config["train_micro_batch_size_per_gpu"] * SEQ
    high = bucket + 6 * PARAMS + (12 + 2 + 6) * PARAMS / RANKS + 16 * tokens * VOCAB \
        + LAYERS * tokens * (10 * DIM + 5 * HIDDEN) * 4
    for peak in summary.memory:
        report = ds_run.ranks[peak.rank]
        assert peak.allocated_bytes == report.peak_allocated  # torch.cuda.max_memory_allocated
        assert low <= peak.allocated_bytes <= high, (peak, low, high)


# --- custom CUDA extensions ----------------------------------------------------------------------

UNKNOWN_EXTENSION = """
import torch
from torch.utils.cpp_extension import load_inline
ext = load_inline(name="my_kernels", cpp_sources="void scale(torch::Tensor x, double a);",
                  cuda_sources="__global__ void k(float* x) {}  void scale(torch::Tensor x, double a) {}",
                  functions=["scale"])
x = torch.ones(4, device="cuda")
ext.scale(x, 2.0)
"""


def test_an_unmodelled_cuda_extension_kernel_fails_naming_rank_extension_and_what_to_change(tmp_path) -> None:
    script = tmp_path / "ext.py"
    script.write_text(UNKNOWN_EXTENSION)
    proc = subprocess.run([sys.executable, "-m", "phantora.cli", "trace", "--quiet", "-o", str(tmp_path / "run.json"),
                           "--", sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "NotImplementedError: phantora: rank 0: my_kernels.scale is a kernel of the custom CUDA extension " \
           "'my_kernels'" in proc.stderr, proc.stderr[-3000:]
    assert "use the PyTorch implementation of this operation" in proc.stderr
    assert "nvcc" not in proc.stderr and "CUDA_HOME" not in proc.stderr  # nothing was compiled


def test_only_cuda_extensions_are_replaced() -> None:
    """load/load_inline of C++-only sources go to torch's own builder (their code runs on the
    CPU); sources with .cu files, with_cuda=True or cuda_sources get the stand-in module."""
    import types

    from interpose.device import cuda_extensions

    calls = []
    fake = types.ModuleType("fake_cpp_extension")
    fake.load = lambda name, sources, *a, **k: calls.append(("load", name)) or "built"
    fake.load_inline = lambda name, cpp_sources, cuda_sources=None, *a, **k: calls.append(("inline", name)) or "built"
    cuda_extensions._patch(fake)
    assert fake.load("cpu_op", ["a.cpp"]) == "built"
    assert fake.load_inline("cpu_inline", "int f();") == "built"
    assert calls == [("load", "cpu_op"), ("inline", "cpu_inline")]
    adam = fake.load(name="fused_adam", sources=[str(ROOT / "no-such-frontend.cpp"), "multi_tensor_adam.cu"])
    assert isinstance(adam, types.ModuleType) and calls == [("load", "cpu_op"), ("inline", "cpu_inline")]
    assert fake.load("x", ["x.cpp"], with_cuda=True).__name__ == "x"
    with pytest.raises(NotImplementedError, match="'ops_lib' registers its kernels as torch ops"):
        fake.load("ops_lib", ["k.cu"], is_python_module=False)
    inline = fake.load_inline("k", "void f();", "__global__ void g() {}", functions=["f", "multi_tensor_adam"])
    assert inline.multi_tensor_adam is cuda_extensions.multi_tensor_adam
    with pytest.raises(NotImplementedError, match=r"k\.f is a kernel of the custom CUDA extension 'k'"):
        inline.f()
    with pytest.raises(AttributeError, match="its sources export f, multi_tensor_adam"):
        inline.g  # noqa: B018


def test_moe_layer_expert_parallel(tmp_path) -> None:
    """DeepSpeed's MoE layer (deepspeed.moe.layer.MoE: top-2 gating with capacity, expert
    parallel 2 over ZeRO-2, expert parameters in their own groups as DeepSpeed's tutorial does).
    Every rank steps; each gate's two argmax decisions are routed balanced and differ (a token's
    second expert is not its first); the dispatch all_to_all moves the [experts, capacity, width]
    buffer evenly: 4 experts x capacity 512 (1,024 tokens / 4 experts x 2 choices x capacity
    factor 1) x 256 bf16, half to each rank."""
    run = run_deepspeed(tmp_path, "ds_zero2.json", RANKS, model=("--moe-experts", "4", "--ep-size", "2", "--top-k", "2"))
    assert run.proc.returncode == 0, f"exit {run.proc.returncode}{run.detail()}"
    assert "unknown ops: none" in run.proc.stderr, run.detail()
    for rank, r in run.ranks.items():
        assert r.global_steps == STEPS and r.skipped_steps == 0, (rank, r)
        assert all(n is not None and math.isfinite(n) and n > 0 for n in r.grad_norms), (rank, r.grad_norms)
    # ZeRO-2 steps its optimizer once per parameter group (the experts' and the others'): one
    # training step each time, marked once, with both groups' Adam in the later steps
    per_rank = optimizer_steps(run.trace)
    assert sorted(per_rank) == [0, 1] and all(len(s) == STEPS and all(c >= 1 for c, _, _ in s) and s[-1][0] == 2
                                              for s in per_rank.values()), per_rank
    gates = re.findall(r"(L\d(?:\.1)?) TopKGate \(sharded_moe\.py:\d+\): 4 experts, top-1, 2,048 tokens over 2 "
                       r"rank\(s\), max/mean 1\.00", run.proc.stderr)
    assert gates == ["L0", "L0.1", "L1", "L1.1"], run.detail()
    half = 4 * 512 * DIM * 2 // 2
    db = load(run.trace)
    sends = db.query("select extract_arg(arg_set_id, 'args.bytes sent to each member[0]'), "
                     "extract_arg(arg_set_id, 'args.bytes sent to each member[1]') from slice "
                     "where extract_arg(arg_set_id, 'args.op') = 'all_to_all'").rows
    # per layer and step: dispatch and combine, forward and backward, on each of the 2 ranks
    assert [tuple(s) for s in sends].count((half, half)) == 4 * LAYERS * STEPS * RANKS, sends[:8]
