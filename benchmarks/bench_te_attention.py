"""Transformer Engine's attention backends under phantora: one te.TransformerLayer, Llama-3-8B
shaped (hidden 4096, FFN 14336, 32 heads, 8 KV groups, RMSNorm, SwiGLU, RoPE; sequence 4096,
batch 1, causal), forward + backward on a virtual H100, in BF16 and FP8 (delayed scaling), with
TE's default backend choice (cuDNN's fused attention on an H100) and with `NVTE_FUSED_ATTN=0`
(TE's switch to its unfused attention). Prints the steady step, the attention kernels' time per
step and the peak memory of each.

    python benchmarks/bench_te_attention.py [--python PY]

PY: an interpreter with the CUDA build of torch and phantora's `te` extra (default: the suite's
environment, ~/.cache/phantora/test-venv-te/bin/python, built by tests/conftest.py).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from phantora.trace.check import load_chrome_trace  # noqa: E402

STEPS = 3
PROGRAM = f'''
import sys, time, torch
import transformer_engine.pytorch as te
from transformer_engine.common.recipe import DelayedScaling, Format
from transformer_engine.pytorch.attention.rope import RotaryPositionEmbedding
fp8 = sys.argv[1] == "fp8"
seq, hidden = 4096, 4096
layer = te.TransformerLayer(hidden, 14336, 32, num_gqa_groups=8, normalization="RMSNorm", activation="swiglu",
                            self_attn_mask_type="causal", params_dtype=torch.bfloat16, hidden_dropout=0.0,
                            attention_dropout=0.0, bias=False)
rope = RotaryPositionEmbedding(hidden // 32)(seq).cuda()
x = torch.randn(seq, 1, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
for step in range({STEPS}):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with te.autocast(enabled=fp8, recipe=DelayedScaling(fp8_format=Format.HYBRID)):
        y = layer(x, rotary_pos_emb=rope)
    y.sum().backward()
    torch.cuda.synchronize()
    print(f"step {{step}}: {{(time.perf_counter() - t0) * 1e3:.2f}} ms", flush=True)
print(f"peak {{torch.cuda.max_memory_allocated() / 2**20:.0f}} MiB")
'''
ATTENTION_OPS = ("nvte::fused_attn", "nvte::softmax", "aten::bmm", "aten::baddbmm")


def run(python: str, precision: str, fused: bool, work: Path) -> dict[str, float]:
    program = work / "te_layer.py"
    program.write_text(PROGRAM)
    trace = work / f"{precision}_{'fused' if fused else 'unfused'}.json"
    env = dict(os.environ, NVTE_FUSED_ATTN="1" if fused else "0")
    proc = subprocess.run([sys.executable, "-m", "phantora.cli", "trace", "--quiet", "-o", str(trace), "--",
                           python, str(program), precision], cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{precision} fused={fused}: exit {proc.returncode}\n{proc.stderr[-4000:]}")
    steps = [float(m) for m in re.findall(r"step \d+: ([\d.]+) ms", proc.stdout)]
    peak = float(re.search(r"peak (\d+) MiB", proc.stdout).group(1))
    kernels = [e for e in load_chrome_trace(trace)["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
    attention_us = sum(e["dur"] for e in kernels if e["args"].get("op", "").startswith(ATTENTION_OPS))
    return {"step": steps[-1], "attention": attention_us / 1e3 / STEPS, "peak": peak}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=str(Path.home() / ".cache/phantora/test-venv-te/bin/python"))
    args = ap.parse_args()
    print("| precision | attention backend | step, ms | attention kernels, ms per step | peak MiB |")
    print("|---|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for precision in ("bf16", "fp8"):
            for fused in (True, False):
                r = run(args.python, precision, fused, Path(tmp))
                backend = "TE's choice (cuDNN fused)" if fused else "unfused (NVTE_FUSED_ATTN=0)"
                print(f"| {precision.upper()} | {backend} | {r['step']:.2f} | {r['attention']:.2f} | {r['peak']:.0f} |",
                      flush=True)


if __name__ == "__main__":
    main()
