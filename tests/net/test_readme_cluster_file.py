"""The cluster file documented in docs/clusters.md (moved there from the README) loads, and every
field its table names is one the loader knows (so the documentation cannot drift from the format)."""

from __future__ import annotations

import re
from pathlib import Path

from phantora.net.cluster import cluster_from_toml
from phantora.net.presets import PRESETS

CLUSTERS = Path(__file__).resolve().parents[2] / "docs" / "clusters.md"


def _section() -> str:
    return CLUSTERS.read_text()


def test_the_readme_example_is_a_valid_cluster_file():
    toml = re.search(r"```toml\n(.*?)```", _section(), re.S).group(1)
    cluster = cluster_from_toml(toml, source="docs/clusters.md")
    assert cluster.node.intra == "pcie" and cluster.node.nics == 2 and cluster.fabric.routing == "ecmp"


def test_the_readme_table_covers_every_field_of_the_presets():
    documented = set(re.findall(r"`([a-z_.]+)`", _section()))
    documented |= {f"{prefix}.{leaf}" for prefix in ("node.nvlink", "node.pcie", "node.nic")
                   for leaf in ("bandwidth", "latency", "efficiency") if f"{prefix}.bandwidth" in documented}
    documented |= {f"fabric.{k}" for k in ("leafs_per_pod", "aggregations_per_pod", "cores", "core_oversubscription")
                   if "fabric.leafs_per_pod" in documented}
    import tomllib

    def keys(d: dict, prefix: str = "") -> set[str]:
        out = set()
        for k, v in d.items():
            name = f"{prefix}{k}"
            out |= keys(v, name + ".") if isinstance(v, dict) else {name}
        return out

    used = set().union(*(keys(tomllib.loads(t)) for t in PRESETS.values()))
    assert used <= documented, sorted(used - documented)
