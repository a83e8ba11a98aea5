"""The measured mode, run on CPU tensors through the same code a GPU uses (device="cpu"), and on
a real GPU where one is visible (marked gpu)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
import torch

from phantora.cost import NO_GPU_WORK, choose_estimator
from phantora.cost import measured
from phantora.cost.analytical import AnalyticalEstimator
from phantora.cost.measured import KernelTimeCache, MeasuredEstimator, build_args
from phantora.cost.measurements import add_signature, mm_signature
from phantora.hardware import lookup_gpu
from phantora.ops import OpSignature, TensorMeta


def cuda(shape, dtype="float32", stride=None) -> TensorMeta:
    if stride is None:
        stride, acc = [], 1
        for s in reversed(shape):
            stride.insert(0, acc)
            acc *= s
    return TensorMeta(tuple(shape), dtype, tuple(stride), "cuda:0")


@pytest.fixture
def cache(tmp_path) -> KernelTimeCache:
    return KernelTimeCache(tmp_path / "kernel_times.sqlite")


@pytest.fixture
def make(h100, cache):
    def make_estimator(**kw) -> MeasuredEstimator:
        return MeasuredEstimator(h100, AnalyticalEstimator(h100), device="cpu", cache=kw.pop("cache", cache), **kw)
    return make_estimator


SMALL_MM = mm_signature(64, 48, 32, "float32")


def test_times_an_op_on_the_device(make, estimator):
    est = make()
    e = est.estimate(SMALL_MM)
    assert e.estimator == "measured" and e.duration_ns > 0
    a = estimator.estimate(SMALL_MM)  # what the fallback knows stays: FLOPs, bytes, kernels, kind
    assert (e.flops, e.bytes, e.kernels, e.kind) == (a.flops, a.bytes, a.kernels, a.kind)
    assert est.stats == {"measured": 1}
    assert est.device_name.startswith("cpu")


def test_second_run_reads_the_disk_cache(make, monkeypatch):
    first = make().estimate(SMALL_MM)

    def must_not_run(*a, **k):
        raise AssertionError("measured again despite the cache")

    monkeypatch.setattr(measured, "measure_signature", must_not_run)
    again = make()  # a new simulator process, same cache file
    assert again.estimate(SMALL_MM).duration_ns == first.duration_ns
    assert again.stats == {"from cache": 1}


def test_cache_is_keyed_by_device_and_torch_version(make, monkeypatch):
    make().estimate(SMALL_MM)
    runs = []
    real = measured.measure_signature
    monkeypatch.setattr(measured, "measure_signature", lambda *a, **k: runs.append(1) or real(*a, **k))
    other_device = make()
    other_device.device_name = "NVIDIA A100-SXM4-80GB"
    other_device.estimate(SMALL_MM)
    other_torch = make()
    other_torch.torch_version = "2.99.0"
    other_torch.estimate(SMALL_MM)
    same = make()
    same.estimate(SMALL_MM)
    assert len(runs) == 2 and same.stats == {"from cache": 1}


def _write_rows(path: str, worker: int) -> None:
    cache = KernelTimeCache(Path(path))
    for i in range(40):
        cache.put("dev", "t", f"{worker}-{i}", "aten::mm.default", float(i))
    cache.close()


def test_concurrent_writers_share_one_cache(tmp_path):
    path = tmp_path / "shared.sqlite"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_write_rows, args=(str(path), w)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    cache = KernelTimeCache(path)
    assert all(cache.get("dev", "t", f"{w}-{i}") == float(i) for w in range(3) for i in range(40))


def test_random_inputs_have_the_signature_shapes_dtypes_and_strides():
    transposed = cuda((64, 32), "bfloat16", stride=(1, 64))
    expanded = cuda((16, 32), "float32", stride=(0, 1))  # a broadcast row
    sig = OpSignature("aten::mm", "default", (transposed, cuda((32, 8), "bfloat16")), (cuda((64, 8), "bfloat16"),))
    _op, args, _kw = build_args(sig, "cpu")
    a = args[0]
    assert (tuple(a.shape), a.stride(), a.dtype) == ((64, 32), (1, 64), torch.bfloat16)
    assert a.float().std() > 0  # random, not constant
    add = OpSignature("aten::add", "Tensor", (expanded, cuda((16, 32)), 1), (cuda((16, 32)),))
    _op, args, kw = build_args(add, "cpu")
    assert args[0].stride() == (0, 1) and kw == {"alpha": 1}


def test_index_inputs_stay_in_range():
    weight, ids = cuda((1000, 16)), cuda((4, 256), "int64")
    sig = OpSignature("aten::embedding", "default", (weight, ids, -1, False, False), (cuda((4, 256, 16)),))
    _op, args, _kw = build_args(sig, "cpu")
    assert 0 <= int(args[1].min()) and int(args[1].max()) < 1000 and int(args[1].max()) > 0


@pytest.mark.parametrize("sig, reason", [
    (OpSignature("aten::nonzero", "default", (cuda((128,)),), (cuda((7, 1), "int64"),),
                 frozenset({"dynamic_output_shape"})), "not measured: data-dependent op"),
    (OpSignature("aten::_assert_async", "msg", (cuda(()), "boom"), (), frozenset()),
     "not measured: an assertion on data"),
    (OpSignature("aten::mm", "default", (cuda((64, 32)), cuda((32, 8))), (cuda((64, 9)),)),
     "not measured: ran with output shapes"),
    (OpSignature("aten::mm", "default", (cuda((64, 32)), TensorMeta((32, 8), "float32", (8, 1), "cuda:1")),
                 (cuda((64, 8)),)), "not measured: spans several GPUs"),
])
def test_what_it_cannot_run_falls_back(make, estimator, sig, reason):
    est = make()
    e = est.estimate(sig)
    fallback = estimator.estimate(sig)
    if fallback.kind == NO_GPU_WORK or fallback.kernels == 0:
        assert e == fallback  # nothing to time
        return
    assert e.duration_ns == fallback.duration_ns
    assert e.estimator.startswith("analytical (") and reason in e.estimator, e.estimator


def test_an_op_that_fails_falls_back_to_the_next_estimator(h100, cache):
    """cuDNN attention has no CPU kernel: the calibrated estimator (the next one for an H100)
    times it, and the label says both why it was not measured and what timed it."""
    calibrated = choose_estimator("calibrated", h100, cuda_probe=lambda: None).estimator
    est = MeasuredEstimator(h100, calibrated, device="cpu", cache=cache)
    q = cuda((1, 2, 64, 32), "bfloat16")
    lse = cuda((1, 2, 64, 1), "float32")
    seed = cuda((), "int64")
    sig = OpSignature("aten::_scaled_dot_product_cudnn_attention", "default",
                      (q, q, q, None, False, "<float>", True, False, None),
                      (q, lse, None, None, None, None, seed, seed, None))
    e = est.estimate(sig)
    assert e.estimator.startswith("analytical (outside calibrated range; not measured: failed to run")
    assert est.stats == {"not measured (failed to run)": 1}


def test_collectives_are_left_to_the_network_model(make):
    t = cuda((1024,))
    sig = OpSignature("c10d::allreduce_", "default", ((t,), "'ProcessGroup'", "'ReduceOp'", None, False, -1),
                      (t, None))
    e = make().estimate(sig)
    assert e.kind == NO_GPU_WORK and e.estimator == "analytical"


def test_summary_says_the_times_come_from_another_device(tmp_path, monkeypatch):
    monkeypatch.setenv("PHANTORA_CACHE_DIR", str(tmp_path))
    choice = choose_estimator("measured", lookup_gpu("h100"), measure_device="cpu", cuda_probe=lambda: None)
    assert choice.estimator.name == "measured" and choice.measured_on.startswith("cpu")
    assert any("different device" in n for n in choice.notes)
    assert choice.metadata()["measured_on"] == choice.measured_on
    choice.estimator.estimate(add_signature(4096, "float32"))
    assert choice.after_run() == ["distinct ops: 1 measured"]
    assert (tmp_path / "kernel_times.sqlite").exists()


def test_the_env_variable_picks_the_device(tmp_path, monkeypatch):
    monkeypatch.setenv("PHANTORA_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PHANTORA_MEASURE_DEVICE", "cpu")
    choice = choose_estimator("measured", lookup_gpu("a100"), cuda_probe=lambda: None)
    assert choice.estimator.device == "cpu"
    # auto still wants a CUDA GPU before it picks the measured mode
    assert choose_estimator("auto", lookup_gpu("a100"), cuda_probe=lambda: None).estimator.name == "analytical"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
def test_on_a_real_gpu(h100, cache):
    """Queued back-to-back launches hide the host: a tiny kernel times in microseconds (the shared
    table's one-event-pair method reads ~13 us), and a large GEMM is compute-bound."""
    est = MeasuredEstimator(h100, AnalyticalEstimator(h100), device="cuda", cache=cache)
    tiny = est.estimate(add_signature(1, "float32"))
    assert tiny.estimator == "measured" and tiny.duration_ns < 8_000
    big = est.estimate(mm_signature(4096, 4096, 4096, "bfloat16"))
    tflops = big.flops / big.duration_ns * 1e-3
    assert 100 < tflops < 1000, tflops
    again = [est.estimate(mm_signature(4096, 4096, 4096 + 64 * i, "bfloat16")).duration_ns for i in range(3)]
    assert max(again) < 1.5 * min(again)  # neighbouring shapes time alike


def tiny_training_step() -> None:
    """Embedding, linear layers, layer norm, GELU, dropout, cross-entropy, AdamW: the ops of a
    training step, at sizes a CPU times in milliseconds."""
    import torch.nn as nn
    import torch.nn.functional as F

    emb, ln, fc, head = nn.Embedding(100, 32), nn.LayerNorm(32), nn.Linear(32, 64), nn.Linear(64, 100)
    params = [*emb.parameters(), *ln.parameters(), *fc.parameters(), *head.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-3, fused=True)
    ids = torch.randint(0, 100, (4, 16))
    h = F.dropout(F.gelu(fc(ln(emb(ids)))), 0.1)
    loss = F.cross_entropy(head(h).view(-1, 100), ids.view(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()


def test_a_training_step_runs_through(make):
    """Every op of a real step (captured on fake tensors, as the interposer sees them) is either
    timed or falls back with its reason; none stops the simulator."""
    from .workloads import capture

    est = make()
    sigs = capture(tiny_training_step)
    labels = [est.estimate(s).estimator for s in sigs if est.fallback.estimate(s).kernels]
    measured_ops = sum(1 for label in labels if label == "measured")
    assert measured_ops >= 0.8 * len(labels), [lab for lab in labels if lab != "measured"]
    assert all(label == "measured" or "not measured: " in label for label in labels), set(labels)
