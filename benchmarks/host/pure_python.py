"""What the counted host charges for pure-Python work against what it takes: hot loops, small calls,
generator expressions, Python `__instancecheck__`, dataclasses, and DTensor's sharding propagation.

    python benchmarks/host/pure_python.py            # here: time scaled to the reference host
    python benchmarks/host/pure_python.py --json F   # the rows, for a fit (fit_python_work.py)

The counted host's costs (phantora/cost/host.py PythonWork: 18.2 ns an instruction, 1.04 us a
Python frame) are fitted on framework code (host_probe's phases), where a frame comes with the C
work of torch calls around it. Code that loops over many small Python frames without torch calls
(pytree walks, DTensor's sharding propagation over a foreach op's hundreds of tensors) costs far
less per frame. This script shows by how much: each workload's counted time, at the reference
host's costs, against its CPU time here (untraced, the least of 5 runs) scaled to the reference
host by the fixed benchmark of cost/host_bench.py (161.8 ms on the lent H100 VM after CUDA's
initialisation, the row fit_python_work.py uses; on that VM itself the scale is ~1). The scaling
assumes pure Python runs at one relative speed on both machines; run it on the lent VM to get the
reference times directly.

Measured 2026-11-29 on the 2-core development machine (benchmark 49-51 ms here, so x3.2-3.3),
counted / scaled: loop 1.7-1.9, small calls 11.1-11.8, generator expression 3.4-3.6, Python
__instancecheck__ 4.2-4.7, dataclass with __setattr__ 3.7-3.8, DTensor's propagation of a clipping and
AdamW step over 48 DTensors on an 8 x 8 mesh 1.6-1.7. Fitting the costs to these rows and host_probe's
together (with a cost of their own for generator resumes, torch's C functions and other C functions)
left the probe's mean error at 19.6% (13.7% today) and these rows at -62% .. +27%: one cost per frame
cannot serve both, and the two sets conflict (host_probe's optimizer step charges 0.88 us to each
resume of AdamW's generator expressions over the parameters when fitted alone). docs/host-time.md has the figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from interpose.host import python_work  # noqa: E402
from phantora.cost.host_bench import python_bench_ms  # noqa: E402

BENCH_REFERENCE_MS = 161.769  # host_bench on the lent H100 VM after CUDA's initialisation (fit_python_work.py)
N = 200_000


class _Checked(type):
    def __instancecheck__(cls, obj: Any) -> bool:  # as torch's _custom_class_base does
        return type.__instancecheck__(cls, obj)


class _Placement(metaclass=_Checked):
    pass


class _Shard(_Placement):
    pass


_PLACEMENTS = (_Shard(), 1, 2.0)


@dataclasses.dataclass
class _Spec:
    placements: tuple
    index: int = 0

    def __setattr__(self, key: str, value: Any) -> None:  # as DTensorSpec does
        object.__setattr__(self, key, value)


def loop() -> None:
    acc = 0
    for i in range(N):
        acc += i * 2


def small_calls() -> None:
    def add(a: int, b: int) -> int:
        return a + b

    acc = 0
    for i in range(N):
        acc = add(acc, i)


def generator_expression() -> None:
    for _ in range(N):
        any(isinstance(p, int) for p in _PLACEMENTS)


def python_instancecheck() -> None:
    for _ in range(N):
        isinstance(_PLACEMENTS[0], _Placement)


def dataclass_init() -> None:
    for i in range(N):
        _Spec((1, 2), i)


def dtensor_sharding_propagation() -> Callable[[], None]:
    """A clipping step and a foreach AdamW step over 48 DTensors on an 8 x 8 mesh (a fake process
    group): the op schemas DTensor propagated, then propagated again uncached."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=64)
    mesh = init_device_mesh("cpu", (8, 8))
    params = [distribute_tensor(torch.randn(64, 32, 16), mesh, [Shard(0), Shard(1)]) for _ in range(24)]
    params += [distribute_tensor(torch.randn(64, 32), mesh, [Replicate(), Shard(0)]) for _ in range(24)]
    for p in params:
        p.grad = torch.ones_like(p)
    dispatcher = DTensor._op_dispatcher
    slow = dispatcher._propagate_op_sharding_dispatch_slow_path
    schemas = []

    def record(op_call: Any, args: Any, kwargs: Any, op_info: Any, try_cache: bool) -> Any:
        schemas.append(op_info.schema)
        return slow(op_call, args, kwargs, op_info, try_cache)

    dispatcher._propagate_op_sharding_dispatch_slow_path = record
    torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
    torch.optim.AdamW(params, lr=1e-3, foreach=True).step()
    dispatcher._propagate_op_sharding_dispatch_slow_path = slow
    propagator = dispatcher.sharding_propagator

    def propagate() -> None:
        for schema in schemas:
            propagator._propagate_tensor_meta_cached.cache_clear()
            propagator.propagate_op_sharding_non_cached(schema)

    return propagate


def measure(counter: Any, fn: Callable[[], Any]) -> dict[str, float]:
    """Counted once (the counter's trace function slows what it counts), timed untraced."""
    counter.resume()
    clock, counts = counter.now_ps(), counter.counts()
    fn()
    clock, counts = counter.now_ps() - clock, [b - a for a, b in zip(counts, counter.counts())]
    counter.pause()
    cpu = []
    for _ in range(5):
        t = time.thread_time_ns()
        fn()
        cpu.append(time.thread_time_ns() - t)
    return {"counted_ns": clock / 1e3, "cpu_ns": min(cpu), "instructions": counts[0], "calls": counts[1],
            "call_sites": counts[2]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args()
    counter = python_work.load()
    counter.exclude(())  # these workloads live in phantora's checkout, which never counts otherwise
    rows = {"host_bench": measure(counter, python_bench_ms)}
    for fn in (loop, small_calls, generator_expression, python_instancecheck, dataclass_init):
        rows[fn.__name__] = measure(counter, fn)
    propagate = dtensor_sharding_propagation()
    propagate()
    rows["dtensor_sharding_propagation"] = measure(counter, propagate)
    scale = BENCH_REFERENCE_MS * 1e6 / rows["host_bench"]["cpu_ns"]
    print(f"host_bench here: {rows['host_bench']['cpu_ns'] / 1e6:.1f} ms of CPU, scale to the reference host x{scale:.2f}")
    print(f"{'workload':30s} {'instructions':>12s} {'frames':>8s} {'counted ms':>11s} {'scaled ms':>10s} {'counted/scaled':>15s}")
    for name, r in rows.items():
        r["scaled_ns"] = r["cpu_ns"] * scale
        print(f"{name:30s} {r['instructions']:12d} {r['calls']:8d} {r['counted_ns'] / 1e6:11.1f} {r['scaled_ns'] / 1e6:10.1f} "
              f"{r['counted_ns'] / r['scaled_ns']:15.2f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
