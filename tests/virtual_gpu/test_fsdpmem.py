"""FSDP2's memory: a step's peak matches a count by hand of what must be alive at it (issue 18).

Two mechanisms made phantora count memory a real GPU does not hold:
  * a DTensor (FSDP2's sharded parameters, gradients and AdamW states) was accounted as memory
    of its own size on top of its local tensor;
  * UntypedStorage.resize_, with which FSDP2 frees (resize_(0)) and reallocates the unsharded
    bf16 parameters of a block, is no aten op and was never seen; nor was a storage an op
    resized (an `out=` tensor of 0 elements).

The count for tests/e2e/scripts/fsdp2_llama_memory.py (L layers, dim D, ffn F, H heads, KV
heads Hkv, vocab V, T = batch x seq tokens, W ranks, P parameters, P_block per block):
  sharded fp32 parameters          4 P / W
  AdamW exp_avg and exp_avg_sq     8 P / W
  cuBLAS workspace                 32 MiB (first GEMM on the compute stream)
  root unsharded bf16 parameters   2 (2 V D + D)   (the root is not resharded after forward)
  prefetched last block            2 P_block        (the root's pre-backward all-gathers it;
                                                     with W = 1 the copy waits for its backward)
  activations saved per layer, in units U = 2 T D bytes (bf16 of one T x D tensor):
      attention RMSNorm   4 U  (x.float() 2 U, normalized bf16 1 U, times weight 1 U);
                          2 U with --norm torch (nn.RMSNorm: _fused_rms_norm saves its bf16
                          input, and its output is saved by the projections)
      q, k, v, SDPA out   2 U + 2 U Hkv / H   (flash attention saves q, k, v, out; logsumexp small)
      FFN RMSNorm         4 U (2 U)
      SwiGLU              4 U F / D (w1 out, silu out, w3 out, their product)
  final RMSNorm                    4 U (2 U)
  loss: log_softmax output fp32    4 T V, and at its backward two more fp32 T x V buffers
        (nll_loss_backward's gradient and log_softmax_backward's), 8 T V
The peak is the log_softmax backward. Small tensors (norm weights, logsumexp, token ids,
scalars) and the allocator's rounding are below 0.5% here; the sizes are chosen so that the
large blocks need no rounding.

For the issue's program (8 layers, D 2048, 16 heads, F 5632, V 32000, 2 x 2048 tokens, W 1)
this is 11.53e9 bytes; phantora now reports 11,530,917,376 (it reported 14.52e9 before). The
real H200 figure for the hidden program of the issue is 10.99e9. With `--norm torch`
(torch.nn.RMSNorm) phantora reported 14,806,873,088 before the fix, the issue's 14.81e9 to the
byte, so the hidden program most likely uses nn.RMSNorm; after the fix it reports 10.96e9 on
the CUDA build of torch (-0.3%), where rms_norm takes the fused path a GPU takes
(_fused_rms_norm saves the bf16 input and rstd); the CPU build, whose _fused_rms_norm has no
CUDA kernel and so was decomposed under autograd (5 U saved per norm instead of 1 U), gave
11.82e9 until interpose/device/fake.py registered a CUDA kernel for it; now both builds give 10.96e9.
A Llama-3-8B shape on 8 ranks (32 layers, D 4096, 32 / 8 heads, F 14336, V 128256, 1 x 8192
tokens): 80.11e9 by this count, phantora 80.14e9 (182.4e9 before); too slow for a test here.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.virtual_gpu.harness import BUILDS, ROOT, assert_ran, run_traced

LLAMA = ROOT / "tests" / "e2e" / "scripts" / "fsdp2_llama_memory.py"
MiB = 1 << 20


@dataclass(frozen=True)
class Llama:
    layers: int
    dim: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    batch: int
    seq: int
    norm: str = "manual"

    def args(self) -> list[str]:
        return ["--layers", str(self.layers), "--dim", str(self.dim), "--heads", str(self.heads),
                "--kv-heads", str(self.kv_heads), "--ffn", str(self.ffn), "--vocab", str(self.vocab),
                "--batch", str(self.batch), "--seq", str(self.seq), "--steps", "2", "--norm", self.norm]


def hand_count(c: Llama, world: int) -> int:
    """The module docstring's count of the bytes alive at the peak."""
    kv = c.dim * c.kv_heads // c.heads
    p_block = 2 * c.dim * c.dim + 2 * c.dim * kv + 3 * c.dim * c.ffn + 2 * c.dim
    p_root = 2 * c.vocab * c.dim + c.dim
    p = c.layers * p_block + p_root
    t = c.batch * c.seq
    u = 2 * t * c.dim
    norm = 4 * u if c.norm == "manual" else 2 * u
    per_layer = norm + (2 * u + 2 * u * c.kv_heads // c.heads) + norm + 4 * u * c.ffn // c.dim
    prefetched = 2 * p_block if world > 1 else 0
    return (12 * p // world + 32 * MiB + 2 * p_root + prefetched
            + c.layers * per_layer + norm + 4 * t * c.vocab + 8 * t * c.vocab)


def peak_printed(stdout: str) -> int:
    found = re.findall(r"peak memory allocated: (\d+)", stdout)  # not anchored: ranks share the pipe
    assert found, stdout[-3000:]
    return int(found[-1])


@BUILDS
def test_fsdp_storage_and_dtensor_memory(tmp_path: Path, user_python: str) -> None:
    proc, _ = run_traced(tmp_path, user_python, "fsdpmem_storage.py", options=("--nproc-per-node", "1"))
    assert_ran(proc, "resize", "out_resize", "dtensor", "fully_shard", "fsdp_step")


@BUILDS
def test_rms_norm_runs_the_fused_op_as_on_a_gpu(tmp_path: Path, user_python: str) -> None:
    proc, _ = run_traced(tmp_path, user_python, "fsdpmem_rmsnorm.py")
    assert_ran(proc, "fused_rms_norm", "backward")


SMALL = Llama(layers=2, dim=1024, heads=8, kv_heads=8, ffn=2048, vocab=8192, batch=1, seq=1024)


@BUILDS
def test_fsdp2_llama_two_ranks_peak_matches_hand_count(tmp_path: Path, user_python: str) -> None:
    proc, _ = run_traced(tmp_path, user_python, LLAMA, *SMALL.args(), options=("--nproc-per-node", "2"))
    assert_ran(proc)
    expected = hand_count(SMALL, world=2)  # 507.5e6 bytes
    assert abs(peak_printed(proc.stdout) - expected) <= 0.005 * expected, (peak_printed(proc.stdout), expected)


ISSUE = Llama(layers=8, dim=2048, heads=16, kv_heads=16, ffn=5632, vocab=32000, batch=2, seq=2048)


def test_fsdp2_llama_054b_single_rank_peak_matches_hand_count(tmp_path: Path) -> None:
    proc, _ = run_traced(tmp_path, sys.executable, LLAMA, *ISSUE.args(),
                         options=("--nproc-per-node", "1", "--gpu", "h200"))
    assert_ran(proc)
    expected = hand_count(ISSUE, world=1)
    assert abs(peak_printed(proc.stdout) - expected) <= 0.005 * expected, (peak_printed(proc.stdout), expected)


REAL_H200_PEAK = 10.99e9  # issue 18: the hidden FSDP2 program measured on a real H200


@BUILDS
def test_fsdp2_llama_054b_with_nn_rmsnorm_is_within_1pct_of_the_real_h200(tmp_path: Path, user_python: str) -> None:
    """The issue's program as far as it is described, with torch.nn.RMSNorm (which reproduced
    the issue's pre-fix 14.81e9 to the byte): against the hand count and the real H200."""
    config = Llama(layers=8, dim=2048, heads=16, kv_heads=16, ffn=5632, vocab=32000, batch=2, seq=2048,
                   norm="torch")
    proc, _ = run_traced(tmp_path, user_python, LLAMA, *config.args(),
                         options=("--nproc-per-node", "1", "--gpu", "h200"))
    assert_ran(proc)
    peak = peak_printed(proc.stdout)
    expected = hand_count(config, world=1)  # 10.96e9
    assert abs(peak - expected) <= 0.005 * expected, (peak, expected)
    assert abs(peak - REAL_H200_PEAK) <= 0.01 * REAL_H200_PEAK, (peak, REAL_H200_PEAK)
