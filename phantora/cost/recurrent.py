"""Recurrent layers: _cudnn_rnn and _cudnn_rnn_backward (nn.LSTM / nn.GRU / nn.RNN on CUDA).

cuDNN runs, per layer and direction, one large GEMM for the input projection of all time
steps, then T dependent steps, each a small recurrent GEMM (M = batch, N = gates * hidden,
K = hidden) plus the fused gate nonlinearities. The sequential steps, not FLOPs, dominate for
small batches. Backward does the same walk in reverse for the data gradient, plus two large
weight-gradient GEMMs per layer: modelled as twice the forward's time.
"""

from __future__ import annotations

from phantora.cost.gemm import GemmShape, gemm_kernel
from phantora.cost.roofline import CostContext, Kernel, OpCost, streaming_kernel
from phantora.ops import OpSignature, TensorMeta

GATES_BY_MODE = {0: 1, 1: 1, 2: 4, 3: 3}  # RNN_RELU, RNN_TANH, LSTM, GRU
BACKWARD_FACTOR = 2.0


# Where (mode, hidden_size, proj_size, num_layers, batch_first, bidirectional) sit in each schema.
_ARG_POSITIONS = {
    "_cudnn_rnn": (6, 7, 8, 9, 10, 13),
    "_cudnn_rnn_backward": (10, 11, 12, 13, 14, 17),
}


def _rnn_forward_kernels(sig: OpSignature, ctx: CostContext, x: TensorMeta) -> list[Kernel]:
    mode, hidden, proj, layers, batch_first, bidirectional = (sig.args[i] for i in _ARG_POSITIONS[sig.short_name])
    gates = GATES_BY_MODE.get(mode, 4)
    dirs = 2 if bidirectional else 1
    steps, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    if len(x.shape) == 2:  # packed sequence: [total, input]; batch_sizes are data
        steps, batch = x.shape[0], 1
    out_size = proj if proj else hidden
    kernels: list[Kernel] = []
    in_features = x.shape[-1]
    itemsize = x.itemsize
    for _layer in range(layers):
        for _d in range(dirs):
            proj_shape = GemmShape(steps * batch, gates * hidden, in_features)
            nbytes = itemsize * (steps * batch * (in_features + gates * hidden) + gates * hidden * in_features)
            kernels.append(gemm_kernel(proj_shape, x.dtype, x.dtype, nbytes, ctx))
            step_shape = GemmShape(batch, gates * hidden, out_size)
            step_bytes = itemsize * (batch * (out_size + gates * hidden) + gates * hidden * out_size)
            step = gemm_kernel(step_shape, x.dtype, x.dtype, step_bytes, ctx)
            cell = streaming_kernel("elementwise_cell_kernel", ctx.gpu, itemsize * batch * hidden * (gates + 3))
            kernels.extend([step, cell] * steps)
        in_features = out_size * dirs
    return kernels


def cudnn_rnn(sig: OpSignature, ctx: CostContext) -> OpCost:
    """_cudnn_rnn(input, weight[], weight_stride0, weight_buf, hx, cx, mode, hidden_size,
    proj_size, num_layers, batch_first, dropout, train, bidirectional, batch_sizes, ...)."""
    return OpCost(tuple(_rnn_forward_kernels(sig, ctx, sig.args[0])))


def cudnn_rnn_backward(sig: OpSignature, ctx: CostContext) -> OpCost:
    """_cudnn_rnn_backward(input, weight[], ..., mode, hidden_size, ...): twice the forward's
    kernels' time."""
    forward = _rnn_forward_kernels(sig, ctx, sig.args[0])
    return OpCost(tuple(
        Kernel(k.name.replace("elementwise_cell", "elementwise_cell_backward"), k.duration_ns * BACKWARD_FACTOR,
               k.flops * BACKWARD_FACTOR, k.bytes * BACKWARD_FACTOR)
        for k in forward
    ))
