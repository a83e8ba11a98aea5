"""The kernel sweep's cases, run on the local GPU: `phantora calibrate --grid sweep`.

    cases = sweep_cases("cuda")                      # SweepCase(key, build), in the sweep's order
    for line in run_sweep(cases, "cuda", out): ...   # writes the device row, then one line per case

Provenance: the case list and the method are those of `kernel_sweep.py`, the script that made
the H100 sweep (phantora/cost/data/h100_sxm_sweep.jsonl, copied from shared/calibration/, where
the script lives beside it). They are copied here, not read from there, so that a user with one
GPU of a new kind gets lines the per-family fit (sweep_fit.py) reads as it reads the H100's:

- every case runs its op forward, and for `_fwd_bwd` cases backward with a ones gradient; the
  sizes, dtypes, layouts and modules are the script's, case by case, in its order;
- 2 warm-up calls, then 3 calls under torch.profiler (CUDA activity) and a synchronize; each
  kernel's name cut to 120 characters, its device time summed per name and divided by 3 (mean us
  per call), the kernels sorted longest first, `total_us` their sum;
- a case that raises writes its key with `error` instead of `kernels` (the script's behaviour;
  the H100 file leaves such lines out: its bf16 layer_norm cases failed there).

The script's list has 152 cases, and phantora adds 16 after them (`extra_cases`: strided
elementwise kernels, misaligned GEMMs, non-causal attention; see STRIDED); the H100 file holds 132
of the script's, keyed identically: the
script's bf16 layer_norm cases failed on that run (nn.LayerNorm's fp32 weight with a bf16
input) and its ViT-sized cases (rows or M = 197 x 64 = 12608, bmm 197 x 197, SDPA at S = 197,
the 16 x 16 patch convolution) are not in the file. Both kinds are kept here: a user's run
covers the file's 132 and more, and its failures are written as lines with `error`.

Differences from the script, none of which changes what is timed: each case builds its own
tensors when it runs (the script shares inputs between neighbouring cases, which only matters for
`.grad` left by the warm-ups; each case's warm-ups leave the same), so memory is freed between
cases; a case's tensors are dropped (and the CUDA cache emptied) after it, so one out-of-memory
case does not fail the rest; the first line is a device row naming the GPU.

On the CPU (`--device cpu`, the script's SWEEP_DEVICE=cpu: batch-like sizes divided by 16, no
grouped_mm, no fused AdamW) there are no kernels: each line's `kernels` are then the profiler's
CPU events with their *self* CPU time per call, a check of the pipeline that the device row labels
as such (`kernels_are: "cpu self time per profiler event"`); those times describe this CPU, and
the fit must not read them as a GPU's.
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Iterator, TextIO

WARMUP = 2  # calls before profiling (the script's)
REPS = 3  # profiled calls; kernel times are means per call
NAME_CHARS = 120  # the script cuts kernel names to this length

CONVS = [(64, 64, 56, 3, 1, 1, 64), (64, 256, 28, 1, 1, 1, 64), (64, 128, 28, 3, 128, 1, 128),
         (64, 384, 14, 3, 384, 1, 384), (64, 96, 56, 3, 96, 2, 96), (32, 960, 7, 3, 960, 1, 960),
         (64, 32, 112, 3, 32, 1, 32), (64, 144, 56, 1, 1, 1, 24), (64, 576, 14, 1, 1, 1, 96),
         (128, 3, 224, 3, 1, 2, 32), (128, 3, 224, 16, 1, 16, 768)]  # (N, C, H, K, groups, stride, Cout)
BATCH_NORMS = [(64, 32, 112), (64, 96, 56), (64, 144, 56), (64, 384, 14), (64, 960, 7), (128, 256, 28)]
ROWS_COLS = [(8192, 768), (12608, 768), (16384, 1024), (8192, 4096), (4096, 8192)]
ROW_OPS = ("layer_norm", "rms_norm", "gelu", "silu", "dropout")
EMBEDDINGS = [(32000, 2048, 8192), (50304, 768, 8192), (128256, 4096, 8192)]  # (vocab, dim, tokens)
MOE = [(8192, 8, 2, 1024), (16384, 64, 8, 2048), (32768, 128, 8, 4096)]  # (tokens, experts, k, dim)
MMS = [(197 * 64, 768, 768), (12608, 3072, 768), (8192, 8, 1024), (1000, 4096, 4096), (8192, 14336, 4096),
       (4100, 4100, 4100), (64, 1000, 1280)]  # (M, N, K)
BMMS = [(64, 197, 64, 197), (128, 1024, 1024, 64), (32, 512, 512, 128)]  # (B, M, N, K)
SDPAS = [(64, 12, 197, 64, False), (1, 32, 8192, 128, True), (4, 16, 2048, 64, True), (8, 16, 1024, 128, False)]
OPTIMIZERS = [(148, 1 << 20), (30, 16 << 20)]  # (tensors, numel each)

# phantora's own cases after the script's 152 (2026-11-30), for what the lent H100 and H200 left
# open (docs/accuracy.md): torch's generic elementwise_kernel by dimensions and dtype (RoPE's
# strided halves against a broadcast table, 2-D and 3-D broadcasts, a transposing copy, a strided
# unary), GEMMs with one misaligned matrix (GPT-2's 50,257 and BERT's 30,522-token vocabularies:
# the logits alone, or the operand of a gradient), and non-causal attention at more shapes.
# kind: (shape of x, what runs)
STRIDED = {"rope_mul": (2, 2048, 32, 128), "rope_neg": (2, 2048, 32, 128), "bcast_mul_2d": (8192, 4096),
           "bcast_mul_3d": (4, 2048, 4096), "transpose_copy": (8, 16, 1024, 128)}
MISALIGNED_MMS = [("mm", 8192, 768, 50257), ("mm", 8192, 768, 30522), ("mm_nt", 8192, 50257, 768),
                  ("mm_nt", 8192, 30522, 768)]  # (op, M, N, K); mm_nt: a @ w.t() with w [N, K]
EXTRA_SDPAS = [(4, 16, 2048, 64, False), (2, 16, 4096, 128, False)]


@dataclass(frozen=True)
class SweepCase:
    key: dict  # the case's line without its measurements: op, sizes, dtype (the file's field order)
    build: Callable[[], Callable[[], Any]]  # makes the case's tensors; returns the call to profile


def _small(device: str) -> bool:
    return device == "cpu"


def _fwdbwd(mod, x) -> Callable[[], None]:  # type: ignore[no-untyped-def]
    import torch

    def f() -> None:
        y = mod(x)
        y.backward(torch.ones_like(y))
    return f


def _conv(dev: str, n: int, c: int, h: int, k: int, g: int, st: int, co: int, cl: bool) -> Callable[[], None]:
    import torch
    import torch.nn as nn

    bf = torch.bfloat16
    conv = nn.Conv2d(c, co, k, st, k // 2 if k < 16 else 0, groups=g, bias=False).to(dev, bf)
    x = torch.randn(n, c, h, h, device=dev, dtype=bf, requires_grad=True)
    if cl:
        conv = conv.to(memory_format=torch.channels_last)
        x = x.detach().to(memory_format=torch.channels_last).requires_grad_()
    return _fwdbwd(conv, x)


def _batch_norm_input(dev: str, n: int, c: int, h: int, cl: bool):  # type: ignore[no-untyped-def]
    import torch

    x = torch.randn(n, c, h, h, device=dev, dtype=torch.bfloat16)
    if cl:
        x = x.to(memory_format=torch.channels_last)
    return x.requires_grad_()


def _batch_norm(dev: str, n: int, c: int, h: int, cl: bool) -> Callable[[], None]:
    import torch.nn as nn

    return _fwdbwd(nn.BatchNorm2d(c).to(dev), _batch_norm_input(dev, n, c, h, cl))


def _relu6(dev: str, n: int, c: int, h: int, cl: bool) -> Callable[[], None]:
    import torch.nn as nn

    return _fwdbwd(nn.ReLU6(), _batch_norm_input(dev, n, c, h, cl))


def _row_op(dev: str, op: str, r: int, c: int, dn: str) -> Callable[[], None]:
    import torch
    import torch.nn as nn

    dt = torch.bfloat16 if dn == "bf16" else torch.float32
    x = torch.randn(r, c, device=dev, dtype=dt, requires_grad=True)
    mod = {"layer_norm": lambda: nn.LayerNorm(c).to(dev), "rms_norm": lambda: nn.RMSNorm(c).to(dev),
           "gelu": nn.GELU, "silu": nn.SiLU, "dropout": lambda: nn.Dropout(0.1)}[op]()
    return _fwdbwd(mod, x)


def _embedding(dev: str, v: int, d: int, t: int) -> Callable[[], None]:
    import torch
    import torch.nn as nn

    emb = nn.Embedding(v, d).to(dev)
    idx = torch.randint(0, v, (t,), device=dev)
    return lambda: emb(idx).sum().backward()


def _cross_entropy(dev: str, v: int, t: int) -> Callable[[], None]:
    import torch
    import torch.nn.functional as F

    lg = torch.randn(t, v, device=dev, requires_grad=True)
    tg = torch.randint(0, v, (t,), device=dev)
    return lambda: F.cross_entropy(lg, tg).backward()


def _moe(dev: str, what: str, t: int, e: int, k: int, d: int) -> Callable[[], Any]:
    """The script's MoE routing block: router logits, top-k selection, the routing ops on it."""
    import torch
    import torch.nn.functional as F

    bf = torch.bfloat16
    lg = torch.randn(t, e, device=dev)
    if what == "topk":
        return lambda: torch.topk(F.softmax(lg, -1), k, -1)
    if what == "grouped_mm":
        ffn = 2 * d
        w = torch.randn(e, d, ffn, device=dev, dtype=bf)
        xs = torch.randn(t * k, d, device=dev, dtype=bf)
        offs = torch.arange(1, e + 1, device=dev, dtype=torch.int32) * (t * k // e)
        return lambda: torch._grouped_mm(xs, w, offs=offs)
    sel = torch.topk(lg, k, -1).indices
    if what == "argsort":
        return lambda: torch.argsort(sel.flatten(), stable=True)
    if what == "bincount":
        return lambda: torch.bincount(sel.flatten(), minlength=e)
    if what == "histc":
        return lambda: torch.histc(sel.flatten().float(), bins=e, min=0, max=e - 1)
    if what == "one_hot":
        return lambda: F.one_hot(sel, e)
    if what == "nonzero_sync":
        m = sel[:, 0] == 0
        return lambda: torch.nonzero(m)
    order = torch.argsort(sel.flatten())
    if what == "index_select":
        x = torch.randn(t, d, device=dev, dtype=bf)
        return lambda: x.index_select(0, order // k)
    y = torch.randn(t * k, d, device=dev, dtype=bf)
    if what == "index_add":
        return lambda: torch.zeros(t, d, device=dev, dtype=bf).index_add_(0, order // k, y)
    if what == "scatter_add":
        return lambda: torch.zeros(t, d, device=dev, dtype=bf).scatter_add_(0, (order // k)[:, None].expand(-1, d), y)
    raise ValueError(what)


def _mm(dev: str, m: int, n: int, kk: int) -> Callable[[], Any]:
    import torch

    a = torch.randn(m, kk, device=dev, dtype=torch.bfloat16)
    b = torch.randn(kk, n, device=dev, dtype=torch.bfloat16)
    return lambda: a @ b


def _bmm(dev: str, bb: int, m: int, n: int, kk: int) -> Callable[[], Any]:
    import torch

    a = torch.randn(bb, m, kk, device=dev, dtype=torch.bfloat16)
    b = torch.randn(bb, kk, n, device=dev, dtype=torch.bfloat16)
    return lambda: torch.bmm(a, b)


def _mm_nt(dev: str, m: int, n: int, kk: int) -> Callable[[], Any]:
    import torch

    a = torch.randn(m, kk, device=dev, dtype=torch.bfloat16)
    w = torch.randn(n, kk, device=dev, dtype=torch.bfloat16)  # nn.Linear's weight: x @ w.t()
    return lambda: a @ w.t()


def _strided(dev: str, kind: str, shape: tuple[int, ...], dn: str) -> Callable[[], Any]:
    """One elementwise op through torch's generic (non-vectorized) kernel; see STRIDED."""
    import torch

    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dn]
    x = torch.randn(*shape, device=dev, dtype=dt)
    if kind in ("rope_mul", "rope_neg"):  # x[..., :half], as rotate_half and RoPE's halves take it
        half = x[..., : shape[-1] // 2]
        if kind == "rope_neg":
            return lambda: -half
        cos = torch.randn(1, shape[1], 1, shape[-1] // 2, device=dev, dtype=dt)
        return lambda: half * cos
    if kind == "bcast_mul_2d":
        w = torch.randn(shape[-1], device=dev, dtype=dt)
        return lambda: x * w
    if kind == "bcast_mul_3d":
        r = torch.randn(*shape[:-1], 1, device=dev, dtype=dt)
        return lambda: x * r
    if kind == "transpose_copy":
        return lambda: x.transpose(1, 2).contiguous()
    raise ValueError(f"unknown strided case {kind!r}")


def _sdpa(dev: str, b: int, h: int, s: int, d: int, causal: bool) -> Callable[[], None]:
    import torch
    import torch.nn.functional as F

    q, k_, v = (torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))

    def f() -> None:
        o = F.scaled_dot_product_attention(q, k_, v, is_causal=causal)
        o.backward(torch.ones_like(o))
    return f


def _optimizer(dev: str, name: str, nparams: int, numel: int) -> Callable[[], Any]:
    import torch

    ps = [torch.randn(numel, device=dev, requires_grad=True) for _ in range(nparams)]
    for p_ in ps:
        p_.grad = torch.randn_like(p_)
    opt = {"adamw_fused": lambda: torch.optim.AdamW(ps, fused=dev.startswith("cuda")),
           "adamw_foreach": lambda: torch.optim.AdamW(ps, foreach=True),
           "sgd_momentum": lambda: torch.optim.SGD(ps, lr=0.1, momentum=0.9)}[name]()
    return opt.step


def sweep_cases(device: str = "cuda") -> list[SweepCase]:
    """The sweep's cases in its order; nothing is allocated until a case's `build` runs.

    `device` "cpu" gives the script's CPU variant (batch-like sizes / 16, no grouped_mm)."""
    import torch

    S = (lambda v: max(1, v // 16)) if _small(device) else (lambda v: v)
    dev = device
    cases: list[SweepCase] = []

    def add(key: dict, fn: Callable[..., Callable[[], Any]], *args: Any) -> None:
        cases.append(SweepCase(key, partial(fn, dev, *args)))

    for (n, c, h, k, g, st, co) in CONVS:
        for cl in (False, True):
            add({"op": "conv2d_fwd_bwd", "N": S(n), "C": c, "H": h, "K": k, "groups": g, "stride": st, "Cout": co,
                 "channels_last": cl, "dtype": "bf16"}, _conv, S(n), c, h, k, g, st, co, cl)
    for (n, c, h) in BATCH_NORMS:
        for cl in (False, True):
            add({"op": "batch_norm_fwd_bwd", "N": S(n), "C": c, "H": h, "channels_last": cl, "dtype": "bf16"},
                _batch_norm, S(n), c, h, cl)
            add({"op": "relu6_fwd_bwd", "N": S(n), "C": c, "H": h, "channels_last": cl, "dtype": "bf16"},
                _relu6, S(n), c, h, cl)
    for (r, c) in ROWS_COLS:
        for dn in ("bf16", "fp32"):
            for op in ROW_OPS:
                add({"op": f"{op}_fwd_bwd", "rows": S(r), "cols": c, "dtype": dn}, _row_op, op, S(r), c, dn)
    for (v, d, t) in EMBEDDINGS:
        add({"op": "embedding_fwd_bwd", "vocab": v, "dim": d, "tokens": S(t), "dtype": "fp32"}, _embedding, v, d, S(t))
        add({"op": "cross_entropy_fwd_bwd", "vocab": v, "tokens": S(t), "dtype": "fp32"}, _cross_entropy, v, S(t))
    for (t, e, k, d) in MOE:
        t = S(t)
        moe = (t, e, k, d)
        add({"op": "topk", "tokens": t, "experts": e, "k": k}, _moe, "topk", *moe)
        add({"op": "argsort", "n": t * k}, _moe, "argsort", *moe)
        add({"op": "bincount", "n": t * k, "bins": e}, _moe, "bincount", *moe)
        add({"op": "histc", "n": t * k, "bins": e}, _moe, "histc", *moe)
        add({"op": "one_hot", "n": t * k, "classes": e}, _moe, "one_hot", *moe)
        add({"op": "nonzero_sync", "n": t}, _moe, "nonzero_sync", *moe)
        add({"op": "index_select", "rows": t * k, "dim": d, "dtype": "bf16"}, _moe, "index_select", *moe)
        add({"op": "index_add", "rows": t * k, "out_rows": t, "dim": d, "dtype": "bf16"}, _moe, "index_add", *moe)
        add({"op": "scatter_add", "rows": t * k, "dim": d, "dtype": "bf16"}, _moe, "scatter_add", *moe)
        if hasattr(torch, "_grouped_mm") and dev.startswith("cuda"):
            add({"op": "grouped_mm", "tokens": t * k, "experts": e, "K": d, "N": 2 * d, "dtype": "bf16",
                 "balanced": True}, _moe, "grouped_mm", *moe)
    for (m, n, kk) in MMS:
        add({"op": "mm", "M": S(m), "N": n, "K": kk, "dtype": "bf16"}, _mm, S(m), n, kk)
    for (bb, m, n, kk) in BMMS:
        add({"op": "bmm", "B": S(bb), "M": m, "N": n, "K": kk, "dtype": "bf16"}, _bmm, S(bb), m, n, kk)
    for (b, h, s, d, causal) in SDPAS:
        add({"op": "sdpa_fwd_bwd", "B": S(b), "H": h, "S": s, "D": d, "causal": causal, "dtype": "bf16"},
            _sdpa, S(b), h, s, d, causal)
    for nparams, numel in OPTIMIZERS:
        for name in ("adamw_fused", "adamw_foreach", "sgd_momentum"):
            add({"op": name, "tensors": nparams, "numel_each": numel}, _optimizer, name, nparams, numel)
    for key, fn, args in extra_cases(S):
        cases.append(SweepCase(key, partial(fn, dev, *args)))
    return cases


def extra_cases(S: Callable[[int], int] = lambda v: v) -> list[tuple[dict, Callable[..., Callable[[], Any]], tuple]]:
    """phantora's cases after the script's (STRIDED, MISALIGNED_MMS, EXTRA_SDPAS): (key, fn, args),
    `fn(dev, *args)` making the case's tensors; `S` scales batch-like sizes as sweep_cases does."""
    out: list[tuple[dict, Callable[..., Callable[[], Any]], tuple]] = []
    for kind, shape in STRIDED.items():
        shape = (S(shape[0]), *shape[1:])
        for dn in ("bf16", "fp32"):
            out.append(({"op": "strided_elementwise", "kind": kind, "shape": list(shape), "dtype": dn},
                        _strided, (kind, shape, dn)))
    for op, m, n, kk in MISALIGNED_MMS:
        out.append(({"op": op, "M": S(m), "N": n, "K": kk, "dtype": "bf16"}, _mm if op == "mm" else _mm_nt, (S(m), n, kk)))
    for (b, h, s_, d, causal) in EXTRA_SDPAS:
        out.append(({"op": "sdpa_fwd_bwd", "B": S(b), "H": h, "S": s_, "D": d, "causal": causal, "dtype": "bf16"},
                    _sdpa, (S(b), h, s_, d, causal)))
    return out


def select(cases: list[SweepCase], ops: list[str] | None) -> list[SweepCase]:
    """The cases whose op is one of `ops` (all of them for None); an unknown op name is an error."""
    if not ops:
        return cases
    known = {c.key["op"] for c in cases}
    unknown = [o for o in ops if o not in known]
    if unknown:
        raise ValueError(f"no sweep case has op {', '.join(unknown)}; the ops: {', '.join(sorted(known))}")
    return [c for c in cases if c.key["op"] in ops]


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def profile_case(fn: Callable[[], Any], device: str, warmup: int = WARMUP, reps: int = REPS) -> dict:
    """`kernels` (name, mean us per call; longest first) and `total_us` of `reps` calls after `warmup`."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.startswith("cuda")
    for _ in range(warmup):
        fn()
    _synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]) as p:
        for _ in range(reps):
            fn()
        _synchronize(device)
    agg: dict[str, float] = {}
    for e in p.events():
        if cuda:
            if e.device_type.name != "CUDA":
                continue
            us = e.device_time
        else:  # the CPU stand-in: self time, so that nested events are not counted twice
            if e.device_type.name != "CPU" or e.self_cpu_time_total <= 0:
                continue
            us = e.self_cpu_time_total
        name = e.name[:NAME_CHARS]
        agg[name] = agg.get(name, 0.0) + us / reps
    return {"kernels": [{"name": k, "us": round(v, 2)} for k, v in sorted(agg.items(), key=lambda kv: -kv[1])],
            "total_us": round(sum(agg.values()), 2)}


def device_row(device: str) -> dict:
    from phantora.cost.measured import local_device_info

    cuda = device.startswith("cuda")
    extra: dict[str, Any] = {}
    if cuda:  # what a GPUSpec for a new kind of GPU starts from (phantora/hardware.py)
        import torch

        props = torch.cuda.get_device_properties(torch.device(device))
        extra = {"capability": f"{props.major}.{props.minor}", "memory_bytes": props.total_memory,
                 "l2_bytes": getattr(props, "L2_cache_size", None)}
    return {"op": "device", **local_device_info(device), **extra, "grid": "sweep",
            "kernels_are": "cuda kernels (torch.profiler CUDA activity)" if cuda else
            "cpu self time per profiler event (a pipeline check: no GPU kernels, not for fitting)",
            "method": f"kernel_sweep.py's cases; {WARMUP} warm-up calls, then {REPS} calls under torch.profiler, "
                      f"each kernel's time summed per name (first {NAME_CHARS} characters) / {REPS}",
            "note": f"measured {_dt.date.today().isoformat()} by phantora calibrate --grid sweep"}


def run_case(case: SweepCase, device: str, warmup: int = WARMUP, reps: int = REPS) -> dict:
    """The case's line: its key plus kernels and total_us, or its key plus `error`."""
    line = dict(case.key)
    try:
        line.update(profile_case(case.build(), device, warmup, reps))
    except Exception as ex:  # the script's behaviour: the case's line says why, the sweep goes on
        line["error"] = f"{type(ex).__name__}: {str(ex)[:160]}"
    finally:
        if device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()  # the case's tensors are gone; give their memory back for the next
    return line


def run_sweep(cases: list[SweepCase], device: str, out: TextIO,
              progress: Callable[[int, int, dict], None] | None = None) -> Iterator[dict]:
    """Write the device row, then each case's line as it is measured (an interrupted run leaves valid lines).

    On the CPU torch runs on one thread, as the device row's name says (local_device_name): a thread
    pool on a shared machine turns a 20 us fill into milliseconds of waiting for its threads."""
    import torch

    out.write(json.dumps(device_row(device)) + "\n")
    out.flush()
    threads = torch.get_num_threads()
    if not device.startswith("cuda"):
        torch.set_num_threads(1)
    try:
        for i, case in enumerate(cases):
            line = run_case(case, device)
            out.write(json.dumps(line) + "\n")
            out.flush()
            if progress is not None:
                progress(i + 1, len(cases), line)
            yield line
    finally:
        torch.set_num_threads(threads)
