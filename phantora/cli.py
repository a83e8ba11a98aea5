"""The `phantora` command line."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click

from phantora import __version__
from phantora.cost.host import DEFAULT_HOST, DEFAULT_HOST_TIME, HOST_TIME_MODES, HOSTS, UnknownHostError, lookup_host
from phantora.hardware import DEFAULT_GPU, GPUS, UnknownGPUError, lookup_gpu
from phantora.mask_fraction import DEFAULT as DEFAULT_MASK_FRACTION
from phantora.mask_fraction import ENV as MASK_FRACTION_ENV

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "ki": 1 << 10, "kib": 1 << 10, "kb": 10**3,
          "m": 1 << 20, "mi": 1 << 20, "mib": 1 << 20, "mb": 10**6,
          "g": 1 << 30, "gi": 1 << 30, "gib": 1 << 30, "gb": 10**9,
          "t": 1 << 40, "ti": 1 << 40, "tib": 1 << 40, "tb": 10**12}


def parse_size(text: str) -> int:
    """'80GiB', '80G' (binary), '80GB' (decimal), '85017493504' -> bytes."""
    m = _SIZE.match(text)
    if not m or m.group(2) is not None and m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read {text!r} as a size; examples: 40GiB, 40G, 42949672960")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])


def _gpu_help() -> str:
    return ", ".join(f"{g.aliases[0]} ({g.key})" for g in GPUS)


class _GpuType(click.ParamType):
    name = "GPU"

    def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
        try:
            return lookup_gpu(value)
        except UnknownGPUError as e:
            self.fail(str(e), param, ctx)


def _host_help() -> str:
    return ", ".join(f"{h.key} (host time x{h.speed:.2f})" for h in HOSTS)


class _HostType(click.ParamType):
    name = "HOST"

    def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
        try:
            return lookup_host(value)
        except UnknownHostError as e:
            self.fail(str(e), param, ctx)


class _SizeType(click.ParamType):
    name = "SIZE"

    def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
        try:
            n = parse_size(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)
        if n <= 0:
            self.fail("must be positive", param, ctx)
        return n


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="phantora")
def main() -> None:
    """Predict how a PyTorch training job performs on GPUs you do not have.

    phantora runs your unmodified script on virtual GPUs, estimates every kernel, allocation
    and copy, makes the script's own clock show simulated time, and writes a Perfetto trace.

    \b
    Examples:
      phantora trace -o run.json -- python examples/gpt_train.py
      phantora trace --gpu a100 -o run.json.gz -- python train.py --batch 8
      phantora trace -o run.pftrace -- python examples/gpt_train.py
      phantora summary run.json
      phantora query run.json "select name, sum(dur) from slice group by name order by 2 desc limit 5"
    """


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Trace file to write: .json or .json.gz (Chrome JSON) or .pftrace (Perfetto protobuf, "
                   "smaller); both open in ui.perfetto.dev.")
@click.option("--gpu", "gpu", default=None, type=_GpuType(),
              help=f"GPU model to simulate, short or full name (case-insensitive): {_gpu_help()}. "
                   f"Default: the cluster's GPU ({DEFAULT_GPU} for the default cluster).")
@click.option("--host", "host", default=None, type=_HostType(),
              help=f"Host CPU the script runs on, which sets its host (launch, Python) time: {_host_help()}. "
                   f"Default: {DEFAULT_HOST}.")
@click.option("--host-time", "host_time", type=click.Choice(HOST_TIME_MODES), default=DEFAULT_HOST_TIME,
              show_default=True, envvar="PHANTORA_HOST_TIME", show_envvar=True,
              help="counted: the script's own Python (and the framework's) between GPU calls is counted (bytecode "
                   "instructions and calls) and charged at the simulated host's cost: the same trace under any load; "
                   "measured: its CPU time is measured here and scaled to the simulated host (also catches time in C "
                   "extensions such as numpy, but moves with this machine's load); modelled: a fitted cost per op "
                   "stands for it, nothing of the script is observed (docs/host-time.md).")
@click.option("--startup-costs/--no-startup-costs", "startup_costs", default=True, show_default=True,
              envvar="PHANTORA_STARTUP_COSTS", show_envvar=True,
              help="Charge a fresh process's one-off costs as on a real GPU host: CUDA context, each kernel's first "
                   "launch (lazy module loading), cuBLAS and cuDNN handles, cudaMalloc of new allocator segments, "
                   "NCCL communicator set-up (table and sources: docs/host-time.md).")
@click.option("--vram", type=_SizeType(), default=None,
              help="Memory per GPU instead of the model's, e.g. 40GiB (G/GiB binary, GB decimal).")
@click.option("--gpus-per-node", type=click.IntRange(1, 256), default=None,
              help="GPUs visible to each process (torch.cuda.device_count()); default: the cluster's node size.")
@click.option("--cluster", "cluster_name", default="dgx-h100", show_default=True,
              help="Cluster the collectives run on: a preset (dgx-h100, dgx-h200, dgx-a100, ethernet) "
                   "or a TOML file.")
@click.option("--nnodes", type=click.IntRange(1), default=1, show_default=True,
              help="Nodes in the cluster (as torchrun's --nnodes).")
@click.option("--nproc-per-node", "--nproc_per_node", "nproc_per_node", type=click.IntRange(1), default=None,
              help="Start this many rank processes per node with torchrun's environment (RANK, LOCAL_RANK, "
                   "WORLD_SIZE, MASTER_ADDR, ...). Without it COMMAND runs once (it may be torchrun itself). "
                   "For `python script.py` or `python -m module` the ranks fork from a process that imported "
                   "torch once (PHANTORA_FORK_SERVER=0: start each with its own interpreter).")
@click.option("--ranks", "ranks", default="default", show_default=True, metavar="all|auto|R0,R1,...",
              help="Which ranks run as processes (with --nproc-per-node or a torchrun command). all: every rank. "
                   "auto: rank 0 runs and stands for every other rank, which is mirrored in the simulator (DDP, "
                   "FSDP, TP x DP), and the last rank runs as its witness (checked against it); a pipeline is "
                   "detected and the run starts again with one process per stage. R0,R1,...: these ranks run, "
                   "each standing for the ranks up to the next (e.g. 0,8,16,24 for 4 pipeline stages over 32 "
                   "GPUs). default: all up to 64 ranks, auto above (docs/scale.md).")
@click.option("--collective-timeout", type=click.FloatRange(1.0), default=300.0, show_default=True,
              help="Seconds (wall time, not counting the simulator's own busy time) a collective waits for a "
                   "missing member that sends nothing before the waiting ranks fail (a member still running its "
                   "work is waited for, up to 10 times this).")
@click.option("--call-timeout", type=click.FloatRange(1.0), default=600.0, show_default=True,
              help="Seconds a script waits for any answer from the simulator before failing; a simulator busy "
                   "with one long piece of work (a deep network rollback) sends keepalives every 30 s while its "
                   "network makes progress, so this counts its silence, not its work.")
@click.option("--comm-slowdown", type=click.FloatRange(0.0, 10.0), default=0.1, show_default=True,
              help="Fraction by which compute kernels slow down while an NCCL kernel runs on the same GPU "
                   "(NCCL occupies SMs); 0 disables. An assumption, not a measured figure.")
@click.option("--sync", type=click.Choice(["optimistic", "conservative"]), default="optimistic", show_default=True,
              help="When a rank's host waits for a collective (a synchronize, .item(), a blocking Work.wait) "
                   "before other ranks, behind in simulated time, could still slow it: optimistic answers with the "
                   "end as it stands (a later correction is a counted stale reply); conservative holds the rank "
                   "until the end is final (exact; slower in wall time). GPU-side waits are exact in both.")
@click.option("--export-kineto", "kineto_dir", default=None, metavar="DIR",
              type=click.Path(file_okay=False, path_type=Path),
              help="Also write one Kineto trace per rank (DIR/rank-<R>.pt.trace.json, the format torch.profiler "
                   "writes) for Holistic Trace Analysis: TraceAnalysis(trace_dir=DIR). DIR is created; rank files "
                   "of an earlier export there are replaced.")
@click.option("--kernel-times", "kernel_times", type=click.Choice(["auto", "analytical", "calibrated", "measured"]),
              default="auto", show_default=True,
              help="How kernels are timed: measured (each distinct op run once on this machine's CUDA GPU, "
                   "cached), calibrated (a measured table for the simulated GPU, interpolated; analytical outside "
                   "it), analytical (roofline model). auto: measured if a CUDA GPU is visible, else calibrated "
                   "if a table exists for the simulated GPU (shipped: H100), else analytical.")
@click.option("--calibration", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Calibration table (.jsonl, as `phantora calibrate` writes) for the calibrated estimator; "
                   "auto uses it when its device row names the simulated GPU.")
@click.option("--routing", "routing_text", default="balanced", show_default=True, metavar="MODEL",
              help="Which experts MoE routers pick (their scores hold no data on a virtual GPU): balanced (equal "
                   "tokens per expert), zipf:S (popularity ~ 1/rank^S, shuffled per layer), dirichlet:A (per-layer "
                   "fractions ~ Dirichlet(A)), or a .json file of measured per-layer expert fractions (docs/moe.md).")
@click.option("--routing-seed", type=int, default=0, show_default=True,
              help="Seed of the zipf and dirichlet routing models.")
@click.option("--mask-fraction", "mask_fraction", type=click.FloatRange(0.0, 1.0), default=DEFAULT_MASK_FRACTION,
              show_default=True, envvar=MASK_FRACTION_ENV, show_envvar=True, metavar="F",
              help="Fraction of the elements a comparison selects on data phantora knows nothing about (`x > 0` "
                   "over activations, then x[mask], nonzero, masked_select) where the placeholder value passes "
                   "it; comparisons of tensors drawn by randn/rand/normal_/uniform_/randint/bernoulli_/dropout "
                   "select what their distribution implies (docs/moe.md).")
@click.option("--quiet", "-q", is_flag=True,
              help="No status line (on a terminal) and no periodic status lines (elsewhere). Notices of a possible "
                   "hang (a collective waiting for a missing rank, a rank that sends nothing) are still printed.")
@click.option("--status-every", type=click.FloatRange(1.0), default=30.0, show_default=True, metavar="SECONDS",
              help="When stderr is not a terminal, print the status (phase, steps per rank, simulated and wall time) "
                   "every SECONDS; a collective waiting or a rank silent this long is reported once.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def trace(output: Path, gpu, host, host_time: str, startup_costs: bool, vram: int | None, gpus_per_node: int | None, cluster_name: str, nnodes: int,  # type: ignore[no-untyped-def]
          nproc_per_node: int | None, ranks: str, collective_timeout: float, call_timeout: float, comm_slowdown: float,
          sync: str, kineto_dir: Path | None, kernel_times: str, calibration: Path | None, routing_text: str,
          routing_seed: int, mask_fraction: float, quiet: bool, status_every: float, command: tuple[str, ...]) -> None:
    """Run COMMAND on simulated GPUs and write a trace.

    Put `--` before the command. The exit code is the command's. A short summary (simulated
    time, kernels, peak memory, unknown ops) is printed on stderr at the end.

    \b
    Examples:
      phantora trace -o run.json -- python examples/gpt_train.py
      phantora trace --gpu h200 --vram 100GiB -o run.json -- python train.py
      phantora trace --nnodes 2 --nproc-per-node 8 -o run.json -- python train_ddp.py
      phantora trace --nproc-per-node 4 --sync conservative -o exact.json -- python train_fsdp.py
      phantora trace -o run.json -- torchrun --nproc-per-node 8 train_ddp.py
      phantora trace --nnodes 128 --nproc-per-node 8 --ranks auto -o big.pftrace -- python train_fsdp.py
      phantora trace --nproc-per-node 2 -o run.json --export-kineto hta/ -- python train_ddp.py
    """
    from phantora.cost import KernelTimesError
    from phantora.cost.measurements import CalibrationFileError
    from phantora.net.cluster import ClusterConfigError, load_cluster
    from phantora.roles import RanksChoiceError
    from phantora.routing import RoutingModelError, parse_routing
    from phantora.simulator.torchrun import TorchrunLineError
    from phantora.simulator.launch import CommandNotFound, LaunchError, TraceRun, print_summary, run_trace
    from phantora.trace import UnsupportedTraceFormat
    from phantora.trace.kineto import KinetoExportError

    problem = output_path_problem(output)
    if problem:
        raise click.BadParameter(problem, param_hint="'-o' / '--output'")
    try:
        routing = parse_routing(routing_text, routing_seed)
    except RoutingModelError as e:
        raise click.BadParameter(str(e), param_hint="'--routing'") from None
    try:
        cluster = load_cluster(cluster_name, nodes=nnodes)
    except ClusterConfigError as e:
        raise click.BadParameter(str(e), param_hint="'--cluster'") from None
    if gpus_per_node is not None and nproc_per_node is not None and gpus_per_node != cluster.gpus_per_node:
        raise click.BadParameter(f"{cluster.name} nodes have {cluster.gpus_per_node} GPUs; describe a different "
                                 "node in a cluster file instead", param_hint="'--gpus-per-node'")
    run = TraceRun(command=list(command), output=output, gpu=gpu or cluster.gpu_spec, vram_bytes=vram,
                   host=host or lookup_host(DEFAULT_HOST), host_time=host_time, startup_costs=startup_costs,
                   gpus_per_node=gpus_per_node or cluster.gpus_per_node, call_timeout_s=call_timeout,
                   cluster=cluster, nproc_per_node=nproc_per_node, collective_timeout_s=collective_timeout,
                   comm_slowdown=comm_slowdown, sync=sync, kineto_dir=kineto_dir, estimator=kernel_times,
                   calibration=calibration, quiet=quiet, status_every_s=status_every, ranks=ranks, routing=routing,
                   mask_fraction=mask_fraction)
    try:
        result = run_trace(run)
    except CommandNotFound as e:
        click.echo(f"phantora: {e}", err=True)
        sys.exit(127)
    except RanksChoiceError as e:
        raise click.BadParameter(str(e), param_hint="'--ranks'") from None
    except TorchrunLineError as e:
        raise click.BadParameter(str(e), param_hint="COMMAND") from None
    except LaunchError as e:
        raise click.BadParameter(str(e), param_hint="'--nproc-per-node'") from None
    except UnsupportedTraceFormat as e:
        raise click.BadParameter(str(e), param_hint="'-o' / '--output'") from None
    except KinetoExportError as e:
        raise click.BadParameter(str(e), param_hint="'--export-kineto'") from None
    except CalibrationFileError as e:
        raise click.BadParameter(str(e), param_hint="'--calibration'") from None
    except KernelTimesError as e:
        raise click.BadParameter(str(e), param_hint="'--kernel-times'") from None
    print_summary(run, result)
    sys.exit(result.exit_code)


def output_path_problem(output: Path) -> str | None:
    """Why the trace cannot be written to `output` (checked before any rank starts), or None.
    A missing directory is an error, as for any shell redirection: a typo there should not
    leave the trace somewhere unexpected."""
    parent = output.parent if str(output.parent) else Path(".")
    if not parent.exists():
        return f"directory {parent} does not exist (create it first, or pick another path)"
    if not parent.is_dir():
        return f"{parent} is not a directory"
    if output.is_dir():
        return f"{output} is a directory; give a file name such as {output / 'run.json'}"
    existed = output.exists()
    try:  # the one reliable test (permissions, read-only file systems, /proc): open it
        with open(output, "ab"):
            pass
    except OSError as e:
        return f"cannot write {output}: {e.strerror}"
    if not existed:
        output.unlink(missing_ok=True)
    return None


@main.command()
@click.argument("trace_file", metavar="TRACE", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--port", type=click.IntRange(0, 65535), default=9001, show_default=True,
              help="Port on 127.0.0.1 to serve from (0: any free port). ui.perfetto.dev opens url= links only "
                   "from 127.0.0.1:9001; on another port use the dashboard's \"Open in Perfetto UI\" button.")
@click.option("--no-browser", is_flag=True, help="Only print the URLs; do not open a browser.")
def view(trace_file: Path, port: int, no_browser: bool) -> None:
    """Serve TRACE to ui.perfetto.dev and to a local dashboard, until Ctrl-C.

    Listens on 127.0.0.1 only and serves nothing but the trace and the dashboard (step times,
    compute / communication / idle per GPU, memory, network links, top kernels; the same
    figures as `phantora summary`). Ctrl-C stops it with exit code 0.

    \b
    Examples:
      phantora view run.json
      phantora view --port 9002 --no-browser run.json.gz
    """
    from phantora.query.errors import TraceFileError
    from phantora.view import PERFETTO_DEEP_LINK_PORT, PortInUse, PortNotAllowed, ViewerAssetsMissing, serve

    try:
        serve(trace_file, port=port, open_browser=not no_browser, echo=click.echo)
    except KeyboardInterrupt:
        # Ctrl-C is how this command is meant to end, so it is a success, not a failure.
        click.echo("phantora view: stopped", err=True)
        sys.exit(0)
    except PortInUse as e:
        _fail(f"port {e.port} on 127.0.0.1 is already in use (another `phantora view`?): stop that program or pick "
              f"another port with --port N (--port 0 picks a free one). Note: ui.perfetto.dev opens url= links only "
              f"from 127.0.0.1:{PERFETTO_DEEP_LINK_PORT}; on another port, use the dashboard's \"Open in Perfetto UI\" "
              "button instead")
    except PortNotAllowed as e:
        _fail(f"not allowed to listen on port {e.port} (ports below 1024 need root): use --port {PERFETTO_DEEP_LINK_PORT}")
    except (TraceFileError, ViewerAssetsMissing) as e:
        _fail(str(e))


# --- reading traces: query, summary, diff -------------------------------------------------------
_ENGINE_OPTION = click.option(
    "--engine", type=click.Choice(["auto", "builtin", "trace_processor"]), default="auto", show_default=True,
    help="Who answers: Perfetto's trace_processor_shell (set PHANTORA_TRACE_PROCESSOR to one; never downloaded), "
         "the built-in SQLite engine, or auto: the first when a binary is found.")


def _fail(message: str) -> None:
    click.echo(f"phantora: {message}", err=True)
    sys.exit(1)


def _open_trace(path: str, engine: str):  # type: ignore[no-untyped-def]
    from phantora.query import EngineUnavailable, TraceFileError, load

    try:
        db = load(path, engine=engine)
    except (TraceFileError, EngineUnavailable) as e:
        _fail(str(e))
    warning = db.truncation_warning()
    if warning:
        click.echo(f"phantora: {warning}", err=True)
    return db


@main.command(short_help="Run SQL on a trace (Perfetto's tables).")
@click.argument("trace_file", metavar="TRACE")
@click.argument("sql")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True,
              help="table: aligned columns; csv: with a header row; json: a list of row objects.")
@_ENGINE_OPTION
def query(trace_file: str, sql: str, fmt: str, engine: str) -> None:
    """Run SQL on a trace, with Perfetto's tables (slice, thread_track, thread, process,
    counter, process_counter_track, flow, args, metadata; times in ns).

    \b
    Examples:
      phantora query run.json "select name, count(*), sum(dur) from slice group by name order by 3 desc limit 10"
      phantora query run.json "select name, str_value, int_value from metadata"
      phantora query run.json.gz --format csv "select ts, dur, extract_arg(arg_set_id, 'args.flops') as flops
        from slice where category = 'kernel'"
    """
    from phantora.query import QueryError
    from phantora.query.render import query_result

    with _open_trace(trace_file, engine) as db:
        try:
            result = db.query(sql)
        except QueryError as e:
            _fail(f"SQL error: {e.message} (in query: {' '.join(e.sql.split())})")
        click.echo(query_result(result, fmt))


@main.command(short_help="Step times, GPU time breakdown, MFU, top kernels, peak memory.")
@click.argument("trace_file", metavar="TRACE")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON (the TraceSummary dataclass).")
@click.option("--top", type=click.IntRange(1), default=10, show_default=True, help="Kernels to list.")
@click.option("--whole-run", is_flag=True,
              help="GPU time, MFU and kernels over each GPU's whole active span (setup and the first step "
                   "included) instead of the steps after the first.")
@_ENGINE_OPTION
def summary(trace_file: str, as_json: bool, top: int, whole_run: bool, engine: str) -> None:
    """Step time, compute / communication / idle breakdown, MFU, top kernels and peak memory
    of a trace, per rank and overall.

    Where the trace has two steps or more, GPU time, MFU and kernel shares cover the steps
    after the first (the first also holds setup and warm-up, and the script's own step times
    leave it out); the output says which window it used.

    \b
    Examples:
      phantora summary run.json
      phantora summary --json run.json > summary.json
    """
    from phantora.query import QueryError
    from phantora.query import render
    from phantora.query.summary import summarize

    with _open_trace(trace_file, engine) as db:
        try:
            s = summarize(db, top=top, steady=not whole_run)
        except QueryError as e:  # a trace_processor without the tables this needs
            _fail(f"cannot summarize {trace_file}: {e.message}")
    click.echo(render.to_json(s) if as_json else render.summary(s))


@main.command(short_help="Compare two traces side by side.")
@click.argument("trace_a", metavar="A")
@click.argument("trace_b", metavar="B")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.option("--top", type=click.IntRange(1), default=10, show_default=True,
              help="Kernels to compare: the union of each trace's top N.")
@click.option("--whole-run", is_flag=True,
              help="GPU time, MFU and kernels over each GPU's whole active span (setup and the first step "
                   "included) instead of the steps after the first.")
@_ENGINE_OPTION
def diff(trace_a: str, trace_b: str, as_json: bool, top: int, whole_run: bool, engine: str) -> None:
    """Compare two traces: step time, GPU time breakdown per step, MFU, peak memory per rank and
    top kernels per step, with B - A and B / A (whole-run totals where a trace has no steps).

    \b
    Example:
      phantora diff baseline.json with_checkpointing.json
    """
    from phantora.query import QueryError
    from phantora.query import render
    from phantora.query.diff import diff as compare
    from phantora.query.summary import summarize

    summaries = []
    for path in (trace_a, trace_b):
        with _open_trace(path, engine) as db:
            try:
                summaries.append(summarize(db, top=None, steady=not whole_run))
            except QueryError as e:
                _fail(f"cannot summarize {path}: {e.message}")
    d = compare(summaries[0], summaries[1], top=top)
    click.echo(render.to_json(d) if as_json else render.trace_diff(d))


@main.command()
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, writable=True, path_type=Path),
              help="Calibration table to write (.jsonl: one measurement per line, plus a device row).")
@click.option("--quick", is_flag=True, help="A coarse grid (about 100 shapes) instead of the full one (about 1,300).")
@click.option("--grid", type=click.Choice(["full", "quick", "tiny", "sweep"]), default=None,
              help="What to measure. full / quick / tiny: op shapes timed with CUDA events into the table "
                   "`--calibration` reads (default: full; quick as --quick; tiny on --device cpu). sweep: the "
                   "152 op cases of the H100 kernel sweep (convolutions, norms, activations, embedding, loss, "
                   "MoE routing, grouped/odd GEMMs, attention, optimizers) and 16 of phantora's (strided "
                   "elementwise, misaligned GEMMs, non-causal attention), every kernel of each case timed with "
                   "torch.profiler, written in the sweep's format (phantora/cost/data/h100_sxm_sweep.jsonl) for "
                   "the per-family fit (a few minutes on a GPU, estimated).")
@click.option("--only", "only", default=None, metavar="OP[,OP...]",
              help="--grid sweep: only the cases of these ops (e.g. mm,sdpa_fwd_bwd,adamw_foreach).")
@click.option("--device", default="cuda", show_default=True,
              help="Where to time the kernels: cuda, cuda:N, or cpu (a tiny grid that checks the pipeline; "
                   "the times then describe this CPU, not a GPU).")
def calibrate(output: Path, quick: bool, grid: str | None, only: str | None, device: str) -> None:
    """Measure kernel times on this machine's GPU and write a calibration table.

    Times the op families and shapes of phantora's H100 table (GEMMs in bf16 and fp32,
    elementwise ops, reductions, layer norm, softmax, cuDNN attention, host <-> device copies)
    on the local GPU, each after warm-up with CUDA events, and writes them in the same format.
    Simulate that GPU with the table: `phantora trace --calibration FILE ...`.

    `--grid sweep` instead runs the cases of the H100 kernel sweep on the local GPU and writes
    every kernel each case launches (the input of the per-family efficiency fit, not of
    `--calibration`).

    \b
    Examples:
      phantora calibrate -o a100.jsonl
      phantora trace --gpu a100 --calibration a100.jsonl -o run.json -- python train.py
      phantora calibrate --grid sweep -o a100_sweep.jsonl
    """
    from phantora.cost.calibrate import RowResult, write_calibration
    from phantora.cost.measured import LocalDeviceError, visible_cuda_device

    if device != "cpu" and not re.fullmatch(r"cuda(:\d+)?", device):
        raise click.BadParameter(f"{device!r}: use cuda, cuda:N or cpu", param_hint="'--device'")
    if quick and grid not in (None, "quick"):
        raise click.UsageError(f"--quick is --grid quick; it cannot go with --grid {grid}")
    if grid is None:
        grid = "tiny" if device == "cpu" else "quick" if quick else "full"
    if device == "cpu" and grid in ("full", "quick"):
        raise click.UsageError(f"--grid {grid} times a GPU's shapes; on --device cpu use --grid tiny or sweep")
    if only is not None and grid != "sweep":
        raise click.UsageError("--only selects cases of --grid sweep")
    if device.startswith("cuda"):
        name = visible_cuda_device()
        if name is None:
            raise click.UsageError("phantora calibrate times kernels on a CUDA GPU and none is visible "
                                   "(torch.cuda.is_available() is False); run it on the GPU to calibrate, or pass "
                                   "--device cpu to check the pipeline on this CPU")
        click.echo(f"calibrating {name} into {output}" + (" (kernel sweep)" if grid == "sweep" else ""), err=True)
    if grid == "sweep":
        _calibrate_sweep(output, device, only)
        return
    if device == "cpu":
        click.echo(f"--device cpu: timing a tiny grid on this CPU into {output} (CPU times, not a GPU's)", err=True)

    def progress(i: int, n: int, r: RowResult) -> None:
        what = " ".join(f"{k}={v}" for k, v in r.row.items() if k not in ("op", "us"))
        result = f"{r.row['us']:.1f} us" if r.error is None else f"skipped: {r.error}"
        click.echo(f"  [{i}/{n}] {r.row['op']} {what}: {result}", err=True)

    try:
        results = write_calibration(output, grid, device, progress)
    except OSError as e:
        raise click.BadParameter(f"cannot write {output}: {e.strerror}", param_hint="'-o' / '--output'") from None
    except LocalDeviceError as e:
        click.echo(f"phantora calibrate: the GPU reported an error ({e}); {output} holds the rows timed before it",
                   err=True)
        sys.exit(1)
    timed = sum(1 for r in results if r.error is None)
    click.echo(f"wrote {timed} measurements ({len(results) - timed} skipped) to {output}", err=True)


def _calibrate_sweep(output: Path, device: str, only: str | None) -> None:
    """`phantora calibrate --grid sweep`: the kernel sweep's cases on `device`, in the sweep's format."""
    from phantora.cost.kernel_sweep import run_sweep, select, sweep_cases

    try:
        cases = select(sweep_cases(device), [o.strip() for o in only.split(",") if o.strip()] if only else None)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="'--only'") from None
    if device == "cpu":
        click.echo(f"--device cpu: the sweep's CPU variant ({len(cases)} cases, sizes / 16) into {output}; its "
                   "'kernels' are CPU self times per profiler event, a pipeline check, not a GPU's kernels", err=True)

    def progress(i: int, n: int, line: dict) -> None:
        what = " ".join(f"{k}={v}" for k, v in line.items() if k not in ("op", "kernels", "total_us", "error"))
        result = (f"{line['total_us']:.1f} us in {len(line['kernels'])} kernels" if "error" not in line
                  else f"error: {line['error']}")
        click.echo(f"  [{i}/{n}] {line['op']} {what}: {result}", err=True)

    try:
        with open(output, "w") as out:
            lines = list(run_sweep(cases, device, out, progress))
    except OSError as e:
        raise click.BadParameter(f"cannot write {output}: {e.strerror}", param_hint="'-o' / '--output'") from None
    failed = sum(1 for line in lines if "error" in line)
    click.echo(f"wrote {len(lines) - failed} cases ({failed} failed, written with 'error') and a device row "
               f"to {output}", err=True)


if __name__ == "__main__":
    main()
