"""`phantora trace`: start the simulator, run the user's command interposed, write the trace.

The command runs as a child process with the bootstrap directory first on PYTHONPATH and the
simulator's socket in PHANTORA_SOCKET; every Python process it starts that imports torch and
touches a GPU becomes a rank. The child's exit code becomes ours (128+N when a signal N
killed it, as shells report it). Ctrl-C or SIGTERM: the children are asked to stop, then
killed after a grace period, and the trace written so far is closed properly.
"""

from __future__ import annotations

from typing import Any

import datetime as _dt
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import interpose
from phantora import __version__
from phantora.cost import EstimatorChoice, choose_estimator
from phantora.engine.engine import Engine, EngineSummary
from phantora.engine.timeline import TimingConfig
from phantora.hardware import GPUSpec
from phantora.net.cluster import Cluster
from phantora.net.network import Network
from phantora.simulator.server import SimulatorServer
from phantora.trace import TeeSink, TraceSink, open_sink
from phantora.trace.kineto import KinetoExport, KinetoSink

BOOTSTRAP_DIR = Path(interpose.__file__).resolve().parent / "bootstrap"
PACKAGE_ROOT = Path(interpose.__file__).resolve().parent.parent
FAILURE_SETTLE_S = 1.0  # from a rank's failure to ending the others (torchrun-like)
GRACE_S = 10.0


@dataclass
class TraceRun:
    command: list[str]
    output: Path
    gpu: GPUSpec
    vram_bytes: int | None = None
    gpus_per_node: int = 8
    estimator: str = "auto"  # --kernel-times: auto, analytical, calibrated, measured
    calibration: Path | None = None  # --calibration: a measured table (shared/calibration format)
    call_timeout_s: float = 600.0
    extra_env: dict[str, str] = field(default_factory=dict)
    cluster: Cluster | None = None  # the network collectives run on (default: one dgx-h100 node)
    nproc_per_node: int | None = None  # None: run COMMAND once (it may be torchrun itself)
    collective_timeout_s: float = 300.0
    comm_slowdown: float = TimingConfig.comm_slowdown
    sync: str = "optimistic"  # --sync: optimistic or conservative (Engine)
    kineto_dir: Path | None = None  # also write one Kineto trace per rank here (for HTA)


@dataclass
class TraceResult:
    exit_code: int
    summary: EngineSummary
    wall_s: float
    internal_errors: list[str]
    rank_errors: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # ranks that exited with an error
    kineto: KinetoExport | None = None
    kernel_times: EstimatorChoice | None = None


def child_env(run: TraceRun, socket_path: str) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(BOOTSTRAP_DIR), str(PACKAGE_ROOT)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PHANTORA_SOCKET"] = socket_path
    env["PHANTORA_GPU"] = run.gpu.key
    env["PHANTORA_DEVICE_COUNT"] = str(run.gpus_per_node)
    env["PHANTORA_CALL_TIMEOUT"] = str(run.call_timeout_s)
    if run.vram_bytes:
        env["PHANTORA_VRAM"] = str(run.vram_bytes)
    env.update(run.extra_env)
    return env


