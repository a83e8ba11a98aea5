"""Issue 17, item 6: `phantora trace --nproc-per-node N -- python script.py` forks its ranks from a
server that imported torch once (phantora/simulator/forkserver.py, interpose/launch/forkserver.py). Each
forked rank must be the process a fresh `python script.py` would be: its own RANK / LOCAL_RANK,
argv, sys.path[0], intra-op threads and random seed; its exit code, signals and failures handled
as a Popen'd rank's; and everything the fork server cannot do soundly starts with Popen."""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from interpose.launch.warm import DIR_ENV as WARM_DIR_ENV, IDLE_ENV as WARM_IDLE_ENV, RUN_VARIABLES
from phantora.simulator.forkserver import fork_plan
from phantora.trace.check import check_chrome_trace

from test_signals import _ended, _pids, _start
from test_trace_cli import ROOT, SCRIPTS

SCRIPT = SCRIPTS / "forkserver_rank.py"


def _trace(tmp_path: Path, *script_args: str, nproc: int = 2, env: dict[str, str] | None = None,
           command: tuple[str, ...] = (), cwd: Path = ROOT) -> tuple[subprocess.Popen, str, str]:
    cmd = [sys.executable, "-m", "phantora.cli", "trace", "--nproc-per-node", str(nproc), "-o",
           str(tmp_path / "run.json"), "--", *(command or (sys.executable, str(SCRIPT))), *script_args]
    proc = subprocess.Popen(cmd, cwd=cwd, env=dict(os.environ, **(env or {})), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=300)
    assert check_chrome_trace(tmp_path / "run.json").ok
    return proc, out, err


def _ranks(stdout: str) -> list[dict]:
    infos = [json.loads(m) for m in re.findall(r"RANKINFO (\{[^{}]*\})", stdout)]  # lines of ranks may interleave
    return sorted(infos, key=lambda i: int(i["rank"]))


