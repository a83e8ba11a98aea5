"""`phantora trace`: start the simulator, run the user's command interposed, write the trace.

The command runs as a child process with the bootstrap directory first on PYTHONPATH and the
simulator's socket in PHANTORA_SOCKET; every Python process it starts that imports torch and
touches a GPU becomes a rank. The child's exit code becomes ours (128+N when a signal N
killed it, as shells report it). Ctrl-C or SIGTERM: the children are asked to stop, then
killed after a grace period, and the trace written so far is closed properly.
"""

from __future__ import annotations

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
from phantora.cost import make_estimator
from phantora.engine.engine import Engine, EngineSummary
from phantora.hardware import GPUSpec
from phantora.simulator.server import SimulatorServer
from phantora.trace import open_sink

BOOTSTRAP_DIR = Path(interpose.__file__).resolve().parent / "bootstrap"
PACKAGE_ROOT = Path(interpose.__file__).resolve().parent.parent
GRACE_S = 10.0


@dataclass
class TraceRun:
    command: list[str]
    output: Path
    gpu: GPUSpec
    vram_bytes: int | None = None
    gpus_per_node: int = 8
    estimator: str = "analytical"
    call_timeout_s: float = 600.0
    extra_env: dict[str, str] = field(default_factory=dict)


@dataclass
class TraceResult:
    exit_code: int
    summary: EngineSummary
    wall_s: float
    internal_errors: list[str]


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


class CommandNotFound(FileNotFoundError):
    pass


def run_trace(run: TraceRun) -> TraceResult:
    if shutil.which(run.command[0]) is None and not os.path.exists(run.command[0]):
        raise CommandNotFound(f"command not found: {run.command[0]}")
    started = time.time()
    sink = open_sink(run.output)
    engine = Engine(run.gpu, make_estimator(run.estimator, run.gpu), sink)
    server = SimulatorServer(engine)
    exit_code = 1
    proc: subprocess.Popen | None = None
    interrupted: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        interrupted.append(signum)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)

    old_handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            proc = subprocess.Popen(run.command, env=child_env(run, server.socket_path))
        except (FileNotFoundError, PermissionError) as e:
            raise CommandNotFound(f"cannot run {run.command[0]!r}: {e.strerror}") from e
        deadline: list[float] = []

        def keep_going() -> bool:
            if proc.poll() is not None:
                return False
            if interrupted and not deadline:
                deadline.append(time.monotonic() + GRACE_S)
            if deadline and time.monotonic() > deadline[0]:
                proc.kill()
            return True

        server.serve(keep_going)
        rc = proc.wait()
        exit_code = 128 - rc if rc < 0 else rc
        if interrupted and rc == 0:
            exit_code = 128 + interrupted[0]
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        for s, h in old_handlers.items():
            signal.signal(s, h)
        server.close()
        summary = engine.summary()
        engine.close({
            "phantora_version": __version__,
            "command": run.command,
            "gpu": run.gpu.key,
            "gpus_per_node": run.gpus_per_node,
            "estimator": run.estimator,
            "exit_code": exit_code,
            "started_at": _dt.datetime.fromtimestamp(started, _dt.timezone.utc).isoformat(),
            "wall_seconds": round(time.time() - started, 3),
            "simulated_ns": summary.simulated_ns,
        })
    return TraceResult(exit_code, summary, time.time() - started, server.internal_errors)


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
    total = run.vram_bytes or run.gpu.total_memory
    for (rank, dev), peak in sorted(s.peak_allocated.items()):
        lines.append(f"  peak memory rank {rank} cuda:{dev}: {format_bytes(peak)} allocated, "
                     f"{format_bytes(s.peak_reserved[(rank, dev)])} reserved (of {format_bytes(total)})")
    if s.unknown_ops:
        calls = sum(s.unknown_ops.values())
        top = ", ".join(f"{k} ({v})" for k, v in sorted(s.unknown_ops.items(), key=lambda kv: -kv[1])[:5])
        lines.append(f"  unknown ops: {len(s.unknown_ops)} kinds, {calls} calls, timed as memory-bound: {top}")
    else:
        lines.append("  unknown ops: none")
    if s.ooms:
        lines.append(f"  out-of-memory errors raised in the script: {s.ooms}")
    if result.internal_errors:
        lines.append(f"  simulator errors: {len(result.internal_errors)} (see messages above)")
    lines.append(f"  trace: {run.output}")
    return "\n".join(lines)


def print_summary(run: TraceRun, result: TraceResult) -> None:
    print(format_summary(run, result), file=sys.stderr, flush=True)
