"""Rollback: late arrivals give exactly the times a run that knew everything would give;
what was already answered is corrected and recorded; conservative mode agrees."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from phantora.net import CollectiveSpec, Network, NetworkConfig, load_cluster

OPS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all",
       "send_recv", "barrier"]
SIZES = [0, 100, 1 << 14, 1 << 18, 1 << 20, 3 << 20, 1 << 22]
GPUS = 8  # the small test cluster: 2 nodes x 4 GPUs


@st.composite
def collectives(draw):
    op = draw(st.sampled_from(OPS))
    n = 2 if op == "send_recv" else draw(st.integers(2, GPUS))
    ranks = tuple(draw(st.permutations(range(GPUS)))[:n])
    root = draw(st.sampled_from(ranks)) if op in ("broadcast", "reduce") else None
    spec = CollectiveSpec(op, draw(st.sampled_from(SIZES)), ranks, root)
    return spec, draw(st.integers(0, 300_000))


@st.composite
def scenarios(draw):
    """Collectives, the order they arrive in, and which handles are asked about after each
    arrival (which makes the network simulate ahead, so later arrivals roll it back)."""
    items = draw(st.lists(collectives(), min_size=1, max_size=10))
    order = draw(st.permutations(range(len(items))))
    queries = [draw(st.lists(st.integers(0, i), max_size=3)) for i in range(len(items))]
    return items, order, queries


def arrived(cluster, items, order, queries) -> tuple[Network, dict[int, int]]:
    """A network given the collectives in `order`, asked after each arrival for the ends in
    `queries` (so it simulates ahead, and later arrivals roll it back); and each item's handle."""
    net = Network(cluster)
    handle = {}
    for step, i in enumerate(order):
        handle[i] = net.submit(*items[i])
        for j in queries[step]:
            net.finish_time(handle[order[j]])
    return net, handle


def from_scratch(cluster, items, config=None):
    net = Network(cluster, config)
    handles = [net.submit(spec, start) for spec, start in items]
    return [net.finish_time(h) for h in handles]


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_any_arrival_order_gives_the_times_of_a_run_that_knew_everything(small_cluster, case):
    items, order, queries = case
    expected = from_scratch(small_cluster, items)
    net = Network(small_cluster)
    handle = {}
    told = {}  # what the engine believes: finish_time answers, then corrections
    for step, i in enumerate(order):
        handle[i] = net.submit(*items[i])
        for c in net.take_corrections():  # only ends already told, with what was told
            assert told[c.handle] == c.old_end_ns
            told[c.handle] = c.new_end_ns
        for j in queries[step]:
            h = handle[order[j]]
            answer = net.finish_time(h)
            for c in net.take_corrections():  # asking again about an undone end corrects it first
                assert told[c.handle] == c.old_end_ns
                told[c.handle] = c.new_end_ns
            told[h] = answer
    final = [net.finish_time(handle[i]) for i in range(len(items))]
    assert final == expected  # bit-identical, not approximately
    net.settle()
    for c in net.take_corrections():
        assert told[c.handle] == c.old_end_ns
        told[c.handle] = c.new_end_ns
    assert all(told[handle[i]] == final[i] for i in range(len(items)) if handle[i] in told)


@settings(max_examples=150, deadline=None)
@given(st.lists(collectives(), min_size=1, max_size=10))
def test_conservative_equals_optimistic_when_arrivals_are_sorted(small_cluster, items):
    items = sorted(items, key=lambda x: x[1])
    expected = from_scratch(small_cluster, items)
    net = Network(small_cluster, NetworkConfig(mode="conservative"))
    handles, answers = [], {}
    for spec, start in items:
        net.advance_horizon(start)
        handles.append(net.submit(spec, start))
        for h in handles:  # an answer, once given, is never wrong
            t = net.finish_time(h)
            if t is not None:
                answers.setdefault(h, t)
                assert answers[h] == t
    net.advance_horizon(10**15)
    final = [net.finish_time(h) for h in handles]
    assert final == expected
    assert all(answers[h] == final[k] for k, h in enumerate(handles) if h in answers)
    assert net.take_rollbacks() == [] and net.rollback_count == 0


def test_conservative_waits_for_the_horizon(small_cluster):
    net = Network(small_cluster, NetworkConfig(mode="conservative"))
    h = net.submit(CollectiveSpec("all_reduce", 1 << 24, (0, 1, 2, 3)), 0)
    assert net.finish_time(h) is None  # a submission at 0 could still slow it down
    net.advance_horizon(1_000)
    assert net.finish_time(h) is None
    net.advance_horizon(10**9)
    assert net.finish_time(h) == from_scratch(small_cluster, [(net._get(h).spec, 0)])[0]


def test_submitting_before_the_horizon_is_an_error(small_cluster):
    net = Network(small_cluster, NetworkConfig(mode="conservative"))
    net.advance_horizon(500)
    try:
        net.submit(CollectiveSpec("all_reduce", 8, (0, 1)), 499)
    except ValueError as e:
        assert "horizon" in str(e)
    else:
        raise AssertionError("accepted a start before the horizon")


