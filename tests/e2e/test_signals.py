"""Issue 19, point 2: signals in multi-rank runs end the run as torchrun reports them: 130 / 143
with one line saying the run was interrupted or terminated; a rank killed from outside is named
as the root cause, the ranks stopped because of it are counted, not blamed; a valid trace and no
rank left running in every case."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from phantora.trace.check import check_chrome_trace, load_chrome_trace

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
SCRIPT = SCRIPTS / "dist_train_forever.py"


def _start(tmp_path: Path, nproc: int, script: Path = SCRIPT) -> subprocess.Popen:
    """phantora in its own session (process group), as a shell starts a foreground job."""
    env = dict(os.environ, PIDFILE_DIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "phantora.cli", "trace", "--nproc-per-node", str(nproc), "-o",
                             str(tmp_path / "run.json"), "--", sys.executable, str(script)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    started, deadline = 0, time.time() + 240
    assert proc.stdout is not None
    while started < nproc and time.time() < deadline:
        line = proc.stdout.readline()
        assert line, "phantora ended before every rank started"
        started += line.count("STARTED")  # two ranks' lines can interleave on the shared pipe
    time.sleep(0.5)
    return proc


def _pids(tmp_path: Path, nproc: int) -> list[int]:
    return [int((tmp_path / f"rank{r}.pid").read_text()) for r in range(nproc)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _ended(proc: subprocess.Popen, tmp_path: Path, nproc: int) -> str:
    _, stderr = proc.communicate(timeout=120)
    assert check_chrome_trace(tmp_path / "run.json").ok
    assert load_chrome_trace(tmp_path / "run.json")["metadata"]["exit_code"] == proc.returncode
    assert not [p for p in _pids(tmp_path, nproc) if _alive(p)], "a rank outlived the run"
    return stderr


def test_ctrl_c_of_a_two_rank_run_exits_130_saying_it_was_interrupted(tmp_path):
    proc = _start(tmp_path, 2)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole foreground group
    stderr = _ended(proc, tmp_path, 2)
    assert proc.returncode == 130, stderr[-3000:]
    assert "run interrupted by SIGINT (Ctrl-C): 2 rank process(es) stopped" in stderr
    assert "collective error" not in stderr and "exited without joining" not in stderr, stderr[-3000:]


def test_ctrl_c_does_not_simulate_the_collectives_still_in_the_network_and_says_so(tmp_path):
    """At hundreds of ranks, simulating what was still in the network to its end kept a Ctrl-C'd
    run alive for minutes; now those collectives are written as never run."""
    proc = _start(tmp_path, 2, SCRIPTS / "dist_async_then_wait.py")
    time.sleep(1.5)  # the records reach the simulator within a second (the rank's flusher)
    os.killpg(proc.pid, signal.SIGINT)
    stderr = _ended(proc, tmp_path, 2)
    assert proc.returncode == 130, stderr[-3000:]
    assert ("interrupted: 200 collective(s) still in the network were not simulated to their ends; "
            "the trace shows them as never run") in stderr, stderr[-3000:]
    trace = load_chrome_trace(tmp_path / "run.json")
    nccl = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "nccl" in e.get("name", "").lower()]
    launches = [e for e in nccl if e.get("cat") == "cpu_op"]
    assert len(launches) == 2 * 200 and all(e["args"].get("never ran") for e in launches)
    assert [e for e in nccl if e.get("cat") != "cpu_op"] == []  # not one all-reduce on a GPU's track


def test_sigterm_of_a_two_rank_run_exits_143_saying_it_was_terminated(tmp_path):
    proc = _start(tmp_path, 2)
    proc.send_signal(signal.SIGTERM)  # a job scheduler ends phantora alone
    stderr = _ended(proc, tmp_path, 2)
    assert proc.returncode == 143, stderr[-3000:]
    assert "run terminated by SIGTERM: 2 rank process(es) stopped" in stderr
    assert "collective error" not in stderr and "exited without joining" not in stderr, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]


def test_a_rank_killed_from_outside_is_the_root_cause_and_the_others_are_counted(tmp_path):
    proc = _start(tmp_path, 4)
    os.kill(_pids(tmp_path, 4)[2], signal.SIGKILL)  # the OOM killer takes rank 2
    stderr = _ended(proc, tmp_path, 4)
    assert proc.returncode == 1, stderr[-3000:]
    assert "rank 2 was killed by signal 9 (SIGKILL) (the first rank to fail: the root cause)" in stderr
    assert "3 other rank(s) stopped because of it: ranks [0, 1, 3]" in stderr
    for healthy in (0, 1, 3):  # no healthy rank is blamed
        assert f"rank {healthy} exited" not in stderr and f"rank {healthy} was killed" not in stderr
    assert "Traceback" not in stderr and "collective error" not in stderr, stderr[-3000:]
    assert len(stderr.splitlines()) < 40, stderr  # was about 400 lines of repeated tracebacks
