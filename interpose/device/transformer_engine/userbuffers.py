"""Transformer Engine's comm+GEMM overlap (userbuffers), as the virtual extension runs it.

`initialize_ub` (TE's module/base.py; Megatron's `--tp-comm-overlap`) gives each tensor-parallel
GEMM of a layer a communication buffer on its TP domain. A GEMM given one does the TP all-gather
of its input or the reduce-scatter of its output inside the extension call, overlapped with the
GEMM, where it would otherwise run on NCCL before or after it. The real extension moves the data
with its own kernels or the copy engines over NVLink; here each transfer is the torch.distributed
operation on the TP domain's group that moves the same bytes between the same ranks (phantora's
network model times it), issued in the order and on the streams that let it overlap as the C++
does (common/comm_gemm_overlap/comm_gemm_overlap.cpp):

- split_overlap_ag, the ring exchange (qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad by default): the
  GEMM in tp chunks of the gathered input's rows, own chunk first; the ring's tp-1 steps (send to
  the next rank, receive from the previous) run back to back and chunk i waits for step i-1.
- split_overlap_rs, the pipeline (proj_fprop, fc2_fprop): the GEMM in num_splits chunks of the
  weight's rows (the output's columns), each chunk reduce-scattered once computed, beside the next.
- bulk_overlap (qkv/fc1 dgrad and wgrad): the buffer's all-gather or reduce-scatter beside one GEMM
  that does not read it.

The pipelined and bulk methods' GEMMs run on the SMs their communication kernels leave
(set_sm_margin: num_comm_sm fewer, cuBLASLt's math_sm_count); the ring exchange copies with the
copy engines and leaves them all. Not modelled (NotImplementedError naming phantora): atomic GEMMs,
the ring-exchange reduce-scatter, reduce-scatter from FP8 buffers, the external all-gather of the
MXFP8 wgrad path, cuBLASMp, and bootstrapping with MPI.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
import torch.distributed as dist

from interpose.device.transformer_engine.errors import not_modelled
from interpose.distributed import process_group

# A GEMM of the extension's call on chunks: (A, B, D, pre-GELU aux, bias, SMs left to the
# communication kernels) -> None; generic_gemm binds its scales, workspace and epilogue flags.
ChunkGemm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None", "torch.Tensor | None", int],
                     None]

RS, AG = 0, 1  # CommOverlapType


def device_supports_multicast(device_id: int = -1) -> bool:
    """cuda::supports_multicast: CUDA multicast objects over NVSwitch, Hopper and later (every GPU
    phantora's table has is an SXM part on NVSwitch); TE's userbuffers use it unless UB_SKIPMC=1."""
    return torch.cuda.get_device_capability() >= (9, 0)


class CommOverlapHelper:
    """The torch.distributed groups userbuffers bootstrap with: the world and the TP domain."""

    def __init__(self, world_group: Any = None, intra_node_group: Any = None) -> None:
        if world_group is None:
            raise not_modelled("userbuffers bootstrapped with MPI (bootstrap_backend='mpi')")
        self.world_group = world_group
        self.intra_node_group = world_group if intra_node_group is None else intra_node_group
        # the C++ helper exchanges the ranks' node names and barriers over both groups here, so
        # their communicators exist before any GEMM uses them
        for group in {id(g): g for g in (world_group, self.intra_node_group)}.values():
            dist.barrier(group=group)


class CommOverlapCore:
    """What TE asks of any comm+GEMM overlap object, and the buffer they all hold."""

    p2p = False

    def __init__(self, buffer_shape: Any = None, buffer_dtype: Any = None, helper: Any = None, tp_size: int = 1,
                 comm_type: Any = RS, num_comm_sm: int = 16, set_sm_margin: bool = True, atomic_gemm: bool = False,
                 use_cublasmp: bool = False, num_splits: int = 1) -> None:
        if buffer_shape is None:  # the pybind base classes' default constructor: nothing to hold
            return
        if use_cublasmp:
            raise not_modelled("comm+GEMM overlap through cuBLASMp (with_cublasmp)")
        if atomic_gemm:
            raise not_modelled("comm+GEMM overlap with atomic GEMMs (atomic_gemm)")
        if len(buffer_shape) != 2:
            raise RuntimeError("Userbuffer shape must be 2-dimensional!")
        group = helper.intra_node_group
        if dist.get_world_size(group) != tp_size:
            raise RuntimeError(f"userbuffers: the TP domain's group has {dist.get_world_size(group)} ranks, "
                               f"tp_size is {tp_size}")
        self.group = group
        self.tp_size = int(tp_size)
        self.tp_id = dist.get_rank(group)
        self.ranks = dist.get_process_group_ranks(group)
        self.comm_type = int(comm_type)
        self.num_splits = int(num_splits)
        self.sm_margin = int(num_comm_sm) if set_sm_margin else 0
        # registered with the TP domain's peers for direct access: one allocation, like any other
        self.buffer = torch.empty([int(s) for s in buffer_shape], dtype=buffer_dtype,
                                  device=torch.device("cuda", torch.cuda.current_device()))
        self.streams: tuple[torch.cuda.Stream, torch.cuda.Stream] | None = None  # made when asked for

    def _chunk(self, i: int) -> torch.Tensor:
        return self.buffer.view(self.tp_size, -1)[i]

    def copy_into_buffer(self, input: torch.Tensor, local_chunk: bool = False) -> None:
        if input.element_size() != self.buffer.element_size():
            raise RuntimeError("Tried to copy data into a Userbuffers buffer but dtypes are not compatible "
                               f"(input dtype has {input.element_size()} bytes, UB dtype has "
                               f"{self.buffer.element_size()} bytes)")
        dst = self._chunk(self.tp_id) if local_chunk else self.buffer.view(-1)
        if input.numel() != dst.numel():
            raise RuntimeError(f"Tried to copy an invalid tensor into a {'local chunk of a ' if local_chunk else ''}"
                               f"Userbuffers buffer (input_size={input.numel()}, buffer size={dst.numel()})")
        dst.copy_(input.contiguous().view(-1).view(dst.dtype))

    def get_buffer(self, local_chunk: bool = False, shape: Any = None) -> torch.Tensor:
        data = self._chunk(self.tp_id) if local_chunk else self.buffer.view(-1)
        if shape is None:
            rows, cols = self.buffer.shape
            shape = [rows // self.tp_size if local_chunk else rows, cols]
        if int(torch.Size(shape).numel()) != data.numel():
            raise RuntimeError(f"Invalid shape for a Userbuffers buffer (requested shape={list(shape)}, "
                               f"size={data.numel()})")
        return data.view([int(s) for s in shape])

    def get_communication_stream(self) -> tuple[torch.cuda.Stream, torch.cuda.Stream]:
        """(send, recv): the ring's two streams, or the one communication stream twice."""
        if self.streams is None:
            self.streams = (torch.cuda.Stream(), torch.cuda.Stream()) if self.p2p else (torch.cuda.Stream(),) * 2
        return self.streams

    def get_tp_size(self) -> int:
        return self.tp_size

    def is_atomic_gemm(self) -> bool:
        return False

    def is_p2p_overlap(self) -> bool:
        return self.p2p

    def is_fp8_ubuf(self) -> bool:
        return self.buffer.element_size() == 1

    def with_cublasmp(self) -> bool:
        return False


class CommOverlapBase(CommOverlapCore):
    pass


class CommOverlapP2PBase(CommOverlapCore):
    p2p = True


class CommOverlap(CommOverlapBase):
    """The pipelined (split GEMM + reduce-scatter) and bulk methods."""

    def __init__(self, buffer_shape: Any, buffer_dtype: Any, helper: Any, tp_size: int, use_cublasmp: bool = False,
                 comm_type: Any = RS, num_splits: int = 4, num_max_streams: int = 3, comm_cga_size: int = 2,
                 gemm_priority: int = 0, comm_priority: int = 0, num_comm_sm: int = 16, set_sm_margin: bool = True,
                 atomic_gemm: bool = False, rs_overlap_first_gemm: bool = False) -> None:
        super().__init__(buffer_shape, buffer_dtype, helper, tp_size, comm_type, num_comm_sm, set_sm_margin,
                         atomic_gemm, use_cublasmp, num_splits)


class CommOverlapP2P(CommOverlapP2PBase):
    """The ring exchange (peer-to-peer copies between neighbouring ranks of the TP domain)."""

    def __init__(self, buffer_shape: Any, buffer_dtype: Any, helper: Any, tp_size: int, comm_type: Any,
                 num_max_streams: int = 3, comm_cga_size: int = 1, gemm_priority: int = 0, comm_priority: int = 0,
                 num_comm_sm: int = 1, set_sm_margin: bool = False, atomic_gemm: bool = False, use_ce: bool = True,
                 aggregate: bool = False, use_cublasmp: bool = False) -> None:
        if int(comm_type) == RS:
            raise not_modelled("comm+GEMM overlap of a reduce-scatter by ring exchange (method 'ring_exchange' "
                               "for an RS layer; the default 'pipeline' is modelled)")
        super().__init__(buffer_shape, buffer_dtype, helper, tp_size, comm_type, num_comm_sm, set_sm_margin,
                         atomic_gemm, use_cublasmp, tp_size)


def overlapped_gemm(ub: CommOverlapCore, comm_type: Any, bulk: bool, gemm: ChunkGemm, a: torch.Tensor,
                    transa: bool, b: torch.Tensor, d: torch.Tensor, aux: torch.Tensor | None,
                    bias: torch.Tensor | None, extra_output: torch.Tensor | None) -> None:
    """The extension's gemm() with `comm_overlap`: the GEMM D = op(B) op(A)^T with its communication."""
    if not isinstance(ub, CommOverlapCore) or not hasattr(ub, "buffer"):
        raise TypeError(f"comm_overlap must be a userbuffers object made by initialize_ub, not {type(ub).__name__}")
    kind = int(comm_type)
    # the C++ issues these copies and kernels itself: torch.distributed's Python, which stands in
    # for it here, is not the program's host time (its ops and launches are still charged)
    with _own_work(), process_group.userbuffers_transport():
        if bulk:
            _bulk(ub, kind, gemm, a, b, d, aux, bias, extra_output)
        elif kind == AG:
            _ring_all_gather(ub, gemm, a, b, d, aux, bias, extra_output)
        else:
            _pipelined_reduce_scatter(ub, gemm, a, transa, b, d, bias, extra_output)


def _own_work() -> Any:
    from interpose import runtime as rt_mod
    rt = rt_mod.current()
    return contextlib.nullcontext() if rt is None else rt.python_time.own_work  # none: unit tests


def _bulk(ub: CommOverlapCore, kind: int, gemm: ChunkGemm, a: torch.Tensor, b: torch.Tensor, d: torch.Tensor,
          aux: torch.Tensor | None, bias: torch.Tensor | None, rs_output: torch.Tensor | None) -> None:
    """CommOverlapBase::bulk_overlap: the buffer, its local chunk filled, all-gathered in place (AG)
    or reduce-scattered into its local chunk (RS), beside the GEMM."""
    if kind == AG:
        work = dist.all_gather_into_tensor(ub.buffer.view(-1), ub._chunk(ub.tp_id), group=ub.group, async_op=True)
    else:
        if ub.is_fp8_ubuf():
            raise not_modelled("bulk reduce-scatter from an FP8 userbuffer")
        work = dist.reduce_scatter_tensor(ub._chunk(ub.tp_id), ub.buffer.view(-1), group=ub.group, async_op=True)
    gemm(a, b, d, aux, bias, ub.sm_margin)
    work.wait()


def _ring_all_gather(ub: CommOverlapCore, gemm: ChunkGemm, a: torch.Tensor, b: torch.Tensor, d: torch.Tensor,
                     aux: torch.Tensor | None, bias: torch.Tensor | None, b_copy: torch.Tensor | None) -> None:
    """CommOverlapP2PBase::split_overlap_ag: B is the buffer (its local chunk filled), D the full output."""
    n = ub.tp_size
    if b.shape[0] % n or d.shape[0] % n:
        raise RuntimeError(f"userbuffers all-gather GEMM: {b.shape[0]} input rows / {d.shape[0]} output rows do "
                           f"not split into {n} chunks")
    # one view op each, as the C++ makes its chunk wrappers without any
    b_chunks, d_chunks = b.view(n, -1, *b.shape[1:]).unbind(0), d.view(n, -1, *d.shape[1:]).unbind(0)
    aux_chunks = None if aux is None else aux.view(n, -1, *aux.shape[1:]).unbind(0)
    buffer_chunks = ub.buffer.view(n, -1).unbind(0)
    after, before = ub.ranks[(ub.tp_id + 1) % n], ub.ranks[(ub.tp_id - 1) % n]
    main, send = torch.cuda.current_stream(), ub.get_communication_stream()[0]
    # the copies are issued from the send stream, which waits only for the previous receive (the
    # chunk it forwards), not for the GEMMs the main stream has queued since (NCCL waits for the
    # stream it is called from)
    send.wait_stream(main)
    steps: list[list[Any]] = []
    for i in range(n):
        if i:
            for work in steps[i - 1]:  # chunk i arrived with step i - 1
                work.wait()
        c = (ub.tp_id - i) % n
        gemm(a, b_chunks[c], d_chunks[c], None if aux_chunks is None else aux_chunks[c], bias, 0)
        if i < n - 1:
            with torch.cuda.stream(send):
                if i:
                    for work in steps[i - 1]:
                        work.wait()
                steps.append(dist.batch_isend_irecv([
                    dist.P2POp(dist.isend, buffer_chunks[(ub.tp_id - i) % n], after, ub.group),
                    dist.P2POp(dist.irecv, buffer_chunks[(ub.tp_id - i - 1) % n], before, ub.group)]))
    main.wait_stream(send)
    if b_copy is not None and b_copy.numel():
        if b_copy.numel() != ub.buffer.numel() or b_copy.element_size() != ub.buffer.element_size():
            raise RuntimeError(f"Expected all-gathered B copy buffer with {ub.buffer.numel()} elements of "
                               f"{ub.buffer.element_size()} bytes")
        b_copy.view(-1).view(ub.buffer.dtype).copy_(ub.buffer.view(-1))


def _pipelined_reduce_scatter(ub: CommOverlapCore, gemm: ChunkGemm, a: torch.Tensor, transa: bool,
                              b: torch.Tensor, d: torch.Tensor, bias: torch.Tensor | None,
                              rs_output: torch.Tensor | None) -> None:
    """CommOverlapBase::split_overlap_rs: the output's column chunks written into the buffer, each
    reduce-scattered into rs_output (the rows of this rank) while the next is computed."""
    if rs_output is None:
        raise RuntimeError("GEMM+RS overlap requires extra output tensor.")
    if ub.is_fp8_ubuf():
        raise not_modelled("pipelined reduce-scatter from an FP8 userbuffer")
    splits, n = ub.num_splits, ub.buffer.shape[0]
    m, k = (a.shape[0], a.shape[1]) if transa else (a.shape[1], a.shape[0])
    if m % splits or n % ub.tp_size:
        raise RuntimeError(f"userbuffers GEMM+RS: {m} output columns / {n} rows do not split into {splits} chunks "
                           f"/ {ub.tp_size} ranks")
    m_chunk = m // splits
    a_flat, out_flat, rs_flat = a.reshape(-1), ub.buffer.view(-1), rs_output.view(-1)
    works = []
    for i in range(splits):
        # contiguous chunks of A and of the buffer, as the C++ takes them (get_tensor_chunk)
        a_chunk = a_flat[i * m_chunk * k:(i + 1) * m_chunk * k].view((m_chunk, k) if transa else (k, m_chunk))
        out = out_flat[i * n * m_chunk:(i + 1) * n * m_chunk].view(n, m_chunk)
        gemm(a_chunk, b, out, None, None if bias is None else bias[i * m_chunk:(i + 1) * m_chunk], ub.sm_margin)
        rows = n // ub.tp_size
        works.append(dist.reduce_scatter_tensor(rs_flat[i * rows * m_chunk:(i + 1) * rows * m_chunk],
                                                out.view(-1), group=ub.group, async_op=True))
    for work in works:
        work.wait()


CLASSES = (CommOverlapHelper, CommOverlapCore, CommOverlapBase, CommOverlapP2PBase, CommOverlap, CommOverlapP2P)
