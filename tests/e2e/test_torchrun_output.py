"""torchrun's output options when phantora starts torchrun's workers itself (several nodes, or
--ranks): the console lines, their prefixes and the log files are those torchrun's own agent
gives (phantora/simulator/worker_logs.py). The reference is torchrun itself, which phantora runs
as it is for one node with every rank."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from test_trace_cli import SCRIPTS

TORCHRUN = str(Path(sys.executable).parent / "torchrun")
OUTPUT_OPTIONS = ("--local-ranks-filter", "1", "--role", "rank", "--tee", "3")


def _trace(tmp_path: Path, name: str, phantora_options: tuple[str, ...], *torchrun_args: str):
    cmd = [sys.executable, "-m", "phantora.cli", "trace", "-q", *phantora_options, "-o", str(tmp_path / f"{name}.json"),
           "--", TORCHRUN, *torchrun_args, str(SCRIPTS / "worker_output.py")]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def _worker_lines(text: str) -> list[str]:
    return sorted(line for line in text.splitlines() if " from rank " in line or "phantora's variables" in line)


def _log_files(root: Path) -> dict[str, str]:
    """attempt_0/<local rank>/<stream>.log -> contents, for the one run directory under root."""
    (run_dir,) = root.iterdir()
    return {str(p.relative_to(run_dir)): p.read_text() for p in sorted(run_dir.rglob("*.log"))}


def test_tee_filter_and_role_give_torchruns_console_lines_and_log_files(tmp_path):
    """--local-ranks-filter 1 --role rank --tee 3 --log-dir D (TorchTitan's run_train.sh passes the
    first three): only local rank 1 on the console, each line prefixed `[rank1]:`, and every
    worker's streams in D's files, with --ranks 0,1 (phantora starts the workers) as with
    torchrun itself (--ranks all)."""
    runs = {}
    for ranks in ("all", "0,1"):
        logs = tmp_path / f"logs-{ranks}"
        proc = _trace(tmp_path, ranks, ("--ranks", ranks), "--nproc-per-node", "2", *OUTPUT_OPTIONS,
                      "--log-dir", str(logs))
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[ranks] = (_worker_lines(proc.stdout), _worker_lines(proc.stderr), _log_files(logs))
    assert runs["0,1"] == runs["all"]
    stdout, stderr, files = runs["0,1"]
    assert stdout == ["[rank1]:out from rank 1 role rank error file set", "[rank1]:phantora's variables: []"]
    assert stderr == ["[rank1]:err from rank 1"]
    assert sorted(files) == ["attempt_0/0/stderr.log", "attempt_0/0/stdout.log", "attempt_0/1/stderr.log",
                             "attempt_0/1/stdout.log"]
    assert files["attempt_0/0/stderr.log"] == "err from rank 0\n"


def test_redirected_workers_of_several_nodes_write_one_log_directory_per_node(tmp_path):
    """--nnodes 2 --redirects 3: no worker writes to the console; each node's agent would make its
    own run directory, and so does phantora, one per node with processes."""
    logs = tmp_path / "logs"
    proc = _trace(tmp_path, "nodes", (), "--nnodes", "2", "--nproc-per-node", "1", "--redirects", "3",
                  "--log-dir", str(logs))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _worker_lines(proc.stdout) == [] and _worker_lines(proc.stderr) == []
    nodes = sorted(logs.iterdir())
    assert len(nodes) == 2
    written = sorted((p / "attempt_0" / "0" / "stdout.log").read_text().splitlines()[0] for p in nodes)
    assert written == [f"out from rank {r} role default error file set" for r in range(2)]


def test_a_malformed_ranks_filter_is_refused_as_torchrun_refuses_it(tmp_path):
    proc = _trace(tmp_path, "bad", ("--ranks", "0,1"), "--nproc-per-node", "2", "--local-ranks-filter", "a")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "--local_ranks_filter must be a comma-separated list of integers" in proc.stderr


def test_phantoras_own_node_options_in_front_of_torchrun_start_each_rank_once(tmp_path):
    """`phantora trace --nnodes 2 --nproc-per-node 1 -- torchrun --nnodes 2 --nproc-per-node 1 ...`,
    as a user writes both: phantora used to start torchrun itself once per rank, and every agent
    failed on the same rendezvous port (EADDRINUSE). Each worker runs once and says what it says
    without phantora's copy of the options."""
    runs = {}
    for name, options in (("both", ("--nnodes", "2", "--nproc-per-node", "1")), ("torchrun", ())):
        proc = _trace(tmp_path, name, options, "--nnodes", "2", "--nproc-per-node", "1")
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = _worker_lines(proc.stdout)
    assert runs["both"] == runs["torchrun"]
    assert [line.split(" role ")[0] for line in runs["both"] if " from rank " in line] == [
        "out from rank 0", "out from rank 1"]


def test_phantora_and_torchrun_process_counts_that_disagree_are_refused_naming_both(tmp_path):
    proc = _trace(tmp_path, "disagree", ("--nproc-per-node", "2"), "--nproc-per-node", "1")
    assert proc.returncode != 0
    assert "phantora --nproc-per-node 2 and torchrun --nproc-per-node 1 disagree" in proc.stderr, proc.stderr[-3000:]
