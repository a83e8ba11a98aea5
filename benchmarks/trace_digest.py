"""Digests of the examples' traces, to check that an engine change leaves every trace unchanged.

    python benchmarks/trace_digest.py --out digests.json [--only fsdp4-conservative,...]
    python benchmarks/trace_digest.py --out after.json --compare digests.json
    python benchmarks/trace_digest.py --trees BEFORE AFTER

--trees compares every trace two runs of the test suite left behind instead (pytest
--basetemp=BEFORE on the old code, --basetemp=AFTER on the new): each `*.json` trace found
under both at the same relative path is digested the same way.

Runs each example configuration (single GPU, DDP, FSDP2, TP x FSDP2, PP; 2-8 ranks; optimistic
and conservative sync) under `phantora trace` with a small model, and digests the trace: the
sorted (name, phase, ts, dur, pid, tid) of every non-metadata event outside the simulator's
track, the simulated time and stale replies, and (conservative) the early reads. --compare
prints which configurations differ, and where.

Not compared, because they depend on the order in which rank processes' messages arrive (two
runs of the same code differ): the simulator track (network rollbacks: a rank behind in
simulated time started a collective in the network's past), the rollback count, and the early
reads of optimistic sync. They are printed. So is whether the events other than memory counter
samples are the same: the pipeline example frees tensors at host times that vary from run to
run (two runs of the same code differ in a few `cuda:N memory` samples).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIMULATOR_PID = 0  # phantora/engine/trace_events.py: rollbacks and corrections
SMALL = ["--layers", "2", "--embd", "128", "--heads", "4", "--seq", "128", "--batch", "2", "--steps", "3"]

# name -> (ranks, script and its arguments)
CONFIGS: dict[str, tuple[int, list[str]]] = {
    "gpt1": (0, ["examples/gpt_train.py", *SMALL]),
    "ddp2": (2, ["examples/ddp_train.py", *SMALL]),
    "fsdp4": (4, ["examples/fsdp_train.py", *SMALL]),
    "fsdp8": (8, ["examples/fsdp_train.py", *SMALL]),
    "tpfsdp4": (4, ["examples/tp_fsdp_train.py", "--tp", "2", *SMALL]),
    "pp4": (4, ["examples/pp_train.py", "--layers", "4", "--embd", "128", "--heads", "4", "--seq", "128",
                "--batch", "8", "--microbatches", "4", "--steps", "3"]),
}
SYNCS = ("optimistic", "conservative")


def digest(trace: Path) -> tuple[str, int, list[tuple], dict]:
    doc = json.loads(trace.read_text())
    events = doc["traceEvents"]
    meta = doc.get("metadata", {})
    counts = {k: meta.get(k) for k in ("simulated_ns", "network_rollbacks", "stale_replies", "largest_stale_error_ns",
                                       "early_reads")}
    rows = sorted((str(e.get("name")), str(e.get("ph")), e.get("ts", 0), e.get("dur", 0), e.get("pid", 0),
                   e.get("tid", 0)) for e in events if e.get("ph") != "M" and e.get("pid") != SIMULATOR_PID)
    h = hashlib.sha256(json.dumps(rows).encode()).hexdigest()
    return h, len(rows), rows, counts


def run(name: str, sync: str, tmp: Path) -> dict:
    ranks, script = CONFIGS[name]
    out = tmp / f"{name}-{sync}.json"
    # the modelled host: digests compare runs, and the measured host differs from run to run
    cmd = [sys.executable, "-m", "phantora.cli", "trace", "--host-time", "modelled", "--sync", sync, "-o", str(out)]
    if ranks:
        cmd += ["--nproc-per-node", str(ranks)]
    cmd += ["--", sys.executable, *script]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name} {sync} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    h, n, rows, counts = digest(out)
    steps = re.findall(r"^step \d+.*$", proc.stdout, re.M)
    (tmp / f"{name}-{sync}.rows.json").write_text(json.dumps(rows))
    return {"sha256": h, "events": n, "counts": counts, "steps": steps, "wall_s": round(wall, 1),
            "rows": str(tmp / f"{name}-{sync}.rows.json")}


def _traces(tree: Path) -> dict[str, Path]:
    """Relative path -> trace, for every Chrome JSON trace under `tree` (pytest's `current`
    links to the newest numbered folder are skipped: they repeat it)."""
    found = {}
    for path in sorted(tree.rglob("*.json")):
        rel = path.relative_to(tree)
        if any((tree / Path(*rel.parts[: i + 1])).is_symlink() for i in range(len(rel.parts))):
            continue
        with open(path, "rb") as f:
            if b'"traceEvents"' not in f.read(4096):
                continue
        found[str(rel)] = path
    return found


def compare_trees(before: Path, after: Path) -> bool:
    """Digest the traces two test runs left behind; print each; True when all are the same."""
    old, new = _traces(before), _traces(after)
    same = 0
    differ = []
    for rel in sorted(old.keys() & new.keys()):
        try:
            (h0, n0, _, c0), (h1, n1, _, c1) = digest(old[rel]), digest(new[rel])
        except json.JSONDecodeError as e:
            differ.append(f"{rel}: unreadable ({e})")
            continue
        if (h0, n0, c0["simulated_ns"]) == (h1, n1, c1["simulated_ns"]):
            same += 1
        else:
            differ.append(f"{rel}: DIFFERENT ({n0} -> {n1} events, simulated {c0['simulated_ns']} -> "
                          f"{c1['simulated_ns']} ns)")
    for line in differ:
        print(line)
    only = sorted(old.keys() ^ new.keys())
    print(f"{same} traces the same, {len(differ)} different, {len(only)} in one tree only"
          + (f" (e.g. {only[:3]})" if only else ""))
    return not differ


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", nargs=2, type=Path, metavar=("BEFORE", "AFTER"),
                    help="compare the traces two test runs left under their --basetemp folders")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--only", default="", help="comma-separated NAME-SYNC (e.g. fsdp4-conservative)")
    ap.add_argument("--compare", type=Path, help="digests of an earlier run")
    ap.add_argument("--keep", type=Path, help="folder to keep traces and event rows in")
    args = ap.parse_args()
    if args.trees:
        sys.exit(0 if compare_trees(*args.trees) else 1)
    if args.out is None:
        ap.error("--out is required (or --trees BEFORE AFTER)")
    todo = [(n, s) for n in CONFIGS for s in SYNCS]
    if args.only:
        want = set(args.only.split(","))
        todo = [(n, s) for n, s in todo if f"{n}-{s}" in want]
    keep = args.keep or Path(tempfile.mkdtemp(prefix="digest-"))
    keep.mkdir(parents=True, exist_ok=True)
    results = {}
    for n, s in todo:
        r = run(n, s, keep)
        results[f"{n}-{s}"] = r
        print(f"{n}-{s}: {r['events']} events {r['sha256'][:16]} {r['counts']} wall {r['wall_s']} s", flush=True)
    args.out.write_text(json.dumps(results, indent=1))
    if args.compare:
        before = json.loads(args.compare.read_text())
        same = True
        for k, r in results.items():
            b = before.get(k)
            if b is None:
                continue
            keys = ["simulated_ns", "stale_replies", "largest_stale_error_ns"]
            if k.endswith("conservative"):
                keys.append("early_reads")
            ok = (all(b[f] == r[f] for f in ("sha256", "events", "steps"))
                  and all(b["counts"][c] == r["counts"][c] for c in keys))
            same &= ok
            info = {c: (b["counts"][c], r["counts"][c]) for c in ("network_rollbacks", "early_reads")}
            print(f"{k}: {'same' if ok else 'DIFFERENT'} (before, after: {info})")
            if not ok and Path(b["rows"]).exists():
                old = Counter(tuple(x) for x in json.loads(Path(b["rows"]).read_text()) if x[1] != "C")
                new = Counter(tuple(x) for x in json.loads(Path(r["rows"]).read_text()) if x[1] != "C")
                print(f"   events other than memory counter samples: {'same' if old == new else 'DIFFERENT'}")
            if not ok and Path(b["rows"]).exists():
                old = Counter(tuple(x) for x in json.loads(Path(b["rows"]).read_text()))
                new = Counter(tuple(x) for x in json.loads(Path(r["rows"]).read_text()))
                for x in sorted((old - new).elements())[:5]:
                    print("   only before:", x)
                for x in sorted((new - old).elements())[:5]:
                    print("   only after: ", x)
        sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
