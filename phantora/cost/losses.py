"""Loss functions: nll_loss (the second half of cross entropy), mse, l1/smooth l1/huber, bce, ...

Cross entropy reaches the dispatcher as _log_softmax + nll_loss_forward, and backward as
nll_loss_backward + _log_softmax_backward_data. nll_loss_backward zero-fills the whole
[N, C] gradient before scattering -1/N into the target columns, so on a large vocabulary it
is as expensive as the softmax itself.
"""

from __future__ import annotations

from phantora.cost.roofline import (
    CostContext,
    OpCost,
    bytes_read,
    bytes_written,
    footprint_bytes,
    input_tensors,
    largest_tensor,
    streaming_kernel,
)
from phantora.ops import OpSignature, TensorMeta


def nll_loss_forward(sig: OpSignature, ctx: CostContext) -> OpCost:
    """nll_loss_forward / nll_loss2d_forward(self, target, weight, reduction, ignore_index):
    read the targets and one log-probability per target."""
    x, target = sig.args[0], sig.args[1]
    gathered = target.numel * x.itemsize
    nbytes = footprint_bytes(target) + gathered + bytes_written(sig)
    name = "nll_loss_forward_reduce_cuda_kernel_2d" if target.numel > 1 else "nll_loss_forward_no_reduce_cuda_kernel"
    return OpCost((streaming_kernel(name, ctx.gpu, nbytes, float(target.numel)),))


def nll_loss_backward(sig: OpSignature, ctx: CostContext) -> OpCost:
    """nll_loss_backward / nll_loss2d_backward(grad_out, self, target, ...): zero the [N, C]
    gradient, then write one value per target."""
    target = sig.args[2]
    grad_input = sig.tensors_out()[0]
    zero = streaming_kernel("FillFunctor", ctx.gpu, footprint_bytes(grad_input))
    scatter = streaming_kernel("nll_loss_backward_reduce_cuda_kernel_2d", ctx.gpu,
                               footprint_bytes(target) + target.numel * grad_input.itemsize)
    return OpCost((zero, scatter))


def elementwise_loss(sig: OpSignature, ctx: CostContext) -> OpCost:
    """mse_loss, smooth_l1_loss, huber_loss, binary_cross_entropy(_with_logits), soft_margin,
    multi_margin, multilabel_margin and their backward ops: an elementwise kernel over the
    inputs, plus a reduce kernel when the loss is reduced to a scalar."""
    ins = input_tensors(sig)
    x = largest_tensor(ins)
    outs = sig.tensors_out()
    reduced = bool(outs) and outs[0].numel == 1 and x is not None and x.numel > 1
    elementwise_bytes = bytes_read(sig) + (footprint_bytes(x) if reduced else bytes_written(sig))
    kernels = [streaming_kernel("elementwise_kernel", ctx.gpu, elementwise_bytes, 3.0 * (x.numel if x else 0))]
    if reduced and isinstance(x, TensorMeta):
        nbytes = footprint_bytes(x) + bytes_written(sig)
        kernels.append(streaming_kernel("reduce_kernel", ctx.gpu, nbytes, float(x.numel)))
    return OpCost(tuple(kernels))