def test_forked_ranks_have_their_own_rank_environment_argv_threads_and_seed(tmp_path):
    proc, out, err = _trace(tmp_path, "a", "--flag", nproc=3, env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, err[-3000:]
    ranks = _ranks(out)
    assert [(r["rank"], r["local_rank"], r["dist_rank"]) for r in ranks] == [("0", "0", 0), ("1", "1", 1), ("2", "2", 2)]
    assert all(r["torch_before"] for r in ranks), "the ranks were not forked from the fork server"
    assert len({r["ppid"] for r in ranks}) == 1 and ranks[0]["ppid"] != proc.pid  # the server's children
    assert len({r["pid"] for r in ranks}) == 3
    assert all(r["argv"] == [str(SCRIPT), "a", "--flag"] and r["file"] == str(SCRIPT) for r in ranks)
    assert all(r["path0"] == str(SCRIPT.parent) for r in ranks)
    assert all(r["threads"] == 1 for r in ranks)  # OMP_NUM_THREADS (torch would use every core)
    assert len({r["draw"] for r in ranks}) == 3  # numpy's global generator reseeded per process
    assert all(r["sum"] == 3.0 and r["devices"] == 8 for r in ranks)
    assert "phantora: simulated 3 rank(s)" in err


def test_python_m_module_ranks_are_forked_with_the_argv_and_path_of_python_m(tmp_path):
    proc, out, err = _trace(tmp_path, "b", command=(sys.executable, "-m", "forkserver_rank"), cwd=SCRIPTS,
                            env={"PYTHONPATH": str(ROOT)})  # this checkout's phantora, from another directory
    assert proc.returncode == 0, err[-3000:]
    ranks = _ranks(out)
    assert [r["rank"] for r in ranks] == ["0", "1"] and all(r["torch_before"] for r in ranks)
    assert all(r["argv"] == [str(SCRIPT), "b"] and r["path0"] == str(SCRIPTS) for r in ranks)


def test_phantora_fork_server_0_starts_every_rank_with_popen(tmp_path):
    proc, out, err = _trace(tmp_path, env={"PHANTORA_FORK_SERVER": "0"})
    assert proc.returncode == 0, err[-3000:]
    ranks = _ranks(out)
    assert [r["rank"] for r in ranks] == ["0", "1"]
    assert not any(r["torch_before"] for r in ranks)
    assert all(r["ppid"] == proc.pid for r in ranks)


def test_a_forked_ranks_exit_code_is_the_root_cause(tmp_path):
    proc, out, err = _trace(tmp_path, "--exit-rank", "1", "--code", "3")
    assert proc.returncode == 1, err[-3000:]
    assert all(r["torch_before"] for r in _ranks(out))
    assert "rank 1 exited with code 3 (the first rank to fail: the root cause)" in err


def test_an_uncaught_exception_prints_the_scripts_traceback_and_exits_1(tmp_path):
    proc, out, err = _trace(tmp_path, "--raise-rank", "0")
    assert proc.returncode == 1, err[-3000:]
    assert "rank 0 exited with code 1" in err
    traceback = err[err.index("Traceback (most recent call last):"):]
    assert f'File "{SCRIPT}", line' in traceback and "ValueError: rank 0 failed on purpose" in traceback
    frames = [line for line in traceback.splitlines() if line.split("]: ", 1)[-1].startswith("  File ")]
    assert frames and all(str(SCRIPT) in line for line in frames), frames  # as `python script.py` prints it


def test_a_script_that_sets_the_environment_before_importing_torch_gets_a_fresh_import(tmp_path):
    """torch read CUDA_VISIBLE_DEVICES when the server imported it: a rank whose script changes the
    environment before `import torch` restarts as a fresh process, which sees its one GPU."""
    proc, out, err = _trace(tmp_path, "--set-visible")
    assert proc.returncode == 0, err[-3000:]
    ranks = _ranks(out)
    assert [(r["rank"], r["devices"], r["torch_before"]) for r in ranks] == [("0", 1, False), ("1", 1, False)]


def test_ctrl_c_reaches_forked_ranks_and_the_trace_stays_valid(tmp_path):
    proc = _start(tmp_path, 2)
    pids = _pids(tmp_path, 2)
    parents = {int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) for pid in pids}
    assert len(parents) == 1 and proc.pid not in parents  # forked by the server, not Popen'd
    os.killpg(proc.pid, signal.SIGINT)
    stderr = _ended(proc, tmp_path, 2)  # valid trace, exit code in it, no rank left running
    assert proc.returncode == 130, stderr[-3000:]
    assert "run interrupted by SIGINT (Ctrl-C): 2 rank process(es) stopped" in stderr


