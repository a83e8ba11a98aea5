"""Max-min fair rates: the textbook cases, and the defining properties on random inputs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phantora.net import maxmin
from phantora.net.maxmin import max_min_rates, unique_ids, unique_inverse


def solve(paths, capacity, caps=None, coefs=None):
    links = [np.array(sorted(p), dtype=np.int64) for p in paths]
    coefs = coefs or [np.ones(len(p)) for p in paths]
    caps = np.array(caps if caps is not None else [np.inf] * len(paths))
    return max_min_rates(links, [np.asarray(c, float) for c in coefs], caps,
                         np.asarray(capacity, dtype=float))


def test_single_flow_gets_its_bottleneck():
    assert solve([[0, 1, 2]], [100.0, 40.0, 70.0]) == pytest.approx([40.0])


@pytest.mark.parametrize("n", [1, 2, 3, 7, 50])
def test_n_flows_on_one_link_get_an_equal_share(n):
    assert solve([[0]] * n, [120.0]) == pytest.approx([120.0 / n] * n)


def test_a_flow_limited_elsewhere_frees_bandwidth_for_the_others():
    # Flows A, B, C share link 0 (90). C also crosses link 1 (10), so C gets 10 and A, B
    # split what is left of link 0: 40 each, not 30.
    assert solve([[0], [0], [0, 1]], [90.0, 10.0]) == pytest.approx([40.0, 40.0, 10.0])


def test_a_rate_cap_acts_like_a_private_link():
    assert solve([[0], [0]], [90.0], caps=[10.0, np.inf]) == pytest.approx([10.0, 80.0])


def test_a_flow_crossing_a_link_twice_loads_it_twice():
    # A ring whose two edges both cross link 0: 2 r <= 100.
    assert solve([[0]], [100.0], coefs=[[2.0]]) == pytest.approx([50.0])
    # ... and competes as two flows would: r_ring * 2 + r_other = 90 with equal rates.
    assert solve([[0], [0]], [90.0], coefs=[[2.0], [1.0]]) == pytest.approx([30.0, 30.0])


flow_sets = st.integers(2, 12).flatmap(lambda n_links: st.tuples(
    st.lists(st.floats(1.0, 100.0), min_size=n_links, max_size=n_links),
    st.lists(st.tuples(st.lists(st.integers(0, n_links - 1), min_size=1, max_size=4, unique=True),
                       st.lists(st.floats(0.25, 3.0), min_size=4, max_size=4),
                       st.one_of(st.just(np.inf), st.floats(0.5, 50.0))),
             min_size=1, max_size=12)))


@settings(max_examples=200, deadline=None)
@given(flow_sets)
def test_rates_are_feasible_and_max_min_fair(case):
    capacity, flows = case
    capacity = np.array(capacity)
    links = [np.array(sorted(p), dtype=np.int64) for p, _, _ in flows]
    coefs = [np.array(c[:len(p)]) for p, c, _ in flows]
    caps = np.array([cap for _, _, cap in flows])
    rates = max_min_rates(links, coefs, caps, capacity)
    load = np.zeros(len(capacity))
    for l, c, r in zip(links, coefs, rates):
        np.add.at(load, l, c * r)
    assert np.all(load <= capacity * (1 + 1e-9))  # feasible
    assert np.all(rates <= caps * (1 + 1e-9))
    # Max-min: every flow is either at its cap or crosses a full link on which no other
    # flow has a higher rate (so it cannot grow without shrinking a flow that is not richer).
    for i, (l, r) in enumerate(zip(links, rates)):
        if r >= caps[i] * (1 - 1e-9):
            continue
        bottleneck = False
        for link in l:
            if load[link] >= capacity[link] * (1 - 1e-9):
                others = [rates[j] for j in range(len(links)) if link in links[j]]
                if max(others) <= r * (1 + 1e-9):
                    bottleneck = True
        assert bottleneck, f"flow {i} could be raised"


@settings(max_examples=100, deadline=None)
@given(flow_sets)
def test_python_and_numpy_paths_agree(case):
    capacity, flows = case
    links = [np.array(sorted(p), dtype=np.int64) for p, _, _ in flows]
    coefs = [np.array(c[:len(p)]) for p, c, _ in flows]
    caps = np.array([cap for _, _, cap in flows])
    small = maxmin._max_min_small(links, coefs, caps, np.array(capacity))
    old = maxmin._SMALL
    maxmin._SMALL = -1
    try:
        big = max_min_rates(links, coefs, caps, np.array(capacity))
    finally:
        maxmin._SMALL = old
    assert small == pytest.approx(big, rel=1e-9)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 9_999), min_size=0, max_size=20_000))
def test_unique_ids_and_unique_inverse_are_numpys_for_few_and_many_ids(ids):
    ids = np.array(ids, dtype=np.int64)
    used, local = unique_inverse(ids, 10_000)
    want_used, want_local = np.unique(ids, return_inverse=True)
    assert np.array_equal(used, want_used) and np.array_equal(local, want_local)
    assert local.dtype == want_local.dtype
    assert np.array_equal(unique_ids(ids, 10_000), want_used)
