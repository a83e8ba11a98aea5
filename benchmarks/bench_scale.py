"""Simulated GPUs far beyond the processes run: representative ranks (`--ranks auto`), issue 17.

    python benchmarks/bench_scale.py [--gpus 8,64,128,1024,4096] [--titan 256,1024] [--moe 1024] [--moe-pp 1024]
                                     [--megatron-moe 64,1024] [--only fsdp|titan|megatron|megatron-moe|moe|moe-pp]
    python benchmarks/bench_scale.py --equivalence [--equivalence-gpus 8,16,32,64]

Rows:
- FSDP2 Llama-style 8B (32 layers, dim 4096, 32 heads, 8 KV heads, SwiGLU 14336, vocab 128256,
  batch 1 x 8192; tests/e2e/scripts/fsdp2_llama_memory.py, plain PyTorch) on 8-GPU DGX H100
  nodes: one process stands for every rank.
- TorchTitan 0.3.0 DeepSeek-V3 671B (MoE) with expert parallelism 64 over FSDP on every GPU, local
  batch 1 x 4096, full activation checkpointing: two processes (rank 0 and a witness). With PP 8
  (Interleaved1F1B, local batch 8 in microbatches of 1, the same global batch): one process per stage
  and a witness of the last.
- Megatron-Core MoE, OLMoE-1B-7B's shape (64 experts, top-8), EP 8 x DP, through the Megatron-Core
  stand-in (tests/frameworks/megatron/pretrain_gpt.py, alltoall dispatcher): two processes.
- TorchTitan 0.3.0 Llama 3 8B with TP 8 x PP 4 x FSDP (local batch 8, seq 8192, its default
  Interleaved1F1B schedule, SAC, eager) through its own torchrun line: `--ranks auto`
  finds the pipeline stages (the run starts again with one representative per stage), so 5
  processes (one per stage, and a witness of the last) stand for every rank. Needs the CUDA build of torch with torchtitan
  ($PHANTORA_CUDA_TORCH_PYTHON or the environment tests/conftest.py builds); skipped, saying
  so, without it.

--equivalence runs the examples (DDP, FSDP2, TP 4 x FSDP2, PP) with `--ranks auto` and with
`--ranks all` at each GPU count and compares them: the largest difference of any rank's step
(ProfilerStep slices), of any collective's end on any rank, and whether every rank has the same
steps and collectives.

Each configuration runs twice, with 1 and with 2 training steps; the difference in wall time is
the wall time of one step without start-up. Columns: processes that ran (distinct roles and the
witness), wall time of the 1-step run, wall per step, the simulated time of one step (FSDP2: the
difference of the two runs' simulated time; TorchTitan: step 2 on rank 0, between the optimizer
kernels ending steps 1 and 2), peak summed PSS of phantora and every process it started (/proc, sampled), and
the size of the Chrome JSON trace of the 2-step run.
"""

from __future__ import annotations

import argparse
import resource
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import orjson
from _procfs import descendants, pss_kib

ROOT = Path(__file__).resolve().parent.parent
LLAMA_8B = ["--layers", "32", "--dim", "4096", "--heads", "32", "--kv-heads", "8", "--ffn", "14336",
            "--vocab", "128256", "--batch", "1", "--seq", "8192"]


class PeakPss(threading.Thread):
    """Peak of the summed PSS of a process and all its descendants."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak_kib, self.stop = pid, 0, threading.Event()

    def run(self) -> None:
        # Reading smaps_rollup walks a process's page tables: with ten 5 GB rank processes a
        # sample took 0.185 s of CPU, and sampling every 0.5 s took a fifth of one of the two
        # cores the measured run shares. The wait grows with the sample, keeping it near 5%.
        wait = 0.5
        while not self.stop.wait(wait):
            started = time.thread_time()
            self.peak_kib = max(self.peak_kib, sum(pss_kib(p) for p in [self.pid, *descendants(self.pid)]))
            wait = max(0.5, 20 * (time.thread_time() - started))


@dataclass
class Run:
    wall_s: float
    processes: int
    simulated_ms: float
    peak_mib: float
    trace_mib: float
    network_s: float  # wall time in the network simulator (trace metadata network_wall_seconds)
    cpu_s: float  # CPU seconds of phantora and every process it started (getrusage of reaped children)


def trace_metadata(path: Path) -> dict:
    """The trace's metadata object, which phantora writes last: read from the file's tail, since
    a 4,096-GPU JSON trace (gigabytes) does not fit in memory parsed."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - (1 << 20)))
        tail = f.read()
    start = tail.rfind(b'"metadata":')
    if start < 0:
        return orjson.loads(path.read_bytes())["metadata"]
    return orjson.loads(tail[start + len(b'"metadata":'):].rstrip()[:-1])


