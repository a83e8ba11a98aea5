"""Python processes that something else starts under phantora (torchrun's agent and workers, a
framework's launcher) are forked by a warm fork server (interpose/launch/handoff.py): the
process started stands in for the forked one, passing on signals and its exit status, and
dies with it. Without a warm directory, or for a command line the server cannot start as it
is, the process runs itself."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from interpose.launch.handoff import forkable
from interpose.launch.warm import DIR_ENV, ROUTING_ENV
from phantora.routing import ENV as PHANTORA_ROUTING_ENV
from phantora.trace.check import check_chrome_trace

from test_forkserver import _server_pids
from test_trace_cli import ROOT, SCRIPTS

RANK_SCRIPT = SCRIPTS / "forkserver_rank.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")


def _stop_servers(folder: str) -> None:
    for pid in _server_pids(folder):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            pass
    return found


def test_a_command_line_is_forkable_only_as_a_plain_script_or_module_with_at_most_u(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    py = sys.executable
    assert forkable([py, str(script), "--lr", "1"]) == ([], [str(script), "--lr", "1"])
    assert forkable([py, "-u", str(script)]) == (["-u"], [str(script)])  # torchrun's workers
    assert forkable([py, "-u", "-m", "deepspeed.launcher.launch", "--x"]) == (["-u"], ["-m", "deepspeed.launcher.launch",
                                                                                       "--x"])
    for line in ([py], [py, "-c", "pass"], [py, "-O", str(script)], [py, "-m"], [py, "-m", "-x"], [py, "-"],
                 [py, str(tmp_path / "missing.py")], [py, str(tmp_path)]):
        assert forkable(line) is None, line


def test_the_routing_variable_named_without_importing_routing_is_routings():
    assert ROUTING_ENV == PHANTORA_ROUTING_ENV


def test_torchruns_agent_and_workers_are_forked_and_signals_and_exit_codes_pass_through(tmp_path):
    """torchrun, unchanged, under a warm directory: its agent and both workers come from the warm
    server (its log names each), a worker's exit code 3 reaches torchrun's report, and the SIGTERM
    torchrun then sends the other worker reaches the forked worker's own handler."""
    folder = tempfile.mkdtemp(prefix="pfs-")
    try:
        cmd = [sys.executable, "-m", "phantora.cli", "trace", "-o", str(tmp_path / "run.json"), "--", str(TORCHRUN),
               "--nproc-per-node", "2", str(RANK_SCRIPT), "--wait-rank", "0", "--exit-rank", "1", "--code", "3"]
        env = dict(os.environ, **{DIR_ENV: folder})
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1, proc.stderr[-3000:]
        ranks = sorted((json.loads(m) for m in re.findall(r"RANKINFO (\{[^{}]*\})", proc.stdout)),
                       key=lambda r: r["rank"])
        assert [r["rank"] for r in ranks] == ["0", "1"]
        assert all(r["torch_before"] for r in ranks), "the workers were not forked"
        assert all(r["orig_argv"][1:3] == ["-u", str(RANK_SCRIPT)] and r["write_through"] for r in ranks)  # python -u
        assert "SIGTERM rank 0" in proc.stdout  # torchrun's SIGTERM, passed on to the forked worker
        assert re.search(r"exitcode\s*:\s*3", proc.stderr), proc.stderr[-3000:]  # rank 1's sys.exit(3)
        assert check_chrome_trace(tmp_path / "run.json").ok
        # the agent's server and its workers' (torchrun adds variables to their environment)
        served = "".join(log.read_text() for log in Path(folder).glob("*.log"))
        assert served.count(f"'{TORCHRUN}'") == 1, served  # the agent
        assert served.count(f"'-u', '{RANK_SCRIPT}'") == 2, served  # its two workers
    finally:
        _stop_servers(folder)


def test_a_stand_in_killed_with_sigkill_takes_its_forked_process_with_it(tmp_path):
    folder = tempfile.mkdtemp(prefix="pfs-")
    try:
        # `python -u` is not a line phantora's launcher forks itself: it starts the process, which hands off
        cmd = [sys.executable, "-m", "phantora.cli", "trace", "-o", str(tmp_path / "run.json"), "--", sys.executable,
               "-u", str(SCRIPTS / "dist_train_forever.py")]
        env = dict(os.environ, **{DIR_ENV: folder}, PIDFILE_DIR=str(tmp_path), RANK="0", LOCAL_RANK="0",
                   WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29555")
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        assert "STARTED" in proc.stdout.readline()
        forked = int((tmp_path / "rank0.pid").read_text())
        (stand_in,) = _children(proc.pid)
        assert stand_in != forked and forked not in _children(stand_in)  # forked by the server, not by it
        os.kill(stand_in, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{forked}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not Path(f"/proc/{forked}").exists(), "the forked process outlived its stand-in"
        _, err = proc.communicate(timeout=120)
        assert proc.returncode != 0 and check_chrome_trace(tmp_path / "run.json").ok, err[-3000:]
    finally:
        _stop_servers(folder)


def test_without_a_warm_directory_torchruns_workers_run_themselves(tmp_path):
    cmd = [sys.executable, "-m", "phantora.cli", "trace", "-o", str(tmp_path / "run.json"), "--", str(TORCHRUN),
           "--nproc-per-node", "2", str(RANK_SCRIPT)]
    env = dict(os.environ, **{DIR_ENV: ""})
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads(m) for m in re.findall(r"RANKINFO (\{[^{}]*\})", proc.stdout)]
    assert len(ranks) == 2 and not any(r["torch_before"] for r in ranks)


def test_ctrl_c_of_a_torchrun_run_under_a_warm_server_ends_every_forked_process(tmp_path):
    """The terminal's SIGINT reaches phantora and torchrun's agent, a stand-in whose forked agent
    lives in the server's session: it is passed on, torchrun stops its workers (SIGTERM through
    their stand-ins), and the run exits 130 with a valid trace and nothing left running."""
    folder = tempfile.mkdtemp(prefix="pfs-")
    try:
        cmd = [sys.executable, "-m", "phantora.cli", "trace", "-o", str(tmp_path / "run.json"), "--", str(TORCHRUN),
               "--nproc-per-node", "2", str(SCRIPTS / "dist_train_forever.py")]
        env = dict(os.environ, **{DIR_ENV: folder}, PIDFILE_DIR=str(tmp_path))
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # its own process group, as a shell's foreground job
        assert proc.stdout is not None
        started, deadline = 0, time.monotonic() + 240
        while started < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, "the run ended before both workers started"
            started += line.count("STARTED")
        workers = [int((tmp_path / f"rank{r}.pid").read_text()) for r in range(2)]
        assert all(w not in _children(proc.pid) for w in workers)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err[-3000:]
        assert "run interrupted by SIGINT (Ctrl-C)" in err
        assert check_chrome_trace(tmp_path / "run.json").ok
        time.sleep(0.5)
        assert not [w for w in workers if Path(f"/proc/{w}").exists()], "a forked worker outlived the run"
    finally:
        _stop_servers(folder)
