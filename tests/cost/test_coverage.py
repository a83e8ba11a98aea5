"""Every aten op a dispatch observer can see is classified on purpose, and nothing is free by
accident: unknown ops get a non-zero fallback and are flagged for the caller to report."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest
import torch

from phantora.cost import NO_GPU_WORK
from phantora.cost.families import FOREIGN, UNMODELLED, UNMODELLED_OPS, classify
from phantora.cost.measurements import mm_signature
from phantora.ops import OpSignature, TensorMeta
from tests.cost.tensors import cuda_tensor as _cuda

# Kernels that make an op reach the dispatcher as itself (not decomposed before dispatch).
OBSERVABLE_KEYS = ("CPU", "CUDA", "Meta", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")


def observable_aten_overloads() -> list[tuple[str, str, frozenset[str]]]:
    """(qualified name, overload, tags) of every aten overload a post-autograd observer can see.

    Overloads whose only kernel is CompositeImplicitAutograd decompose before dispatch and are
    skipped; overloads with no kernel under these keys at all (CUDA-only ops on this CPU
    build, sparse/quantized backends) are kept: a CUDA build of torch can dispatch them.
    """
    out = []
    for full in torch._C._dispatch_get_all_op_names():
        if not full.startswith("aten::"):
            continue
        has = lambda key: torch._C._dispatch_has_kernel_for_dispatch_key(full, key)  # noqa: E731
        if has("CompositeImplicitAutograd") and not any(has(k) for k in OBSERVABLE_KEYS):
            continue
        name, _, overload = full.partition(".")
        op = getattr(getattr(torch.ops.aten, name.removeprefix("aten::")), overload or "default")
        tags = frozenset(str(t).removeprefix("Tag.") for t in op.tags) | ({"view"} if op.is_view else set())
        out.append((name, overload or "default", tags))
    return out


@pytest.fixture(scope="module")
def overloads():
    return observable_aten_overloads()


def test_every_observable_aten_op_is_classified(overloads):
    assert len(overloads) > 2000  # the enumeration itself works
    unclassified = sorted({f"{n}.{o}" for n, o, tags in overloads if classify(n, tags) is None})
    assert not unclassified, (
        f"{len(unclassified)} aten overloads would fall to the generic fallback unnoticed; add them "
        f"to a family (phantora/cost/families.py), or to UNMODELLED_OPS on purpose: {unclassified}"
    )


def test_family_census(overloads):
    """The explicit no-model sets stay small next to what is modelled."""
    census = Counter(classify(n, tags).name for n, _o, tags in overloads)
    modelled = sum(v for k, v in census.items() if k not in ("foreign", "unmodelled"))
    assert census["unmodelled"] < 0.05 * len(overloads), census
    assert modelled > 0.8 * len(overloads), census


def test_unmodelled_set_names_real_ops():
    """UNMODELLED_OPS must not rot: every name is an aten op of this torch."""
    missing = [n for n in UNMODELLED_OPS if not hasattr(torch.ops.aten, n)]
    assert not missing
    assert len(UNMODELLED_OPS) <= 60


def test_namespaces():
    assert classify("prim::device").model is None
    assert classify("profiler::_record_function_enter_new").model is None
    assert classify("_c10d_functional::all_reduce").name == "collective"
    assert classify("c10d::allreduce_").name == "collective"
    assert classify("mylib::custom_kernel") is None




@pytest.mark.parametrize("name", ["mylib::custom_kernel", "aten::made_up_op"])
@pytest.mark.parametrize("shape", [(0,), (1,), (4096, 4096)])
def test_unknown_op_gets_nonzero_fallback(estimator, name, shape):
    x = _cuda(shape)
    e = estimator.estimate(OpSignature(name, "default", (x,), (x,)))
    assert not e.known
    assert e.kernels == 1 and e.duration_ns >= estimator.gpu.min_kernel_ns
    assert e.host_ns > 0


def test_unmodelled_and_foreign_ops_are_flagged(estimator):
    a = _cuda((512, 512))
    for name in ("aten::_linalg_svd", "aten::linalg_qr", "aten::_ctc_loss"):
        assert classify(name) is UNMODELLED
        e = estimator.estimate(OpSignature(name, "default", (a,), (a,)))
        assert not e.known and e.duration_ns > 0
    assert classify("aten::mkldnn_convolution") is FOREIGN
    assert not estimator.estimate(OpSignature("aten::mkldnn_convolution", "default", (a, a), (a,))).known


def test_model_error_falls_back_flagged(estimator):
    """A modelled op whose signature the model cannot read (wrong arity) is flagged, not zero."""
    a = _cuda((8, 8))
    e = estimator.estimate(OpSignature("aten::mm", "default", (a,), (a,)))
    assert not e.known and e.duration_ns > 0


def test_host_only_op_launches_nothing(estimator):
    cpu = TensorMeta((1024,), "float32", (1,), "cpu")
    e = estimator.estimate(OpSignature("aten::add", "Tensor", (cpu, cpu, 1), (cpu,), frozenset({"pointwise"})))
    assert e.kind == NO_GPU_WORK and e.kernels == 0 and e.duration_ns == 0 and e.known
    assert e.host_ns > 0


def test_estimates_are_deterministic_integers(estimator):
    sig = mm_signature(4096, 4096, 4096, "bfloat16")
    a, b = estimator.estimate(sig), estimator.estimate(sig)
    assert a == b and isinstance(a.duration_ns, int) and isinstance(a.host_ns, int)


def test_cost_package_does_not_import_torch():
    code = ("import sys, phantora.cost.analytical, phantora.cost.measurements; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