def trace(command: list[str], options: list[str], out: Path, cwd: Path, env: dict[str, str] | None = None) -> Run:
    # modelled host time: the simulated step then does not depend on how loaded this machine is
    cmd = [sys.executable, "-m", "phantora.cli", "trace", "--quiet", "--host-time", "modelled", *options, "-o", str(out),
           "--", *command]
    t0 = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    sampler = PeakPss(proc.pid)
    sampler.start()
    _, stderr = proc.communicate(timeout=7200)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    sampler.stop.set()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(options)} failed ({proc.returncode}):\n{stderr[-3000:]}")
    m = re.search(r"simulated (?:\d+ ranks \((\d+) process\(es\)|(\d+) rank\(s\))", stderr)
    processes = int(m.group(1) or m.group(2)) if m else 0
    metadata = trace_metadata(out)
    return Run(wall, processes, metadata["simulated_ns"] / 1e6, sampler.peak_kib / 1024, out.stat().st_size / 2**20,
               metadata.get("network_wall_seconds", 0.0), cpu)


def nodes_options(gpus: int) -> list[str]:
    return ["--nnodes", str(max(gpus // 8, 1)), "--nproc-per-node", str(min(gpus, 8)), "--ranks", "auto"]


def fsdp_row(gpus: int, tmp: Path) -> tuple[str, int, Run, Run, float]:
    script = [sys.executable, str(ROOT / "tests/e2e/scripts/fsdp2_llama_memory.py"), *LLAMA_8B]
    one = trace([*script, "--steps", "1"], nodes_options(gpus), tmp / f"fsdp{gpus}-1.json", ROOT)
    two = trace([*script, "--steps", "2"], nodes_options(gpus), tmp / f"fsdp{gpus}-2.json", ROOT)
    return "FSDP2 Llama 8B", gpus, one, two, two.simulated_ms - one.simulated_ms


def _titan_python() -> str | None:
    python = os.environ.get("PHANTORA_CUDA_TORCH_PYTHON")
    if not python:
        from interpose.device.shim_build import cache_dir

        python = str(cache_dir() / "test-venv-cuda-torch" / "bin" / "python")
    probe = subprocess.run([python, "-c", "import torchtitan"], capture_output=True, text=True)
    return python if probe.returncode == 0 else None


TITAN_8B = ["--module", "llama3", "--config", "llama3_8b", "--parallelism.tensor_parallel_degree", "8",
            "--parallelism.pipeline_parallel_degree", "4", "--training.local_batch_size", "8",
            "--training.seq_len", "8192"]
# DeepSeek-V3 671B (61 layers, 58 of them MoE: 256 routed experts, top-8, and one shared) with
# expert parallelism 64 over FSDP across every GPU, TorchTitan's all-to-all dispatcher, full
# activation checkpointing (NVIDIA's DGX Cloud recipe's layout, docs/moe.md), H100s.
_TITAN_671B = ["--module", "deepseek_v3", "--config", "deepseek_v3_671b", "--parallelism.expert_parallel_degree", "64",
               "--training.seq_len", "4096"]
TITAN_671B_MOE = [*_TITAN_671B, "--training.local_batch_size", "1"]
# The same with pipeline parallelism 8 (TorchTitan's Interleaved1F1B, 2 stages a rank) and local batch 8 (8
# microbatches of 1 x 4096): a data-parallel group is 8x smaller, so the global batch is the EP x FSDP row's.
TITAN_671B_MOE_PP = [*_TITAN_671B, "--training.local_batch_size", "8", "--parallelism.pipeline_parallel_degree", "8"]


def titan_row(gpus: int, tmp: Path, python: str, name: str = "TorchTitan 8B TP8 x PP4 x FSDP",
              config: list[str] = TITAN_8B, subcommands: tuple[str, ...] = ()) -> tuple[str, int, Run, Run, float]:
    """Its simulated step is step 2's on rank 0, between the optimizer kernels that end steps 1
    and 2: the runs' simulated ends also hold TorchTitan's start-up, whose simulated length
    varies from run to run (docs/scale.md)."""
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    from frameworks.torchtitan.assets import write_assets
    from frameworks.torchtitan.run import step_ends_us

    workdir = tmp / f"titan{gpus}"
    workdir.mkdir(exist_ok=True)
    write_assets(workdir, documents=max(2000, 2 * gpus))  # every data-parallel rank needs a shard of the stand-in C4
    env = dict(os.environ, HF_HOME=str(workdir / "hf"), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    runs = []
    for steps in (1, 2):
        command = [str(Path(python).parent / "torchrun"), "--nnodes", str(gpus // 8), "--nproc-per-node", "8",
                   "-m", "torchtitan.train", *config, "--training.steps", str(steps), "--training.disable_cuda_graphs",
                   "--hf_assets_path", "./tests/assets/tokenizer", "--dataloader.dataset", "c4_test",
                   *subcommands]  # last: options after a subcommand are the subcommand's
        runs.append(trace(command, ["--ranks", "auto"], workdir / f"run{steps}.json", workdir, env))
    if runs[1].trace_mib > 1024:  # a 4,096-GPU JSON trace does not fit in memory parsed: the runs' difference
        return f"{name} (*)", gpus, runs[0], runs[1], runs[1].simulated_ms - runs[0].simulated_ms
    ends = step_ends_us(workdir / "run2.json", 0, 2)
    return name, gpus, runs[0], runs[1], (ends[1] - ends[0]) / 1e3


MEGATRON_8B = ["--tp", "8", "--pp", "4", "--virtual-pipeline-model-parallel-size", "2", "--num-layers", "32",
               "--hidden-size", "4096", "--num-attention-heads", "32", "--ffn-hidden-size", "14336",
               "--seq-length", "4096", "--vocab-size", "128256", "--micro-batch-size", "1", "--num-microbatches", "8"]


# OLMoE-1B-7B's shape (16 layers, hidden 2048, 16 heads, 64 experts of FFN 1024, top-8, vocab
# 50304) with expert parallelism 8 over data parallelism on every GPU, Megatron-Core's alltoall
# dispatcher, local spec (SequentialMLP over each rank's 8 experts), sequence 4096, 4 microbatches
MEGATRON_MOE = ["--tp", "1", "--pp", "1", "--num-layers", "16", "--hidden-size", "2048", "--num-attention-heads", "16",
                "--ffn-hidden-size", "1024", "--seq-length", "4096", "--vocab-size", "50304", "--micro-batch-size", "1",
                "--num-microbatches", "4", "--num-experts", "64", "--moe-router-topk", "8",
                "--expert-model-parallel-size", "8"]


def megatron_row(gpus: int, tmp: Path, python: str, name: str = "Megatron 8B TP8 x PP4 (VP 2) x DP",
                 config: list[str] = MEGATRON_8B) -> tuple[str, int, Run, Run, float]:
    """Megatron-Core (tests/frameworks/megatron/pretrain_gpt.py, public megatron.core APIs): by default TP 8 x
    PP 4 (interleaved, 2 model chunks per rank) x DP, distributed optimizer; MEGATRON_MOE for the MoE row.
    The simulated step is the difference of the 1- and 2-iteration runs' simulated time."""
    script = ROOT / "tests/frameworks/megatron/pretrain_gpt.py"
    runs = []
    for iters in (1, 2):
        command = [str(Path(python).parent / "torchrun"), "--nnodes", str(gpus // 8), "--nproc-per-node", "8",
                   str(script), *config, "--train-iters", str(iters)]
        runs.append(trace(command, ["--ranks", "auto"], tmp / f"megatron{gpus}-{iters}.json", ROOT))
    return name, gpus, runs[0], runs[1], runs[1].simulated_ms - runs[0].simulated_ms


EXAMPLES = {  # small models: the point is the comparison, and --ranks all at 64 ranks
    "DDP": ["examples/ddp_train.py", "--bucket-mb", "4"],
    "FSDP2": ["examples/fsdp_train.py"],
    "TP 4 x FSDP2": ["examples/tp_fsdp_train.py", "--tp", "4"],
    "PP (1F1B)": ["examples/pp_train.py", "--microbatches", "8"],
}
SMALL = ["--layers", "4", "--embd", "256", "--heads", "4", "--seq", "256", "--batch", "8", "--steps", "3"]


def _timelines(path: Path) -> tuple[dict, dict]:
    steps: dict[int, list[float]] = {}
    ends: dict[int, list[tuple]] = {}
    for e in orjson.loads(path.read_bytes())["traceEvents"]:
        if e.get("ph") != "X":
            continue
        if e["name"].startswith("ProfilerStep"):
            steps.setdefault(e["pid"], []).append(e["dur"])
        elif e["name"].startswith("ncclDevKernel"):
            ends.setdefault(e["pid"], []).append((e["args"]["op"], e["ts"] + e["dur"]))
    return steps, {pid: sorted(v, key=lambda x: x[1]) for pid, v in ends.items()}


def equivalence(gpus: list[int], tmp: Path, examples: list[str]) -> None:
    print(f"{'example':<14} {'GPUs':>5} {'processes':>9} {'wall auto s':>11} {'wall all s':>10} {'same ranks':>10} "
          f"{'max step diff':>13} {'max coll. end diff us':>21}", flush=True)
    for name, (script, *extra) in EXAMPLES.items():
        if name not in examples:
            continue
        for n in gpus:
            if name.startswith("PP") and n > 8:
                continue  # one stage per rank: nothing is mirrored (auto starts again with every rank), and
                # past 8 stages pp_train's 8 microbatches are too few (ValueError: the default list stopped at 16)
            args = [*SMALL, *extra] if not name.startswith("PP") else [*SMALL[:-4], "--batch", "16", "--layers",
                                                                          str(max(n, 4)), "--steps", "3", *extra]
            runs = {}
            for mode in ("auto", "all"):
                out = tmp / f"eq-{mode}.json"
                options = ["--nnodes", str(max(n // 8, 1)), "--nproc-per-node", str(min(n, 8)), "--ranks", mode]
                runs[mode] = (trace([sys.executable, str(ROOT / script), *args], options, out, ROOT), _timelines(out))
            (ra, (sa, ea)), (rb, (sb, eb)) = runs["auto"], runs["all"]
            same = sorted(sa) == sorted(sb) and all(len(ea.get(p, [])) == len(eb[p]) for p in eb)
            step_diff = max((abs(x - y) / y for p in sb for x, y in zip(sa.get(p, []), sb[p]) if y), default=0.0)
            end_diff = max((abs(x[1] - y[1]) for p in eb for x, y in zip(ea.get(p, []), eb[p])), default=0.0)
            print(f"{name:<14} {n:>5} {ra.processes:>9} {ra.wall_s:>11.1f} {rb.wall_s:>10.1f} {str(same):>10} "
                  f"{step_diff * 100:>12.3f}% {end_diff:>21.3f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="8,64,128,1024,4096", help="GPU counts of the FSDP2 rows")
    ap.add_argument("--titan", default="256,1024", help="GPU counts of the TorchTitan TP x PP x FSDP rows")
    ap.add_argument("--megatron", default="64,256,1024", help="GPU counts of the Megatron-Core TP x PP x DP rows")
    ap.add_argument("--moe", default="1024", help="GPU counts of the TorchTitan DeepSeek-V3 671B EP x FSDP rows")
    ap.add_argument("--moe-pp", default="1024", help="GPU counts of the TorchTitan DeepSeek-V3 671B EP x FSDP x PP 8 rows")
    ap.add_argument("--megatron-moe", default="64,1024", help="GPU counts of the Megatron-Core MoE EP x DP rows")
    ap.add_argument("--only", choices=("fsdp", "titan", "megatron", "megatron-moe", "moe", "moe-pp"), default=None)
    ap.add_argument("--equivalence", action="store_true", help="compare --ranks auto with --ranks all instead")
    ap.add_argument("--equivalence-gpus", default="8,16,32,64")
    ap.add_argument("--examples", default=",".join(EXAMPLES), help="which examples --equivalence runs")
    args = ap.parse_args()
    if args.equivalence:
        with tempfile.TemporaryDirectory() as tmp_dir:
            equivalence([int(g) for g in args.equivalence_gpus.split(",")], Path(tmp_dir), args.examples.split(","))
        return
    print(f"{'config':<34} {'GPUs':>5} {'processes':>9} {'wall 1 step s':>13} {'wall/step s':>11} "
          f"{'CPU/step s':>10} {'network/step s':>14} {'sim step ms':>11} {'peak PSS MiB':>12} {'trace MiB':>9}",
          flush=True)
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        rows = []
        if args.only in (None, "fsdp"):
            rows += [(fsdp_row, int(g)) for g in args.gpus.split(",") if g]
        python = _titan_python() if args.only != "fsdp" else None
        if args.only != "fsdp" and python is None:
            print("TorchTitan and Megatron-Core rows skipped: no torchtitan in the CUDA-build environment (run "
                  "tests/frameworks/test_torchtitan.py once, or set PHANTORA_CUDA_TORCH_PYTHON)")
        elif python is not None:
            if args.only in (None, "titan"):
                rows += [(lambda g, t, p=python: titan_row(g, t, p), int(g)) for g in args.titan.split(",") if g]
            if args.only in (None, "megatron"):
                rows += [(lambda g, t, p=python: megatron_row(g, t, p), int(g)) for g in args.megatron.split(",") if g]
            if args.only in (None, "megatron-moe"):
                rows += [(lambda g, t, p=python: megatron_row(g, t, p, "Megatron MoE (OLMoE shape) EP8 x DP",
                                                              MEGATRON_MOE), int(g))
                         for g in args.megatron_moe.split(",") if g]
            if args.only in (None, "moe"):
                rows += [(lambda g, t, p=python: titan_row(g, t, p, "TorchTitan 671B MoE EP64 x FSDP", TITAN_671B_MOE,
                                                                     ("activation-checkpoint:full",)),
                          int(g)) for g in args.moe.split(",") if g]
            if args.only in (None, "moe-pp"):
                rows += [(lambda g, t, p=python: titan_row(g, t, p, "TorchTitan 671B MoE EP64 x FSDP x PP8",
                                                           TITAN_671B_MOE_PP, ("activation-checkpoint:full",)),
                          int(g)) for g in args.moe_pp.split(",") if g]
        for make, gpus in rows:
            try:
                name, gpus, one, two, step_ms = make(gpus, tmp)
            except (RuntimeError, subprocess.TimeoutExpired) as e:  # one failed row: say so, run the rest
                print(f"{'(failed)':<34} {gpus:>5} {str(e).splitlines()[0][:200]}\n{str(e)[-1500:]}", flush=True)
                continue
            step = f"{step_ms:11.1f}"
            print(f"{name:<34} {gpus:>5} {two.processes:>9} {one.wall_s:>13.1f} {two.wall_s - one.wall_s:>11.1f} "
                  f"{two.cpu_s - one.cpu_s:>10.1f} {two.network_s - one.network_s:>14.1f} {step} {two.peak_mib:>12.0f} {two.trace_mib:>9.1f}", flush=True)
            for f in tmp.glob("*.json"):
                f.unlink()


if __name__ == "__main__":
    main()
