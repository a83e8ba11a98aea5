"""Issue 19, point 1 (second half): an exception inside the simulator ends the run as a script
error does: one line naming what failed, the trace closed and valid, exit 1, no rank left running.

The failure is made inside this test process: run_trace runs in-process (the rank processes are
real) with one simulator component replaced by one that raises, as a bug there would."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from phantora.hardware import lookup_gpu
from phantora.net.cluster import load_cluster
from phantora.net.network import Network
from phantora.simulator.launch import TraceRun, format_summary, run_trace
from phantora.trace.check import check_chrome_trace, load_chrome_trace

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _two_rank_run(tmp_path: Path) -> TraceRun:
    return TraceRun(command=[sys.executable, str(SCRIPTS / "dist_allreduce_pidfile.py")], output=tmp_path / "run.json",
                    gpu=lookup_gpu("h100"), cluster=load_cluster("dgx-h100", nodes=1), nproc_per_node=2,
                    extra_env={"PIDFILE_DIR": str(tmp_path)})


def _overflow(*args, **kwargs):
    raise TypeError("Integer exceeds 64-bit range")  # what a 1e-30 GB/s link once gave


@pytest.mark.parametrize("method", ["_validated", "_end"])  # used by submit, finish_time
def test_a_network_failure_ends_the_run_with_one_line_and_a_valid_trace(tmp_path, monkeypatch, capfd, method):
    monkeypatch.setattr(Network, method, _overflow)
    run = _two_rank_run(tmp_path)
    result = run_trace(run)
    err = capfd.readouterr().err
    assert result.exit_code == 1
    assert result.simulator_error is not None
    line = result.simulator_error.message
    assert "network" in line and "TypeError: Integer exceeds 64-bit range" in line, line
    assert "\n" not in line
    assert "Traceback" not in err, err[-3000:]  # no raw traceback on the terminal
    assert line in format_summary(run, result)
    # the trace is closed, valid, and says what ended it
    assert check_chrome_trace(run.output).ok
    assert not Path(str(run.output) + ".partial").exists()
    meta = load_chrome_trace(run.output)["metadata"]
    assert meta["exit_code"] == 1 and "Integer exceeds 64-bit range" in meta["simulator_error"]
    # the full traceback is kept for a bug report, in the file the line names
    assert result.simulator_error.details.exists() and str(result.simulator_error.details) in line
    assert "Traceback" in result.simulator_error.details.read_text()
    for r in range(2):  # no orphan rank
        assert not _alive(int((tmp_path / f"rank{r}.pid").read_text()))
