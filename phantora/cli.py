"""The `phantora` command line."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click

from phantora import __version__
from phantora.hardware import DEFAULT_GPU, GPUS, UnknownGPUError, lookup_gpu

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
    """


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Trace file to write: .json or .json.gz (Chrome JSON; opens in ui.perfetto.dev).")
@click.option("--gpu", "gpu", default=None, type=_GpuType(),
              help=f"GPU model to simulate, short or full name (case-insensitive): {_gpu_help()}. "
                   f"Default: the cluster's GPU ({DEFAULT_GPU} for the default cluster).")
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
                   "WORLD_SIZE, MASTER_ADDR, ...). Without it COMMAND runs once (it may be torchrun itself).")
@click.option("--collective-timeout", type=click.FloatRange(1.0), default=300.0, show_default=True,
              help="Seconds (wall time) a collective waits for its last member before the waiting ranks fail.")
@click.option("--call-timeout", type=click.FloatRange(1.0), default=600.0, show_default=True,
              help="Seconds a script waits for any answer from the simulator before failing.")
@click.option("--comm-slowdown", type=click.FloatRange(0.0, 10.0), default=0.1, show_default=True,
              help="Fraction by which compute kernels slow down while an NCCL kernel runs on the same GPU "
                   "(NCCL occupies SMs); 0 disables. An assumption, not a measured figure.")
@click.option("--kernel-times", "kernel_times", type=click.Choice(["auto", "analytical", "calibrated", "measured"]),
              default="auto", show_default=True,
              help="How kernels are timed: measured (each distinct op run once on this machine's CUDA GPU, "
                   "cached), calibrated (a measured table for the simulated GPU, interpolated; analytical outside "
                   "it), analytical (roofline model). auto: measured if a CUDA GPU is visible, else calibrated "
                   "if a table exists for the simulated GPU (shipped: H100), else analytical.")
@click.option("--calibration", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Calibration table (.jsonl, as `phantora calibrate` writes) for the calibrated estimator; "
                   "auto uses it when its device row names the simulated GPU.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def trace(output: Path, gpu, vram: int | None, gpus_per_node: int | None, cluster_name: str, nnodes: int,  # type: ignore[no-untyped-def]
          nproc_per_node: int | None, collective_timeout: float, call_timeout: float, comm_slowdown: float,
          kernel_times: str, calibration: Path | None, command: tuple[str, ...]) -> None:
    """Run COMMAND on simulated GPUs and write a trace.

    Put `--` before the command. The exit code is the command's. A short summary (simulated
    time, kernels, peak memory, unknown ops) is printed on stderr at the end.

    \b
    Examples:
      phantora trace -o run.json -- python examples/gpt_train.py
      phantora trace --gpu h200 --vram 100GiB -o run.json -- python train.py
      phantora trace --nnodes 2 --nproc-per-node 8 -o run.json -- python train_ddp.py
      phantora trace -o run.json -- torchrun --nproc-per-node 8 train_ddp.py
    """
    from phantora.cost import KernelTimesError
    from phantora.cost.measurements import CalibrationFileError
    from phantora.net.cluster import ClusterConfigError, load_cluster
    from phantora.simulator.launch import CommandNotFound, LaunchError, TraceRun, print_summary, run_trace
    from phantora.trace import UnsupportedTraceFormat

    try:
        cluster = load_cluster(cluster_name, nodes=nnodes)
    except ClusterConfigError as e:
        raise click.BadParameter(str(e), param_hint="'--cluster'") from None
    if gpus_per_node is not None and nproc_per_node is not None and gpus_per_node != cluster.gpus_per_node:
        raise click.BadParameter(f"{cluster.name} nodes have {cluster.gpus_per_node} GPUs; describe a different "
                                 "node in a cluster file instead", param_hint="'--gpus-per-node'")
    run = TraceRun(command=list(command), output=output, gpu=gpu or cluster.gpu_spec, vram_bytes=vram,
                   gpus_per_node=gpus_per_node or cluster.gpus_per_node, call_timeout_s=call_timeout,
                   cluster=cluster, nproc_per_node=nproc_per_node, collective_timeout_s=collective_timeout,
                   comm_slowdown=comm_slowdown, estimator=kernel_times, calibration=calibration)
    try:
        result = run_trace(run)
    except CommandNotFound as e:
        click.echo(f"phantora: {e}", err=True)
        sys.exit(127)
    except LaunchError as e:
        raise click.BadParameter(str(e), param_hint="'--nproc-per-node'") from None
    except UnsupportedTraceFormat as e:
        raise click.BadParameter(str(e), param_hint="'-o' / '--output'") from None
    except CalibrationFileError as e:
        raise click.BadParameter(str(e), param_hint="'--calibration'") from None
    except KernelTimesError as e:
        raise click.BadParameter(str(e), param_hint="'--kernel-times'") from None
    print_summary(run, result)
    sys.exit(result.exit_code)


@main.command()
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, writable=True, path_type=Path),
              help="Calibration table to write (.jsonl: one measurement per line, plus a device row).")
@click.option("--quick", is_flag=True, help="A coarse grid (about 100 shapes) instead of the full one (about 1,300).")
@click.option("--device", default="cuda", show_default=True,
              help="Where to time the kernels: cuda, cuda:N, or cpu (a tiny grid that checks the pipeline; "
                   "the times then describe this CPU, not a GPU).")
def calibrate(output: Path, quick: bool, device: str) -> None:
    """Measure kernel times on this machine's GPU and write a calibration table.

    Times the op families and shapes of phantora's H100 table (GEMMs in bf16 and fp32,
    elementwise ops, reductions, layer norm, softmax, cuDNN attention, host <-> device copies)
    on the local GPU, each after warm-up with CUDA events, and writes them in the same format.
    Simulate that GPU with the table: `phantora trace --calibration FILE ...`.

    \b
    Examples:
      phantora calibrate -o a100.jsonl
      phantora trace --gpu a100 --calibration a100.jsonl -o run.json -- python train.py
    """
    from phantora.cost.calibrate import RowResult, write_calibration
    from phantora.cost.measured import LocalDeviceError, visible_cuda_device

    if device != "cpu" and not re.fullmatch(r"cuda(:\d+)?", device):
        raise click.BadParameter(f"{device!r}: use cuda, cuda:N or cpu", param_hint="'--device'")
    if device.startswith("cuda"):
        name = visible_cuda_device()
        if name is None:
            raise click.UsageError("phantora calibrate times kernels on a CUDA GPU and none is visible "
                                   "(torch.cuda.is_available() is False); run it on the GPU to calibrate, or pass "
                                   "--device cpu to check the pipeline on this CPU")
        click.echo(f"calibrating {name} into {output}", err=True)
    grid = "tiny" if device == "cpu" else "quick" if quick else "full"
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


if __name__ == "__main__":
    main()
