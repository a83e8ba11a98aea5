"""Running one of TorchTitan's own integration tests (integration_list.py) under phantora, as
its run_tests.py runs it: each variant's shell command, from a directory set up as a checkout's
root, with `phantora trace -o TRACE --` in front of `./run_train.sh`; variants in order, stopping
at the first that exits non-zero. Shared by tests/frameworks/test_torchtitan_integration.py and
benchmarks/frameworks/torchtitan_integration.py.
"""

from __future__ import annotations

import os
import re
import resource
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.frameworks.torchtitan.integration_list import OUTPUT_DIR, OverrideDefinitions, command

ROOT = Path(__file__).resolve().parents[3]
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# the start of TorchTitan's MetricsProcessor.log line for a training step (components/metrics.py;
# the validator's is "validate step:"), behind torchrun's "[rankN]:" prefix (--local-ranks-filter
# names every rank, so every rank's lines are printed)
_STEP = re.compile(r"^\[rank(\d+)\]:.* - INFO - step:\s*(\d+)\s+loss:", re.M)
# a Python exception line (possibly behind "[rankN]:"), or a logged error
_ERROR = re.compile(r"(?:^|\s|:)((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure)\b.*)"
                    r"|(\bERROR\b.*)|(\berror: .*)")
# torchrun's own report that a child failed names the rank, not the cause; `set -x` echoes; warnings
_WRAPPER = re.compile(r"ChildFailedError|elastic/multiprocessing|torch\.distributed\.elastic|errors/__init__|"
                      r"To enable traceback see|traceback :|^\+ |- WARNING -|^W\d{4} |Warning:")
_RANK = re.compile(r"^\[(?:rank|default)\d+\]:\s?")


def pip_install_missing(python: str, packages: tuple[str, ...]) -> list[str]:
    """pip install those of `packages` (name==version) not installed at that version; returns them."""
    missing = []
    for spec in packages:
        name, _, version = spec.partition("==")
        probe = subprocess.run([python, "-c", f"import importlib.metadata as m; print(m.version({name!r}))"],
                               capture_output=True, text=True)
        if probe.returncode != 0 or (version and probe.stdout.strip() != version):
            missing.append(spec)
    if missing:
        proc = subprocess.run([python, "-m", "pip", "install", "--quiet", *missing], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"pip install {' '.join(missing)} failed:\n{proc.stderr[-3000:]}")
    return missing


def environment(python: str, workdir: Path) -> dict[str, str]:
    """The shell's environment: the CUDA environment's bin/ first on PATH (run_train.sh calls
    `torchrun`), this checkout on PYTHONPATH (for `python -m phantora.cli`), RUNNER_TEMP=workdir
    as on TorchTitan's CI (the list is built for it: runnable_tests(str(workdir))), the datasets
    cache in workdir and the Hugging Face Hub offline."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(python).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(RUNNER_TEMP=str(workdir), HF_HOME=str(workdir / "hf"), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    return env


def phantora_command(test: OverrideDefinitions, args: tuple[str, ...], workdir: Path, trace: Path,
                     ranks: str | None = None) -> str:
    """run_tests.py's command for one variant with `phantora trace -o TRACE --` in front of
    ./run_train.sh, output_dir workdir/artifacts-to-be-uploaded; `ranks`: phantora's --ranks."""
    cmd = command(test, args, str(workdir / OUTPUT_DIR))
    assert cmd.count(" ./run_train.sh ") == 1, cmd
    if not ranks:
        phantora = f"{shlex.quote(sys.executable)} -m phantora.cli trace -o {shlex.quote(str(trace))} --"
        return cmd.replace(" ./run_train.sh ", f" {phantora} ./run_train.sh ", 1)
    # --ranks needs the torchrun line itself (phantora starts the chosen ranks' processes), so
    # phantora goes in front of run_train.sh's normal-training torchrun line, its variables filled
    phantora = f"{shlex.quote(sys.executable)} -m phantora.cli trace --ranks {shlex.quote(ranks)} -o {shlex.quote(str(trace))} --"
    all_ranks = ",".join(map(str, range(test.ngpu)))
    line = (f'PYTORCH_ALLOC_CONF="expandable_segments:True" TORCHFT_LIGHTHOUSE="http://localhost:29510" {phantora} '
            f'torchrun --nproc_per_node={test.ngpu} --rdzv_backend c10d --rdzv_endpoint="localhost:0" '
            f"--local-ranks-filter {all_ranks} --role rank --tee 3 -m torchtitan.train --module llama3 --config llama3_debugmodel")
    return cmd.replace(" ./run_train.sh ", f" {line} ", 1)


