"""Cluster descriptions: presets, the TOML format, and the errors bad files get."""

from __future__ import annotations

import subprocess
import sys

import pytest

from phantora.net import (ClusterConfigError, cluster_from_toml, describe_presets, load_cluster,
                          preset_names, preset_toml)
from .conftest import SMALL_TOML


def test_presets_include_the_required_machines():
    assert {"dgx-h100", "dgx-a100", "dgx-h200", "ethernet"} <= set(preset_names())


@pytest.mark.parametrize("name", ["dgx-h100", "dgx-a100", "dgx-h200", "ethernet"])
def test_every_preset_loads_at_any_node_count(name):
    for nodes in (1, 3, 512):
        c = load_cluster(name, nodes=nodes)
        assert c.nodes == nodes
        assert c.num_gpus == nodes * c.gpus_per_node
        assert c.name in c.describe()


def test_dgx_h100_is_what_the_issue_describes():
    c = load_cluster("DGX_H100")  # case and separator insensitive
    assert c.node.gpus == 8 and c.node.intra == "nvswitch" and c.node.nvls
    assert c.node.nics == 8 and c.node.nic.bandwidth == pytest.approx(50.0)  # 400 Gb/s
    assert c.fabric.rail_optimized
    assert c.gpu_spec.key == "h100-sxm-80gb"


def test_global_gpu_index_is_node_times_gpus_plus_local():
    c = load_cluster("dgx-a100", nodes=4)
    assert c.node_of(19) == 2 and c.local_index(19) == 3


def test_preset_text_round_trips_through_a_file(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(preset_toml("dgx-a100"))
    assert load_cluster(str(path), nodes=2) == load_cluster("dgx-a100", nodes=2)


def test_describe_presets_lists_every_preset():
    text = describe_presets()
    for name in preset_names():
        assert name in text


def _bad(text: str) -> ClusterConfigError:
    with pytest.raises(ClusterConfigError) as err:
        cluster_from_toml(text, source="bad.toml")
    return err.value


def test_unknown_enum_value_names_field_and_allowed_values():
    e = _bad(SMALL_TOML.replace('routing = "ecmp"', 'routing = "random"'))
    assert e.field == "fabric.routing"
    assert e.allowed == ("adaptive", "ecmp")
    assert "fabric.routing" in str(e) and "adaptive, ecmp" in str(e) and "bad.toml" in str(e)


def test_unknown_topology_lists_the_topologies():
    e = _bad(SMALL_TOML.replace('topology = "leaf_spine"', 'topology = "torus"'))
    assert e.field == "fabric.topology" and "fat_tree" in str(e)


def test_misspelt_key_is_rejected_not_ignored():
    e = _bad(SMALL_TOML.replace("spines = 2", "spine = 2"))
    assert e.field in ("fabric.spine", "fabric.spines")
    assert "spines" in str(e)


def test_bandwidth_without_unit_says_what_units_work():
    e = _bad(SMALL_TOML.replace('bandwidth = "400 Gb/s"', "bandwidth = 400"))
    assert e.field == "node.nic.bandwidth"
    assert "Gb/s" in str(e) and "GB/s" in str(e)


def test_unreadable_latency():
    e = _bad(SMALL_TOML.replace('link_latency = "300 ns"', 'link_latency = "fast"'))
    assert e.field == "fabric.link_latency" and "us" in str(e)


def test_unknown_gpu_lists_known_gpus():
    e = _bad(SMALL_TOML.replace('gpu = "h100"', 'gpu = "h900"'))
    assert e.field == "node.gpu" and "h100-sxm-80gb" in e.allowed


def test_missing_required_field():
    e = _bad(SMALL_TOML.replace("nodes_per_leaf = 1\n", ""))
    assert e.field == "fabric.nodes_per_leaf" and "missing" in str(e)


def test_out_of_range_values():
    assert _bad(SMALL_TOML.replace("gpus = 4", "gpus = 0")).field == "node.gpus"
    assert _bad(SMALL_TOML.replace("efficiency = 1.0\n[node.pcie]",
                                   "efficiency = 1.5\n[node.pcie]")).field == "node.nvlink.efficiency"
    assert _bad(SMALL_TOML.replace("count = 4", "count = 5")).field == "node.nic.count"
    assert _bad(SMALL_TOML.replace("nodes = 2", 'nodes = "two"')).field == "nodes"


def test_nvls_needs_nvswitch():
    e = _bad(SMALL_TOML.replace('intra = "nvswitch"', 'intra = "pcie"'))
    assert e.field in ("node.nvls", "node.nvlink")


def test_keys_of_the_other_topology_are_rejected():
    e = _bad(SMALL_TOML.replace("spines = 2", "spines = 2\ncores = 4"))
    assert e.field == "fabric.cores" and "fat_tree" in str(e)


def test_fat_tree_cores_must_split_over_aggregations():
    text = SMALL_TOML.replace("spines = 2", "leafs_per_pod = 2\naggregations_per_pod = 2\ncores = 3")
    text = text.replace('topology = "leaf_spine"', 'topology = "fat_tree"')
    assert _bad(text).field == "fabric.cores"


def test_not_toml():
    e = _bad("name = \n[[[")
    assert "TOML" in str(e)


def test_unknown_cluster_name_lists_presets():
    with pytest.raises(ClusterConfigError) as err:
        load_cluster("dgx-h900")
    assert "dgx-h100" in str(err.value) and err.value.field == "cluster"


def test_bad_node_override():
    with pytest.raises(ClusterConfigError) as err:
        load_cluster("dgx-h100", nodes=0)
    assert err.value.field == "nodes"


def test_importing_phantora_net_does_not_import_torch():
    code = "import sys, phantora.net; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