def test_a_late_arrival_corrects_a_reported_end_and_records_the_rollback(small_cluster):
    net = Network(small_cluster)
    first = net.submit(CollectiveSpec("all_reduce", 1 << 26, (0, 1, 2, 3), label="A"), 0)
    old = net.finish_time(first)
    late = net.submit(CollectiveSpec("all_reduce", 1 << 26, (0, 1, 2, 3), label="B"), 1_000)
    assert net.take_corrections() == []  # A's new end is not simulated yet
    net.settle()
    (correction,) = net.take_corrections()
    assert correction.handle == first and correction.label == "A"
    assert correction.old_end_ns == old and correction.new_end_ns > old
    assert net.finish_time(first) == correction.new_end_ns
    (record,) = net.take_rollbacks()
    assert record.handle == late and record.label == "B"
    # the network had simulated up to A's last byte (its end adds A's latency)
    assert record.to_ns == 1_000
    assert record.from_ns == record.network_time_ns == old - net.collective_info(first).latency_ns
    assert record.flows_rolled_back == 1
    assert record.undone == (first,)
    assert net.take_corrections() == [] and net.take_rollbacks() == []


def test_unchanged_ends_are_not_reported_as_corrections(small_cluster):
    net = Network(small_cluster)
    short = net.submit(CollectiveSpec("all_reduce", 1 << 16, (0, 1)), 0)
    long = net.submit(CollectiveSpec("all_reduce", 1 << 28, (0, 1)), 0)
    t_short, t_long = net.finish_time(short), net.finish_time(long)
    net.submit(CollectiveSpec("send_recv", 1 << 28, (0, 1)), t_short + 1000)
    net.settle()
    corrections = net.take_corrections()
    assert [c.handle for c in corrections] == [long]
    assert corrections[0].old_end_ns == t_long
    assert net.finish_time(short) == t_short


def test_a_late_arrival_rolls_back_only_the_part_of_the_network_it_touches():
    cluster = load_cluster("dgx-h100", nodes=2)
    net = Network(cluster)
    node0 = net.submit(CollectiveSpec("all_reduce", 1 << 28, tuple(range(8))), 0)
    node1 = net.submit(CollectiveSpec("all_reduce", 1 << 28, tuple(range(8, 16))), 0)
    t0, t1 = net.finish_time(node0), net.finish_time(node1)
    net.submit(CollectiveSpec("all_reduce", 1 << 20, tuple(range(8, 16))), 10_000)
    (record,) = net.take_rollbacks()
    assert record.flows_rolled_back == 1  # node 1's all-reduce; node 0 untouched
    assert record.undone == (node1,)
    assert net.finish_time(node0) == t0 and net.finish_time(node1) > t1


def test_a_late_arrival_on_links_idle_since_its_start_rewinds_nothing():
    """Its island (flows that ever shared links: A, X and C through GPUs 1 and 2) was simulated
    past the late one's start, but no flow with an event after that start shares its links."""
    net = Network(load_cluster("dgx-h100", nodes=1))
    a = net.submit(CollectiveSpec("all_reduce", 1 << 16, (0, 1)), 0)
    x = net.submit(CollectiveSpec("all_reduce", 1 << 16, (1, 2)), 0)
    c = net.submit(CollectiveSpec("all_reduce", 1 << 30, (2, 3)), 0)
    t_c = net.finish_time(c)
    late_start = max(net.finish_time(a), net.finish_time(x)) + 1_000
    assert late_start < t_c - net.collective_info(c).latency_ns  # C's flow was simulated past it
    late = net.submit(CollectiveSpec("all_reduce", 1 << 20, (0, 1)), late_start)
    assert net.take_rollbacks() == [] and net.take_corrections() == []
    assert net.finish_time(c) == t_c
    fresh = Network(load_cluster("dgx-h100", nodes=1))
    handles = [fresh.submit(CollectiveSpec("all_reduce", n, r), s) for n, r, s in
               [(1 << 16, (0, 1), 0), (1 << 16, (1, 2), 0), (1 << 30, (2, 3), 0), (1 << 20, (0, 1), late_start)]]
    assert [fresh.finish_time(h) for h in handles] == [net.finish_time(h) for h in (a, x, c, late)]


def test_same_inputs_same_outputs(small_cluster):
    def run():
        net = Network(small_cluster)
        hs = []
        for k in range(12):
            hs.append(net.submit(CollectiveSpec("all_reduce", (k + 1) << 20,
                                                tuple(range(k % 3, k % 3 + 4))), 10_000 * (12 - k)))
            net.finish_time(hs[-1])
        return [net.finish_time(h) for h in hs], net.take_rollbacks(), net.take_corrections()

    assert run() == run()


