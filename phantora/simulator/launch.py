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
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import interpose
from interpose.host.host_time import ENV as HOST_TIME_ENV
from interpose.launch.warm import STDERR_ENV, STDOUT_ENV
from phantora import __version__
from phantora.cache import build_once, cache_dir
from phantora.cost import EstimatorChoice, choose_estimator
from phantora.cost import host_bench
from phantora.cost.host import DEFAULT_HOST, DEFAULT_HOST_TIME, HostSpec, lookup_host
from phantora.engine.engine import Engine, EngineSummary
from phantora.engine.mirrors import RolesRefuted
from phantora.engine.timeline import TimingConfig
from phantora.hardware import GPUSpec
from phantora.net.cluster import Cluster
from phantora.net.network import Network
from phantora.roles import ENV as REPRESENTATIVES_ENV
from phantora.roles import RankRoles, RanksChoiceError
from phantora.mask_fraction import DEFAULT as DEFAULT_MASK_FRACTION
from phantora.mask_fraction import ENV as MASK_FRACTION_ENV
from phantora.routing import ENV as ROUTING_ENV
from phantora.routing import RoutingModel
from phantora.simulator.failure import SimulatorFailure
from phantora.simulator.forkserver import RankProcess, start_rank_processes
from phantora.simulator.progress import Progress
from phantora.simulator.server import SimulatorServer
from phantora.simulator.torchrun import WorkerOutput, parse_torchrun
from phantora.simulator.worker_logs import Tails, worker_outputs
from phantora.trace import TeeSink, TraceSink, open_sink
from phantora.trace.kineto import KinetoExport, KinetoSink

BOOTSTRAP_DIR = Path(interpose.__file__).resolve().parent / "launch" / "bootstrap"
PACKAGE_ROOT = Path(interpose.__file__).resolve().parent.parent
PACKAGES = ("phantora", "interpose")  # what the command's processes import of phantora
# A rank that ended leaves its peers waiting in collectives it never joined. If it failed, this
# launcher stops them (SIGTERM) as soon as it sees its exit code, as torchrun does; they fail
# with "exited without joining" only if it is still running this long after the rank said bye
# (a rank that exited 0 without joining; a rank whose teardown is slow under load).
ABANDON_GRACE_S = 5.0
GRACE_S = 10.0


@dataclass
class TraceRun:
    command: list[str]
    output: Path
    gpu: GPUSpec
    vram_bytes: int | None = None
    host: HostSpec = field(default_factory=lambda: lookup_host(DEFAULT_HOST))  # --host: the CPU's speed
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
    quiet: bool = False  # --quiet: no status line, no periodic status lines
    status_every_s: float = 30.0  # --status-every: plain status lines off a terminal; hang notices after it
    ranks: str = "default"  # --ranks: which ranks run as processes (phantora/roles.py)
    witness: bool = False  # also run the last rank as a witness (set when --ranks auto found the stages)
    routing: RoutingModel = field(default_factory=RoutingModel)  # --routing: MoE routers' choices (phantora/routing.py)
    mask_fraction: float = DEFAULT_MASK_FRACTION  # --mask-fraction: comparisons on unknown data (phantora/mask_fraction.py)
    host_time: str = DEFAULT_HOST_TIME  # --host-time: the program's Python counted, measured here, or modelled (timeline.py)
    startup_costs: bool = True  # --startup-costs: a fresh process's one-off costs (phantora/cost/startup.py)
    worker_output: WorkerOutput | None = None  # an adopted torchrun line's output options (worker_logs.py)


MIRROR_FROM_RANKS = 65  # --ranks default: every rank runs up to 64 ranks, rank 0 stands for the rest above


