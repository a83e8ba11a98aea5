"""Sleeps that poll for another process are real (interpose/host/clock.py, REAL_SLEEP_MODULES): a rank
waiting for a file lock another process holds spends no simulated time spinning, and the lock's own
timeout runs in real time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def test_waiting_for_a_file_lock_another_process_holds_takes_no_simulated_time(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "phantora.cli", "trace", "--quiet", "--host-time", "modelled", "-o",
                           str(tmp_path / "run.json"), "--", sys.executable, str(SCRIPTS / "lock_poll.py"),
                           str(tmp_path / "x.lock")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    waited, timed_out = (json.loads(line) for line in proc.stdout.strip().splitlines()[-2:])
    # filelock polls every 50 ms for the 0.5 s the other process holds it: simulated, the wait
    # was a number of polls that depended on wall-clock timing (clock.py, REAL_SLEEP_MODULES)
    assert waited["simulated_s"] < 0.005
    assert timed_out == {"timeout": "Timeout"}  # its own timeout, in real time
