"""phantora's CPU evaluation of a block mask (interpose/ops/hops.py, _cpu_block_mask) gives the
BlockMask that torch's own create_block_mask gives on the CPU, tensor for tensor: the same
counts, indices and transposed (query-side) tensors, for elementwise mask_mods (which it evaluates
on broadcast indices, in slices of query rows) and for one that only vmap evaluates per element."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.flex_attention import and_masks, create_block_mask

from interpose.ops import hops


def _assert_same_block_mask(mask_mod, B, H, Q, KV, args=(), kwargs=None) -> None:
    kwargs = kwargs or {}
    expected = create_block_mask(mask_mod, B, H, Q, KV, "cpu", *args, **kwargs).as_tuple()
    got = hops._cpu_block_mask(mask_mod, B, H, Q, KV, args, kwargs).as_tuple()
    assert len(got) == len(expected)
    for position, (e, g) in enumerate(zip(expected, got)):
        if isinstance(e, torch.Tensor):
            assert g.dtype == e.dtype and torch.equal(g, e), position
        elif e is None or isinstance(e, (int, tuple)):
            assert g == e, position


def _document_ids(lengths: list[int], batch: int) -> torch.Tensor:
    ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    return torch.stack([ids.roll(17 * b) for b in range(batch)])


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(1, 400), min_size=1, max_size=6),
       batch=st.integers(1, 3), heads=st.sampled_from([None, 1, 2]),
       kv_trim=st.integers(0, 130), block=st.sampled_from([128, 64, (128, 64), (64, 128)]),
       separate_full=st.booleans())
def test_a_causal_document_mask_matches_torchs(lengths, batch, heads, kv_trim, block, separate_full) -> None:
    ids = _document_ids(lengths, batch)
    q_len = ids.shape[1]
    kv_len = max(1, q_len - kv_trim)

    def document(b, h, q_idx, kv_idx):
        return ids[b, q_idx] == ids[b, kv_idx]

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    _assert_same_block_mask(and_masks(causal, document), batch, heads, q_len, kv_len, (block,),
                            {"separate_full_blocks": separate_full})


def test_masks_longer_than_one_slice_match_torchs() -> None:
    """A mask of several slices (16M cells each): 2 x 3,000 x 3,000 with a sliding window per head."""
    def window(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < 512 * (h + 1))

    q_len = 3000
    assert 2 * 2 * q_len * q_len > hops._SLICE_CELLS
    _assert_same_block_mask(window, 2, 2, q_len, q_len)


def test_a_mask_mod_that_is_not_elementwise_is_evaluated_per_element() -> None:
    """q_idx.min() is the query's own index under vmap and the slice's first on broadcast indices:
    the two disagree on the first query block, and the vmap's answer is the one kept."""
    def shifted_causal(b, h, q_idx, kv_idx):
        return q_idx - q_idx.min() + 300 >= kv_idx

    _assert_same_block_mask(shifted_causal, 1, 1, 1000, 1000)


def test_a_mask_of_the_same_form_reuses_the_elementwise_check(monkeypatch) -> None:
    """A loop's next document mask (new data, same code) is evaluated on broadcast indices without
    checking it against vmap again, and still matches torch's; a mask_mod of another form (here,
    one only vmap evaluates right) is checked on its own."""
    checks = []
    agree = hops._agree
    monkeypatch.setattr(hops, "_agree", lambda *a: checks.append(a[2]) or agree(*a))
    monkeypatch.setattr(hops, "_elementwise", {})

    def causal_document(ids):
        def document(b, h, q_idx, kv_idx):
            return ids[b, q_idx] == ids[b, kv_idx]

        def causal(b, h, q_idx, kv_idx):
            return q_idx >= kv_idx

        return and_masks(causal, document)

    first, second = _document_ids([300, 500, 224], 2), _document_ids([100, 700, 224], 2)
    _assert_same_block_mask(causal_document(first), 2, None, 1024, 1024)
    assert sorted(checks) == [0, 896]  # the first and last query blocks
    _assert_same_block_mask(causal_document(second), 2, None, 1024, 1024)
    assert len(checks) == 2

    def shifted_causal(b, h, q_idx, kv_idx):
        return q_idx - q_idx.min() + 300 >= kv_idx

    _assert_same_block_mask(shifted_causal, 2, None, 1024, 1024)
    assert len(checks) > 2


def test_mask_forms_tell_code_captured_values_and_tensor_kinds_apart() -> None:
    def make(limit, ids):
        def mod(b, h, q_idx, kv_idx):
            return (q_idx - kv_idx < limit) & (ids[b, q_idx] >= 0)

        return mod

    ids = torch.zeros(2, 8, dtype=torch.int64)
    assert hops._mask_form(make(4, ids)) == hops._mask_form(make(4, ids + 1))  # data alone differs
    assert hops._mask_form(make(4, ids)) != hops._mask_form(make(5, ids))
    assert hops._mask_form(make(4, ids)) != hops._mask_form(make(4, ids.int()))
    assert hops._mask_form(make(4, ids)) != hops._mask_form(make(4, ids[0]))

    class Window:
        def __call__(self, b, h, q_idx, kv_idx):
            return q_idx >= kv_idx

    assert hops._mask_form(Window()) is None  # an object's state is not known: checked every time