def _statements(output: str) -> list[str]:
    """The output's lines without colours and torchrun's "[rankN]:" prefix; a box that tyro (TorchTitan's
    command-line parser) draws around an error ("╭─ Value error ─╮ │ ... │ ╰─╯") joined into one line."""
    out: list[str] = []
    box: list[str] | None = None
    footer = False  # past the box's rule: its help pointer, not the error
    for raw in output.splitlines():
        line = _RANK.sub("", _ANSI.sub("", raw)).strip()
        if line.startswith("╭─"):
            box, footer = [line.strip("╭─╮ ") + ":"], False
        elif box is not None and line.startswith("│"):
            text = line.strip("│ ")
            footer = footer or text.startswith("─")
            if text and not footer:
                box.append(text)
        elif box is not None:
            out.append(" ".join(box))
            box = None
            if not line.startswith("╰"):
                out.append(line)
        else:
            out.append(line)
    if box is not None:
        out.append(" ".join(box))
    return out


def last_error_line(output: str) -> str:
    """The last line of a failed run's output that states an error (torchrun's wrapper report,
    which names the rank and not the cause, and warnings left out); else the last non-empty line."""
    lines = _statements(output)
    for line in reversed(lines):
        if line and (_ERROR.search(line) or line.endswith("error:")) and not _WRAPPER.search(line):
            return line[:300]
    return next((line[:300] for line in reversed(lines) if line), "(no output)")


def steps_per_rank(output: str) -> dict[int, list[int]]:
    """The steps TorchTitan logged, per rank."""
    steps: dict[int, list[int]] = {}
    for rank, step in _STEP.findall(_ANSI.sub("", output)):
        steps.setdefault(int(rank), []).append(int(step))
    return steps


@dataclass
class Variant:
    index: int
    command: str  # the shell command run from the working directory
    returncode: int | None = None  # None: killed at the wall-time limit
    wall_s: float = 0.0
    cpu_s: float = 0.0  # CPU of the command and every process it waited for (getrusage), which load changes less
    log: str = ""
    trace: str = ""
    trace_written: bool = False
    steps: dict[int, list[int]] = field(default_factory=dict)  # rank -> steps logged
    over_test_timeout: bool = False  # ran longer than the test's own `timeout`

    @property
    def output(self) -> str:
        return Path(self.log).read_text(errors="replace")


@dataclass
class Result:
    test: str
    descr: str
    ngpu: int
    passed: bool = False
    cause: str = ""
    variants: list[Variant] = field(default_factory=list)
    not_run: int = 0  # variants after the failing one (run_single_test stops there)


def _run_shell(cmd: str, cwd: Path, env: dict[str, str], log: Path, timeout: float) -> tuple[int | None, float, float]:
    """cmd in a shell as run_tests.py's _run_cmd runs it (stdout and stderr merged), into log; at
    the timeout the whole process group ends (phantora, torchrun and the ranks under it). Returns
    the exit code, wall seconds and CPU seconds."""
    start = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(log, "w") as f:
        f.write(f"$ {cmd}\n")
        f.flush()
        proc = subprocess.Popen(cmd, shell=True, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            rc = None
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return rc, time.monotonic() - start, cpu


def run_test(test: OverrideDefinitions, workdir: Path, env: dict[str, str], timeout: float,
             ranks: str | None = None) -> Result:
    """Every variant of one test in order from workdir (write_checkout's), stopping at the first
    failure as run_single_test does; logs in workdir/logs, traces in workdir/traces."""
    result = Result(test.test_name, test.test_descr, test.ngpu)
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    (workdir / "traces").mkdir(parents=True, exist_ok=True)
    for i, args in enumerate(test.override_args):
        stem = f"{test.test_name}.{i}"
        trace, log = workdir / "traces" / f"{stem}.json", workdir / "logs" / f"{stem}.log"
        trace.unlink(missing_ok=True)
        v = Variant(i, phantora_command(test, tuple(args), workdir, trace, ranks), log=str(log), trace=str(trace))
        v.returncode, v.wall_s, v.cpu_s = _run_shell(v.command, workdir, env, log, timeout)
        output = v.output
        v.trace_written = trace.exists()
        v.steps = steps_per_rank(output)
        v.over_test_timeout = test.timeout is not None and v.wall_s > test.timeout
        result.variants.append(v)
        if v.returncode != 0:
            result.cause = (f"variant {i}: killed at the {timeout:.0f} s limit" if v.returncode is None
                            else f"variant {i}: rc={v.returncode}: {last_error_line(output)}")
            result.not_run = len(test.override_args) - i - 1
            return result
    result.passed = True
    return result