def adopt_torchrun(run: TraceRun) -> None:
    """A torchrun COMMAND whose workers phantora must start itself: several nodes (torchrun's
    agent would wait for the other nodes' agents) or representative ranks (--ranks). The run then
    starts torchrun's workers as --nproc-per-node does (torchrun.py). phantora's own --nproc-per-node
    in front of a torchrun line would start torchrun once per rank, every agent on the same port: the
    line is adopted instead, if the two agree."""
    if run.nproc_per_node is None and run.ranks in ("default", "all") and not any(
            a.startswith("--nnodes") for a in run.command[1:]):
        return  # one node, every rank: torchrun itself runs (no need to read its line)
    line = parse_torchrun(run.command)  # TorchrunLineError
    if line is None:
        return
    assert run.cluster is not None
    nproc = line.nproc_per_node or run.cluster.gpus_per_node
    if run.nproc_per_node is not None:
        if run.nproc_per_node != nproc:
            raise LaunchError(f"phantora --nproc-per-node {run.nproc_per_node} and torchrun --nproc-per-node {nproc} "
                              "disagree; torchrun's is enough")
        run.nproc_per_node = None  # torchrun's line starts the workers, as below
    world = nproc * line.nnodes
    if line.nnodes == 1 and (run.ranks == "all" or (run.ranks == "default" and world < MIRROR_FROM_RANKS)):
        return
    if run.cluster.nodes not in (1, line.nnodes):
        raise LaunchError(f"phantora --nnodes {run.cluster.nodes} and torchrun --nnodes {line.nnodes} disagree; "
                          "torchrun's is enough")
    run.cluster = replace(run.cluster, nodes=line.nnodes)
    run.command, run.nproc_per_node, run.worker_output = line.worker, nproc, line.output


def rank_roles(run: TraceRun) -> RankRoles | None:
    """Which ranks run as processes (None: COMMAND runs once and starts its own ranks)."""
    if run.nproc_per_node is None:
        if run.ranks not in ("default", "all"):
            raise RanksChoiceError(f"--ranks {run.ranks} needs --nproc-per-node (or a torchrun command): phantora "
                                   "starts the rank processes itself to run only some of them")
        return None
    assert run.cluster is not None
    world = run.nproc_per_node * run.cluster.nodes
    choice = run.ranks if run.ranks != "default" else ("auto" if world >= MIRROR_FROM_RANKS else "all")
    return RankRoles.parse(choice, world, witness=run.witness)


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
    simulator_error: SimulatorFailure | None = None  # the simulator itself failed (exit code 1)
    refuted: RolesRefuted | None = None  # --ranks auto was refuted: the run stopped, to start again


def import_dir(root: Path = PACKAGE_ROOT) -> Path:
    """The folder the command's processes import phantora's two packages from (on their
    PYTHONPATH). From a checkout, its root. From an installed phantora, whose packages sit in a
    site-packages with the rest of phantora's environment, a folder of links to the two only: the
    whole site-packages would come before the command's own, so a script run by another
    environment's Python (one with a CUDA build of torch, a framework's venv) imported phantora's
    torch instead of its own, or failed on another Python version's binary modules."""
    if root.name not in ("site-packages", "dist-packages") and next(root.glob("*.dist-info"), None) is None:
        return root
    target = cache_dir() / "import-dir" / hashlib.sha256(str(root).encode()).hexdigest()[:16]

    def link_packages(target: Path) -> None:
        staging = target.with_name(f"{target.name}.{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        for name in PACKAGES:
            (staging / name).symlink_to(root / name, target_is_directory=True)
        staging.rename(target)  # whole: a concurrent run never sees one link of two

    return build_once(target, link_packages)


def child_env(run: TraceRun, socket_path: str) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(BOOTSTRAP_DIR), str(import_dir())]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PHANTORA_SOCKET"] = socket_path
    env["PHANTORA_GPU"] = run.gpu.key
    env["PHANTORA_DEVICE_COUNT"] = str(run.gpus_per_node)
    env["PHANTORA_CALL_TIMEOUT"] = str(run.call_timeout_s)
    if run.vram_bytes:
        env["PHANTORA_VRAM"] = str(run.vram_bytes)
    env[ROUTING_ENV] = run.routing.spec()
    env[MASK_FRACTION_ENV] = repr(run.mask_fraction)
    env[HOST_TIME_ENV] = run.host_time
    env.update(run.extra_env)
    return env


