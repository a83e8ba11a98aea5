"""Multi-rank runs end to end: phantora's torchrun-style launcher, the simulated NCCL process
group, collectives timed by phantora.net, and the failure cases of issue 4."""

from __future__ import annotations

import re
import sys
from collections import Counter

import pytest

from phantora.net.cluster import load_cluster
from phantora.net.network import Network
from phantora.net.records import CollectiveSpec
from phantora.trace.check import check_chrome_trace, load_chrome_trace

from test_trace_cli import SCRIPTS, events, phantora, trace_script

SMALL = ["--layers", "2", "--embd", "256", "--heads", "4", "--seq", "256", "--batch", "4"]


def nccl_kernels(path, pid=None):
    return [e for e in events(path) if e.get("ph") == "X" and e["name"].startswith("ncclDevKernel")
            and (pid is None or e["pid"] == pid)]


def fresh_network_ns(op: str, nbytes: int, gpus: tuple[int, ...], root: int | None = None) -> int:
    """What phantora.net alone says this collective takes on an idle one-node DGX H100."""
    net = Network(load_cluster("dgx-h100", nodes=1))
    h = net.submit(CollectiveSpec(op, nbytes, gpus, root=root), 0)
    return net.finish_time(h)


def test_every_collective_kind_is_matched_and_timed_by_the_network_model(tmp_path):
    proc, out = trace_script(tmp_path, str(SCRIPTS / "dist_collectives.py"), options=("--nproc-per-node", "2"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 0: done" in proc.stdout and "rank 1: done" in proc.stdout
    # object collectives carry real values (through the c10d store)
    for r in (0, 1):
        assert f"rank {r}: gathered [{{'rank': 0, 'text': ''}}, {{'rank': 1, 'text': 'x'}}]" in proc.stdout
        assert f"rank {r}: broadcast got ['from rank 1', 10]" in proc.stdout
    check = check_chrome_trace(out)
    assert check.ok, check.problems
    per_rank = {pid: [k["args"]["op"] for k in nccl_kernels(out, pid)] for pid in (1, 2)}
    expected = ["all_reduce", "all_gather", "reduce_scatter", "all_reduce", "broadcast", "all_reduce", None, "barrier"]
    assert per_rank[1][:6] == expected[:6] and per_rank[1][6] == "send" and per_rank[1][7] == "barrier"
    assert per_rank[2][6] == "recv"
    assert per_rank[1][8:] == ["all_gather", "broadcast"]
    # each collective's network time is what phantora.net computes for it on an idle network
    # (one communicator: its collectives run one after another on one NCCL stream)
    for k in nccl_kernels(out, 1):
        a = k["args"]
        op = {"send": "send_recv", "recv": "send_recv"}.get(a["op"], a["op"])
        assert a["network ns"] == fresh_network_ns(op, max(a["bytes"], 1), (0, 1), a["root"]), a
    # the script's own clock shows the 64 MiB all-reduce's simulated time (plus launch costs)
    first = nccl_kernels(out, 1)[0]["args"]
    shown = float(re.search(r"rank 0: all_reduce ([\d.]+) us", proc.stdout).group(1))
    assert first["network ns"] / 1e3 < shown < first["network ns"] / 1e3 + 100
    # the trace records the rollback figures the summary line prints (for `phantora summary`)
    meta = load_chrome_trace(out)["metadata"]
    rollbacks = int(re.search(r"network rollbacks (\d+): ", proc.stderr).group(1))
    stale = re.search(r"; (\d+) of them stale", proc.stderr)
    assert (meta["network_rollbacks"], meta["stale_replies"]) == (rollbacks, int(stale.group(1)) if stale else 0)
    assert stale or "none of them changed afterwards" in proc.stderr
    # and how much the network simulated: at least one event batch per collective that moved bytes
    assert meta["network_event_batches"] >= len(nccl_kernels(out, 1)) - 1
    # every collective, the functional one (through phantora's dispatch mode) included, names the
    # script's line that issued it
    sites = {k["args"]["call site"] for k in nccl_kernels(out)}
    assert all(s.startswith(str(SCRIPTS / "dist_collectives.py") + ":") for s in sites), sites
    assert any(":25 in <module>" in s for s in sites), sites  # fc.all_reduce
    # participants are linked by flow arrows
    assert sum(1 for e in events(out) if e.get("ph") == "s" and e.get("cat") == "collective") == 10


def test_network_links_are_counter_tracks_of_their_load(tmp_path):
    proc, out = trace_script(tmp_path, str(SCRIPTS / "dist_collectives.py"), options=("--nproc-per-node", "2"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    evs = events(out)
    net_pid = next(e["pid"] for e in evs if e.get("name") == "process_name" and e["args"]["name"] == "network")
    links: dict[str, list[dict]] = {}
    for e in evs:
        if e.get("ph") == "C" and e["pid"] == net_pid:
            links.setdefault(e["name"], []).append(e)
    # two GPUs on one NVSwitch: each GPU's link up to the switch and down from it
    assert set(links) == {f"link {d} [node0 gpu{g}]" for d in ("gpu->nvswitch", "nvswitch->gpu") for g in (0, 1)}
    comm = [(k["ts"], k["ts"] + k["dur"], k) for k in nccl_kernels(out, 1)]
    for name, samples in links.items():
        samples.sort(key=lambda e: e["ts"])
        assert samples[-1]["args"]["utilization"] == 0.0  # every busy period ends
        for a, b in zip(samples, samples[1:]):
            assert 0.0 <= a["args"]["utilization"] <= 1.0
            if a["args"]["GB/s"] > 0:  # a link is busy only while some collective runs
                assert any(s - 0.002 <= a["ts"] and b["ts"] <= e + 0.002 for s, e, _ in comm), (name, a, b)
    # the ring all-gather of a 128 MiB output: each GPU sends its 64 MiB half over its up-link
    s, e, k = next(c for c in comm if c[2]["args"]["op"] == "all_gather")
    up = sorted(links["link gpu->nvswitch [node0 gpu0]"], key=lambda x: x["ts"])
    sent = sum(a["args"]["GB/s"] * 1e9 * (min(b["ts"], e) - max(a["ts"], s)) / 1e6
               for a, b in zip(up, up[1:]) if min(b["ts"], e) > max(a["ts"], s))
    assert sent == pytest.approx(k["args"]["bytes"] / 2, rel=0.01)


@pytest.mark.slow
def test_ddp_example_buckets_all_reduce_with_the_network_models_times(tmp_path):
    proc, out = trace_script(tmp_path, "examples/ddp_train.py", *SMALL, "--steps", "2", "--accum", "2",
                             "--bucket-mb", "1", options=("--nproc-per-node", "2"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len([line for line in proc.stdout.splitlines() if line.startswith("step ")]) == 2
    assert check_chrome_trace(out).ok
    ks = nccl_kernels(out, 1)
    buckets = [k for k in ks if k["args"]["op"] == "all_reduce"]
    # 2 steps, several 1 MiB buckets each, and no_sync: the first micro-step all-reduces nothing
    sizes = Counter(k["args"]["bytes"] for k in buckets)
    assert len(sizes) >= 2 and len(buckets) % 2 == 0
    for k in buckets:
        assert k["name"].startswith("ncclDevKernel_AllReduce_Sum_f32_")
        assert k["args"]["network ns"] == fresh_network_ns("all_reduce", k["args"]["bytes"], (0, 1))
    # gradients of the last micro-step only: bucket bytes per step = all parameters, fp32
    params_bytes = sum(k["args"]["bytes"] for k in buckets) // 2
    assert params_bytes > 4 * 2 * 256 * 256 * 12  # at least the blocks' weights


def test_mismatched_collective_is_an_error_naming_ranks_and_call_sites(tmp_path):
    proc, out = trace_script(tmp_path, str(SCRIPTS / "dist_mismatch.py"), options=("--nproc-per-node", "2"))
    assert proc.returncode == 1
    assert "unreachable" not in proc.stdout
    err = proc.stderr
    assert "mismatched collective" in err
    assert "rank 0: all_reduce(4,000 bytes" in err and "rank 1: all_reduce(16,000 bytes" in err
    assert "dist_mismatch.py:11" in err
    assert check_chrome_trace(out).ok


def test_a_rank_that_raises_ends_all_ranks_with_a_valid_trace(tmp_path):
    proc, out = trace_script(tmp_path, str(SCRIPTS / "dist_rank_raises.py"), options=("--nproc-per-node", "2"))
    assert proc.returncode == 1
    assert "ValueError: rank 1 failed on purpose" in proc.stderr
    assert "rank 1 exited with code 1" in proc.stderr
    assert "unreachable" not in proc.stdout
    assert check_chrome_trace(out).ok


def test_a_rank_that_never_joins_times_out_naming_it(tmp_path):
    """Rank 0 hosts the job's c10d store (phantora starts the workers, no agent), so its goodbye
    waits for the other ranks, except when it leaves on an exception: then its exit stops rank 1,
    as torchrun's agent stops the workers, where rank 1 went on to its 120 s wait's end."""
    proc, out = trace_script(tmp_path, str(SCRIPTS / "dist_missing_rank.py"),
                             options=("--nproc-per-node", "2", "--collective-timeout", "3"))
    assert proc.returncode == 1
    assert "waiting for rank(s) [1] to join all_reduce(4,000 bytes" in proc.stderr
    assert "dist_missing_rank.py:14" in proc.stderr
    assert "1 other rank(s) stopped because of it: ranks [1]" in proc.stderr, proc.stderr[-3000:]
    assert "unreachable" not in proc.stdout
    assert check_chrome_trace(out).ok


def test_a_rank_behind_rank_0_in_wall_time_reads_its_values_after_rank_0_left(tmp_path):
    """Ranks run at their own wall speed under phantora. Rank 0 hosts the job's c10d store when
    phantora starts the workers itself, and destroy_process_group() stopped the store's server:
    a pipeline's last stage, minutes behind rank 0 (TorchTitan's validation_tp_cp_pp), failed with
    "Broken pipe" and read a wrong value. phantora keeps the store, and rank 0's process ends once
    the other rank is done. Rank 1 here waits 5 real seconds before reading the all-reduce's sum."""
    proc, out = trace_script(tmp_path, str(SCRIPTS / "dist_rank_behind_reads_store.py"), "5",
                             options=("--nproc-per-node", "2"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    left = {int(r): float(t) for r, t in re.findall(r"rank (\d) left at ([\d.]+)", proc.stdout)}
    assert left[1] - left[0] > 4  # rank 0 did leave first
    assert "rank 1 reads 3.0" in proc.stdout  # 1 + 2: rank 0's value, read through the store
    assert "TCPStore" not in proc.stderr and "Broken pipe" not in proc.stderr
    assert check_chrome_trace(out).ok


def test_more_processes_than_gpus_per_node_is_refused(tmp_path):
    proc = phantora("trace", "--nproc-per-node", "9", "-o", str(tmp_path / "x.json"), "--", sys.executable, "-c", "0")
    assert proc.returncode == 2
    assert "--nproc-per-node 9 is more than the 8 GPUs of a dgx-h100 node" in proc.stderr


def test_unknown_cluster_lists_the_presets(tmp_path):
    proc = phantora("trace", "--cluster", "dgx-z9", "-o", str(tmp_path / "x.json"), "--", sys.executable, "-c", "0")
    assert proc.returncode == 2
    assert "dgx-h100" in proc.stderr and "dgx-z9" in proc.stderr


def test_the_users_own_torchrun_command_runs_unchanged(tmp_path):
    out = tmp_path / "run.json"
    proc = phantora("trace", "-o", str(out), "--", sys.executable, "-m", "torch.distributed.run",
                    "--nproc-per-node", "2", str(SCRIPTS / "dist_collectives.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "phantora: simulated 2 rank(s)" in proc.stderr
    assert len(nccl_kernels(out, 1)) == len(nccl_kernels(out, 2)) == 10


def test_two_process_groups_with_the_same_ranks_are_separate_communicators(tmp_path):
    """new_group([0, 1]) in a 2-rank world: its collectives count their own sequence numbers and
    run on their own NCCL stream, as a second communicator does."""
    proc, out = trace_script(tmp_path, str(SCRIPTS / "dist_same_ranks_groups.py"), options=("--nproc-per-node", "2"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 0 ok" in proc.stdout and "rank 1 ok" in proc.stdout
    ks = nccl_kernels(out, 1)
    assert len(ks) == 3 and len({k["tid"] for k in ks}) == 2  # world: 1 all-reduce, new group: 2
    names = {e["args"]["name"] for e in events(out) if e.get("ph") == "M" and e.get("name") == "thread_name"
             and e["pid"] == 1}
    assert {"cuda:0 nccl group [0, 1]", "cuda:0 nccl group [0, 1] (process group '1')"} <= names


def test_object_collectives_leave_nothing_in_the_store(tmp_path):
    """all_gather_object, broadcast_object_list and gather_object exchange pickles through the
    c10d store; the last member to read a call's deletes them, so a long run's store does not grow
    (before: 167 more keys after the 30 rounds on 2 ranks: the pickles, and the values posted
    for the collectives' empty placeholders, which no rank reads)."""
    proc, _ = trace_script(tmp_path, str(SCRIPTS / "object_store_keys.py"), options=("--nproc-per-node", "2"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, after = map(int, re.search(r"store keys after 1 round (\d+), after 31 rounds (\d+)", proc.stdout).groups())
    assert after == before, (before, after)


def test_collectives_in_a_backward_free_their_tensors_when_the_program_drops_them(tmp_path):
    """Four backward steps each run a synchronous all-reduce (64 MiB), an all-to-all (2 x 16 MiB
    out) and a waited async all-reduce (32 MiB), then drop the tensors: nothing stays allocated.
    Before: phantora kept every work issued in a backward, with its tensors, to the backward's end
    (128 MiB left after each step here; a 16-GPU DeepSeek-V3 16B step with full checkpointing
    peaked at 31.4 GiB instead of 16.6)."""
    proc, _ = trace_script(tmp_path, str(SCRIPTS / "backward_collective_memory.py"),
                           options=("--nproc-per-node", "2"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank}: MiB still allocated after each backward's collectives [0, 0, 0, 0]" in proc.stdout, \
            proc.stdout
