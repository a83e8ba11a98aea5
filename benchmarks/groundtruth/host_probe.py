"""Host (CPU) time of eager training steps on a real GPU machine, per phase, with op counts.

    python benchmarks/groundtruth/host_probe.py OUT_DIR

Models run with tiny shapes so every kernel is shorter than its launch: the GPU never limits,
and wall time per phase is host time. For each workload and phase (no-grad forward, forward
with autograd recording, backward, optimizer step) it records the median wall time and what
the phase dispatched: aten ops (views counted apart), ops run by the autograd engine, and
nn.Module calls. phantora's host-cost model is fitted to these numbers.

Also dumps the caching-allocator trace of one step of the CNN example's model, to see the
allocations phantora does not model (e.g. cuDNN workspaces).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from cnn_train import ResNet  # noqa: E402
from gpt_train import GPT, GPTConfig  # noqa: E402


DEVICE = "cuda"  # benchmarks/host/count_probe.py runs the same workloads on "cpu" too


class Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = self.views = self.backward = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "prim":
            return func(*args, **(kwargs or {}))
        self.ops += 1
        if func.is_view:
            self.views += 1
        if torch._C._current_autograd_node() is not None:
            self.backward += 1
        return func(*args, **(kwargs or {}))


class ModuleCalls:
    def __init__(self) -> None:
        self.n = 0
        self.handle = nn.modules.module.register_module_forward_pre_hook(self._hook)

    def _hook(self, mod, args):
        self.n += 1


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def timed(fn, reps: int) -> float:
    for _ in range(5):
        fn()
    sync()
    samples = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e6


def counted(fn) -> dict:
    calls = ModuleCalls()
    with Count() as c:
        fn()
    sync()
    calls.handle.remove()
    return {"ops": c.ops, "views": c.views, "backward_ops": c.backward, "module_calls": calls.n}


def workload(name: str, model: nn.Module, make_batch, loss_fn, opt, scaler=None, autocast_dtype=None) -> dict:
    x, y = make_batch()

    def fwd_nograd():
        with torch.no_grad(), torch.autocast(DEVICE, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            loss_fn(model, x, y)

    state = {}

    def fwd():
        with torch.autocast(DEVICE, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            state["loss"] = loss_fn(model, x, y)

    def bwd():
        loss = state.pop("loss")
        (scaler.scale(loss) if scaler else loss).backward()

    def fwd_bwd():
        fwd()
        bwd()

    def step():
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        opt.zero_grad(set_to_none=False)

    def full():
        fwd_bwd()
        step()

    fwd_bwd()
    step()
    out = {"name": name}
    out["us"] = {
        "fwd_nograd": timed(fwd_nograd, 50),
        "fwd": timed(lambda: (fwd(), state.clear()), 50),
        "fwd_bwd": timed(fwd_bwd, 50),
        "step": timed(step, 50),
        "full": timed(full, 50),
    }
    out["counts"] = {"fwd_nograd": counted(fwd_nograd), "fwd": counted(lambda: (fwd(), state.clear())),
                     "fwd_bwd": counted(fwd_bwd), "step": counted(step)}
    return out


def gpt(layers: int, ckpt: bool) -> dict:
    cfg = GPTConfig(block_size=32, vocab_size=512, n_layer=layers, n_head=4, n_embd=64)
    model = GPT(cfg, activation_checkpointing=ckpt).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    return workload(f"gpt_L{layers}{'_ckpt' if ckpt else ''}", model,
                    lambda: (torch.randint(512, (2, 32), device=DEVICE),) * 2,
                    lambda m, x, y: m(x, y), opt, autocast_dtype=torch.bfloat16)


def cnn() -> dict:
    model = ResNet(10, widths=(8, 8, 8, 8)).to(DEVICE).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
    return workload("cnn_resnet18_tiny", model,
                    lambda: (torch.randn(2, 3, 8, 8, device=DEVICE).to(memory_format=torch.channels_last),
                             torch.randint(10, (2,), device=DEVICE)),
                    lambda m, x, y: F.cross_entropy(m(x), y), opt, scaler=torch.amp.GradScaler(DEVICE),
                    autocast_dtype=torch.float16)


def mlp(depth: int) -> dict:
    model = nn.Sequential(*[nn.Sequential(nn.Linear(32, 32), nn.ReLU()) for _ in range(depth)]).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    return workload(f"mlp_{depth}", model, lambda: (torch.randn(4, 32, device=DEVICE), None),
                    lambda m, x, y: m(x).square().mean(), opt)


def cnn_allocations() -> dict:
    model = ResNet(100).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
    scaler = torch.amp.GradScaler(DEVICE)
    x = torch.randn(64, 3, 64, 64, device=DEVICE).to(memory_format=torch.channels_last)
    y = torch.randint(100, (64,), device=DEVICE)

    def step():
        with torch.autocast(DEVICE, dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    step()
    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=200000, stacks="python")
    step()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = []
    for e in snap["device_traces"][0]:
        if e["action"] in ("alloc", "free_requested"):
            frames = [f"{f['filename'].split('/')[-1]}:{f['line']}:{f['name']}" for f in e.get("frames", [])[:4]]
            events.append([e["action"], e["size"], e.get("stream", 0), frames])
    return {"allocated_before_step": base, "peak_during_step": torch.cuda.max_memory_allocated(), "events": events}


WORKLOADS = {"mlp_4": lambda: mlp(4), "mlp_16": lambda: mlp(16), "gpt_L2": lambda: gpt(2, False),
             "gpt_L6": lambda: gpt(6, False), "gpt_L6_ckpt": lambda: gpt(6, True), "cnn_resnet18_tiny": cnn}


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "host_out")
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    results = []
    for make in WORKLOADS.values():
        t0 = time.time()
        r = make()
        results.append(r)
        print(f"{r['name']}: {time.time() - t0:.1f}s  {json.dumps(r['us'])}", flush=True)
    dev = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    (out / "host_probe.json").write_text(json.dumps({**dev, "data": results}, indent=1))
    (out / "cnn_allocations.json").write_text(json.dumps({**dev, "data": cnn_allocations()}))
    print("done", flush=True)


if __name__ == "__main__":
    main()
