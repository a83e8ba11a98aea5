"""Issue 14, cause 8: the launch environment as torch reads it.

A rank's identity is the one torch.distributed uses (RANK from torchrun; LOCAL_RANK + NODE_RANK +
WORLD_SIZE from Lightning's launcher; the rank passed to init_process_group by mp.spawn children
and Lightning), and CUDA_VISIBLE_DEVICES narrows the GPUs a process sees as the CUDA driver does.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import pytest

from interpose.runtime import RankIdentity, visible_devices
from phantora.engine.engine import CallError, Engine, RankInfo
from phantora.hardware import lookup_gpu
from phantora.trace import NullSink
from tests.virtual_gpu.harness import BUILDS, assert_ran, run_traced


# --- CUDA_VISIBLE_DEVICES, as the driver parses it ----------------------------------------------
@pytest.mark.parametrize("value, expected", [
    (None, (0, 1, 2, 3, 4, 5, 6, 7)),  # unset: every GPU of the node
    ("2,3", (2, 3)),
    ("3,1", (3, 1)),  # cuda:0 is the first entry, not the lowest
    (" 5 , 6", (5, 6)),
    ("1,7,9,3", (1, 7)),  # 9 is not a GPU of an 8-GPU node: the list stops there
    ("0,-1,2", (0,)),  # negative: stops
    ("0,x,2", (0,)),  # not a number: stops
    ("1gpu,2", (1, 2)),  # strtoul reads the leading number
    ("0,0", ()),  # a repeated GPU hides them all
    ("", ()),
    ("GPU-00000000-0000-0000-0000-000000000006,GPU-00000000-0000-0000-0000-000000000002", (6, 2)),
    ("GPU-00000000-0000-0000-0000-000000000006,2", (6,)),  # UUID lists take only UUIDs
])
def test_visible_devices_parse_like_cuda(value: str | None, expected: tuple[int, ...]) -> None:
    assert visible_devices(value, 8) == expected


# --- the rank a process guesses before init_process_group ------------------------------------
def test_identity_from_torchrun_env_is_certain() -> None:
    ident = RankIdentity.from_env({"RANK": "5", "LOCAL_RANK": "1", "GROUP_RANK": "1", "WORLD_SIZE": "8"})
    assert (ident.rank, ident.local_rank, ident.node, ident.world_size, ident.certain) == (5, 1, 1, 8, True)


def test_identity_from_lightning_env_is_a_guess() -> None:
    # Lightning's launcher: no RANK; global rank = NODE_RANK * local world size + LOCAL_RANK
    ident = RankIdentity.from_env({"LOCAL_RANK": "3", "NODE_RANK": "0", "WORLD_SIZE": "4"})
    assert (ident.rank, ident.local_rank, ident.certain) == (3, 3, False)
    ident = RankIdentity.from_env({"LOCAL_RANK": "1", "NODE_RANK": "2", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "2"})
    assert (ident.rank, ident.node, ident.certain) == (5, 2, False)


def test_identity_of_a_plain_process_and_of_a_spawned_child() -> None:
    assert RankIdentity.from_env({}) == RankIdentity(0, 0, 0, 1, certain=True)
    assert RankIdentity.from_env({}, spawned=True).certain is False  # mp.spawn: only init_process_group tells


# --- the simulator: a guessed rank is corrected at init_process_group -------------------------
class _Names(NullSink):
    """Keeps the process names the engine writes."""

    def __init__(self) -> None:
        self.processes: dict[int, str] = {}

    def process(self, pid: int, name: str, sort_index: int) -> None:
        self.processes[pid] = name


def _engine() -> tuple[Engine, _Names]:
    from phantora.cost import make_estimator

    gpu = lookup_gpu("h100")
    names = _Names()
    return Engine(gpu, make_estimator("analytical", gpu), names), names


def test_guessed_ranks_that_collide_are_renamed_at_init() -> None:
    # mp.spawn: two children use their GPU before init_process_group; both guess rank 0
    e, names = _engine()
    a = e.add_rank(RankInfo(0, 0, 0, 101, certain=False))
    b = e.add_rank(RankInfo(0, 0, 0, 102, certain=False))
    assert a.info.rank == 0 and b.info.rank < 0  # the second waits under a provisional id
    e.identify_rank(0, 1, 0, 1, 2)  # the first is rank 1 ...
    e.identify_rank(b.info.rank, 0, 0, 0, 2)  # ... the second rank 0
    assert e.ranks[1] is a and e.ranks[0] is b and e.expected_ranks == 2
    assert names.processes[a.info.trace_pid].startswith("rank 1 · node 0 · GPU 1")
    assert names.processes[b.info.trace_pid].startswith("rank 0 · node 0 · GPU 0")
    assert a.info.trace_pid != b.info.trace_pid


def test_init_takes_a_rank_a_guessing_process_holds() -> None:
    e, _ = _engine()
    a = e.add_rank(RankInfo(0, 0, 0, 101, certain=False))
    b = e.add_rank(RankInfo(0, 0, 0, 102, certain=False))
    e.identify_rank(b.info.rank, 0, 0, 0, 2)  # the provisional one says it is rank 0 first
    assert e.ranks[0] is b and a.info.rank < 0 and e.moved == {0: a.info.rank}
    e.identify_rank(a.info.rank, 1, 0, 1, 2)
    assert e.ranks[1] is a


def test_two_certain_claims_of_one_rank_still_fail() -> None:
    e, _ = _engine()
    e.add_rank(RankInfo(0, 0, 0, 101))
    with pytest.raises(CallError, match="two processes claim rank 0"):
        e.add_rank(RankInfo(0, 0, 0, 102))
    b = e.add_rank(RankInfo(1, 0, 1, 103))
    with pytest.raises(CallError, match="two processes claim rank 0"):
        e.identify_rank(b.info.rank, 0, 0, 0, 2)


# --- traced scripts -------------------------------------------------------------------------------
def _thread_names(trace: Path) -> list[str]:
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    return [e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") in ("thread_name", "process_name")]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(extra)
    return env


@BUILDS
@pytest.mark.parametrize("visible, physical", [("2,3", "2,3"), ("1,7,9,3", "1,7"), ("", "")])
def test_cuda_visible_devices(tmp_path: Path, user_python: str, visible: str, physical: str) -> None:
    proc, trace = run_traced(tmp_path, user_python, "launchdp_visible.py", physical,
                             env=_env(CUDA_VISIBLE_DEVICES=visible))
    if physical:
        assert_ran(proc, "device_count", "properties", "kernels", "invalid ordinal")
        names = _thread_names(trace)
        for i, gpu in enumerate(int(g) for g in physical.split(",")):
            # cuda:i of the process is the node's GPU `gpu`, as on a real machine
            assert f"cuda:{i} default stream (GPU {gpu} of the node)" in names, names
        assert any(n.startswith(f"rank 0 · node 0 · GPU {physical} ·") for n in names), names
    else:
        assert_ran(proc, "device_count", "no gpu error", "cpu")
        assert "no process used a virtual GPU (CUDA_VISIBLE_DEVICES='' hides all 8 GPUs" in proc.stderr


def test_lightning_style_launch(tmp_path: Path) -> None:
    """The script re-launches itself with LOCAL_RANK / NODE_RANK / WORLD_SIZE (no RANK) and passes
    the rank to init_process_group, as Lightning's launcher does."""
    proc, trace = run_traced(tmp_path, sys.executable, "launchdp_lightning_style.py", "2", timeout=300)
    assert_ran(proc, "rank 0", "rank 1")
    assert "simulated 2 rank(s)" in proc.stderr, proc.stderr
    names = _thread_names(trace)
    assert any(n.startswith("rank 0 · node 0 · GPU 0") for n in names) and \
        any(n.startswith("rank 1 · node 0 · GPU 1") for n in names), names


def test_spawned_ranks_named_by_init_process_group(tmp_path: Path) -> None:
    """mp.spawn children use the GPU before init_process_group; spawn index 0 is rank 1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc, trace = run_traced(tmp_path, sys.executable, "launchdp_spawn.py", "2", str(port), timeout=300)
    assert_ran(proc, "rank 0", "rank 1")
    assert "simulated 2 rank(s)" in proc.stderr, proc.stderr
    names = _thread_names(trace)
    assert any(n.startswith("rank 0 · node 0 · GPU 0") for n in names) and \
        any(n.startswith("rank 1 · node 0 · GPU 1") for n in names), names
    assert not any(n.startswith("rank ?") for n in names), names
