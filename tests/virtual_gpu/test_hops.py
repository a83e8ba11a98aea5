"""Higher-order operators on a virtual GPU (issue 14, cause 10): flex_attention, torch.cond,
while_loop, wrap, tag_activation_checkpoint, invoke_subgraph and map run eagerly, on both torch
builds.

Before interpose/ops/hops.py, the first HOP call raised "There was no rule registered for
HigherOrderOperator flex_attention and mode <interpose.observer.OpObserver ...>" (and cond the
same for `cond`): the observer had no HOP rules, and VirtualCudaFakeMode lacked FakeTensorMode's.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from phantora.trace.check import load_chrome_trace
from tests.virtual_gpu.harness import BUILDS, assert_ran, run_traced

B, H, S, D = 2, 4, 512, 64  # tests/virtual_gpu/scripts/hops_flex.py
BLOCK = 128  # create_block_mask's default block size
FULL_FORWARD_FLOPS = 2 * B * H * S * S * (D + D)  # QK^T and PV over every (q, kv) pair


def _kernels(path: Path) -> list[dict]:
    events = [e for e in load_chrome_trace(path)["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
    return sorted(events, key=lambda e: e["ts"])


def _by_op(kernels: list[dict], op: str) -> list[dict]:
    return [k for k in kernels if k["args"].get("op") == op]


@BUILDS
def test_flex_attention_forward_backward_costed_by_block_mask(tmp_path: Path, user_python: str) -> None:
    proc, trace = run_traced(tmp_path, user_python, "hops_flex.py")
    assert_ran(proc, "block_mask_sparsity", "block_mask_sliced", "flex_causal", "flex_sliding", "flex_document",
               "flex_full", "sdpa", "flex_compiled_wrapper")
    kernels = _kernels(trace)
    forward = _by_op(kernels, "higher_order::flex_attention.default")
    backward = _by_op(kernels, "higher_order::flex_attention_backward.default")
    # Compiled with Inductor (the CUDA build has Triton), the compiled call is Inductor's
    # flex-attention template; without Triton (CPU build) it runs as the eager HOP.
    forward += [k for k in kernels if k["name"].startswith("triton_tem_")
                and any(op.endswith("flex_attention") for op in k["args"].get("fused aten ops", []))]
    # One fused kernel per call: causal, sliding, document, full, compiled-causal forward; the
    # first four also ran backward.
    assert len(forward) == 5, [k["name"] for k in forward]
    assert len(backward) == 4, [k["name"] for k in backward]
    causal, sliding, document, full, compiled = (k["args"]["flops"] for k in forward)

    assert full == FULL_FORWARD_FLOPS
    # 4 x 4 blocks of 128 tokens: causal visits the 10 blocks on or below the diagonal, the
    # 128-token window the 4 diagonal blocks and the 3 just below them.
    n = S // BLOCK
    assert abs(causal / full - (n * (n + 1) // 2) / n**2) < 1e-9, causal / full
    assert abs(sliding / full - (2 * n - 1) / n**2) < 1e-9, sliding / full
    assert compiled == causal
    # The document ids were copied from the CPU, so the block mask computed from them on the
    # virtual GPU holds data (docs/moe.md) and visits the blocks a GPU visits: documents of 200,
    # 200 and 112 tokens over 128-token blocks touch 2, 4, 3 and 3 key blocks per query block.
    assert document == full * 12 / 16
    for fwd, bwd in zip(forward, backward):
        assert bwd["args"]["flops"] == 2.5 * fwd["args"]["flops"]  # 5 products backward vs 2
    # Fewer blocks in a row, less time: the window visits at most 2 blocks per query block.
    assert forward[1]["dur"] < forward[0]["dur"]
    assert backward[1]["dur"] < backward[0]["dur"]

    # A full mask costs about what SDPA of the same shape costs: the same algorithm, modelled at
    # 90% (forward) / 85% (backward) of FlashAttention-2's rate, and SDPA picks cuDNN on the H100,
    # which runs faster than FlashAttention-2 there. So flex is slower, but by less than 2.5x.
    sdpa_fwd = _by_op(kernels, "aten::_scaled_dot_product_cudnn_attention.default")
    sdpa_bwd = _by_op(kernels, "aten::_scaled_dot_product_cudnn_attention_backward.default")
    assert len(sdpa_fwd) == 1 and len(sdpa_bwd) == 1
    assert sdpa_fwd[0]["args"]["flops"] == full
    assert 1.0 <= forward[3]["dur"] / sdpa_fwd[0]["dur"] <= 2.5, (forward[3]["dur"], sdpa_fwd[0]["dur"])
    assert 1.0 <= backward[3]["dur"] / sdpa_bwd[0]["dur"] <= 2.5, (backward[3]["dur"], sdpa_bwd[0]["dur"])
    # The fused kernel, not torch's unfused eager fallback (a bmm per product, a softmax).
    assert not [k for k in kernels if k["args"].get("op", "").startswith(("aten::bmm", "aten::_softmax"))]


@BUILDS
def test_a_mask_reading_gpu_tensors_with_known_data_gets_its_real_blocks_at_no_host_cost(
        tmp_path: Path, user_python: str) -> None:
    """TorchTitan builds its packed-document masks with torch.compile(create_block_mask) from
    document ids on the GPU. phantora evaluates such a mask on the CPU with the ids' known values
    (they were copied from the CPU), and that evaluation is phantora's work, not the program's.
    Before: the mask_mod's virtual tensor failed the evaluation (every block counted as visited,
    sparsity 99.2% read from placeholder counts), and each compiled call had Dynamo compile
    create_block_mask for the CPU, charged to the program's host: 9.3 ms a call against 0.29 for a
    mask of indices alone."""
    lengths = [700, 300, 600, 448]
    # the counted host (the default; the suite's is modelled), which charges the program's Python
    proc, _ = run_traced(tmp_path, user_python, "flex_mask_data.py", ",".join(map(str, lengths)),
                         options=("--host-time", "counted"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    got = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("{")))

    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))

    def document(b, h, q_idx, kv_idx):
        return (ids[q_idx] == ids[kv_idx]) & (q_idx >= kv_idx)

    real = create_block_mask(document, None, None, 2048, 2048, device="cpu").sparsity()
    assert 50 < real < 95, real  # causal alone is 46.9%: the documents take blocks away
    assert got["sparsity_eager"] == real
    assert got["sparsity_compiled"] == real
    # The compiled call costs the program its compiled code, whatever the mask reads.
    assert got["compiled_ms"] < 1.5 * got["index_only_compiled_ms"], got
    # The same eager call costs the same whether phantora could evaluate the mask or not.
    assert abs(got["eager_ms"] / got["no_data_ms"] - 1) < 0.01, got
    # The mask on ids without data (called three times) is named once, with what follows from it.
    notices = [line for line in proc.stderr.splitlines() if "create_block_mask(" in line]
    assert len(notices) == 1, notices
    assert "Q_LEN=2048" in notices[0] and "costed as visiting every block" in notices[0], notices


@BUILDS
def test_control_flow_hops_run_their_bodies(tmp_path: Path, user_python: str) -> None:
    proc, trace = run_traced(tmp_path, user_python, "hops_control.py")
    assert_ran(proc, "cond_virtual_predicate", "cond_hinted_predicate", "cond_backward", "while_loop", "wrap",
               "tag_activation_checkpoint", "invoke_subgraph", "map")
    count = Counter((k["args"].get("op"), tuple(map(tuple, k["args"].get("shapes", [])))) for k in _kernels(trace))
    # cond on a virtual predicate (x.sum() < 0 reads False under the value policy): only sin ran.
    assert count[("aten::sin.default", ((3, 5),))] == 1
    assert count[("aten::cos.default", ((3, 5),))] == 0
    # cond on isfinite(x).all() (reads True): only the true branch's cos and mul ran.
    assert count[("aten::cos.default", ((3, 6),))] == 1
    assert count[("aten::mul.Tensor", ((3, 6),))] == 1
    assert count[("aten::sin.default", ((3, 6),))] == 0
    # cond under autograd: the false branch forward, and its backward (d sin = cos * grad).
    assert count[("aten::sin.default", ((3, 7),))] >= 1
    assert count[("aten::cos.default", ((3, 7),))] == 1
    # while_loop with a counter that keeps its real value: three iterations of the body.
    assert count[("aten::mul.Tensor", ((7, 11),))] == 3
    # wrap: one tanh; tag_activation_checkpoint: tanh forward, recomputed in backward.
    assert count[("aten::tanh.default", ((4, 9),))] == 3
    assert count[("aten::tanh_backward.default", ((4, 9), (4, 9)))] == 1
    # invoke_subgraph runs its subgraph once; map runs its body once per slice.
    assert count[("aten::exp.default", ((5, 13),))] == 1
    assert count[("aten::relu.default", ((4, 8),))] == 3
