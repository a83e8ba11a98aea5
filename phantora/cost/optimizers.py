"""Multi-tensor ops: _foreach_* and the fused optimizers (_fused_adam(w)_, _fused_sgd_, ...).

torch runs them through multi_tensor_apply: each launch takes up to max_tensors tensors of the
lists (fewer the more lists an op touches) and up to 320 chunks of 65,536 elements; a launch
happens whenever either limit is reached. So an op over a list of 150 parameters issues a few
launches, each streaming its share of the bytes. Constants from
ATen/native/cuda/MultiTensorApply.cuh.
"""

from __future__ import annotations

import math

from phantora.cost.gemm import GemmShape, gemm_kernel
from phantora.cost.roofline import (
    CostContext,
    Kernel,
    OpCost,
    ceil_div,
    footprint_bytes,
    memory_ns,
    sm_rate_per_ns,
    streaming_kernel,
)
from phantora.ops import OpSignature, TensorMeta

CHUNK_ELEMENTS = 65_536
MAX_BLOCKS_PER_LAUNCH = 320
MAX_TENSORS_BY_DEPTH = {1: 110, 2: 64, 3: 48, 4: 36, 5: 30}
FLOPS_PER_ELEMENT = {"adam": 15.0, "sgd": 4.0, "adagrad": 6.0}
# Fused optimizers keep 4-5 streams in flight per element and reach a little less than a copy:
# H100 profile, _fused_adamw_ over 8 x 4096^2 fp32 params: 3.76 GB in 1.42 ms (2.65 TB/s).
FUSED_OPTIMIZER_EFFICIENCY = 0.88
# The fused Adam(W) math (FusedAdamMathFunctor; Apex's and DeepSpeed's AdamFunctor alike) costs SM
# time per element that overlaps its DRAM stream only in part: a launch takes
#     ramp + sqrt(dram_ns^2 + sm_ns^2),  dram_ns = bytes / achieved HBM bandwidth,
#     sm_ns = elements x ADAM_CLK_PER_ELEMENT / (SMs x clock).
# Fitted to the H100 sweep's two fused AdamW cases (fp32; 148 x 1M and 30 x 16M elements: 1.274 and
# 1.282 clocks per element per SM, 1639.6 and 5322.4 us); the same as the 0.88 efficiency there. It
# is what carries the kernel to other GPUs and dtypes: held out, the H200 sweep's two fp32 cases
# (+3.2%, +2.8%), and the lent H200's Llama steps with bf16 parameters and states (14 bytes per
# element, where the bytes alone would give 2.5 ms of 769M elements and the real kernels take 4.66):
# the bf16 kernel is SM-bound on the H200, which the 0.88 efficiency read 37% fast.
ADAM_CLK_PER_ELEMENT = 1.28

# In-place foreach ops that write their first list without reading it.
WRITE_ONLY_FIRST_LIST = {"_foreach_zero_", "_foreach_copy_"}
# Foreach reductions: one value per tensor, then a cleanup kernel combining the partials.
FOREACH_REDUCTIONS = {"_foreach_norm", "_foreach_max", "_foreach_powsum"}


def tensor_lists(sig: OpSignature) -> list[list[TensorMeta]]:
    """The Tensor[] arguments, in schema order (Scalar[] lists are skipped)."""
    lists = []
    for a in sig.args:
        if isinstance(a, tuple) and a and all(isinstance(t, TensorMeta) for t in a):
            lists.append(list(a))
    return lists


def _tensor_list(a) -> list[TensorMeta]:
    return [t for t in a if isinstance(t, TensorMeta)] if isinstance(a, tuple) else []