@settings(max_examples=200, deadline=None)
@given(scenarios(), st.data())
def test_collectives_submitted_together_give_the_times_of_a_run_that_knew_everything(small_cluster, case, data):
    """submit_many (the collectives of a representative's mirrored ranks, submitted together
    after the network has simulated ahead) rolls back once and still gives the exact times."""
    items, order, queries = case
    expected = from_scratch(small_cluster, items)
    cut = data.draw(st.integers(0, len(order)))
    net = Network(small_cluster)
    handle = {}
    for step, i in enumerate(order[:cut]):
        handle[i] = net.submit(*items[i])
        for j in queries[step]:
            net.finish_time(handle[order[j]])
    together = order[cut:]
    for i, h in zip(together, net.submit_many([items[i] for i in together])):
        handle[i] = h
    assert [net.finish_time(handle[i]) for i in range(len(items))] == expected


def _closure_by_scanning(sim, seeds, t):
    """The rollback scope by its definition: among every flow with an event at or after t, the
    closure over shared links from the seeds (what rollback_scope scanned for before it walked
    out from the seeds' links)."""
    from phantora.net.fluid import DONE

    candidates = [f for f in sim.flows.values() if f.state != DONE or f.done_t >= t]
    inside, links = {f.fid for f in seeds}, {link for f in seeds for link in f.link_list}
    grew = True
    while grew:
        grew = False
        for f in candidates:
            if f.fid not in inside and links.intersection(f.link_list):
                inside.add(f.fid)
                links.update(f.link_list)
                grew = True
    return sorted(inside)


@settings(max_examples=200, deadline=None)
@given(scenarios(), st.integers(0, 400_000), st.data(), st.sampled_from([2048, 1]), st.sampled_from([64, 3, 0]))
def test_the_rollback_scope_walked_or_scanned_is_the_closure_by_definition(small_cluster, case, t, data,
                                                                           walk_limit, many_links):
    """Both ways rollback_scope finds it: the walk from the seeds' links, and (beyond
    walk_limit flows) the vectorized pass over the island; with the flows of more than
    `many_links` links indexed apart (fluid.WideIndex: 64 is the default, which no flow of the
    small test cluster reaches; 0 sends every flow there)."""
    from unittest import mock

    from phantora.net import fluid, rollback

    items, order, queries = case
    with mock.patch.object(fluid, "_MANY_LINKS", many_links):
        net = Network(small_cluster)
        handles = []
        for step, i in enumerate(order):
            handles.append(net.submit(*items[i]))
            for j in queries[step]:
                net.finish_time(handles[j])
        sim = net._sim
        from phantora.net.fluid import DONE

        # a rollback's seeds are late flows: not done (they have not even started)
        live = sorted(f.fid for f in sim.flows.values() if f.state != DONE)
        if not live:
            return
        handle = sim.flows[data.draw(st.sampled_from(live))].handle
        seeds = [f for f in net._collectives[handle].flows if f.fid in sim.flows and f.state != DONE]
        with mock.patch.object(rollback, "_WALK_LIMIT", walk_limit):
            scope = rollback.rollback_scope(sim, seeds, t)
        assert [f.fid for f in scope] == _closure_by_scanning(sim, seeds, t)
        assert not sim.link_seen.any()  # the walk's scratch marks are cleared


def test_an_undone_end_is_corrected_when_the_network_simulates_it_again():
    """A rollback does not re-simulate the ends it undid: their corrections come when a later
    question (another collective's end, prune) has simulated that far, or at settle()."""
    net = Network(load_cluster("dgx-h100", nodes=1))
    a = net.submit(CollectiveSpec("all_reduce", 1 << 26, (0, 1, 2, 3), label="A"), 0)
    old = net.finish_time(a)
    batches = net.event_batches
    net.submit(CollectiveSpec("all_reduce", 1 << 26, (0, 1, 2, 3), label="B"), 1_000)
    assert net.event_batches == batches and net.take_corrections() == []  # nothing simulated yet
    c = net.submit(CollectiveSpec("all_reduce", 1 << 26, (0, 1, 2, 3), label="C"), 2_000)
    net.finish_time(c)  # simulates past A's new end
    (correction,) = net.take_corrections()
    assert correction.handle == a and correction.old_end_ns == old and correction.new_end_ns > old
    assert net.finish_time(a) == correction.new_end_ns and net.take_corrections() == []


def test_prune_corrects_an_undone_end_before_forgetting_it():
    net = Network(load_cluster("dgx-h100", nodes=1))
    a = net.submit(CollectiveSpec("all_reduce", 1 << 26, (0, 1, 2, 3), label="A"), 0)
    old = net.finish_time(a)
    net.submit(CollectiveSpec("all_reduce", 1 << 26, (0, 1, 2, 3), label="B"), 1_000)
    retired = net.prune(10 * old)
    (correction,) = net.take_corrections()
    assert correction.handle == a and correction.old_end_ns == old
    assert [r.end_ns for r in retired if r.handle == a] == [correction.new_end_ns]
