"""Flows with many links (rings over many GPUs, all-to-all rounds) are indexed apart from the
others (fluid.WideIndex, found from a link in numpy rather than link by link). The test cluster's
flows have a few links each, so _MANY_LINKS is lowered here to send some or all of them down that
path: every answer must be bit-identical to the per-link path's. (The rollback scope with such
flows: test_rollback.py's closure test.)"""

from __future__ import annotations

from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from phantora.net import fluid
from phantora.net.fluid import Flow, WideIndex

from .test_rollback import arrived, from_scratch, scenarios

# 0: every flow is wide; 3: those of more than 3 links (most inter-node ones) are
WIDE_FROM = st.sampled_from([0, 3])


@settings(max_examples=200, deadline=None)
@given(scenarios(), WIDE_FROM)
def test_wide_flows_give_the_times_of_the_per_link_index_in_any_arrival_order(small_cluster, case, many):
    items, order, queries = case
    expected = from_scratch(small_cluster, items)  # every flow narrow
    with mock.patch.object(fluid, "_MANY_LINKS", many):
        net, handle = arrived(small_cluster, items, order, queries)
        assert [net.finish_time(handle[i]) for i in range(len(items))] == expected


def _flow(fid: int, links: list[int]) -> Flow:
    arr = np.array(links, dtype=np.int64)
    return Flow(fid, (fid,), 0, 0, 1.0, 0, arr, np.ones(len(arr)), 1.0)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "discard", "look"]), st.integers(0, 11),
                          st.lists(st.integers(0, 15), min_size=1, max_size=300)), max_size=60),
       st.booleans())
def test_wide_index_answers_as_a_set_of_flows_does(ops, counted):
    """Adds, discards (of flows kept or not, re-added after a discard) and look-ups (of links
    repeated or not) in any order: touching() names exactly the flows held that use one of the
    links asked about."""
    flows = {fid: _flow(fid, sorted({(fid * 5 + k) % 16 for k in range(fid % 4 + 1)})) for fid in range(12)}
    index, held = WideIndex(16, counted=counted), set()
    for op, fid, links in ops:
        f = flows[fid]
        if op == "add" and fid not in held:
            index.add(f)
            held.add(fid)
        elif op == "discard":
            index.discard(f)
            held.discard(fid)
        else:
            asked = np.array(links, dtype=np.int64)
            want = {g for g in held if set(flows[g].link_list) & set(links)}
            assert index.touching(asked) == want
        if counted:
            expect = np.zeros(16, dtype=np.int32)
            for g in held:
                expect[flows[g].links] += 1
            assert (index.on_link == expect).all()
        assert bool(index) == bool(held)


@given(st.lists(st.lists(st.integers(0, 15), min_size=1, max_size=6, unique=True), min_size=1, max_size=40),
       st.lists(st.integers(0, 15), min_size=1, max_size=100))
@settings(max_examples=200, deadline=None)
def test_flows_added_together_are_found_by_any_of_their_links(links_of, asked):
    """Flows added together make one chunk, eight flows to a byte of its bits: every link asked
    about alone, and any list of links (repeats included), names exactly the flows that use them."""
    flows = [_flow(fid, sorted(links)) for fid, links in enumerate(links_of)]
    index = WideIndex(16, counted=False)
    for f in flows:
        index.add(f)
    for link in range(16):
        assert index.touching(np.array([link])) == {f.fid for f in flows if link in f.link_list}
    assert index.touching(np.array(asked)) == {f.fid for f in flows if set(f.link_list) & set(asked)}
