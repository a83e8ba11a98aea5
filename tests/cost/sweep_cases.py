"""The op signatures phantora sees for each case of the H100 kernel sweep
(phantora/cost/data/h100_sxm_sweep.jsonl, made by shared/calibration/kernel_sweep.py).

Each case reruns the sweep script's own PyTorch code for that line on fake tensors (the way
workloads.py captures signatures: a dispatch recorder inside FakeTensorMode, CPU tensors moved
to cuda:0), including its two warm-up calls, so the recorded call sees what the profiled one
did: the `torch.ones_like` gradient of `_fwd_bwd` cases and the accumulation of the leaf
gradients into `.grad` left by the warm-ups. Where the CPU build dispatches differently from
CUDA it is told to take the CUDA path: SDPA calls the cuDNN attention ops (what torch 2.11
picked on the H100), SGD uses foreach (CUDA's default), nonzero is built by hand (fake tensors
cannot size its output).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from phantora.cost.kernel_sweep import extra_cases
from phantora.cost.measurements import cudnn_attention_signatures
from phantora.cost.sweep_fit import SWEEP, load_rows
from phantora.ops import OpSignature

from .workloads import capture_call

BF = torch.bfloat16
_DT = {"bf16": torch.bfloat16, "fp32": torch.float32}
# Ops the recorder sees that launch nothing (phantora's estimator says so too); dropped to keep
# the listings short.
_SKIP_PREFIX = ("prim::", "profiler::")
_SKIP = {"aten::detach", "aten::view", "aten::expand", "aten::empty", "aten::t", "aten::transpose",
         "aten::lift_fresh", "aten::alias", "aten::_unsafe_view", "aten::as_strided", "aten::slice",
         "aten::select", "aten::unsqueeze", "aten::permute"}


def load_sweep(path: Path = SWEEP) -> list[dict]:
    """The sweep's measured cases (sweep_fit.load_rows, without device rows and failed cases)."""
    return [r for r in load_rows(path) if "kernels" in r]


def family(r: dict) -> str:
    """The family a sweep case belongs to in the per-family figures."""
    op = r["op"]
    if op == "conv2d_fwd_bwd":
        kind = ("stem" if r["C"] == 3 else "depthwise" if r["groups"] > 1 else
                "1x1" if r["K"] == 1 else "strided" if r["stride"] > 1 else "regular")
        return f"conv {kind} {'NHWC' if r['channels_last'] else 'NCHW'}"
    if op in ("batch_norm_fwd_bwd", "relu6_fwd_bwd"):
        return f"{op[:-8]} {'NHWC' if r['channels_last'] else 'NCHW'}"
    if op.endswith("_fwd_bwd"):
        return op[:-8]
    if op in ("topk", "argsort", "bincount", "histc", "one_hot", "nonzero_sync"):
        return "moe routing"
    if op in ("index_select", "index_add", "scatter_add"):
        return "gather/scatter"
    if op in ("adamw_fused", "adamw_foreach", "sgd_momentum"):
        return "optimizer"
    return op


def label(r: dict) -> str:
    keys = [k for k in r if k not in ("op", "kernels", "total_us", "dtype", "channels_last", "balanced")]
    return " ".join([r["op"]] + [f"{k}={r[k]}" for k in keys] + [r.get("dtype", "")] +
                    (["NHWC" if r["channels_last"] else "NCHW"] if "channels_last" in r else []))


