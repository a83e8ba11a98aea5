"""Collect ground truth from a real CUDA GPU for phantora's models.

Run on a machine with a GPU:  python benchmarks/groundtruth/gpu_probe.py OUT_DIR
Writes JSON files into OUT_DIR; the ones checked into tests/data/groundtruth/ came from an
H100 80GB HBM3 (see each file's "device" entry). Parts:
  device.json       torch.cuda device properties, mem_get_info, versions
  allocator.json    caching-allocator replays: op sequences with memory_allocated/reserved after
                    each op (tests replay them through phantora's allocator model)
  sdpa_choice.json  which fused SDPA backend torch picks for a grid of inputs
  oom.json          the exact torch.OutOfMemoryError message for an over-sized allocation
  host_costs.json   host (CPU) time per call of common ops on tiny tensors, and the aten ops
                    each call dispatches
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

MiB = 1 << 20


def device_info() -> dict:
    p = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info()
    fields = {k: getattr(p, k) for k in dir(p) if not k.startswith("_") and not callable(getattr(p, k))}
    fields = {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in fields.items()}
    return {
        "name": torch.cuda.get_device_name(0),
        "capability": list(torch.cuda.get_device_capability(0)),
        "properties": fields,
        "mem_get_info_at_start": [free, total],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "is_bf16_supported": torch.cuda.is_bf16_supported(),
        "alloc_conf": str(torch._C._cuda_getAllocatorBackend()) if hasattr(torch._C, "_cuda_getAllocatorBackend") else None,
    }


def _snap() -> list[int]:
    return [torch.cuda.memory_allocated(), torch.cuda.memory_reserved(), torch.cuda.max_memory_allocated()]


def allocator_replays() -> dict:
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    replays = []

    # 1. Hand-picked sizes around every rounding boundary, then frees and reuse.
    sizes = [1, 100, 511, 512, 513, 4096, MiB - 1, MiB, MiB + 1, 2 * MiB, 5 * MiB, 10 * MiB - 1,
             10 * MiB, 10 * MiB + 1, 12 * MiB, 50 * MiB, 200 * MiB, 1024 * MiB + 3]
    ops, live = [], {}
    base = _snap()
    for i, n in enumerate(sizes):
        live[i] = torch.empty(n, dtype=torch.uint8, device="cuda")
        ops.append({"op": "alloc", "id": i, "bytes": n, "after": _snap()})
    for i in [3, 0, 8, 7, 15, 12, 16]:
        del live[i]
        ops.append({"op": "free", "id": i, "after": _snap()})
    for j, n in enumerate([256, 700 * 1024, 9 * MiB, 30 * MiB, 150 * MiB], start=100):
        live[j] = torch.empty(n, dtype=torch.uint8, device="cuda")
        ops.append({"op": "alloc", "id": j, "bytes": n, "after": _snap()})
    for i in sorted(live):
        del live[i]
        ops.append({"op": "free", "id": i, "after": _snap()})
    torch.cuda.empty_cache()
    ops.append({"op": "empty_cache", "after": _snap()})
    replays.append({"name": "boundaries", "before": base, "ops": ops})

    # 2. Seeded random mixes of allocations and frees, small and large.
    for seed, max_log2 in [(1, 20), (2, 28), (3, 30)]:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        rng = random.Random(seed)
        ops, live, next_id = [], {}, 0
        base = _snap()
        for _ in range(400):
            if live and rng.random() < 0.45:
                k = rng.choice(sorted(live))
                del live[k]
                ops.append({"op": "free", "id": k, "after": _snap()})
            else:
                n = int(2 ** rng.uniform(0, max_log2))
                live[next_id] = torch.empty(n, dtype=torch.uint8, device="cuda")
                ops.append({"op": "alloc", "id": next_id, "bytes": n, "after": _snap()})
                next_id += 1
        live.clear()
        ops.append({"op": "free_all", "after": _snap()})
        torch.cuda.empty_cache()
        ops.append({"op": "empty_cache", "after": _snap()})
        replays.append({"name": f"random_seed{seed}_max2^{max_log2}", "before": base, "ops": ops})

    # 3. What library workspaces add: memory after the first bf16 matmul and first SDPA.
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    before = _snap()
    b = a @ a
    torch.cuda.synchronize()
    after_mm = _snap()
    q = torch.randn(4, 8, 512, 64, device="cuda", dtype=torch.bfloat16)
    o = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    torch.cuda.synchronize()
    after_sdpa = _snap()
    del a, b, q, o
    return {"replays": replays, "workspace": {"before_mm": before, "after_first_mm": after_mm,
                                               "after_first_sdpa": after_sdpa}}


def _op_names_mode():
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpNames(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    return OpNames


def sdpa_choices() -> list[dict]:
    global _OpNames
    _OpNames = _op_names_mode()
    out = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for d in (32, 64, 80, 96, 128, 192, 256, 512):
            for mask in ("none", "bool", "float"):
                for causal in (False, True):
                    if causal and mask != "none":
                        continue
                    for dropout in (0.0, 0.1):
                        for gqa in (False, True):
                            for grad in (False, True):
                                B, H, S = 2, 8, 256
                                q = torch.randn(B, H, S, d, device="cuda", dtype=dtype, requires_grad=grad)
                                kvh = 2 if gqa else H
                                k = torch.randn(B, kvh, S, d, device="cuda", dtype=dtype, requires_grad=grad)
                                v = torch.randn(B, kvh, S, d, device="cuda", dtype=dtype, requires_grad=grad)
                                m = None
                                if mask == "bool":
                                    m = torch.ones(S, S, device="cuda", dtype=torch.bool).tril()
                                elif mask == "float":
                                    m = torch.zeros(S, S, device="cuda", dtype=dtype)
                                try:
                                    c = int(torch._fused_sdp_choice(q, k, v, m, dropout, causal, scale=None, enable_gqa=gqa))
                                except Exception as e:  # noqa: BLE001 - record what torch says
                                    c = f"error: {type(e).__name__}: {e}"[:200]
                                with _OpNames() as seen:
                                    try:
                                        F.scaled_dot_product_attention(q, k, v, attn_mask=m, dropout_p=dropout, is_causal=causal, enable_gqa=gqa)
                                    except Exception as e:  # noqa: BLE001
                                        seen.ops.append(f"error: {type(e).__name__}")
                                out.append({"dtype": str(dtype).removeprefix("torch."), "head_dim": d,
                                            "mask": mask, "causal": causal, "dropout": dropout,
                                            "gqa": gqa, "requires_grad": grad, "choice": c,
                                            "aten_ops": [o for o in seen.ops if "attention" in o or "error" in o or "bmm" in o]})
    return out


def oom_message() -> dict:
    try:
        torch.empty(400 * (1 << 30), dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as e:
        return {"type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__], "message": str(e)}
    return {"message": None}


def host_costs() -> list[dict]:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    x = torch.randn(8, 8, device="cuda")
    w = torch.randn(8, 8, device="cuda")
    bias = torch.randn(8, device="cuda")
    xb = torch.randn(2, 2, 8, 8, device="cuda", dtype=torch.bfloat16)
    params = [torch.randn(8, device="cuda", requires_grad=True) for _ in range(16)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt_fused = torch.optim.AdamW(params, lr=1e-3, fused=True)
    opt_foreach = torch.optim.AdamW(params, lr=1e-3, foreach=True)
    lin = torch.nn.Linear(8, 8).cuda()
    ln = torch.nn.LayerNorm(8).cuda()
    calls = {
        "add_": lambda: x.add_(1.0),
        "add": lambda: x + w,
        "mul_scalar": lambda: x * 2.0,
        "view": lambda: x.view(64),
        "t": lambda: x.t(),
        "empty": lambda: torch.empty(8, device="cuda"),
        "zeros": lambda: torch.zeros(8, device="cuda"),
        "mm": lambda: x @ w,
        "F.linear": lambda: F.linear(x, w, bias),
        "nn.Linear": lambda: lin(x),
        "nn.LayerNorm": lambda: ln(x),
        "gelu": lambda: F.gelu(x),
        "softmax": lambda: F.softmax(x, dim=-1),
        "sum": lambda: x.sum(),
        "cat": lambda: torch.cat([x, w]),
        "copy_": lambda: x.copy_(w),
        "sdpa": lambda: F.scaled_dot_product_attention(xb, xb, xb, is_causal=True),
        "foreach_add_16": lambda: torch._foreach_add_([p.grad for p in params], 1.0),
        "adamw_fused_16": lambda: opt_fused.step(),
        "adamw_foreach_16": lambda: opt_foreach.step(),
    }
    out = []
    for name, fn in calls.items():
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        n = 2000 if "adamw" not in name else 300
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        with Count() as c:
            fn()
        torch.cuda.synchronize()
        out.append({"call": name, "host_us": (t1 - t0) / n * 1e6, "aten_ops": c.ops})
    return out


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "groundtruth_out")
    out.mkdir(parents=True, exist_ok=True)
    dev = device_info()
    parts = {"device": lambda: dev, "allocator": allocator_replays, "sdpa_choice": sdpa_choices,
             "oom": oom_message, "host_costs": host_costs}
    only = sys.argv[2].split(",") if len(sys.argv) > 2 else list(parts)
    for name, fn in parts.items():
        if name not in only:
            continue
        t0 = time.time()
        data = fn()
        payload = {"device": dev["name"], "torch": dev["torch"], "data": data}
        (out / f"{name}.json").write_text(json.dumps(payload, indent=1))
        print(f"{name}: {time.time() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    main()