def launch_element_counts(numels: list[int], depth: int, chunk_elements: int = CHUNK_ELEMENTS) -> list[int]:
    """Elements each multi_tensor_apply launch processes, following torch's launch rule (Apex's
    multi_tensor_apply has the same rule with the caller's chunk size)."""
    max_tensors = MAX_TENSORS_BY_DEPTH.get(depth, 30)
    launches: list[int] = []
    tensors = blocks = elements = 0
    for n in numels:
        if n == 0:
            continue
        tensors += 1
        chunks = ceil_div(n, chunk_elements)
        for chunk in range(chunks):
            blocks += 1
            elements += min(chunk_elements, n - chunk * chunk_elements)
            last_chunk = chunk == chunks - 1
            if blocks == MAX_BLOCKS_PER_LAUNCH or (tensors == max_tensors and last_chunk):
                launches.append(elements)
                blocks = elements = 0
                tensors = 0 if last_chunk else 1
    if blocks:
        launches.append(elements)
    return launches


def multi_tensor_kernels(
    name: str, numels: list[int], depth: int, total_bytes: float, flops_per_element: float, ctx: CostContext,
    efficiency: float = 1.0, chunk_elements: int = CHUNK_ELEMENTS,
) -> tuple[Kernel, ...]:
    """Split `total_bytes` over the launches in proportion to their elements."""
    launches = launch_element_counts(numels, depth, chunk_elements)
    total = sum(launches)
    if not total:
        return ()
    return tuple(
        streaming_kernel(name, ctx.gpu, total_bytes * n / total, flops_per_element * n, efficiency=efficiency)
        for n in launches
    )


def adam_kernels(name: str, numels: list[int], total_bytes: float, ctx: CostContext) -> tuple[Kernel, ...]:
    """The fused Adam(W) launches (depth 4): each its share of the bytes and its elements, timed by
    the DRAM and SM terms of ADAM_CLK_PER_ELEMENT's comment."""
    launches = launch_element_counts(numels, 4)
    total = sum(launches)
    gpu = ctx.gpu
    kernels = []
    for n in launches:
        nbytes = total_bytes * n / total
        dram_ns = memory_ns(nbytes, gpu) - gpu.kernel_ramp_ns
        sm_ns = n / sm_rate_per_ns(gpu, 1.0 / ADAM_CLK_PER_ELEMENT)
        flops = FLOPS_PER_ELEMENT["adam"] * n
        kernels.append(Kernel(name, gpu.kernel_ramp_ns + math.hypot(dram_ns, sm_ns), flops, nbytes))
    return tuple(kernels)


def foreach(sig: OpSignature, ctx: CostContext) -> OpCost:
    """_foreach_<op>[_](lists..., scalars): one elementwise pass over every list."""
    name = sig.short_name
    if name == "_foreach_mm":
        return foreach_mm(sig, ctx)
    lists = tensor_lists(sig)
    if not lists:
        return OpCost(())
    outputs = sig.tensors_out()
    written_list: list[TensorMeta]
    read_lists = lists
    if "out" in sig.tags:  # trailing out= list
        read_lists, written_list = lists[:-1], lists[-1]
    elif outputs:  # out-of-place: a new list per result
        written_list = outputs
    else:  # in-place: the first list is written
        written_list = lists[0]
    if name in WRITE_ONLY_FIRST_LIST:
        read_lists = read_lists[1:]
    read = sum(footprint_bytes(t) for lst in read_lists for t in lst)
    written = sum(footprint_bytes(t) for t in written_list)
    depth = len(read_lists) + (0 if written_list is lists[0] else 1)
    base = name.removeprefix("_foreach_").removesuffix("_")
    numels = [t.numel for t in lists[0]]
    kernels = multi_tensor_kernels(f"multi_tensor_apply_kernel<{base}>", numels, max(1, min(depth, 5)),
                                   read + written, 1.0, ctx)
    if name in FOREACH_REDUCTIONS:
        cleanup = streaming_kernel("lpnorm_cleanup", ctx.gpu, 4.0 * len(numels) * MAX_BLOCKS_PER_LAUNCH)
        kernels += (cleanup,)
    return OpCost(kernels)


def foreach_mm(sig: OpSignature, ctx: CostContext) -> OpCost:
    """_foreach_mm(self[], mat2[]): one GEMM per pair."""
    a_list, b_list = tensor_lists(sig)[:2]
    kernels = []
    for a, b, out in zip(a_list, b_list, sig.tensors_out()):
        nbytes = footprint_bytes(a) + footprint_bytes(b) + footprint_bytes(out)
        kernels.append(gemm_kernel(GemmShape(a.shape[0], b.shape[1], a.shape[1]), a.dtype, out.dtype, nbytes, ctx))
    return OpCost(tuple(kernels))


