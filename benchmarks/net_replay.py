"""Record the engine's calls to the network simulator in one run, replay them without torch.

    python benchmarks/net_replay.py record LOG -- <phantora trace arguments> -- <program>
    python benchmarks/net_replay.py replay LOG [--profile] [--check OTHER_LOG_RESULTS]

`record` runs `phantora trace` in this process with phantora.net.Network replaced by a subclass
that appends every call of the engine's interface (CALLS: submit_many, finish_time,
provisional_end, end_by, known_end, prune, ..., settle) and its answer to LOG (a pickle stream). `replay` feeds the same calls, in the same order, to a fresh
Network on the same cluster and compares every answer with the recorded one: the network's cost
of a large run (a 1,024-GPU pipeline spends nearly all its wall time there, docs/scale.md) can
then be measured and profiled in seconds, and a faster network checked to answer exactly as the
recorded one did. Answers that hold objects (collective_info, corrections) are compared as
their repr.
"""

from __future__ import annotations

import argparse
import cProfile
import pickle
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CALLS = ("submit_many", "finish_time", "provisional_end", "end_by", "known_end", "prune", "advance_horizon",
         "run_before", "collective_info", "take_corrections", "take_rollbacks", "settle", "link_utilization")


def _recording_network(log):
    from phantora.net.network import Network

    class RecordingNetwork(Network):
        def __init__(self, cluster, config=None):
            super().__init__(cluster, config)
            pickle.dump(("__init__", (cluster, config)), log)

    def wrap(name):
        original = getattr(Network, name)

        def call(self, *args, **kwargs):
            out = original(self, *args, **kwargs)
            pickle.dump((name, args, kwargs, _answer(name, out)), log)
            return out

        return call

    for name in CALLS:
        setattr(RecordingNetwork, name, wrap(name))
    return RecordingNetwork


def _answer(name: str, out):
    if name in ("collective_info", "take_corrections", "take_rollbacks", "prune", "link_utilization"):
        return repr(out) if name != "take_rollbacks" else len(out)
    return out


def record(log_path: Path, argv: list[str]) -> None:
    import phantora.simulator.launch as launch
    from phantora.cli import main

    with open(log_path, "wb") as log:
        launch.Network = _recording_network(log)
        try:
            main.main(args=["trace", *argv], standalone_mode=False)
        finally:
            log.flush()


def _calls(log_path: Path):
    with open(log_path, "rb") as f:
        while True:
            try:
                yield pickle.load(f)
            except EOFError:
                return


def replay(log_path: Path, profile: bool) -> int:
    """Every answer must equal the recorded one, except how many rollbacks there were (a
    different rollback mechanism may rewind less; the ends it gives must not change)."""
    from phantora.net.network import Network

    entries = list(_calls(log_path))
    net = None
    counts: dict[str, int] = {}
    differing: dict[str, int] = {}
    recorded_rollbacks = 0
    prof = cProfile.Profile() if profile else None
    started, cpu_started = time.perf_counter(), time.process_time()
    if prof:
        prof.enable()
    for entry in entries:
        if entry[0] == "__init__":  # `--ranks auto` may start the run again: a new network
            net = Network(*entry[1])
            continue
        name, args, kwargs, want = entry
        counts[name] = counts.get(name, 0) + 1
        got = _answer(name, getattr(net, name)(*args, **kwargs))
        if name == "take_rollbacks":
            recorded_rollbacks += want
        elif got != want:
            differing[name] = differing.get(name, 0) + 1
            if sum(differing.values()) <= 10:
                print(f"MISMATCH {name}{args[:1]}: recorded {str(want)[:200]} replayed {str(got)[:200]}")
    if prof:
        prof.disable()
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    print(f"{sum(counts.values())} calls ({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))})")
    print(f"replayed in {wall:.2f} s ({cpu:.2f} s of CPU); rollbacks {net.rollback_count} (recorded {recorded_rollbacks}); "
          f"flows submitted {net.flows_submitted}; event batches {net.event_batches}; differing answers {sum(differing.values())} {differing or ''}")
    if prof:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
    return 1 if differing else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("record")
    r.add_argument("log", type=Path)
    r.add_argument("rest", nargs=argparse.REMAINDER)
    p = sub.add_parser("replay")
    p.add_argument("log", type=Path)
    p.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    if args.mode == "record":
        rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
        record(args.log, rest)
    else:
        sys.exit(replay(args.log, args.profile))


if __name__ == "__main__":
    main()