class _CudaDropout(nn.Module):
    """nn.Dropout as CUDA runs it: the fused native_dropout (the CPU build decomposes it)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x):
        return torch.ops.aten.native_dropout(x, self.p, True)[0]


def _fwdbwd(mod, x):
    def f():
        y = mod(x)
        y.backward(torch.ones_like(y))
    return f


def _builder(r: dict) -> Callable[[str], Callable[[], object]] | None:
    op = r["op"]
    key = json.dumps({k: v for k, v in r.items() if k not in ("kernels", "total_us", "error")})
    extra = {json.dumps(k): (fn, args) for k, fn, args in extra_cases()}  # phantora's cases: their own code
    if key in extra:
        fn, args = extra[key]
        return lambda dev: fn(dev, *args)
    if op == "conv2d_fwd_bwd":
        def build(dev):
            c, k, g, st, co, h = r["C"], r["K"], r["groups"], r["stride"], r["Cout"], r["H"]
            conv = nn.Conv2d(c, co, k, st, k // 2 if k < 16 else 0, groups=g, bias=False, dtype=BF)
            x = torch.randn(r["N"], c, h, h, dtype=BF)
            if r["channels_last"]:
                conv.weight = nn.Parameter(conv.weight.detach().to(memory_format=torch.channels_last))
                x = x.to(memory_format=torch.channels_last)
            return _warm(_fwdbwd(conv, x.requires_grad_()))
        return build
    if op in ("batch_norm_fwd_bwd", "relu6_fwd_bwd"):
        def build(dev):
            x = torch.randn(r["N"], r["C"], r["H"], r["H"], dtype=BF)
            if r["channels_last"]:
                x = x.to(memory_format=torch.channels_last)
            mod = nn.BatchNorm2d(r["C"]) if op.startswith("batch") else nn.ReLU6()
            return _warm(_fwdbwd(mod, x.requires_grad_()))
        return build
    mods = {"layer_norm_fwd_bwd": lambda c: nn.LayerNorm(c), "rms_norm_fwd_bwd": lambda c: nn.RMSNorm(c),
            "gelu_fwd_bwd": lambda c: nn.GELU(), "silu_fwd_bwd": lambda c: nn.SiLU(),
            "dropout_fwd_bwd": lambda c: _CudaDropout(0.1)}
    if op in mods:
        def build(dev):
            x = torch.randn(r["rows"], r["cols"], dtype=_DT[r["dtype"]], requires_grad=True)
            return _warm(_fwdbwd(mods[op](r["cols"]), x))
        return build
    if op == "embedding_fwd_bwd":
        def build(dev):
            emb = nn.Embedding(r["vocab"], r["dim"])
            idx = torch.randint(0, r["vocab"], (r["tokens"],))
            return _warm(lambda: emb(idx).sum().backward())
        return build
    if op == "cross_entropy_fwd_bwd":
        def build(dev):
            lg = torch.randn(r["tokens"], r["vocab"], requires_grad=True)
            tg = torch.randint(0, r["vocab"], (r["tokens"],))
            return _warm(lambda: F.cross_entropy(lg, tg).backward())
        return build
    if op in ("topk", "argsort", "bincount", "histc", "one_hot", "index_select", "index_add", "scatter_add"):
        def build(dev):
            n = r.get("n") or r.get("rows") or r["tokens"]
            e = r.get("experts") or r.get("bins") or r.get("classes") or 8
            if op == "topk":
                lg = torch.randn(r["tokens"], r["experts"])
                return lambda: torch.topk(F.softmax(lg, -1), r["k"], -1)
            sel = torch.randint(0, e, (n,))
            if op == "argsort":
                return lambda: torch.argsort(sel, stable=True)
            if op == "histc":
                return lambda: torch.histc(sel.float(), bins=e, min=0, max=e - 1)
            if op == "one_hot":
                return lambda: F.one_hot(sel.view(-1, 1), e)  # sweep: sel is [tokens, k]
            d = r["dim"]
            rows = r["rows"]
            out_rows = r.get("out_rows", rows // 2)
            order = torch.randint(0, rows, (rows,))
            kk = max(1, rows // out_rows)
            if op == "index_select":
                x = torch.randn(rows // kk, d, dtype=BF)
                return lambda: x.index_select(0, order // kk)
            y = torch.randn(rows, d, dtype=BF)
            if op == "index_add":
                return lambda: torch.zeros(out_rows, d, dtype=BF).index_add_(0, order // kk, y)
            return lambda: torch.zeros(out_rows, d, dtype=BF).scatter_add_(0, (order // kk)[:, None].expand(-1, d), y)
        return build
    if op in ("mm", "bmm"):
        def build(dev):
            if op == "mm":
                a, b = torch.randn(r["M"], r["K"], dtype=BF), torch.randn(r["K"], r["N"], dtype=BF)
                return lambda: a @ b
            a = torch.randn(r["B"], r["M"], r["K"], dtype=BF)
            b = torch.randn(r["B"], r["K"], r["N"], dtype=BF)
            return lambda: torch.bmm(a, b)
        return build
    if op == "grouped_mm":
        def build(dev):
            t, e, d, n = r["tokens"], r["experts"], r["K"], r["N"]
            w = torch.randn(e, d, n, dtype=BF)
            xs = torch.randn(t, d, dtype=BF)
            offs = torch.arange(1, e + 1, dtype=torch.int32) * (t // e)
            return lambda: torch._grouped_mm(xs, w, offs=offs)
        return build
    if op in ("adamw_fused", "adamw_foreach", "sgd_momentum"):
        def build(dev):
            ps = [torch.randn(r["numel_each"], requires_grad=True) for _ in range(r["tensors"])]
            for p in ps:
                p.grad = torch.randn_like(p)
            if op == "adamw_fused":
                opt = torch.optim.AdamW(ps, fused=True)
            elif op == "adamw_foreach":
                opt = torch.optim.AdamW(ps, foreach=True)
            else:
                opt = torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=True)
            return _warm(opt.step)
        return build
    return None


def _warm(f):
    f()
    f()
    return f


def signatures(r: dict) -> list[OpSignature]:
    """The op signatures of one sweep case, in order (ops that launch nothing left out)."""
    op = r["op"]
    if op == "sdpa_fwd_bwd":
        b, h, s, d = r["B"], r["H"], r["S"], r["D"]
        fwd, bwd = cudnn_attention_signatures(b, h, s, d, "bfloat16", r["causal"], backward=True)
        q = fwd.outputs[0]
        # ones_like(o), then the three gradients accumulated into q/k/v.grad left by the warm-ups
        ones = OpSignature("aten::ones_like", "default", (q,), (q,), frozenset({"core"}))
        add = OpSignature("aten::add_", "Tensor", (q, q, 1), (q,), frozenset({"core", "pointwise", "inplace"}))
        return [fwd, ones, bwd, add, add, add]
    if op == "rms_norm_fwd_bwd" and r["dtype"] == "fp32":
        # CUDA runs fp32 RMSNorm fused (_fused_rms_norm); the CPU build decomposes it: by hand
        from phantora.ops import TensorMeta
        rows, cols = r["rows"], r["cols"]
        x = TensorMeta((rows, cols), "float32", (cols, 1), "cuda:0")
        w = TensorMeta((cols,), "float32", (1,), "cuda:0")
        rstd = TensorMeta((rows, 1), "float32", (1, 1), "cuda:0")
        core = frozenset({"core"})
        return [OpSignature("aten::_fused_rms_norm", "default", (x, [cols], w, "<float>"), (x, rstd), core),
                OpSignature("aten::ones_like", "default", (x,), (x,), core),
                OpSignature("aten::_fused_rms_norm_backward", "default", (x, x, [cols], rstd, w, [True, True]),
                            (x, w), core),
                OpSignature("aten::add_", "Tensor", (x, x, 1), (x,), frozenset({"core", "pointwise"})),
                OpSignature("aten::add_", "Tensor", (w, w, 1), (w,), frozenset({"core", "pointwise"}))]
    if op == "bincount":  # fake tensors cannot size its output: by hand
        from phantora.ops import TensorMeta
        sel = TensorMeta((r["n"],), "int64", (1,), "cuda:0")
        out = TensorMeta((r["bins"],), "int64", (1,), "cuda:0")
        return [OpSignature("aten::bincount", "default", (sel, None, r["bins"]), (out,),
                            frozenset({"core", "dynamic_output_shape"}))]
    if op == "nonzero_sync":
        from phantora.ops import TensorMeta
        n = r["n"]
        m = TensorMeta((n,), "bool", (1,), "cuda:0")
        out = TensorMeta((n // 2, 1), "int64", (1, 1), "cuda:0")  # the sweep's mask is ~1/8 true
        return [OpSignature("aten::nonzero", "default", (m,), (out,), frozenset({"core", "dynamic_output_shape"}))]
    build = _builder(r)
    if build is None:
        raise ValueError(f"no signature builder for sweep op {op!r}")
    sigs = capture_call(build)
    sigs = [s for s in sigs if s.name not in _SKIP and not s.name.startswith(_SKIP_PREFIX)]
    if op == "adamw_foreach":  # its step counters live on the host (not capturable): no GPU work
        sigs = [s for s in sigs if s.name != "aten::_local_scalar_dense" and
                not all(t.shape == () for t in s.tensors_in())]
    return sigs


def check_family(errs: list[float], fam: str, bounds: tuple[float, float]) -> None:
    """A family's median and largest |error| within its (median bound, max bound)."""
    assert errs, fam
    med, worst = statistics.median(abs(e) for e in errs), max(abs(e) for e in errs)
    assert med <= bounds[0] and worst <= bounds[1], (fam, round(med, 3), round(worst, 3))


def median_abs(errs_by_family: dict) -> float:
    """The median |error| over every case of every family."""
    return statistics.median(abs(e) for es in errs_by_family.values() for e in es)


def predict_ns(est, sigs) -> float:
    """An estimator's total kernel time for a case's signatures (no launch gaps: as total_us)."""
    return float(sum(est.estimate(s).duration_ns for s in sigs))


def loo_errors(est, rows, sigs_by_case):
    """Leave-one-out: each case predicted with the curves of its kernel classes refitted without
    it (phantora/cost/sweep_fit.py); cases no fitted class covers are predicted as they are."""
    from phantora.cost import fitted, sweep_fit

    out = []
    for i, (r, sigs) in enumerate(zip(rows, sigs_by_case)):
        classes = sweep_fit.classes_of_case(rows, i)
        refit = sweep_fit.fit_all(rows, exclude_case=i, only=classes) if classes else {}
        with fitted.using(refit):
            p = predict_ns(est, sigs) / 1e3
        out.append((r, p, p / r["total_us"] - 1))
    return out