def rank_env(run: TraceRun, rank: int, master_port: int, run_id: str) -> dict[str, str]:
    """The environment torchrun gives worker `rank` (same variable names and meanings)."""
    assert run.nproc_per_node is not None and run.cluster is not None
    nproc, nnodes = run.nproc_per_node, run.cluster.nodes
    node, local = divmod(rank, nproc)
    return {
        "RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": str(nproc * nnodes),
        "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": str(node), "GROUP_WORLD_SIZE": str(nnodes),
        "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(nproc * nnodes), "ROLE_NAME": "default",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_USE_AGENT_STORE": "False", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CommandNotFound(FileNotFoundError):
    pass


class LaunchError(ValueError):
    pass


def run_trace(run: TraceRun) -> TraceResult:
    if shutil.which(run.command[0]) is None and not os.path.exists(run.command[0]):
        raise CommandNotFound(f"command not found: {run.command[0]}")
    if run.cluster is None:
        from phantora.net.cluster import load_cluster

        run.cluster = load_cluster("dgx-h100", nodes=1)
    if run.nproc_per_node is not None and run.nproc_per_node > run.cluster.gpus_per_node:
        raise LaunchError(f"--nproc-per-node {run.nproc_per_node} is more than the {run.cluster.gpus_per_node} GPUs "
                          f"of a {run.cluster.name} node; use at most {run.cluster.gpus_per_node} or more --nnodes")
    started = time.time()
    kernel_times = choose_estimator(run.estimator, run.gpu, calibration=run.calibration)  # KernelTimesError
    # The export directory first: it only creates the directory, while open_sink opens a file.
    kineto = KinetoSink(run.kineto_dir, run.gpu, run.vram_bytes) if run.kineto_dir is not None else None
    sink: TraceSink = open_sink(run.output)
    if kineto is not None:
        sink = TeeSink([sink, kineto])
    engine = Engine(run.gpu, kernel_times.estimator, sink, TimingConfig(comm_slowdown=run.comm_slowdown),
                    network=Network(run.cluster), sync=run.sync)
    server = SimulatorServer(engine, collective_timeout_s=run.collective_timeout_s)
    exit_code = 1
    procs: list[subprocess.Popen] = []
    failures: list[str] = []
    interrupted: list[int] = []

    def stop_all(sig: int) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(sig)

    def on_signal(signum: int, _frame: object) -> None:
        interrupted.append(signum)
        stop_all(signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)

    old_handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        base_env = child_env(run, server.socket_path)
        if run.nproc_per_node is None:
            envs = [base_env]
        else:
            port, run_id = _free_port(), f"phantora-{os.getpid()}"
            envs = [dict(base_env, **rank_env(run, r, port, run_id))
                    for r in range(run.nproc_per_node * run.cluster.nodes)]
        for env in envs:
            try:
                procs.append(subprocess.Popen(run.command, env=env))
            except (FileNotFoundError, PermissionError) as e:
                stop_all(signal.SIGTERM)
                raise CommandNotFound(f"cannot run {run.command[0]!r}: {e.strerror}") from e
        deadline: list[float] = []
        first_failure: list[float] = []

        def keep_going() -> bool:
            alive = [p for p in procs if p.poll() is None]
            if not alive:
                return False
            if len(procs) > 1 and not deadline:
                failed = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode not in (None, 0)]
                if failed and not first_failure:
                    first_failure.append(time.monotonic())
                # A rank that crashes fails its peers' pending collectives; give the crashing
                # rank a moment to finish exiting so the report names it, not only its victims.
                if failed and time.monotonic() - first_failure[0] >= FAILURE_SETTLE_S:
                    # torchrun: one failed worker ends the others
                    failures.extend(f"rank {i} exited with code {rc}" if rc > 0 else
                                    f"rank {i} was killed by signal {-rc}" for i, rc in failed)
                    stop_all(signal.SIGTERM)
                    deadline.append(time.monotonic() + GRACE_S)
            if interrupted and not deadline:
                deadline.append(time.monotonic() + GRACE_S)
            if deadline and time.monotonic() > deadline[0]:
                for p in alive:
                    p.kill()
            return True

        server.serve(keep_going)
        codes = [p.wait() for p in procs]
        if len(procs) == 1:
            rc = codes[0]
            exit_code = 128 - rc if rc < 0 else rc
        else:
            exit_code = 0 if all(c == 0 for c in codes) else 1  # as torchrun exits
            if exit_code and not failures:
                failures.extend(f"rank {i} exited with code {c}" for i, c in enumerate(codes) if c != 0)
        if interrupted and exit_code == 0:
            exit_code = 128 + interrupted[0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for s, h in old_handlers.items():
            signal.signal(s, h)
        server.close()
        summary = engine.summary()
        engine.close({
            "phantora_version": __version__,
            "command": run.command,
            "gpu": run.gpu.key,
            "gpus_per_node": run.gpus_per_node,
            "cluster": run.cluster.name,
            "nodes": run.cluster.nodes,
            "nproc_per_node": run.nproc_per_node,
            "estimator": kernel_times.estimator.name,
            "kernel_times": kernel_times.metadata(),
            "exit_code": exit_code,
            "started_at": _dt.datetime.fromtimestamp(started, _dt.timezone.utc).isoformat(),
            "wall_seconds": round(time.time() - started, 3),
            "simulated_ns": summary.simulated_ns,
            "network_rollbacks": summary.rollbacks,
            "stale_replies": summary.stale_replies,
            "largest_stale_error_ns": summary.largest_stale_error_ns,
            "sync": run.sync,
            "early_reads": summary.early_reads,
        })
    return TraceResult(exit_code, summary, time.time() - started, server.internal_errors, server.rank_errors, failures,
                       kineto.export if kineto else None, kernel_times)


def format_bytes(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def format_summary(run: TraceRun, result: TraceResult) -> str:
    s = result.summary
    lines = [
        f"phantora: simulated {s.ranks} rank(s) on {run.gpu.device_name} ({run.gpu.key}); "
        f"{s.simulated_ns / 1e9:.6f} s of simulated time in {result.wall_s:.1f} s of wall time",
        f"  ops {s.ops:,}   kernels {s.kernels:,}   GPU busy {s.gpu_busy_ns / 1e9:.6f} s   "
        f"{s.flops / 1e12:.2f} TFLOP",
    ]
    if s.ranks == 0:
        lines.append("  no process used a virtual GPU" + _hidden_gpus_note(run))
    total = run.vram_bytes or run.gpu.total_memory
    for (rank, dev), peak in sorted(s.peak_allocated.items()):
        lines.append(f"  peak memory rank {rank} cuda:{dev}: {format_bytes(peak)} allocated, "
                     f"{format_bytes(s.peak_reserved[(rank, dev)])} reserved (of {format_bytes(total)})")
    lines.extend(kernel_times_lines(result))
    if s.unknown_ops:
        calls = sum(s.unknown_ops.values())
        top = ", ".join(f"{k} ({v})" for k, v in sorted(s.unknown_ops.items(), key=lambda kv: -kv[1])[:5])
        lines.append(f"  unknown ops: {len(s.unknown_ops)} kinds, {calls} calls, timed as memory-bound: {top}")
    else:
        lines.append("  unknown ops: none")
    if s.collectives:
        lines.extend(collective_lines(run, s))
    if s.ooms:
        lines.append(f"  out-of-memory errors raised in the script: {s.ooms}")
    for msg in result.failures:
        lines.append(f"  {msg}")
    for msg in result.rank_errors[:5]:
        lines.append("  collective error: " + msg.splitlines()[0])
    if result.internal_errors:
        lines.append(f"  simulator errors: {len(result.internal_errors)} (see messages above)")
    lines.append(f"  trace: {run.output}")
    if result.kineto is not None:
        k = result.kineto
        lines.append(f"  kineto traces (for HTA): {len(k.files)} file(s) in {k.directory}/ "
                     f"({', '.join(p.name for p in k.files[:4])}{', ...' if len(k.files) > 4 else ''})")
        if k.removed_stale:
            lines.append(f"    removed {len(k.removed_stale)} rank file(s) of an earlier run: "
                         + ", ".join(p.name for p in k.removed_stale[:4]))
        if k.other_trace_files:
            lines.append(f"    note: HTA will also load {len(k.other_trace_files)} other .json/.gz file(s) there: "
                         + ", ".join(p.name for p in k.other_trace_files[:4]))
    return "\n".join(lines)


def collective_lines(run: TraceRun, s: Any) -> list[str]:
    """Collectives, rollbacks and stale replies, each in words a user can act on."""
    lines = [f"  collectives {s.collectives:,} (per rank, summed)   communication busy {s.comm_busy_ns / 1e9:.6f} s",
             f"  network rollbacks {s.rollbacks}: times the network re-simulated flows because a rank, running "
             "behind in simulated time, started a collective in the network's past"]
    stale = (f"{s.stale_replies} of them stale (a later rollback moved that end, by up to "
             f"{s.largest_stale_error_ns / 1e3:.1f} us; the script saw the old time)" if s.stale_replies
             else "none of them changed afterwards")
    if run.sync == "conservative":
        stale = "none stale: conservative mode holds a waiting rank until the end is final"
    lines.append(f"  --sync {run.sync}: {s.early_reads} collective end(s) were read by a waiting host (synchronize, "
                 f".item(), Work.wait) before they were final; {stale}")
    return lines


def _hidden_gpus_note(run: TraceRun) -> str:
    from interpose.runtime import visible_devices

    value = run.extra_env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    if value is not None and not visible_devices(value, run.gpus_per_node):
        return (f" (CUDA_VISIBLE_DEVICES={value!r} hides all {run.gpus_per_node} GPUs of the node, so "
                "torch.cuda.is_available() is False in the script)")
    return ""


def kernel_times_lines(result: TraceResult) -> list[str]:
    """Which estimator timed the kernels, how many each timed, and what the user must know."""
    choice = result.kernel_times
    if choice is None:
        return []
    lines = [f"  kernel times: {choice.description}"]
    by = result.summary.kernels_by_estimator
    if by:
        # Labels are "estimator (why)": count per estimator first, so the line never reads as if
        # the headline estimator timed kernels it did not.
        families: dict[str, dict[str, int]] = {}
        for label, n in by.items():
            name, _, why = label.partition(" (")
            families.setdefault(name, {})[why.rstrip(")")] = n
        parts = []
        for name, whys in sorted(families.items(), key=lambda kv: -sum(kv[1].values())):
            detail = ", ".join(f"{n:,} {why}" for why, n in sorted(whys.items(), key=lambda kv: -kv[1]) if why)
            parts.append(f"{sum(whys.values()):,} {name}" + (f" ({detail})" if detail else ""))
        lines.append("    kernels timed: " + "; ".join(parts))
    lines.extend(f"    {line}" for line in choice.after_run())
    lines.extend(f"    note: {note}" for note in choice.notes)
    return lines


def print_summary(run: TraceRun, result: TraceResult) -> None:
    print(format_summary(run, result), file=sys.stderr, flush=True)
