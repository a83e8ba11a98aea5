"""Issue 19, points 3 and 4: what a long run is doing, while it runs.

A rank that stops making progress is reported (once, with its pid); a collective waiting for a
missing member is reported before it times out; the trace on disk grows as the run goes, so a
run killed from outside leaves a prefix `summary` and `query` read (with a warning); a status
line on a terminal, plain periodic lines elsewhere, none with --quiet."""

from __future__ import annotations

import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from phantora.trace.check import check_chrome_trace, load_chrome_trace

from test_trace_cli import SCRIPTS, phantora, trace_script

ROOT = Path(__file__).resolve().parents[2]


def test_a_rank_spinning_in_python_is_reported_and_a_stopped_run_leaves_a_readable_trace(tmp_path):
    out = tmp_path / "run.json"
    proc = subprocess.Popen([sys.executable, "-m", "phantora.cli", "trace", "--status-every", "2", "-o", str(out), "--",
                             sys.executable, str(SCRIPTS / "python_spin.py")], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, PIDFILE_DIR=str(tmp_path)))
    assert proc.stdout is not None and "STARTED" in proc.stdout.readline()
    time.sleep(4)
    # while it runs, the .partial holds the run so far: readable, said to be truncated
    partial = Path(str(out) + ".partial")
    assert partial.stat().st_size > 0
    cut = tmp_path / "cut.json"
    shutil.copy(partial, cut)
    for args in (("summary", str(cut)), ("query", str(cut), "select count(*) as n from slice")):
        read = phantora(*args)
        assert read.returncode == 0, read.stderr
        assert "is truncated" in read.stderr
    assert int(phantora("query", str(cut), "select count(*) from slice", "--format", "csv").stdout.split()[-1]) > 20
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    pid = int((tmp_path / "rank0.pid").read_text())
    assert f"rank 0 (pid {pid}) has sent nothing for" in stderr and "running pure Python" in stderr
    assert stderr.count("has sent nothing") == 1  # said once
    assert "phantora: running | simulated" in stderr  # the periodic status line (stderr is a pipe)
    assert check_chrome_trace(out).ok and load_chrome_trace(out)["metadata"]["exit_code"] == 143
    try:
        os.kill(pid, 0)
        raise AssertionError("the rank outlived the run")
    except ProcessLookupError:
        pass


def test_a_collective_waiting_for_a_missing_rank_is_reported_before_it_times_out(tmp_path):
    proc, out = trace_script(tmp_path, str(SCRIPTS / "dist_missing_rank.py"),
                             options=("--nproc-per-node", "2", "--collective-timeout", "8", "--status-every", "2"))
    assert proc.returncode == 1
    notice = [line for line in proc.stderr.splitlines() if "has waited" in line]
    assert len(notice) == 1, proc.stderr[-3000:]
    assert "all_reduce(4,000 bytes" in notice[0] and "for rank(s) [1]" in notice[0]
    assert "dist_missing_rank.py:14" in notice[0] and "--collective-timeout 8 s" in notice[0]
    assert proc.stderr.index("has waited") < proc.stderr.index("timed out after 8 s")
    assert check_chrome_trace(out).ok


def _on_a_terminal(tmp_path: Path, *options: str) -> tuple[int, str]:
    """phantora trace with stderr on a pseudo-terminal; everything it drew there."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "phantora.cli", "trace", *options, "-o", str(tmp_path / "run.json"),
                             "--", sys.executable, str(SCRIPTS / "short_steps.py")], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=slave, env=dict(os.environ, TERM="xterm", COLUMNS="200"))
    os.close(slave)
    drawn = b""
    while True:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal closed: phantora exited
                break
            if not chunk:
                break
            drawn += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    return proc.wait(timeout=60), drawn.decode(errors="replace")


def test_a_status_line_on_a_terminal_and_none_with_quiet(tmp_path):
    rc, drawn = _on_a_terminal(tmp_path)
    assert rc == 0, drawn[-3000:]
    assert re.search(r"running \| step \d on 1 rank\(s\) \| simulated \d\.\d{3} s \| wall 0:0\d", drawn), drawn[-3000:]
    assert "\x1b[2K" in drawn  # drawn in place, cleared at the end (rich's transient status)
    assert "phantora: simulated 1 rank(s)" in drawn
    rc, drawn = _on_a_terminal(tmp_path, "--quiet")
    assert rc == 0
    assert "running |" not in drawn and "starting ranks" not in drawn
    assert "phantora: simulated 1 rank(s)" in drawn