def test_the_fork_server_is_used_only_where_it_is_sound(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    envs = [{"PATH": os.environ["PATH"], "WORLD_SIZE": "2", "RANK": str(r), "LOCAL_RANK": str(r)} for r in range(2)]
    plan = fork_plan([sys.executable, str(script), "--x"], envs)
    assert plan is not None and plan.path0 == str(tmp_path) and plan.common_env == {"PATH": os.environ["PATH"],
                                                                                   "WORLD_SIZE": "2"}
    assert fork_plan(["python3", "-m", "pkg.train"], envs).path0 == os.getcwd()
    for command in (["torchrun", "--nproc-per-node", "2", str(script)], ["bash", str(script)],
                    [sys.executable, "-c", "pass"], [sys.executable, "-u", str(script)],
                    [sys.executable, str(tmp_path / "missing.py")], [sys.executable, "-m"], [sys.executable]):
        assert fork_plan(command, envs) is None, command
    assert fork_plan([sys.executable, str(script)], envs[:1]) is None  # one rank: nothing to share
    # unless a warm fork server shares torch's import with later runs
    assert fork_plan([sys.executable, str(script)], [dict(envs[0], **{WARM_DIR_ENV: str(tmp_path)})]) is not None
    assert fork_plan([sys.executable, str(script)], [dict(e, PHANTORA_FORK_SERVER="0") for e in envs]) is None
    # a variable other than the rank's identity differs: torch may read it at import
    assert fork_plan([sys.executable, str(script)], [dict(e, CUDA_VISIBLE_DEVICES=e["RANK"]) for e in envs]) is None


def test_importing_torch_reads_none_of_the_variables_that_differ_between_ranks_or_runs():
    """The fork server imports torch and torch._dynamo without them (every rank has its own, and a
    warm server's later runs their own). Reads by name count; going through every variable does
    not (tqdm looks for its TQDM_ ones so)."""
    probe = f"""
import os, sys
reads = []
cls = type(os.environ)
get, has = cls.__getitem__, cls.__contains__
def by_name(k):
    if sys._getframe(2).f_code.co_name != "__iter__":  # not os.environ.items() / .values()
        reads.append(k)
cls.__getitem__ = lambda self, k: (by_name(k), get(self, k))[1]
cls.__contains__ = lambda self, k: (by_name(k), has(self, k))[1]
import torch, torch._dynamo
print(sorted(set(reads) & set({sorted(RUN_VARIABLES)!r})))
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=True).stdout
    assert out.strip() == "[]"


WARM_SCRIPT = SCRIPTS / "warm_rank.py"


def _warm_runs(tmp_path: Path, folder: str, *runs: dict) -> list[list[dict]]:
    """Each run: {"env": ..., "nproc": ..., "cwd": ...}; returns each run's WARMINFO lines."""
    infos = []
    for i, r in enumerate(runs):
        nproc = ("--nproc-per-node", str(r["nproc"])) if r.get("nproc") else ()
        cmd = [sys.executable, "-m", "phantora.cli", "trace", *nproc, "-o", str(tmp_path / f"run{i}.json"), "--",
               sys.executable, str(WARM_SCRIPT), f"run{i}", *r.get("script_args", ())]
        env = dict(os.environ, **{WARM_DIR_ENV: folder}, **r.get("env", {}))
        proc = subprocess.run(cmd, cwd=r.get("cwd", ROOT), env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "nanobind" not in proc.stderr  # a forked process's exit is a fresh one's (gc.unfreeze)
        assert check_chrome_trace(tmp_path / f"run{i}.json").ok
        infos.append([json.loads(m) for m in re.findall(r"WARMINFO (\{[^{}]*\})", proc.stdout)])
    return infos


def _alive(pid: int) -> bool:
    """Running, not a zombie that nobody has reaped yet (the launcher that started it may be gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _server_pids(folder: str) -> set[int]:
    return {int(p.read_text()) for p in Path(folder).glob("*.pid")}


def test_a_warm_fork_server_serves_later_runs_of_the_same_interpreter_and_environment(tmp_path):
    folder = tempfile.mkdtemp(prefix="pfs-")
    try:
        other = tmp_path / "elsewhere"
        other.mkdir()
        # OMP_NUM_THREADS: what --nproc-per-node's ranks get anyway; PYTHONPATH: this checkout's
        # phantora from any directory (an installed one elsewhere is another package: another server)
        env = {"WARM_PROBE": "a", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        a, b, c, d = _warm_runs(
            tmp_path, folder,
            {"env": dict(env, PHANTORA_HOST_TIME="modelled")},
            # phantora's per-run settings and the directory differ: the same server
            {"env": dict(env, PHANTORA_HOST_TIME="counted"), "cwd": other},
            {"env": env, "nproc": 2},  # so do torchrun's variables
            # a variable torch may read at import differs: a server of its own
            {"env": dict(env, CUDA_VISIBLE_DEVICES="0,1,2")})
        servers = _server_pids(folder)
        assert len(servers) == 2
        assert len(a) == len(b) == len(d) == 1 and len(c) == 2
        ranks = a + b + c + d
        assert all(r["torch_before"] and r["sum"] == 8.0 for r in ranks)  # forked, and simulated
        assert {r["grandparent"] for r in a + b + c} == {a[0]["grandparent"]} and a[0]["grandparent"] in servers
        assert d[0]["grandparent"] in servers - {a[0]["grandparent"]} and d[0]["devices"] == 3
        assert a[0]["devices"] == 8 and a[0]["cwd"] == str(ROOT) and b[0]["cwd"] == str(other)
        assert [r[0]["argv"] for r in (a, b)] == [[str(WARM_SCRIPT), "run0"], [str(WARM_SCRIPT), "run1"]]
        assert all(r["probe"] == "a" for r in ranks)
    finally:
        for pid in _server_pids(folder):
            os.kill(pid, signal.SIGTERM)


def test_a_warm_fork_server_exits_when_idle(tmp_path):
    folder = tempfile.mkdtemp(prefix="pfs-")
    """Idle once no run is being served: a run longer than the idle time keeps it (the suite's
    60 s once let a server go in the middle of a slow first run)."""
    (a,) = _warm_runs(tmp_path, folder, {"env": {WARM_IDLE_ENV: "3"}, "script_args": ("--sleep", "6")})
    pid = a[0]["grandparent"]
    assert _alive(pid)  # a 6 s run, then the run's end: not 3 s idle yet
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)
    assert not list(Path(folder).glob("*.sock")) and not list(Path(folder).glob("*.pid"))  # it removed both


def test_without_a_warm_directory_one_rank_runs_start_fresh(tmp_path):
    (a,) = _warm_runs(tmp_path, "", {})
    assert a[0]["torch_before"] is False


@pytest.mark.parametrize("as_module", [False, True], ids=["script", "python-m"])
def test_a_forked_rank_exits_as_a_fresh_python_would(tmp_path, as_module):
    """A forked rank leaves without tearing down the server's frozen objects (torch's import), which
    would cost each rank most of a second: what the script left for Python's exit must still happen
    as it does in a fresh `python script.py` (or `python -m module`, whose globals are __main__'s).
    Compared with PHANTORA_FORK_SERVER=0 on one script."""
    results, printed = {}, {}
    command = (sys.executable, "-m", "forkserver_exit") if as_module else (sys.executable, str(SCRIPTS / "forkserver_exit.py"))
    for label, env in (("forked", {}), ("fresh", {"PHANTORA_FORK_SERVER": "0"})):
        folder = tmp_path / label
        folder.mkdir()
        proc, out, err = _trace(folder, str(folder), env=dict(env, PYTHONPATH=str(ROOT)), command=command,
                                cwd=SCRIPTS if as_module else ROOT)
        printed[label] = lines = [line.split("]: ", 1)[-1] for line in out.splitlines() if "rank" in line]
        files = {p.name: (gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()).decode()
                 for p in sorted(folder.glob("*.txt*"))}
        results[label] = (proc.returncode, sorted(lines), "nanobind" in err, files)
    assert results["forked"] == results["fresh"]
    returncode, _, leaks, files = results["forked"]
    assert returncode == 0 and not leaks
    for rank in (0, 1):
        for lines in printed.values():  # each rank's lines in order: threads joined, atexit, finalizers
            own = [line for line in lines if line.endswith(f"rank {rank}") or line.startswith(f"thread rank {rank} ")]
            assert sorted(own) == sorted([f"end of script rank {rank}", f"thread rank {rank} {sum(range(2_000_000))}",
                                          f"atexit rank {rank}", f"del rank {rank}"])
            assert own[-2:] == [f"atexit rank {rank}", f"del rank {rank}"] and own[-3].startswith("thread")
        assert files[f"plain{rank}.txt"] == "unflushed " * 1000
        assert files[f"zipped{rank}.txt.gz"] == "compressed " * 1000


def test_a_forked_ranks_system_exit_gives_pythons_status(capsys):
    """As _Py_HandleSystemExit: None is 0, an int is itself, anything else is printed and is 1."""
    from interpose.launch.forkserver import _system_exit_status

    assert [_system_exit_status(SystemExit(code)) for code in (None, 0, 3, True)] == [0, 0, 3, 1]
    assert capsys.readouterr().err == ""
    assert _system_exit_status(SystemExit("stopped: no data")) == 1
    assert capsys.readouterr().err == "stopped: no data\n"