def rank_env(run: TraceRun, rank: int, master_port: int, run_id: str) -> dict[str, str]:
    """The environment torchrun gives worker `rank` (same variable names and meanings)."""
    assert run.nproc_per_node is not None and run.cluster is not None
    nproc, nnodes = run.nproc_per_node, run.cluster.nodes
    node, local = divmod(rank, nproc)
    role = run.worker_output.role if run.worker_output is not None else "default"
    return {
        "RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": str(nproc * nnodes),
        "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": str(node), "GROUP_WORLD_SIZE": str(nnodes),
        "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(nproc * nnodes), "ROLE_NAME": role,
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_USE_AGENT_STORE": "False", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }


def _reserve_port() -> socket.socket:
    """A port for rank 0's c10d store, held until the run ends.

    The socket stays bound (SO_REUSEADDR, never listening), so no other process's bind(0) or
    outgoing connection is given this port while rank 0 starts up (seconds: it imports torch
    first), yet rank 0's TCPStore, which also sets SO_REUSEADDR, can bind and listen on it.
    Choosing a free port and closing it at once, as before, let a parallel job take the port
    in that window (EADDRINUSE in rank 0, seen in CI)."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", 0))
    return holder


class CommandNotFound(FileNotFoundError):
    pass


class LaunchError(ValueError):
    pass


def run_trace(run: TraceRun) -> TraceResult:
    """Run COMMAND interposed and write the trace. With --ranks auto, a run whose ranks show
    that they are not all alike (pipeline stages sending to each other) is stopped and run again
    with one representative per stage, as the refutation names them."""
    result = _trace_once(run)
    if result.refuted is not None:
        e = result.refuted
        print(f"phantora: {e}\nphantora: starting again with --ranks {','.join(map(str, e.representatives))}",
              file=sys.stderr, flush=True)
        run.ranks, run.witness = ",".join(map(str, e.representatives)), True
        result = _trace_once(run)
    return result


def _trace_once(run: TraceRun) -> TraceResult:
    if shutil.which(run.command[0]) is None and not os.path.exists(run.command[0]):
        raise CommandNotFound(f"command not found: {run.command[0]}")
    if run.cluster is None:
        from phantora.net.cluster import load_cluster

        run.cluster = load_cluster("dgx-h100", nodes=1)
    adopt_torchrun(run)  # TorchrunLineError, LaunchError
    if run.nproc_per_node is not None and run.nproc_per_node > run.cluster.gpus_per_node:
        raise LaunchError(f"--nproc-per-node {run.nproc_per_node} is more than the {run.cluster.gpus_per_node} GPUs "
                          f"of a {run.cluster.name} node; use at most {run.cluster.gpus_per_node} or more --nnodes")
    roles = rank_roles(run)  # RanksChoiceError
    started = time.time()
    kernel_times = choose_estimator(run.estimator, run.gpu, calibration=run.calibration)  # KernelTimesError
    # The export directory first: it only creates the directory, while open_sink opens a file.
    kineto = KinetoSink(run.kineto_dir, run.gpu, run.vram_bytes) if run.kineto_dir is not None else None
    sink: TraceSink = open_sink(run.output)
    if kineto is not None:
        sink = TeeSink([sink, kineto])
    timing = TimingConfig(comm_slowdown=run.comm_slowdown, host_speed=run.host.speed, kernel_gap_ns=run.gpu.kernel_gap_ns,
                          host_time=run.host_time, startup_costs=run.startup_costs)
    engine = Engine(run.gpu, kernel_times.estimator, sink, timing, network=Network(run.cluster), sync=run.sync)
    if roles is not None and run.nproc_per_node is not None:
        engine.mirror_ranks(roles, run.nproc_per_node)
        if roles.mirrored and run.routing.kind != "balanced":
            engine.warn(f"--routing {run.routing.spec().split('#')[0]} with mirrored ranks (--ranks {run.ranks}): a "
                        "mirrored rank computes what its representative does, so expert-parallel ranks holding "
                        "popular experts are simulated as busy as their representatives; --ranks all simulates each "
                        "rank's own load (docs/moe.md)")
    server = SimulatorServer(engine, collective_timeout_s=run.collective_timeout_s)
    server.restart_when_refuted = run.ranks in ("auto", "default")
    exit_code = 1
    ranks = RankWatch(server)
    procs = ranks.procs
    if run.nproc_per_node is not None:
        server.abandon_grace_s = ABANDON_GRACE_S  # this launcher stops the others on a failure
    server.progress = progress = Progress(quiet=run.quiet, every_s=run.status_every_s)

    def on_signal(signum: int, _frame: object) -> None:
        ranks.interrupted.append(signum)
        ranks.stop_all(signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)

    old_handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    port_holder: socket.socket | None = None
    tails: Tails | None = None
    try:
        base_env = child_env(run, server.socket_path)
        if run.nproc_per_node is None:
            envs = [base_env]
        else:
            port_holder = _reserve_port()
            port, run_id = port_holder.getsockname()[1], f"phantora-{os.getpid()}"
            assert roles is not None
            if roles.mirrored:
                base_env[REPRESENTATIVES_ENV] = roles.env_value()
            envs = [dict(base_env, **rank_env(run, r, port, run_id)) for r in roles.processes]
            ranks.ranks = list(roles.processes)
            if run.worker_output is not None and run.worker_output.redirected():
                outputs = worker_outputs(run.worker_output, run.nproc_per_node, list(roles.processes), run_id)
                for env, r in zip(envs, roles.processes):  # each rank opens its own (open_rank_streams)
                    env.update({STDOUT_ENV: outputs[r].stdout, STDERR_ENV: outputs[r].stderr,
                                "TORCHELASTIC_ERROR_FILE": outputs[r].error_file})
                tails = Tails(outputs)
        server.ranks_expected = len(envs) if run.nproc_per_node is not None else 0
        try:
            for proc in start_rank_processes(run.command, envs):  # from a fork server where sound
                procs.append(proc)
        except (FileNotFoundError, PermissionError) as e:
            ranks.stop_all(signal.SIGTERM)
            raise CommandNotFound(f"cannot run {run.command[0]!r}: {e.strerror}") from e
        server.serve(ranks.keep_going)
        ranks.finish()
        exit_code = ranks.exit_code()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if tails is not None:
            tails.stop()
        for s, h in old_handlers.items():
            signal.signal(s, h)
        if port_holder is not None:
            port_holder.close()
        progress.close()
        server.close()
        if server.failure is not None:
            engine.give_up_collectives()
        elif ranks.interrupted:
            _give_up_when_interrupted(engine)
        summary = _summary(engine, server)
        if server.failure is not None:
            server.failure.write_details(run.output.with_name(run.output.name + ".simulator-error.txt"))
        metadata = {
            "phantora_version": __version__,
            "command": run.command,
            "gpu": run.gpu.key,
            "gpus_per_node": run.gpus_per_node,
            "cluster": run.cluster.name,
            "nodes": run.cluster.nodes,
            "nproc_per_node": run.nproc_per_node,
            "representatives": list(summary.representatives) if summary.mirrored else None,
            "mirrored_ranks": summary.mirrored,
            "estimator": kernel_times.estimator.name,
            "kernel_times": kernel_times.metadata(),
            "exit_code": exit_code,
            "started_at": _dt.datetime.fromtimestamp(started, _dt.timezone.utc).isoformat(),
            "wall_seconds": round(time.time() - started, 3),
            "simulated_ns": summary.simulated_ns,
            "network_rollbacks": summary.rollbacks,
            # the network simulator's share of wall_seconds (docs/scale.md reports it per layout)
            "network_wall_seconds": round(engine.network.wall_s, 3) if engine.network is not None else 0.0,
            # its event batches, re-simulation after rollbacks included (how much it simulated)
            "network_event_batches": engine.network.event_batches if engine.network is not None else 0,
            "stale_replies": summary.stale_replies,
            "largest_stale_error_ns": summary.largest_stale_error_ns,
            "sync": run.sync,
            "early_reads": summary.early_reads,
            "moe_routing": {"model": run.routing.describe(), "layers": summary.routing},
            # what a comparison selects on data phantora knows nothing about (--mask-fraction)
            "unknown_mask_fraction": run.mask_fraction,
            "host_time": host_time_metadata(run, summary),
        }
        if server.failure is not None:
            metadata["simulator_error"] = server.failure.message
        _close_trace(engine, sink, metadata, server)
    return TraceResult(exit_code, summary, time.time() - started, server.internal_errors, server.rank_errors,
                       ranks.report(), kineto.export if kineto else None, kernel_times, server.failure,
                       server.refuted)


def format_bytes(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def format_summary(run: TraceRun, result: TraceResult) -> str:
    s = result.summary
    ranks = f"{s.ranks} rank(s)"
    if s.mirrored:
        ranks = (f"{s.ranks + s.mirrored} ranks ({s.ranks} process(es), {s.mirrored} mirrored: --ranks "
                 f"{','.join(map(str, s.representatives))})")
    lines = [
        f"phantora: simulated {ranks} on {run.gpu.device_name} ({run.gpu.key}); "
        f"{s.simulated_ns / 1e9:.6f} s of simulated time in {result.wall_s:.1f} s of wall time",
        f"  ops {s.ops:,}   kernels {s.kernels:,}   GPU busy {s.gpu_busy_ns / 1e9:.6f} s   "
        f"{s.flops / 1e12:.2f} TFLOP",
    ]
    if s.ranks == 0:
        lines.append("  no process used a virtual GPU" + _hidden_gpus_note(run))
    if s.mirror_lag_ns:
        lines.append(f"  mirrored ranks: rank {s.mirror_lag_rank}'s collectives ended up to {s.mirror_lag_ns / 1e3:.1f} us "
                     "after its representative's (the network treats them differently); mirrored ranks follow their "
                     "representative's timeline, so their later work is not delayed by it: --ranks all is exact")
    total = run.vram_bytes or run.gpu.total_memory
    for (rank, dev), peak in sorted(s.peak_allocated.items()):
        lines.append(f"  peak memory rank {rank} cuda:{dev}: {format_bytes(peak)} allocated, "
                     f"{format_bytes(s.peak_reserved[(rank, dev)])} reserved (of {format_bytes(total)})")
    lines.extend(kernel_times_lines(result, run))
    if s.unknown_ops:
        calls = sum(s.unknown_ops.values())
        top = ", ".join(f"{k} ({v})" for k, v in sorted(s.unknown_ops.items(), key=lambda kv: -kv[1])[:5])
        lines.append(f"  unknown ops: {len(s.unknown_ops)} kinds, {calls} calls, timed as memory-bound: {top}")
    else:
        lines.append("  unknown ops: none")
    if s.collectives:
        lines.extend(collective_lines(run, s))
    if s.routing:
        lines.extend(routing_lines(run.routing.describe(), s.routing))
    if s.ooms:
        lines.append(f"  out-of-memory errors raised in the script: {s.ooms}")
    for msg in result.failures:
        lines.append(f"  {msg}")
    if result.rank_errors:
        more = len(result.rank_errors) - 1
        lines.append("  collective error: " + result.rank_errors[0].splitlines()[0]
                     + (f" (and {more} more collective error(s) that followed from it)" if more else ""))
    if result.simulator_error is not None:
        lines.append(result.simulator_error.message)
    elif result.internal_errors:
        lines.append(f"  simulator errors: {len(result.internal_errors)}: " + result.internal_errors[0].splitlines()[-1])
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


def routing_lines(model: str, layers: list[dict], most: int = 8) -> list[str]:
    """MoE routers' decisions: the model, and each layer's imbalance (max/mean tokens per expert)."""
    lines = [f"  MoE routing: {model}; {len(layers)} routing decision(s) (topk/argmax over scores without data, "
             "docs/moe.md)"]
    for d in layers[:most]:
        worst = d["worst_rank_max_over_mean"]
        lines.append(f"    {d['name']} {d['router']}: {d['experts']} experts, top-{d['top_k']}, {d['tokens']:,} tokens "
                     f"over {d['ranks']} rank(s), max/mean {d['max_over_mean']:.2f}"
                     + (f" (worst rank {worst:.2f})" if worst != d["max_over_mean"] else ""))
    if len(layers) > most:
        lines.append(f"    ... {len(layers) - most} more (trace metadata moe_routing)")
    return lines


# a stale read off by this much can move a step by a visible fraction (steps are milliseconds or more);
# errors of a few microseconds, as in the examples of docs/design.md, do not
STALE_HINT_NS = 100_000


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
    if run.sync != "conservative" and s.largest_stale_error_ns >= STALE_HINT_NS:
        lines.append("    what the script did after those reads depends on how phantora's processes raced, so its "
                     "step times may move between runs; --sync conservative holds each read until the end is final "
                     "(the reference, no stale read; docs/design.md)")
    return lines


def _hidden_gpus_note(run: TraceRun) -> str:
    from interpose.runtime import visible_devices

    value = run.extra_env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    if value is not None and not visible_devices(value, run.gpus_per_node):
        return (f" (CUDA_VISIBLE_DEVICES={value!r} hides all {run.gpus_per_node} GPUs of the node, so "
                "torch.cuda.is_available() is False in the script)")
    return ""


def host_time_metadata(run: TraceRun, summary: EngineSummary) -> dict[str, Any]:
    """--host-time and, measured, this machine's Python speed as the ranks measured it: the scale
    of the lowest rank's first measurement (its Python until its next one) and the range of all."""
    meta: dict[str, Any] = {"mode": run.host_time, "host": run.host.key, "host_speed": run.host.speed}
    probes = summary.speed_probes
    if run.host_time == "measured" and probes:
        every = [ms for r in sorted(probes) for ms in probes[r]]
        first = probes[min(probes)][0]
        meta.update(python_scale=round(host_bench.python_scale(first), 4), bench_ms_range=[round(min(every), 2),
                    round(max(every), 2)], probes=len(every), reference=host_bench.REFERENCE)
    return meta


def kernel_times_lines(result: TraceResult, run: TraceRun | None = None) -> list[str]:
    """Which estimator timed the kernels, how many each timed, and what the user must know."""
    choice = result.kernel_times
    if choice is None:
        return []
    lines = [f"  kernel times: {choice.description}"]
    if run is not None:
        lines.append(f"  host: {run.host.key}, modelled host costs x{run.host.speed:.2f} ({run.host.description}; "
                     "--host)")
        meta = host_time_metadata(run, result.summary)
        if run.host_time == "measured" and "python_scale" in meta:
            lines.append(f"  host time: the program's Python measured here (--host-time measured), x"
                         f"{meta['python_scale']:.2f} to the {host_bench.REFERENCE.split(' (')[0]} (its Python "
                         f"benchmark here: {meta['bench_ms_range'][0]:.1f}-{meta['bench_ms_range'][1]:.1f} ms in "
                         f"{meta['probes']} runs, vs {host_bench.REFERENCE_BENCH_MS:.1f} ms)")
        elif run.host_time == "measured":
            lines.append("  host time: the program's Python measured here (--host-time measured); no rank measured "
                         "this machine's speed")
        elif run.host_time == "counted":
            lines.append("  host time: the program's Python counted (instructions and calls at the reference host's "
                         "cost; --host-time counted): the same under any load")
        else:
            lines.append("  host time: modelled per op (--host-time modelled; the program's own Python is not measured)")
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


# --- rank processes: failures, signals, the simulator's own failure ---------------------------------

_SIGNAL_NAMES = {signal.SIGINT: "SIGINT (Ctrl-C)", signal.SIGTERM: "SIGTERM"}


@dataclass
class RankExit:
    rank: int
    code: int  # Popen.returncode: negative when a signal killed it
    seen_s: float  # monotonic time the launcher saw it
    stopped: bool  # the launcher had asked every rank to stop before it ended

    def words(self) -> str:
        if self.code >= 0:
            return f"rank {self.rank} exited with code {self.code}"
        try:
            name = signal.Signals(-self.code).name
        except ValueError:
            name = "?"
        return f"rank {self.rank} was killed by signal {-self.code} ({name})"


class RankWatch:
    """The rank processes of one run, watched from the simulator's loop as torchrun's agent watches
    its workers: the first rank to fail is the root cause and every other rank is stopped
    (SIGTERM, then SIGKILL after GRACE_S); a signal to phantora stops them all; so does a failure
    of the simulator itself. The report names the root cause and counts the rest."""

    def __init__(self, server: SimulatorServer) -> None:
        self.server = server
        self.procs: list[subprocess.Popen | RankProcess] = []
        self.ranks: list[int] = []  # each process's global rank (--ranks 0,4,7: not its index)
        self.exits: dict[int, RankExit] = {}
        self.interrupted: list[int] = []  # signals phantora received
        self._stop_at: float | None = None
        self._kill_at: float | None = None

    def stop_all(self, sig: int) -> None:
        self.server.stop()
        if self._stop_at is None:
            self._stop_at = time.monotonic()
            self._kill_at = self._stop_at + GRACE_S
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(sig)

    def _observe(self) -> None:
        now = time.monotonic()
        for i, p in enumerate(self.procs):
            if i not in self.exits and p.poll() is not None:
                rank = self.ranks[i] if i < len(self.ranks) else i
                self.exits[i] = RankExit(rank, p.returncode, now, self._stop_at is not None)

    def keep_going(self) -> bool:
        self._observe()
        if all(p.returncode is not None for p in self.procs):
            return False
        if self._stop_at is None and (self.server.failure is not None or
                                      len(self.procs) > 1 and any(e.code for e in self.exits.values())):
            self.stop_all(signal.SIGTERM)  # torchrun: one failed worker ends the others
        if self._kill_at is not None and time.monotonic() > self._kill_at:
            for p in self.procs:
                if p.poll() is None:
                    p.kill()
        return True

    def finish(self) -> None:
        """After the loop: ranks still running (the simulator failed) are stopped and reaped."""
        if any(p.poll() is None for p in self.procs):
            self.stop_all(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=max(0.0, (self._kill_at or 0.0) - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._observe()

    def root_cause(self) -> RankExit | None:
        failed = [e for e in self.exits.values() if e.code != 0 and not e.stopped]
        return min(failed, key=lambda e: (e.seen_s, e.rank)) if failed else None

    def exit_code(self) -> int:
        if self.server.failure is not None:
            return 1
        if self.interrupted:
            return 128 + self.interrupted[0]  # as a shell reports a run ended by that signal
        if len(self.procs) == 1:
            rc = self.procs[0].returncode
            return 128 - rc if rc < 0 else rc
        return 0 if all(p.returncode == 0 for p in self.procs) else 1  # as torchrun exits

    def report(self) -> list[str]:
        """Lines for the summary: why the run ended, the root cause first, the rest counted."""
        if self.interrupted:
            name = _SIGNAL_NAMES.get(self.interrupted[0], f"signal {self.interrupted[0]}")
            verb = "interrupted" if self.interrupted[0] == signal.SIGINT else "terminated"
            return [f"run {verb} by {name}: {len(self.procs)} rank process(es) stopped"]
        if self.server.failure is not None or len(self.procs) < 2:
            return []
        root = self.root_cause()
        if root is None:
            return []
        lines = [f"{root.words()} (the first rank to fail: the root cause)"]
        also = [e for e in self.exits.values() if e is not root and e.code != 0 and not e.stopped]
        stopped = [e for e in self.exits.values() if e.stopped and e.code != 0]
        if also:
            lines.append(f"{len(also)} other rank(s) failed after it: ranks {sorted(e.rank for e in also)}")
        if stopped:
            lines.append(f"{len(stopped)} other rank(s) stopped because of it: ranks {sorted(e.rank for e in stopped)}")
        return lines


def _give_up_when_interrupted(engine: Engine) -> None:
    """Ctrl-C asks to stop now: the collectives still in the network are not simulated to their
    ends (at hundreds of ranks that took minutes) but written as never run, the work queued
    behind them placed as after them, and the trace closed."""
    try:
        stopped = engine.give_up_collectives()
    except Exception:  # the summary and the trace still close; _summary reports a broken engine
        return
    if stopped:
        engine.warn(f"interrupted: {stopped} collective(s) still in the network were not simulated to their ends; "
                    "the trace shows them as never run")


def _summary(engine: Engine, server: SimulatorServer) -> EngineSummary:
    try:
        return engine.summary()
    except Exception as e:  # the engine is broken: report the failure, still close the trace
        if server.failure is None:
            server.failure = SimulatorFailure.from_exception(e, "summarising the run")
        return EngineSummary(0, len(engine.ranks), 0, 0, 0, 0.0, {}, {}, {}, [])


def _close_trace(engine: Engine, sink: TraceSink, metadata: dict[str, Any], server: SimulatorServer) -> None:
    """engine.close writes what the engine still holds, then closes the sink; when the engine
    fails, the sink is closed directly so that the file is still a complete trace."""
    try:
        engine.close(metadata)
    except Exception as e:
        if server.failure is None:
            server.failure = SimulatorFailure.from_exception(e, "closing the trace")
        sink.close(metadata)
