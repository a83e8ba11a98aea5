"""The routing model (phantora/routing.py): whole counts that add up, a token -> experts table
with distinct experts per token, the options of --routing and the errors of a routing file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phantora.routing import (RoutingModel, RoutingModelError, assign_experts, expert_counts, imbalance,
                              load_routing_file, parse_routing)

SHAPES = st.integers(1, 64).flatmap(lambda e: st.tuples(st.just(e), st.integers(0, e), st.integers(0, 3000)))
MODELS = st.sampled_from([RoutingModel(), RoutingModel("zipf", 1.2, 3), RoutingModel("zipf", 3.0, 0),
                          RoutingModel("dirichlet", 0.1, 7), RoutingModel("dirichlet", 5.0, 1)])


@settings(max_examples=300, deadline=None)
@given(shape=SHAPES, model=MODELS, layer=st.integers(0, 60))
def test_counts_add_up_and_fit_the_tokens(shape: tuple[int, int, int], model: RoutingModel, layer: int) -> None:
    """N tokens x top-k choices in all; no expert gets a token twice; the table holds exactly them."""
    experts, k, tokens = shape
    counts = expert_counts(model.fractions(layer, experts), tokens, k)
    assert counts.sum() == tokens * k
    assert (counts >= 0).all() and (counts <= tokens).all()
    table = assign_experts(counts, tokens, k)
    assert table.shape == (tokens, k)
    assert np.array_equal(np.bincount(table.reshape(-1), minlength=experts), counts)
    if k:
        assert all(len(set(row)) == k for row in table.tolist()), "a token picked an expert twice"


@settings(max_examples=200, deadline=None)
@given(shape=SHAPES)
def test_balanced_counts_differ_by_at_most_one_spread_over_the_experts(shape: tuple[int, int, int]) -> None:
    experts, k, tokens = shape
    counts = expert_counts(RoutingModel().fractions(0, experts), tokens, k)
    assert counts.max() - counts.min() <= 1
    # the remainder is spread: no half of the experts holds more than its share plus one
    extra = (counts - counts.min()).astype(int)
    half = experts // 2
    assert abs(int(extra[:half].sum()) - int(extra.sum()) * half / experts) <= 1


def test_balanced_hand_counts() -> None:
    assert expert_counts(np.full(8, 1 / 8), 4096, 2).tolist() == [1024] * 8
    # 10 choices over 4 experts: 2 each, the 2 extra to experts 0 and 2 (spread, not 0 and 1)
    assert expert_counts(np.full(4, 0.25), 5, 2).tolist() == [3, 2, 3, 2]


def test_skewed_counts_follow_the_fractions_and_cap_at_the_tokens() -> None:
    counts = expert_counts(np.array([0.75, 0.25]), 1000, 1)
    assert counts.tolist() == [750, 250]
    # 0.9 of 100 tokens x top-2 would be 180 > 100 tokens: capped, the rest spread by fraction
    counts = expert_counts(np.array([0.9, 0.05, 0.05]), 100, 2)
    assert counts.tolist() == [100, 50, 50]


def test_skewed_models_are_seeded_per_layer_and_deterministic() -> None:
    z = RoutingModel("zipf", 1.5, 0)
    assert np.allclose(z.fractions(3, 16), z.fractions(3, 16))
    assert not np.allclose(z.fractions(3, 16), z.fractions(4, 16))
    assert not np.allclose(z.fractions(3, 16), RoutingModel("zipf", 1.5, 1).fractions(3, 16))
    # Zipf: the fractions are 1/rank^S, normalised, in some order
    p = np.sort(z.fractions(0, 4))[::-1]
    w = 1 / np.arange(1, 5) ** 1.5
    assert np.allclose(p, w / w.sum())
    d = RoutingModel("dirichlet", 0.3, 2).fractions(1, 32)
    assert abs(d.sum() - 1) < 1e-12 and imbalance(d) > 1.5


def test_imbalance_is_max_over_mean() -> None:
    assert imbalance([10, 10, 10, 10]) == 1.0
    assert imbalance([40, 0, 0, 0]) == 4.0
    assert imbalance([0, 0]) == 1.0


@pytest.mark.parametrize("text, kind, param", [("balanced", "balanced", None), ("", "balanced", None),
                                                ("zipf:1.2", "zipf", 1.2), ("dirichlet:0.5", "dirichlet", 0.5)])
def test_parse_routing_options(text: str, kind: str, param: float | None) -> None:
    m = parse_routing(text, seed=4)
    assert (m.kind, m.param) == (kind, param)
    assert parse_routing(m.spec()) == m  # the ranks receive the model as its spec


@pytest.mark.parametrize("text, words", [("zipf", "positive number"), ("zipf:-1", "positive number"),
                                         ("dirichlet:abc", "positive number"), ("uniform", "not a routing model"),
                                         ("zipf:1#seed=x", "not an integer")])
def test_bad_routing_options_say_what_to_write(text: str, words: str) -> None:
    with pytest.raises(RoutingModelError, match=words):
        parse_routing(text)


def _file(tmp_path: Path, doc: object) -> Path:
    p = tmp_path / "routing.json"
    p.write_text(json.dumps(doc))
    return p


def test_routing_file_layers_default_and_normalisation(tmp_path: Path) -> None:
    p = _file(tmp_path, {"layers": [[0.5, 0.5], [0.8, 0.2]], "default": [0.6, 0.4], "comment": "measured"})
    m = parse_routing(str(p), seed=0)
    assert m.kind == "file" and parse_routing(m.spec()) == m
    assert m.fractions(1, 2).tolist() == [0.8, 0.2]
    assert m.fractions(5, 2).tolist() == [0.6, 0.4]
    # within 1% of 1: normalised
    m = load_routing_file(_file(tmp_path, {"layers": [[0.503, 0.5]]}))
    assert abs(sum(m.layers[0]) - 1) < 1e-12


@pytest.mark.parametrize("doc, words", [
    ([0.5, 0.5], "expected an object"),
    ({"layers": []}, "non-empty list"),
    ({"layers": [[0.5, 0.5]], "experts": 2}, "unknown field 'experts'"),
    ({"layers": [[0.5, "x"]]}, r"layers\[0\]\[1\] is 'x'"),
    ({"layers": [[0.5, 0.5], [0.7, -0.1]]}, r"layers\[1\]\[1\] is -0.1"),
    ({"layers": [[0.5, 0.4]]}, r"layers\[0\] sums to 0.9"),
    ({"layers": [[1.0]], "default": []}, "default must be a non-empty list"),
])
def test_routing_file_errors_name_the_field(tmp_path: Path, doc: object, words: str) -> None:
    with pytest.raises(RoutingModelError, match=words):
        load_routing_file(_file(tmp_path, doc))


def test_routing_file_errors_at_run_time_name_the_layer(tmp_path: Path) -> None:
    m = load_routing_file(_file(tmp_path, {"layers": [[0.5, 0.5]]}))
    with pytest.raises(RoutingModelError, match="lists 1 MoE layers and no \"default\".*layer 1"):
        m.fractions(1, 2)
    with pytest.raises(RoutingModelError, match=r"layers\[0\] has 2 fractions, but MoE layer 0 .* 8 experts"):
        m.fractions(0, 8)


def test_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(RoutingModelError, match="cannot read routing file"):
        parse_routing(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{layers: ")
    with pytest.raises(RoutingModelError, match="not valid JSON"):
        parse_routing(str(bad))
