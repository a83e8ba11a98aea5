"""Benchmark driver: run GPT training steps and report REAL wall time per step.

    python benchmarks/_gpt_steps.py --fake-only      # shim + FakeTensorMode alone, no simulator
    python benchmarks/_gpt_steps.py --fake-only phantora   # the same with phantora's faster mode
    phantora trace -o x.json -- python benchmarks/_gpt_steps.py   # the whole pipeline
Prints one JSON line: {"mode", "steps", "wall_s_per_step", "cpu_s_per_step", "simulated_s_per_step",
"ops_per_step"}. --fake-only runs FakeTensorMode's own per-op work (its dispatch cache's key and
rebuilt outputs as torch does them) with the fixes phantora's mode needs to run the program;
`--fake-only phantora` uses phantora's mode as it is (interpose/device/fake.py PER_OP_OVERRIDES).
cpu is this process's CPU time (time.process_time, which phantora leaves real), so it leaves out
the simulator process, which shares the machine's cores with it.

Real time is read with datetime.now(): under phantora every time.* clock reads the rank's
simulated host clock, including copies bound before torch was imported (`from time import
perf_counter`, module attributes: interpose/host/clock.py re-points them), while datetime.now()
reads the system clock in C and stays real (docs/virtual-gpu.md, "Clocks and threads"). A program
under phantora that wants its own wall time can do the same. time.perf_counter gives the simulated
step for comparison (the same as the wall step under --fake-only).
"""
import argparse
import json
import os
import sys
import time
from datetime import datetime


def real_s() -> float:
    """Wall-clock seconds that phantora does not virtualize (see the module docstring)."""
    return datetime.now().timestamp()


ap = argparse.ArgumentParser()
ap.add_argument("--fake-only", nargs="?", const="stock", choices=["stock", "phantora"])
ap.add_argument("--warmup", type=int, default=2)
ap.add_argument("--steps", type=int, default=5)
args = ap.parse_args()

if args.fake_only:
    import ctypes

    from interpose.device.shim_build import shim_path

    ctypes.CDLL(str(shim_path()), mode=ctypes.RTLD_GLOBAL)
    import torch

    from torch._subclasses.fake_tensor import FakeTensorMode

    from interpose.device.fake import PER_OP_OVERRIDES, install_fake_fixes, make_fake_mode

    install_fake_fixes()
    torch.cuda.is_available = lambda: True  # autocast("cuda") checks these two
    torch.cuda.is_bf16_supported = lambda including_emulation=True: True
    torch.cuda.amp.common.amp_definitely_not_available = lambda: False
    mode = make_fake_mode()
    if args.fake_only == "stock":
        for name in PER_OP_OVERRIDES:
            setattr(mode, name, getattr(FakeTensorMode, name).__get__(mode))
    mode.__enter__()
else:
    import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from gpt_train import GPT, GPTConfig  # noqa: E402

cfg = GPTConfig()
model = GPT(cfg).to("cuda")
opt = torch.optim.AdamW(model.parameters(), lr=6e-4, fused=True)


def step() -> None:
    x = torch.randint(cfg.vocab_size, (8, 1024), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x, x)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


for _ in range(args.warmup):
    step()
ops0 = None
if not args.fake_only:
    from interpose import runtime

    ops0 = runtime.get().observer.ops_seen
t0, cpu0, sim0 = real_s(), time.process_time(), time.perf_counter()
for _ in range(args.steps):
    step()
if not args.fake_only:
    from phantora import protocol

    runtime.get().client.call(protocol.C_NOW)  # waits until the simulator has processed every op
wall = (real_s() - t0) / args.steps
cpu = (time.process_time() - cpu0) / args.steps
simulated = (time.perf_counter() - sim0) / args.steps
ops = None if ops0 is None else (runtime.get().observer.ops_seen - ops0) / args.steps
print(json.dumps({"mode": f"fake-only ({args.fake_only})" if args.fake_only else "phantora", "steps": args.steps,
                  "wall_s_per_step": wall, "cpu_s_per_step": cpu, "simulated_s_per_step": simulated, "ops_per_step": ops}))