def amp_unscale(sig: OpSignature, ctx: CostContext) -> OpCost:
    """_amp_foreach_non_finite_check_and_unscale_(grads[], found_inf, inv_scale): read and
    rewrite every gradient once."""
    grads = tensor_lists(sig)[0] if tensor_lists(sig) else []
    total = 2.0 * sum(footprint_bytes(t) for t in grads)
    return OpCost(multi_tensor_kernels("multi_tensor_apply_kernel<UnscaleFunctor>",
                                       [t.numel for t in grads], 1, total, 2.0, ctx))


def fused_optimizer(sig: OpSignature, ctx: CostContext) -> OpCost:
    """_fused_adam(w)_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, ...),
    _fused_sgd_(params, grads, momentum_buffers, ...), _fused_adagrad_(params, grads, sums,
    steps, ...) and their functional (out-of-place) forms.

    Params and every state list are read and written; grads are read; the per-tensor step
    counters are scalars.
    """
    name = sig.short_name.removesuffix("_")
    family = "adam" if "adam" in name else ("sgd" if "sgd" in name else "adagrad")
    # state lists by position (an unused one, e.g. max_exp_avg_sqs without amsgrad, is empty)
    state_positions = {"adam": (2, 3, 4), "sgd": (2,), "adagrad": (2,)}[family]
    params, grads = _tensor_list(sig.args[0]), _tensor_list(sig.args[1])
    states = [lst for lst in (_tensor_list(sig.args[i]) for i in state_positions) if lst]
    param_bytes = sum(footprint_bytes(t) for t in params)
    grad_bytes = sum(footprint_bytes(t) for t in grads)
    state_bytes = sum(footprint_bytes(t) for lst in states for t in lst)
    total = 2.0 * param_bytes + grad_bytes + 2.0 * state_bytes
    depth = 2 + len(states)
    functor = f"Fused{family.capitalize()}MathFunctor"  # FusedAdamMathFunctor, FusedSgdMathFunctor, ...
    if family == "adam" and len(states) == 2:  # without amsgrad: depth 4, the fitted kernel
        return OpCost(adam_kernels(f"multi_tensor_apply_kernel<{functor}>", [t.numel for t in params], total, ctx))
    return OpCost(multi_tensor_kernels(f"multi_tensor_apply_kernel<{functor}>", [t.numel for t in params],
                                       min(depth, 5), total, FLOPS_PER_ELEMENT[family], ctx,
                                       efficiency=FUSED_OPTIMIZER_EFFICIENCY))


def extension_multi_tensor_adam(sig: OpSignature, ctx: CostContext) -> OpCost:
    """cuda_extension::multi_tensor_adam(chunk_size, noop_flag, grads, params, exp_avgs,
    exp_avg_sqs, ...): the multi-tensor Adam kernel of a CUDA extension built at run time
    (DeepSpeed's FusedAdam, Apex's amp_C; interpose/device/cuda_extensions.py). Its source cannot be
    timed, so it is costed as torch's _fused_adam(w)_ on the same tensors: the same bytes (grads
    read; params, exp_avgs and exp_avg_sqs read and written), the same launch rule (it is the
    multi_tensor_apply these kernels share: depth 4, 320 blocks of 65,536 elements; DeepSpeed and
    Apex pass chunk_size 2048 * 32, torch's chunk), the same arithmetic and efficiency. An
    assumption, not a measurement of the extension's kernel."""
    grads, params, exp_avgs, exp_avg_sqs = (_tensor_list(sig.args[i]) for i in (2, 3, 4, 5))
    total = sum(footprint_bytes(t) for t in grads) + 2.0 * sum(
        footprint_bytes(t) for lst in (params, exp_avgs, exp_avg_sqs) for t in lst)
    return OpCost(adam_kernels("multi_tensor_apply_kernel<AdamFunctor>", [t.numel for t in params], total, ctx))
