"""Generated cluster files and collective sequences (issue 19, point 1): a cluster file is either
refused with an error naming the bad field, or every collective on it simulates to a finite,
non-negative integer end time. A 1e-30 GB/s link used to pass validation and then crash the
simulator inside a 2-rank all-reduce ("Integer exceeds 64-bit range")."""

from __future__ import annotations

import tomllib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phantora.net import CollectiveSpec, Network
from phantora.net.cluster import ClusterConfigError, cluster_from_dict
from phantora.net.presets import PRESETS

INT64_MAX = (1 << 63) - 1

mantissas = st.sampled_from(["1", "2.5", "0.001", "450", "1e-30", "1e30", "1e-9", "3e5", "0", "0.0001"])
bandwidths = st.builds(lambda m, u: f"{m} {u}", mantissas, st.sampled_from(["GB/s", "Gb/s", "TB/s", "MB/s"]))
latencies = st.builds(lambda m, u: f"{m} {u}", mantissas, st.sampled_from(["ns", "us", "ms"]))
efficiencies = st.sampled_from([1.0, 0.5, 1e-12, 0.0, 1.5, 0.824])


@st.composite
def cluster_dicts(draw):
    data = tomllib.loads(PRESETS[draw(st.sampled_from(["dgx-h100", "dgx-a100", "ethernet"]))])
    data["nodes"] = draw(st.integers(1, 3))
    # Each field keeps the preset's value or takes a generated one (often outside physics).
    for link in ("nvlink", "pcie", "nic"):
        if link in data["node"]:
            for key, values in (("bandwidth", bandwidths), ("latency", latencies), ("efficiency", efficiencies)):
                if draw(st.booleans()):
                    data["node"][link][key] = draw(values)
    if draw(st.booleans()):
        data["fabric"]["link_latency"] = draw(latencies)
    return data


@st.composite
def collective_sequences(draw, world):
    ops = draw(st.lists(st.tuples(
        st.sampled_from(["all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier", "send_recv"]),
        st.sampled_from([4, 4096, 1 << 20, 1 << 30, 1 << 36]),
        st.integers(0, 10**12)), min_size=1, max_size=4))
    specs = []
    for op, nbytes, start in ops:
        n = 2 if op == "send_recv" else draw(st.integers(2, world))
        ranks = tuple(draw(st.permutations(range(world)))[:n])
        root = ranks[0] if op == "broadcast" else None
        specs.append((CollectiveSpec(op, nbytes, ranks, root=root), start))
    return specs


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_cluster_file_is_refused_or_every_collective_on_it_ends(data):
    raw = data.draw(cluster_dicts())
    try:
        cluster = cluster_from_dict(raw, source="generated.toml")
    except ClusterConfigError as e:
        assert e.field, f"the error names no field: {e}"
        assert str(e).startswith("generated.toml: "), str(e)
        return
    net = Network(cluster)
    handles = [net.submit(spec, start) for spec, start in data.draw(collective_sequences(cluster.num_gpus))]
    for h in handles:
        end = net.finish_time(h)
        assert isinstance(end, int) and 0 <= end <= INT64_MAX, end


def test_the_reported_case_names_the_field_and_the_range():
    raw = tomllib.loads(PRESETS["dgx-h100"])
    raw["node"]["nvlink"]["bandwidth"] = "1e-30 GB/s"
    try:
        cluster_from_dict(raw, source="c.toml")
    except ClusterConfigError as e:
        assert e.field == "node.nvlink.bandwidth"
        assert "physical range" in str(e) and "100 MB/s to 100 TB/s" in str(e)
    else:
        raise AssertionError("a 1e-30 GB/s link was accepted")
