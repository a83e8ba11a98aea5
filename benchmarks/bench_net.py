"""How fast phantora.net simulates, from 8 to 4,096 GPUs (DGX H100 nodes).

    python benchmarks/bench_net.py                 # 8, 64, 512, 4096 GPUs
    python benchmarks/bench_net.py --gpus 8 64 --steps 5

Three workloads per cluster size:
  allreduce  one 1 GiB all-reduce across every GPU, on a fresh network (so the time includes
             choosing the algorithm and routing every ring/tree edge).
  tp+dp      training steps of tensor parallelism inside each node (4 all-reduces of 32 MiB
             per node per step, TP=8) and data parallelism across nodes (one 256 MiB
             all-reduce per local rank, over all nodes). Nodes start each collective at
             slightly different times and collectives reach the network in a shuffled order,
             each followed by finish_time(), as rank processes running at their own speed
             would produce: late arrivals roll the network back. prune() after each step.
  ep a2a     expert-parallel all-to-alls in groups of 64 ranks, as TorchTitan's DeepSeek-V3 671B
             runs them, with FSDP's all-gathers across the groups (bench_ep_all_to_all; up to
             1,024 GPUs).
Columns: collectives submitted; flows = max-min rate variables (one per ring channel
pattern, tree, or point-to-point transfer); transfers = point-to-point transfers those flows
stand for (ring edges etc.); rollbacks; events = event batches processed (re-simulation after
rollbacks included); wall seconds; flows/s and transfers/s. The collector runs as in the simulator
server (phantora/simulator/server.py SERVE_GC_THRESHOLD) unless --stock-gc.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from phantora.net import CollectiveSpec, Network, load_cluster  # noqa: E402
from phantora.simulator.server import fewer_collections  # noqa: E402


def bench_allreduce(gpus: int) -> dict:
    cluster = load_cluster("dgx-h100", nodes=max(1, gpus // 8))
    t0 = time.perf_counter()
    net = Network(cluster)
    h = net.submit(CollectiveSpec("all_reduce", 1 << 30, tuple(range(cluster.num_gpus))), 0)
    net.finish_time(h)
    wall = time.perf_counter() - t0
    info = net.collective_info(h)
    return dict(workload="allreduce", collectives=1, flows=net.flows_submitted,
                transfers=net.transfers_submitted, rollbacks=net.rollback_count,
                events=net.stats().event_batches, wall=wall,
                note=f"{info.algorithm}/{info.protocol}, busbw {info.busbw:.0f} GB/s")


def bench_tp_dp(gpus: int, steps: int, seed: int) -> dict:
    cluster = load_cluster("dgx-h100", nodes=max(1, gpus // 8))
    nodes, rng = cluster.nodes, random.Random(seed)
    t0 = time.perf_counter()
    net = Network(cluster)
    submitted = 0
    step_ns = 20_000_000
    for step in range(steps):
        base = step * step_ns
        work = []
        for node in range(nodes):
            skew = rng.randrange(0, 200_000)  # ranks drift apart by up to 200 us
            ranks = tuple(range(8 * node, 8 * node + 8))
            for layer in range(4):
                work.append((CollectiveSpec("all_reduce", 32 << 20, ranks, label=f"tp{layer}"),
                             base + skew + layer * 1_000_000))
        if nodes > 1:
            for local in range(8):
                ranks = tuple(local + 8 * n for n in range(nodes))
                work.append((CollectiveSpec("all_reduce", 256 << 20, ranks, label="dp"),
                             base + 5_000_000 + rng.randrange(0, 200_000)))
        rng.shuffle(work)
        for spec, start in work:
            net.finish_time(net.submit(spec, start))
        net.take_corrections()
        net.take_rollbacks()
        net.prune(base)
        submitted += len(work)
    wall = time.perf_counter() - t0
    stats = net.stats()
    return dict(workload="tp+dp", collectives=submitted, flows=net.flows_submitted,
                transfers=net.transfers_submitted, rollbacks=stats.rollbacks,
                events=stats.event_batches, wall=wall,
                note=f"{steps} steps, live after prune: {stats.live_flows} flows, "
                     f"{stats.history_segments} segments")


def bench_ep_all_to_all(gpus: int, steps: int, seed: int, ep: int = 64) -> dict:
    """Expert parallelism as TorchTitan lays it out (DeepSeek-V3 671B: EP 64 over FSDP on every
    GPU): EP groups of `ep` consecutive ranks, each MoE layer a dispatch and a combine all-to-all
    (4,096 tokens x top-8 x 7,168 x bf16 per rank), after FSDP's all-gather of the layer's experts
    over the ranks holding the same experts in every group, and with the next layer's attention
    gathered over every rank meanwhile. With --ranks auto two processes run: the
    groups mirrored from each representative arrive together (submit_many, as
    engine/mirrors.py does), the two sets drift apart by up to 500 us, and each collective's end is
    read before the next is submitted."""
    cluster = load_cluster("dgx-h100", nodes=max(1, gpus // 8))
    ep = min(ep, cluster.num_gpus)
    groups = [tuple(range(g * ep, (g + 1) * ep)) for g in range(cluster.num_gpus // ep)]
    halves = [groups[: max(1, len(groups) // 2)], groups[max(1, len(groups) // 2):]]
    rng = random.Random(seed)
    nbytes = 4096 * 8 * 7168 * 2
    shards = [tuple(range(i, cluster.num_gpus, ep)) for i in range(ep)]  # same expert slice, every group
    expert_bytes = 4 * 3 * 7168 * 2048 * 2  # a rank's 4 experts of a layer, bf16, gathered
    dense_bytes = 187_000_000 * 2  # a layer's attention (MLA), bf16, gathered on every rank
    everyone = tuple(range(cluster.num_gpus))
    t0 = time.perf_counter()
    net = Network(cluster)
    submitted = 0
    step_ns = 400_000_000
    for step in range(steps):
        base = step * step_ns
        skews = [rng.randrange(0, 500_000) for _ in halves]
        for layer in range(4):
            layer_at = base + layer * 40_000_000
            if len(groups) > 1:  # FSDP's all-gather of the layer's experts, across the EP groups
                at = layer_at + max(skews)  # it starts when both representatives have joined
                net.finish_time(net.submit_many([(CollectiveSpec("all_gather", expert_bytes, ranks, label="fsdp"), at)
                                                 for ranks in shards])[0])
                submitted += len(shards)
                # the next layer's attention, prefetched over every rank while the experts run
                net.finish_time(net.submit(CollectiveSpec("all_gather", dense_bytes, everyone, label="fsdp"),
                                           at + 12_000_000))
                submitted += 1
            for phase in range(2):  # dispatch, combine
                at = layer_at + 10_000_000 + phase * 15_000_000
                order = list(range(len(halves)))
                rng.shuffle(order)
                for h in order:
                    if not halves[h]:
                        continue
                    handles = net.submit_many([(CollectiveSpec("all_to_all", nbytes, ranks, label="ep"), at + skews[h])
                                               for ranks in halves[h]])
                    net.finish_time(handles[0])
                    submitted += len(handles)
        net.take_corrections()
        net.take_rollbacks()
        net.prune(base)
    wall = time.perf_counter() - t0
    stats = net.stats()
    return dict(workload="ep a2a", collectives=submitted, flows=net.flows_submitted,
                transfers=net.transfers_submitted, rollbacks=stats.rollbacks,
                events=stats.event_batches, wall=wall,
                note=f"EP {ep}, {len(groups)} groups, {steps} steps x 4 layers x 2")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[8, 64, 512, 4096])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stock-gc", action="store_true",
                        help="CPython's default collector thresholds, not the simulator server's")
    args = parser.parse_args()
    with contextlib.nullcontext() if args.stock_gc else fewer_collections():
        run(args)


def run(args: argparse.Namespace) -> None:
    bench_allreduce(16)  # warm up imports and numpy before timing anything
    header = (f"{'GPUs':>5} {'workload':>9} {'colls':>6} {'flows':>6} {'transfers':>9} "
              f"{'rollbacks':>9} {'events':>7} {'wall s':>7} {'flows/s':>8} {'transfers/s':>11}"
              f"  note")
    print(header)
    print("-" * len(header))
    rows = []
    for gpus in args.gpus:
        workloads = [bench_allreduce(gpus), bench_tp_dp(gpus, args.steps, args.seed)]
        workloads.append(bench_ep_all_to_all(gpus, args.steps, args.seed))
        for row in workloads:
            rows.append((gpus, row))
            print(f"{gpus:>5} {row['workload']:>9} {row['collectives']:>6} {row['flows']:>6} "
                  f"{row['transfers']:>9} {row['rollbacks']:>9} {row['events']:>7} "
                  f"{row['wall']:>7.4f} {row['flows'] / row['wall']:>8.0f} "
                  f"{row['transfers'] / row['wall']:>11.0f}  {row['note']}", flush=True)
    big = [r for g, r in rows if g == 4096 and r["workload"] == "allreduce"]
    if big:
        verdict = "met" if big[0]["wall"] < 1.0 else "MISSED"
        print(f"\ntarget: 4,096-GPU all-reduce in < 1 s wall: {big[0]['wall']:.3f} s ({verdict})")


if __name__ == "__main__":
    main()
