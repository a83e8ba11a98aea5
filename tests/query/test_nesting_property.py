"""For any properly nested slices, in any file order, the importer's depth and parent_id are
the brute-force definition: a slice's ancestors are the other slices of its track whose
interval contains its own."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from phantora.query.importer import import_events


@st.composite
def nested_intervals(draw, lo: int = 0, hi: int = 1_000_000, depth: int = 0) -> list[tuple[int, int]]:
    """Siblings inside [lo, hi), disjoint or touching (one ends where the next starts), each
    with its own nested children; no child equals its parent's interval (which would make
    "which one is outside" a matter of file order)."""
    out: list[tuple[int, int]] = []
    cuts = sorted(draw(st.lists(st.integers(lo, hi), min_size=0, max_size=7 if depth < 3 else 0, unique=True)))
    for a, b in zip(cuts, cuts[1:]):
        if (a, b) == (lo, hi) or not draw(st.booleans()):
            continue
        out.append((a, b))
        if b - a > 2:
            out += draw(nested_intervals(lo=a, hi=b, depth=depth + 1))
    return out


@settings(max_examples=150, deadline=None)
@given(tracks=st.lists(nested_intervals(), min_size=1, max_size=3), seed=st.integers(0, 2**32 - 1))
def test_depth_and_parent_match_containment(tracks, seed):
    events = []
    for tid, intervals in enumerate(tracks, start=1):
        for i, (a, b) in enumerate(intervals):
            # ns on the wire as microseconds with three decimals, like phantora writes them
            events.append({"ph": "X", "pid": 1, "tid": tid, "name": f"{tid}:{i}", "ts": a / 1000,
                           "dur": (b - a) / 1000})
    random.Random(seed).shuffle(events)
    trace = import_events(events)

    by_id = {row[0]: row for row in trace.slices}
    got = {row[5]: (row[6], by_id[row[7]][5] if row[7] is not None else None) for row in trace.slices}
    assert len(got) == len(events)
    for tid, intervals in enumerate(tracks, start=1):
        for i, (a, b) in enumerate(intervals):
            ancestors = [j for j, (c, d) in enumerate(intervals) if j != i and c <= a and b <= d]
            parent = min(ancestors, key=lambda j: intervals[j][1] - intervals[j][0], default=None)
            assert got[f"{tid}:{i}"] == (len(ancestors), None if parent is None else f"{tid}:{parent}")
