"""Matrix products: mm, addmm, bmm, baddbmm, addmv, mv, dot, _scaled_mm, _addmm_activation, ...

Time model (cuBLAS-like): the output is cut into tiles, one thread block per tile, run in waves
of one tile per SM. For each candidate tile shape (and split-K factor when there are too few
tiles to fill the GPU) the time is

    waves * tile_m * tile_n * 2 * (K / split + K_OVERHEAD) / (per-SM rate * tile efficiency)

and the fastest candidate wins, as cuBLAS's heuristics pick one. This captures
- wave quantization: 133 tiles on 132 SMs take two waves on Ampere. Hopper and later cuBLAS
  kernels are persistent with stream-K load balancing: the last partial wave is spread over all
  SMs for a small fix-up cost (H100 profile: 1537x2816x4096 bf16 takes 4.7% longer than
  1536x2816x4096, whose 132 tiles of 128x256 exactly fill the GPU);
- small K: each tile pays a fixed prologue/epilogue worth K_OVERHEAD steps of its main loop;
- skinny shapes: few tiles leave SMs idle unless split-K or smaller tiles help, and the
  memory roofline (reading A and B once) takes over for matrix-vector-like shapes.
The per-SM rate is the dtype's dense peak times GPUSpec.gemm_efficiency (fp32 is true FP32 on
CUDA cores unless TF32 is allowed).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from phantora.cost.roofline import (
    CostContext,
    Kernel,
    OpCost,
    ceil_div,
    footprint_bytes,
    matmul_compute_type,
    memory_ns,
    peak_flops,
    prod,
    single,
    streaming_kernel,
    uses_tensor_cores,
)
from phantora.hardware import GPUSpec
from phantora.ops import OpSignature, TensorMeta, dtype_bytes


@dataclass(frozen=True, slots=True)
class Tile:
    m: int
    n: int
    efficiency: float  # main-loop rate relative to the largest tile (less operand reuse)


# Thread-block tiles cuBLAS/CUTLASS pick from. Smaller tiles reuse each loaded operand less,
# so they run their main loop slower; they win only when they fix quantization.
TENSOR_CORE_TILES = (
    Tile(128, 256, 1.0), Tile(256, 128, 1.0), Tile(128, 128, 0.92),
    Tile(64, 128, 0.75), Tile(128, 64, 0.75), Tile(64, 64, 0.55),
)
SIMT_TILES = (Tile(128, 128, 1.0), Tile(128, 64, 0.92), Tile(64, 64, 0.8), Tile(32, 32, 0.45))

# Prologue (pipeline fill) plus epilogue (C tile store) of one tile, in K steps of its main loop.
# Tensor cores: fitted to H100 bf16 8192x8192xK (profiled 67 us at K=256, 510 vs ~730 TFLOP/s).
K_OVERHEAD = {True: 128, False: 64}  # keyed by uses_tensor_cores
# Stream-K (compute capability 9.0+): fix-up cost of a partial last wave, in waves.
STREAM_K_FROM_MAJOR = 9
STREAM_K_FIXUP_WAVES = 0.05
SPLIT_K_FACTORS = (2, 3, 4, 6, 8, 12, 16)
# GEMMs stream their operands through shared memory in tiles, not as one linear sweep: the
# memory roofline of skinny GEMMs sits a little under a plain copy's (H100 profile:
# 256x8192x8192 bf16 in 50.7 us, 2.8 TB/s).
OPERAND_STREAMING_EFFICIENCY = 0.93
MIN_K_PER_SPLIT = 256

# cuBLAS's Hopper kernels load their operands with TMA, which needs every matrix 16-byte aligned:
# each leading dimension (and a batched operand's batch stride) a multiple of 16 bytes. When one
# is not, cuBLAS falls back to CUTLASS's sm80 tensor-core kernels with narrower loads (named
# ..._align2, ..._align1 by the elements a load moves), not persistent, far slower. The sweeps'
# bf16 4100x4100x4100 (8,200-byte rows) runs cutlass_80_tensorop_bf16_s16816gemm_bf16_128x256_64x3_nn_align2
# in 694 us on the H100 and 668 us on the H200 (shared/calibration/h100_sxm_sweep.jsonl,
# cost/data/h200_sxm_sweep.jsonl): the tile model below gives 0.27 of the dense peak for it on
# both (the same SMs and clocks). By the alignment in bytes the loads can use: 8-byte rows got the
# 4-byte (align2) kernel there, so 8 counts as 4; 2-byte alignment (an odd dimension of a 16-bit
# type: GPT-2's 50,257-token vocabulary) moves half as much per load and is taken at half the rate,
# an assumption no measurement here pins (the H200 sweep's one align1 case, bmm 64x197x64x197, is
# too small to: its time is mostly latency).
ALIGNED_BYTES = 16
MISALIGNED_EFFICIENCY = {8: 0.27, 4: 0.27, 2: 0.135, 1: 0.135}
MISALIGNED_TYPES = ("bf16", "fp16", "tf32")  # FP8 GEMMs refuse misaligned operands; SIMT loads scalars anyway


def gemm_alignment(*matrices: TensorMeta | None) -> int:
    """The byte alignment (1..16) the operands' leading dimensions and batch strides share; a
    matrix with a dimension of 1 or no unit stride (torch copies it first) does not count. Only
    the two multiplied operands are passed: they are what the main loop loads. Whether an output
    alone misaligned (a GEMM into GPT-2's [tokens, 50,257] logits) slows the kernel, no
    measurement here tells (both cases above have a misaligned operand); it is taken as aligned."""
    align = ALIGNED_BYTES
    for t in matrices:
        if t is None or len(t.shape) < 2 or min(t.shape[-2:]) <= 1:
            continue
        if t.stride[-1] == 1:
            strides = [t.stride[-2]]
        elif t.stride[-2] == 1:
            strides = [t.stride[-1]]
        else:
            continue
        if len(t.shape) > 2 and prod(t.shape[:-2]) > 1:
            strides += [st for size, st in zip(t.shape[:-2], t.stride[:-2]) if size > 1]
        for st in strides:
            nbytes = st * t.itemsize
            if nbytes:
                align = min(align, nbytes & -nbytes)
    return align


@dataclass(frozen=True, slots=True)
class GemmShape:
    m: int
    n: int
    k: int
    batch: int = 1

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k


# How cuBLAS's and CUTLASS's kernel names spell each tensor-core compute type
KERNEL_TYPE_TAGS = {"bf16": "bf16", "fp16": "f16", "tf32": "tf32", "fp8": "e4m3", "int8": "i8"}
# FP8 operands by format: FP8 recipes mix them (HYBRID: E4M3 activations and weights, E5M2 gradients)
FP8_FORMAT_TAGS = {"float8_e4m3fn": "e4m3", "float8_e4m3fnuz": "e4m3", "float8_e5m2": "e5m2", "float8_e5m2fnuz": "e5m2"}


def gemm_kernel_name(gpu: GPUSpec, compute_type: str, dtype_out: str,
                     operand_dtypes: tuple[str, str] | None = None) -> str:
    """A cuBLAS-like kernel name, e.g. sm90_xmma_gemm_bf16bf16_bf16f32, sm90_xmma_gemm_e4m3e5m2_bf16f32
    for an FP8 GEMM of an E4M3 and an E5M2 operand (deterministic)."""
    arch = f"sm{gpu.capability[0]}{gpu.capability[1]}"
    if compute_type == "fp64":
        return f"{arch}_dgemm"
    if not uses_tensor_cores(compute_type):
        return f"{arch}_sgemm_f32"
    t = KERNEL_TYPE_TAGS[compute_type]
    ta, tb = t, t
    if compute_type == "fp8" and operand_dtypes is not None:
        ta, tb = (FP8_FORMAT_TAGS.get(d, t) for d in operand_dtypes)
    out = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}.get(dtype_out, t)
    acc = "s32" if compute_type == "int8" else "f32"
    return f"{arch}_xmma_gemm_{ta}{tb}_{out}{acc}"


def other_gemm_gpu(gpu: GPUSpec) -> GPUSpec:
    """`gpu` as the GEMM model sees it for kernels that are not cuBLAS's (cuDNN's implicit-GEMM
    convolutions, grouped GEMMs): its gemm_efficiency replaced by GPUSpec.other_gemm_efficiency.
    A fresh copy each time (~5 us; the engine estimates each op signature once), not a cache keyed
    by a few of the spec's fields, which would hand a variant of the GPU another variant's fields."""
    other = gpu.other_gemm_efficiency
    if other is None or other == gpu.gemm_efficiency:
        return gpu
    return replace(gpu, gemm_efficiency=other)


def _waves(work_units: int, sm_count: int, stream_k: bool) -> float:
    """Waves of one tile per SM; stream-K spreads a partial last wave over all SMs."""
    if not stream_k:
        return float(ceil_div(work_units, sm_count))
    full, partial = divmod(work_units, sm_count)
    return full + (partial / sm_count + STREAM_K_FIXUP_WAVES if partial else 0.0)


def gemm_compute_ns(shape: GemmShape, compute_type: str, gpu: GPUSpec, alignment: int = ALIGNED_BYTES) -> float:
    """Main-loop time of the best tile / split-K configuration (no memory roofline, no ramp);
    `alignment`: the operands' (gemm_alignment)."""
    tensor_cores = uses_tensor_cores(compute_type)
    tiles = TENSOR_CORE_TILES if tensor_cores else SIMT_TILES
    k_overhead = K_OVERHEAD[tensor_cores]
    efficiency = gpu.gemm_efficiency
    stream_k = gpu.capability[0] >= STREAM_K_FROM_MAJOR
    if misaligned(compute_type, alignment):
        efficiency, stream_k = min(efficiency, MISALIGNED_EFFICIENCY[alignment]), False
    rate_per_sm = peak_flops(gpu, compute_type) * efficiency / gpu.sm_count
    m, n, k = max(shape.m, 1), max(shape.n, 1), max(shape.k, 1)
    best = float("inf")
    for tile in tiles:
        tiles_mn = ceil_div(m, tile.m) * ceil_div(n, tile.n) * shape.batch
        splits = (1,)
        if shape.batch == 1 and tiles_mn < gpu.sm_count:
            splits = (1,) + tuple(s for s in SPLIT_K_FACTORS if k // s >= MIN_K_PER_SPLIT)
        for split in splits:
            waves = _waves(tiles_mn * split, gpu.sm_count, stream_k)
            tile_flops = 2.0 * tile.m * tile.n * (k / split + k_overhead)
            ns = waves * tile_flops / (rate_per_sm * tile.efficiency) * 1e9
            if split > 1:  # fp32 partial tiles written, then read back by a reduction
                ns += memory_ns(2.0 * split * m * n * 4, gpu) - gpu.kernel_ramp_ns
            best = min(best, ns)
    return best


def misaligned(compute_type: str, alignment: int) -> bool:
    """Whether a GEMM of these operands leaves cuBLAS's TMA kernels for CUTLASS's narrow-load ones."""
    return alignment < ALIGNED_BYTES and compute_type in MISALIGNED_TYPES


def gemm_kernel(
    shape: GemmShape, dtype: str, dtype_out: str, nbytes: float, ctx: CostContext, tf32: bool | None = None,
    dtype_b: str | None = None, alignment: int = ALIGNED_BYTES,
) -> Kernel:
    """One GEMM kernel: the slower of the tile model and the memory roofline, plus the ramp.
    `dtype_b`: the second operand's, where it may differ (FP8 formats); it names the kernel.
    `alignment`: the operands' byte alignment (gemm_alignment)."""
    gpu = ctx.gpu
    compute_type = matmul_compute_type(dtype, ctx.allow_tf32 if tf32 is None else tf32)
    name = gemm_kernel_name(gpu, compute_type, dtype_out, None if dtype_b is None else (dtype, dtype_b))
    if misaligned(compute_type, alignment):
        t = KERNEL_TYPE_TAGS[compute_type]
        name = f"cutlass_80_tensorop_{t}_s16816gemm_{t}_align{max(1, alignment // dtype_bytes(dtype))}"
    if shape.flops == 0:
        return Kernel(name, gpu.kernel_ramp_ns, 0.0, nbytes)
    compute = gemm_compute_ns(shape, compute_type, gpu, alignment)
    memory = memory_ns(nbytes, gpu, OPERAND_STREAMING_EFFICIENCY) - gpu.kernel_ramp_ns
    return Kernel(name, max(compute, memory) + gpu.kernel_ramp_ns, shape.flops, nbytes)


def _tensors(sig: OpSignature) -> list[TensorMeta]:
    return [a for a in sig.args if isinstance(a, TensorMeta)]


def _out(sig: OpSignature) -> TensorMeta:
    return sig.tensors_out()[0]


def _matrix_bytes(*ts: TensorMeta | None) -> float:
    return float(sum(footprint_bytes(t) for t in ts if t is not None))


# --- the ops -------------------------------------------------------------------------------

def mm(sig: OpSignature, ctx: CostContext) -> OpCost:
    """mm(a[M,K], b[K,N]) and friends with an optional additive input (addmm's `self`)."""
    a, b = sig.args[0], sig.args[1]
    out = _out(sig)
    shape = GemmShape(a.shape[0], b.shape[1], a.shape[1])
    nbytes = _matrix_bytes(a, b, out)
    return single(gemm_kernel(shape, a.dtype, out.dtype, nbytes, ctx, alignment=gemm_alignment(a, b)))


def addmm(sig: OpSignature, ctx: CostContext) -> OpCost:
    """addmm(bias, a, b) / _addmm_activation: the bias add and GELU/ReLU run in the epilogue."""
    bias, a, b = sig.args[0], sig.args[1], sig.args[2]
    out = _out(sig)
    shape = GemmShape(a.shape[0], b.shape[1], a.shape[1])
    nbytes = _matrix_bytes(a, b, out, bias)
    return single(gemm_kernel(shape, a.dtype, out.dtype, nbytes, ctx, alignment=gemm_alignment(a, b)))


def bmm(sig: OpSignature, ctx: CostContext) -> OpCost:
    a, b = sig.args[0], sig.args[1]
    out = _out(sig)
    shape = GemmShape(a.shape[1], b.shape[2], a.shape[2], a.shape[0])
    return single(gemm_kernel(shape, a.dtype, out.dtype, _matrix_bytes(a, b, out), ctx,
                              alignment=gemm_alignment(a, b)))


def baddbmm(sig: OpSignature, ctx: CostContext) -> OpCost:
    """baddbmm(self, a, b) and addbmm (sums over the batch into one [M, N] output)."""
    c, a, b = sig.args[0], sig.args[1], sig.args[2]
    out = _out(sig)
    shape = GemmShape(a.shape[1], b.shape[2], a.shape[2], a.shape[0])
    return single(gemm_kernel(shape, a.dtype, out.dtype, _matrix_bytes(a, b, out, c), ctx,
                              alignment=gemm_alignment(a, b)))


def matrix_vector(sig: OpSignature, ctx: CostContext) -> OpCost:
    """mv, addmv, dot, vdot, addr, outer-product-like ops: memory-bound (each input read once)."""
    ts = _tensors(sig)
    out = sig.tensors_out()
    flops = 0.0
    if sig.short_name in ("mv", "addmv"):
        mat = ts[0] if sig.short_name == "mv" else ts[1]
        flops = 2.0 * mat.numel
    elif sig.short_name in ("dot", "vdot"):
        flops = 2.0 * ts[0].numel
    elif out:
        flops = 2.0 * out[0].numel
    nbytes = _matrix_bytes(*ts) + _matrix_bytes(*out)
    name = "gemv2T_kernel" if sig.short_name in ("mv", "addmv") else sig.short_name
    return single(streaming_kernel(name, ctx.gpu, nbytes, flops))


def scaled_mm(sig: OpSignature, ctx: CostContext) -> OpCost:
    """_scaled_mm(a, b, scale_a, scale_b, bias, ...): fp8 (or int8) GEMM with scaling epilogue."""
    a, b = sig.args[0], sig.args[1]
    out = _out(sig)
    shape = GemmShape(a.shape[0], b.shape[1], a.shape[1])
    nbytes = _matrix_bytes(*_tensors(sig), out)
    return single(gemm_kernel(shape, a.dtype, out.dtype, nbytes, ctx))


# CUTLASS's grouped GEMM (torch._grouped_mm on sm90) first builds the per-group problem list on
# the GPU: prepare_grouped_gemm_data, 1.8-2.1 us in the H100 sweep (shared/calibration).
GROUPED_PREPARE_NS = 1_900


def grouped_problems(sig: OpSignature) -> list[GemmShape] | None:
    """The per-group GEMMs of _grouped_mm(a, b, offs): with offsets, a 2-D `a` against a 3-D `b`
    groups a's rows (MoE's forward and input gradient; m_g are the tokens routed to expert g), a
    2-D against a 2-D groups the shared K (the weight gradient: one [M, N] output per group), a
    3-D against a 2-D groups b's columns; 3-D against 3-D is a batch. Offsets are data (the group
    boundaries, OpSignature.data); without them the groups are taken as equal."""
    ts = _tensors(sig)
    if len(ts) < 2:
        return None
    a, b = ts[0], ts[1]
    offs = sig.data_of("offs")
    n_offs = ts[2].shape[0] if len(ts) > 2 and ts[2].shape else 0

    def sizes(total: int, groups: int) -> list[int]:
        """The grouped dimension's size per group: from the offsets, else `total` split equally."""
        if offs:
            return [max(0, offs[0])] + [max(0, hi - lo) for lo, hi in zip(offs, offs[1:])]
        groups = max(n_offs or groups, 1)
        return [total // groups] * groups

    if len(a.shape) == 2 and len(b.shape) == 3:
        return [GemmShape(m, b.shape[-1], a.shape[-1]) for m in sizes(a.shape[0], b.shape[0])]
    if len(a.shape) == 2 and len(b.shape) == 2:
        return [GemmShape(a.shape[0], b.shape[-1], k) for k in sizes(a.shape[1], 1)]
    if len(a.shape) == 3 and len(b.shape) == 2:
        return [GemmShape(a.shape[1], n, a.shape[2]) for n in sizes(b.shape[-1], 1)]
    if len(a.shape) == 3 and len(b.shape) == 3:
        return [GemmShape(a.shape[1], b.shape[2], a.shape[2])] * a.shape[0]
    return None


def grouped_gemm_compute_ns(problems: list[GemmShape], compute_type: str, gpu: GPUSpec) -> float:
    """One persistent kernel over every group's tiles: the tiles of all groups (each group's own
    ceil(m/tile) x ceil(n/tile), so a group of 3 tokens costs a whole tile row) run in waves of
    one tile per SM. No split-K and no stream-K across groups."""
    tensor_cores = uses_tensor_cores(compute_type)
    tiles = TENSOR_CORE_TILES if tensor_cores else SIMT_TILES
    rate_per_sm = peak_flops(gpu, compute_type) * other_gemm_gpu(gpu).gemm_efficiency / gpu.sm_count
    k_overhead = K_OVERHEAD[tensor_cores]
    best = float("inf")
    for tile in tiles:
        work = 0.0  # tile-steps: sum over tiles of (K + overhead)
        count = 0
        for p in problems:
            if p.m <= 0 or p.n <= 0:
                continue
            t = ceil_div(p.m, tile.m) * ceil_div(p.n, tile.n)
            count += t
            work += t * (max(p.k, 0) + k_overhead)
        if count == 0:
            return 0.0
        # waves: the mean tile's time, times full waves (a group's tiles are alike; mixed K
        # across groups spreads over the SMs like one more partial wave)
        waves = ceil_div(count, gpu.sm_count)
        mean_steps = work / count
        ns = waves * 2.0 * tile.m * tile.n * mean_steps / (rate_per_sm * tile.efficiency) * 1e9
        best = min(best, ns)
    return best


def grouped_mm(sig: OpSignature, ctx: CostContext) -> OpCost:
    """_grouped_mm / _scaled_grouped_mm (MoE's experts): one grouped kernel over the groups the
    offsets give (grouped_problems), timed per group's tiles, so uneven groups (imbalanced
    routing) and groups smaller than a tile cost what they cost; plus the kernel that builds
    the problem list."""
    problems = grouped_problems(sig)
    out = _out(sig)
    ts = _tensors(sig)
    a = ts[0]
    if problems is None:  # an unexpected layout: total work as one GEMM, as before
        k = a.shape[-1]
        shape = GemmShape(prod(out.shape[:-1]), out.shape[-1], k)
        return single(gemm_kernel(shape, a.dtype, out.dtype, _matrix_bytes(a, ts[1], out), ctx))
    gpu = ctx.gpu
    compute_type = matmul_compute_type(a.dtype, ctx.allow_tf32)
    flops = sum(p.flops for p in problems)
    nbytes = _matrix_bytes(*ts[:2], out)
    name = "cutlass_grouped_gemm_" + gemm_kernel_name(gpu, compute_type, out.dtype).split("_", 1)[1]
    if flops == 0:
        main = Kernel(name, gpu.kernel_ramp_ns, 0.0, nbytes)
    else:
        compute = grouped_gemm_compute_ns(problems, compute_type, gpu)
        memory = memory_ns(nbytes, gpu, OPERAND_STREAMING_EFFICIENCY) - gpu.kernel_ramp_ns
        main = Kernel(name, max(compute, memory) + gpu.kernel_ramp_ns, flops, nbytes)
    prepare = Kernel("prepare_grouped_gemm_data", GROUPED_PREPARE_NS, 0.0, 0.0)
    return OpCost((main, prepare))


def weight_only_quant_mm(sig: OpSignature, ctx: CostContext) -> OpCost:
    """_weight_int4pack_mm / _weight_int8pack_mm: activations x packed low-bit weights."""
    a = sig.args[0]
    out = _out(sig)
    k = a.shape[-1]
    m = prod(a.shape[:-1])
    shape = GemmShape(m, out.shape[-1], k)
    nbytes = _matrix_bytes(*_tensors(sig), out)
    return single(gemm_kernel(shape, a.dtype, out.dtype, nbytes, ctx))


def linear(sig: OpSignature, ctx: CostContext) -> OpCost:
    """linear(x[..., K], w[N, K], bias): one GEMM with M = prod(x.shape[:-1])."""
    x, w = sig.args[0], sig.args[1]
    bias = sig.args[2] if len(sig.args) > 2 and isinstance(sig.args[2], TensorMeta) else None
    out = _out(sig)
    shape = GemmShape(prod(x.shape[:-1]), w.shape[0], x.shape[-1])
    return single(gemm_kernel(shape, x.dtype, out.dtype, _matrix_bytes(x, w, out, bias), ctx,
                              alignment=gemm_alignment(x, w)))


def linear_backward(sig: OpSignature, ctx: CostContext) -> OpCost:
    """linear_backward(x, grad_out, w, mask): grad_input GEMM, grad_weight GEMM, bias reduction."""
    x, gy, w, mask = sig.args[0], sig.args[1], sig.args[2], sig.args[3]
    m, k, n = prod(x.shape[:-1]), x.shape[-1], w.shape[0]
    kernels = []
    if mask[0]:
        kernels.append(gemm_kernel(GemmShape(m, k, n), gy.dtype, x.dtype, _matrix_bytes(gy, w, x), ctx,
                                   alignment=gemm_alignment(gy, w)))
    if mask[1]:
        kernels.append(gemm_kernel(GemmShape(n, k, m), gy.dtype, w.dtype, _matrix_bytes(gy, x, w), ctx,
                                   alignment=gemm_alignment(gy, x)))
    if len(mask) > 2 and mask[2]:
        kernels.append(streaming_kernel("reduce_kernel", ctx.gpu, footprint_bytes(gy), gy.numel))
    return OpCost(tuple(kernels))


def pairwise_distance(sig: OpSignature, ctx: CostContext) -> OpCost:
    """_cdist_forward / _cdist_backward / _euclidean_dist (x1 [*, P, M], x2 [*, R, M]): the
    p=2 path is a GEMM of x1 against x2 plus row norms; other p's do the same work on CUDA
    cores. Timed as one [P x R x M] GEMM per batch entry."""
    ts = _tensors(sig)
    x1, x2 = (ts[1], ts[2]) if sig.short_name == "_cdist_backward" else (ts[0], ts[1])
    out = _out(sig)
    batch = prod(x1.shape[:-2]) if len(x1.shape) > 2 else 1
    shape = GemmShape(x1.shape[-2], x2.shape[-2], x1.shape[-1], batch)
    nbytes = _matrix_bytes(*ts, out)
    return single(gemm_kernel(shape, x1.dtype, out.dtype, nbytes, ctx))
