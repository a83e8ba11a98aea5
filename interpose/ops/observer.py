"""The dispatch observer: sees every post-autograd aten op of the process and reports it.

It is a TorchDispatchMode entered after FakeTensorMode, so it runs first for every op
(FakeTensorMode is an infra mode and always runs last). For each op it
  * runs the op (in FakeTensorMode, or for real when every input is a real CPU tensor, see
    `_run_for_real`),
  * interns the op's signature (shapes, dtypes, strides, devices) and sends [R_OP, sig, stream],
  * accounts new device storages in the virtual GPU's caching allocator (raising
    torch.OutOfMemoryError where the real GPU would),
  * answers the ops that need data (.item(), pin_memory, is_pinned) itself.
"""

from __future__ import annotations

import contextlib

from typing import Any, Iterator

import torch
from torch._ops import HigherOrderOperator
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.utils._python_dispatch import (TorchDispatchMode, _get_current_dispatch_mode_stack,
                                          is_traceable_wrapper_subclass_type)

from interpose.device import cuda_graphs, cuda_rng
from interpose.device.fake import ProgramFakeTensor, cache_hit_watch
from interpose.host import host_time
from interpose.ops import custom_ops, hops
from interpose.values import data_dependent, routing
from interpose import runtime as rt_mod
from interpose.values import policy as values
from interpose.host.python_events import ThreadFlags, beside_flag, op_flags, opens_checkpoint_region
from interpose.ops.signature import signature_data, signature_of
from phantora import protocol as P
from phantora.engine.memory import OutOfMemory
from phantora.ops import OpSignature

aten = torch.ops.aten

# Metadata queries that never reach a GPU and cost nothing worth modelling.
_SKIP = {
    torch.ops.prim.device.default, aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default,
    aten.sym_storage_offset.default, aten.is_same_size.default, aten.dim.default,
    aten.is_contiguous.default, aten.is_contiguous.memory_format, aten.is_strides_like_format.default,
    aten.is_non_overlapping_and_dense.default, aten.size.default, aten.stride.default,
    aten.numel.default, aten.storage_offset.default,
}
_SKIP = {op for op in _SKIP if op is not None}

# prim.device: the C++ side asks a FakeTensor's device this way for every output of an op
# (autograd's view bookkeeping, argument checks): about 3.5 per reported op in a GPT step, and one
# per chunk when FSDP2 chunks each parameter into world-size pieces. FakeTensorMode answers it
# from the tensor (torch's `_device_handler`); the observer answers the same without dispatching
# it a second time through the mode stack.
_PRIM_DEVICE = torch.ops.prim.device.default
_META = torch.device("meta")

# Ops that use cuBLAS (which allocates its workspace at the first call on a stream).
# By overload packet: the `out=` overloads call cuBLAS too.
_GEMMS = {aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten._addmm_activation, aten.mv, aten.addmv,
          aten.dot, aten.vdot, aten.addbmm}


# Ops FakeTensorMode computes the same way as another op that its dispatch cache serves.
# _unsafe_view is view without autograd's view record (aten::linear of a 3-d input ends in one,
# so every such Linear has one); stock FakeTensorMode never caches it and runs its shape function
# each time (466 us of CPU per call through phantora, 281 us as view; upstream, pytorch#193765
# proposes caching it). Both fake kernels are fake_impls._view_meta, and below
# autograd, where the observer runs, neither records a view: view's cache entry gives the same
# tensor on the same storage. The op is still reported as _unsafe_view.
_CACHED_EQUIVALENT = {aten._unsafe_view.default: aten.view.default}


def _is_fake(t: Any) -> bool:
    return isinstance(t, FakeTensor)


class OpObserver(TorchDispatchMode):
    def __init__(self, runtime: rt_mod.Runtime) -> None:
        super().__init__()
        self.rt = runtime
        self.ops_seen = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        python_time = self.rt.python_time
        python_time.enter(dispatch=True)  # the GPU side of the op is modelled: its CPU time here is phantora's
        try:
            if func is _PRIM_DEVICE and len(args) == 1 and isinstance(args[0], FakeTensor):
                # what FakeTensorMode (fake_tensor._device_handler) would answer
                return _META if args[0].fake_mode.in_kernel_invocation else args[0].fake_device
            if _wraps_other_tensors(types):
                # A tensor subclass that wraps other tensors (DTensor, FSDP2's sharded parameters,
                # TwoTensor...) decides what runs: its own __torch_dispatch__ turns the op into ops on
                # its inner (virtual) tensors and into collectives, which come back through this mode.
                # Those are what the GPU runs, with local shapes; the wrapper op itself launches
                # nothing. (Reporting the wrapper op timed DTensor work at its global shape.)
                return NotImplemented
            # FakeTensorMode is not thread-safe (its in-kernel flag is shared, the matching
            # dispatch-key state is thread-local), so ops from several threads (pin-memory thread,
            # user threads, the autograd thread) go through the modes one at a time.
            with self.rt.dispatch_lock:
                return self._dispatch(func, args, kwargs or {})
        finally:
            python_time.exit()

    def _dispatch(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if isinstance(func, HigherOrderOperator):
            return hops.dispatch_hop(self, func, args, kwargs)
        if func in _SKIP:
            return func(*args, **kwargs)
        special = _SPECIAL.get(func)
        if special is not None:
            return special(self, func, args, kwargs)
        impl = custom_ops.python_implementation(func)
        if impl is not None and self.active():
            return custom_ops.run_implementation(self, impl, args, kwargs)
        return self.run_op(func, args, kwargs)

    def run_op(self, func: Any, args: tuple, kwargs: dict, tags: frozenset[str] = frozenset()) -> Any:
        """An op as the observer runs any op without a special handler: run it, track its values
        and shadows, report it (with `tags` added to its signature). Handlers in _SPECIAL that
        only rewrite arguments or add to the result call this."""
        if not self.rt.active:
            return func(*args, **kwargs)
        if _metadata_only.depth:
            return func(*args, **kwargs)
        any_fake, any_tensor, wants_cuda = _scan(args, kwargs)
        if not any_fake and any_tensor and not wants_cuda:
            # Every input is a real CPU tensor (a DataLoader batch, an optimizer step counter):
            # compute it for real so its values stay meaningful.
            with unset_fake_temporarily():
                out = func(*args, **kwargs)
            values.note_result(func, args, kwargs, out)  # GradScaler's found_inf may be a real CPU tensor
            self._report(func, args, kwargs, out, tags)
            return out
        internal = _is_internal_detach(func)
        exact = values.exact_inputs(func, args, kwargs)  # before an in-place op changes them
        called = _CACHED_EQUIVALENT.get(func, func)
        cache_hit_watch.watch(called)
        try:
            out = called(*args, **kwargs)
        finally:
            cache_entry = cache_hit_watch.take()
        if func in cuda_rng.RANDOM_OPS:
            cuda_rng.note_random_op(func, args, kwargs, out)
        if not any_tensor and not wants_cuda:
            out = _make_small_cpu_factory_real(func, args, kwargs, out)
        if not values.note_view(func, args, out):
            values.note_result(func, args, kwargs, out, exact)
            values.note_shadow(func, args, kwargs, out, _is_fake, unset_fake_temporarily, exact)
        out = _real_host_copy(func, args, out)
        if not internal:
            self._report(func, args, kwargs, out, tags, cache_entry)
        return out

    def active(self) -> bool:
        """Whether ops now run as the program's GPU work (not phantora's own set-up, not torch's
        metadata-only propagation)."""
        return self.rt.active and not _metadata_only.depth

    # --- reporting ----------------------------------------------------------------------------
    def _report(self, func: Any, args: tuple, kwargs: dict, out: Any, tags: frozenset[str] = frozenset(),
                cache_entry: Any = None) -> None:
        """Send the op to the simulator. `tags` join its signature's (phantora/ops.py), e.g.
        HOST_SYNC for an op whose CUDA implementation reads a count back to the host.
        `cache_entry`: FakeTensorMode's dispatch-cache entry that answered the op, if one did."""
        rt = self.rt
        self.ops_seen += 1
        # An entry stands for one op on one set of metadata and scalars (FakeTensorMode's key),
        # which decide the signature too, unless pinned memory (CPU tensors), argument data or
        # tags enter it: such ops are never remembered by entry.
        known = rt.sig_by_cache_entry.get(id(cache_entry)) if cache_entry is not None else None
        if known is not None and known[0] is cache_entry and known[1] is func and not tags:
            sig_id, device = known[2], known[3]
        else:
            key, device = _signature_key(func, args, kwargs, rt)
            data = signature_data(func, args, kwargs)
            if tags or data:
                key = (*key, tags, data)
            if device < 0 and not rt.client.connected:
                return  # host-only work of a process that is not a rank (yet)
            if device >= 0 and not rt.config.device_count:
                rt.check_device(device)  # CUDA_VISIBLE_DEVICES hides every GPU: fail before becoming a rank
            with rt.lock:
                sig_id = rt.sig_ids.get(key)
                if sig_id is None:
                    sig_id = rt.sig_ids[key] = len(rt.sig_ids)
                    sig = signature_of(func, args, kwargs, out, is_pinned=_pinned_checker(rt), extra_tags=tags,
                                       data=data)
                    rt.client.record([P.R_SIG, sig_id, sig.to_wire()])
            if cache_entry is not None and not tags and not data and device >= 0 and not _holds_cpu_tensor(args, kwargs):
                if len(rt.sig_by_cache_entry) >= _MAX_REMEMBERED_ENTRIES:
                    rt.sig_by_cache_entry.clear()
                rt.sig_by_cache_entry[id(cache_entry)] = (cache_entry, func, sig_id, device)  # holds the entry: its id stays its own
        with rt.lock:
            peer = _peer_copy_devices(func, args, out)
            if peer is not None:  # it runs on the source device's current stream (copy_kernel_cuda)
                device = peer[0]
            stream = current_stream_id(device) if device >= 0 else 0
            flags = (op_flags(args, rt.in_optimizer > 0) if device >= 0 else 0) | beside_flag()
            if device >= 0 and opens_checkpoint_region():
                rt.client.record([P.R_HOST, "checkpoint", 1])  # the region's Python runs before its first op
            if flags & (P.OP_BACKWARD | P.OP_IN_MODULE | P.OP_RECORDS_GRAD):
                rt.model_work_since_step = True
            if device >= 0 and _compiled.depth:
                flags |= P.OP_COMPILED
            if rt.capturing and device >= 0:
                capture = rt.capturing.get((device, stream))
                if capture is not None:  # recorded into a CUDA graph, not run (interpose/device/cuda_graphs.py)
                    flags |= P.OP_CAPTURED
                    capture.ops.append(str(func))
                    peer = None  # a captured copy runs at replay, so its event barrier is not recorded now
            if peer is not None:
                _peer_barrier(rt, peer[1], peer[0], stream)
            rt.client.record([P.R_OP, sig_id, stream, flags])
            if peer is not None:
                _peer_barrier(rt, peer[0], peer[1], current_stream_id(peer[1]))
            if device >= 0:
                if not flags & P.OP_BESIDE:
                    rt.host_thread.launched_gpu_work()
                self._account_outputs(func, out, stream)

    def report_kernel(self, sig: OpSignature, device: int, stream: int) -> None:
        """One kernel of compiled code that no aten op launches (a generated Triton kernel,
        interpose/compile/compiled_kernels.py): reported like an op whose outputs already exist."""
        rt = self.rt
        if not rt.active or not rt.client.connected:
            return
        self.ops_seen += 1
        key = ("kernel", sig)
        with rt.lock:
            sig_id = rt.sig_ids.get(key)
            if sig_id is None:
                sig_id = rt.sig_ids[key] = len(rt.sig_ids)
                rt.client.record([P.R_SIG, sig_id, sig.to_wire()])
            flags = P.OP_COMPILED | (P.OP_IN_OPTIMIZER if rt.in_optimizer > 0 else 0)
            if torch._C._current_autograd_node() is not None:
                flags |= P.OP_BACKWARD
            if rt.capturing:
                capture = rt.capturing.get((device, stream))
                if capture is not None:
                    flags |= P.OP_CAPTURED
                    capture.ops.append(sig.name)
            rt.client.record([P.R_OP, sig_id, stream, flags])
            rt.host_thread.launched_gpu_work()

    def _account_outputs(self, func: Any, out: Any, stream: int) -> None:
        rt = self.rt
        try:
            for t, index in _cuda_outputs(out):
                rt.track_storage(t.untyped_storage(), index, stream)
            if getattr(func, "overloadpacket", None) in _GEMMS:
                dev = _first_cuda_device(out)
                if dev is not None:
                    rt.cublas_workspace(dev, stream)
        except OutOfMemory as e:
            dev = _first_cuda_device(out)
            rt.client.record([P.R_OOM, dev if dev is not None else 0, e.info.requested_bytes if e.info else 0, str(e)])
            gpu = rt.config.gpu
            hint = (
                f"\nphantora: rank {rt.rank} ran out of memory on simulated cuda:{dev} ({gpu.device_name}) "
                f"in {func}. To fit: a smaller batch or sequence, activation checkpointing, sharding "
                f"(FSDP), or a GPU with more memory (--gpu, --vram)."
            )
            raise torch.OutOfMemoryError(str(e) + hint) from None

    def measure_dispatch_floor(self, device: int) -> int:
        """host_time.measure_dispatch_floor for this observer: a tiny add_ on a virtual GPU,
        reported to no one (torch's metadata-only path), so the simulation sees nothing. The
        runtime calls it through `rt.observer` once the process is a rank (Runtime._measure_host)."""
        # The first record may come from inside the observer's own dispatch, where it is off the
        # mode stack: the probe's ops must go through it as the program's will.
        outside = contextlib.nullcontext() if self in _get_current_dispatch_mode_stack() else self
        with _not_observed(), outside:
            x = torch.empty(16, device=f"cuda:{device}")
            return host_time.measure_dispatch_floor(self.rt.python_time, lambda: x.add_(1))


_metadata_only = ThreadFlags()  # .depth: inside code torch runs only to learn shapes
_compiled = ThreadFlags()  # .depth: inside a graph compiled by Inductor (interpose/compile/torch_compile.py)


@contextlib.contextmanager
def _nested(counter: ThreadFlags) -> Iterator[None]:
    """This thread is inside one more region of the kind `counter` counts."""
    counter.depth += 1
    try:
        yield
    finally:
        counter.depth -= 1


def compiled_code() -> contextlib.AbstractContextManager[None]:
    """Ops reported inside are launched by compiled code (no Python around them)."""
    return _nested(_compiled)


def _not_observed() -> contextlib.AbstractContextManager[None]:
    return _nested(_metadata_only)


def install_metadata_only_regions() -> None:
    """torch marks the code it runs only to derive metadata, not as part of the computation,
    with `disable_proxy_modes_tracing()` (DTensor's sharding propagation runs each op on fake
    copies of its global-shape arguments there, so a tracer records nothing). Nothing of it
    runs on a GPU either: the observer lets such ops through without reporting them, drawing
    random numbers or tracking values."""
    from torch.fx.experimental import proxy_tensor

    stock = proxy_tensor.disable_proxy_modes_tracing
    if getattr(stock, "_phantora_not_observed", False):
        return

    @contextlib.contextmanager
    def disable_proxy_modes_tracing() -> Iterator[Any]:
        with stock() as modes, _not_observed():
            yield modes

    disable_proxy_modes_tracing._phantora_not_observed = True  # type: ignore[attr-defined]
    proxy_tensor.disable_proxy_modes_tracing = disable_proxy_modes_tracing


def _without_dynamo(dispatch: Any) -> Any:
    """What torch._disable_dynamo does for a mode's __torch_dispatch__ (TorchDispatchMode.
    __init_subclass__ wraps it so): no Dynamo frame callback while it runs. Done here, in
    phantora's own code, because torch's wrappers (torch/_compile.py, torch/_dynamo/eval_frame.py)
    run ~110 instructions of Python per op that the counted host time would charge to the program."""
    set_eval_frame = torch._C._dynamo.eval_frame.set_eval_frame

    def __torch_dispatch__(self: Any, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        prior = set_eval_frame(None)
        try:
            return dispatch(self, func, types, args, kwargs)
        finally:
            set_eval_frame(prior)

    __torch_dispatch__._torchdynamo_disable = True  # as torch marks its disabled functions
    return __torch_dispatch__


# torch's wrapper keeps the method it wraps as __wrapped__ (functools.wraps)
_raw_dispatch = OpObserver.__dict__["__torch_dispatch__"]
OpObserver.__torch_dispatch__ = _without_dynamo(getattr(_raw_dispatch, "__wrapped__", _raw_dispatch))


def _wraps_other_tensors(types: Any) -> bool:
    """Whether a tensor subclass among the op's argument types wraps inner tensors (a traceable
    wrapper subclass, as torch defines it; FakeTensor is not one)."""
    if len(types) == 1 and types[0] is ProgramFakeTensor:  # most ops: the program's tensors only
        return False
    return any(is_traceable_wrapper_subclass_type(t) for t in types)


_COPIES = {aten._to_copy.default, aten.copy_.default, aten._copy_from.default, aten._copy_from_and_resize.default}


def _peer_copy_devices(func: Any, args: tuple, out: Any) -> tuple[int, int] | None:
    """(source, destination) of a copy between two CUDA devices, else None."""
    if func not in _COPIES or not args or not isinstance(args[0], torch.Tensor):
        return None
    if func is aten.copy_.default:
        src, dst = (args[1] if len(args) > 1 else None), args[0]
    elif func is aten._to_copy.default:
        src, dst = args[0], out
    else:
        src, dst = args[0], (args[1] if len(args) > 1 else None)
    if not (isinstance(src, torch.Tensor) and isinstance(dst, torch.Tensor)):
        return None
    if src.device.type != "cuda" or dst.device.type != "cuda" or src.device.index == dst.device.index:
        return None
    return src.device.index or 0, dst.device.index or 0


def _peer_barrier(rt: rt_mod.Runtime, from_device: int, to_device: int, to_stream: int) -> None:
    """`to_device`'s stream waits for `from_device`'s current stream: copy_kernel_cuda puts such
    an event barrier before a peer copy (the source stream waits for the destination's) and
    after it (the destination's current stream waits for the copy), so nothing reads or writes
    either side while it runs."""
    event = rt.new_event_id()
    rt.client.record([P.R_EVENT_RECORD, event, from_device, current_stream_id(from_device)])
    rt.client.record([P.R_EVENT_WAIT, event, to_device, to_stream])


def _is_internal_detach(func: Any) -> bool:
    """An aten.detach that exists only because the tensor is a Python subclass (FakeTensor).

    C++ code that makes a new Variable from an existing TensorImpl (autograd unpacking a saved
    tensor through saved-tensor hooks, as torch.utils.checkpoint does; Tensor.data) calls
    TensorImpl::shallow_copy_and_detach. For a real CUDA tensor that is a C++ copy of the
    metadata, no op (the real H100 profile of examples/gpt_train.py --checkpoint counts ~340
    aten::detach per step); for a FakeTensor torch routes it to __torch_dispatch__ as
    aten.detach (PyInterpreter::detach), and phantora charged each one as a backward view
    op: ~240 extra per step at 12 checkpointed blocks. A detach called as an op always passes
    the ADInplaceOrView kernel, which excludes that key below it; the subclass route skips the
    dispatcher, so the key is not excluded."""
    return func is aten.detach.default and not torch._C._dispatch_tls_is_dispatch_key_excluded(
        torch._C.DispatchKey.ADInplaceOrView)


def _cuda_outputs(out: Any) -> list[tuple[torch.Tensor, int]]:
    """The CUDA tensors among an op's outputs whose storages hold device memory, each with its
    device index (read once: the observer reads devices several times per op). (No output is
    a wrapper subclass such as DTensor: ops on those are left to the subclass, whose ops on its
    inner tensors come through here, see _wraps_other_tensors.)"""
    if isinstance(out, torch.Tensor):
        dev = _device_of(out)
        return [(out, dev.index or 0)] if dev.type == "cuda" else []
    found: list[tuple[torch.Tensor, int]] = []
    if isinstance(out, (tuple, list)):
        for o in out:
            found.extend(_cuda_outputs(o))
    return found


def _first_cuda_device(out: Any) -> int | None:
    outs = _cuda_outputs(out)
    return outs[0][1] if outs else None


def _pinned_checker(rt: rt_mod.Runtime) -> Any:
    def is_pinned(t: torch.Tensor) -> bool:
        return rt.storage_is_pinned(t.untyped_storage())

    return is_pinned


def current_stream_id(device: int) -> int:
    return torch._C._accelerator_getStream(device).stream_id


def _scan(args: tuple, kwargs: dict) -> tuple[bool, bool, bool]:
    """(any fake tensor, any tensor, asks for a cuda device) over the op's arguments."""
    any_fake = any_tensor = False
    for a in args:
        if isinstance(a, torch.Tensor):
            any_tensor = True
            if isinstance(a, FakeTensor):
                any_fake = True
        elif isinstance(a, (list, tuple)):
            for x in a:
                if isinstance(x, torch.Tensor):
                    any_tensor = True
                    if isinstance(x, FakeTensor):
                        any_fake = True
    wants_cuda = False
    for v in kwargs.values():
        if isinstance(v, torch.Tensor):
            any_tensor = True
            if isinstance(v, FakeTensor):
                any_fake = True
        elif isinstance(v, torch.device) and v.type == "cuda":
            wants_cuda = True
        elif isinstance(v, str) and v.startswith("cuda"):
            wants_cuda = True
    return any_fake, any_tensor, wants_cuda


def _make_small_cpu_factory_real(func: Any, args: tuple, kwargs: dict, out: Any) -> Any:
    """A factory (no tensor inputs) that made a 1-element or an integer/bool CPU tensor is redone
    for real.

    Optimizers and GradScaler keep step counters and flags in such tensors and read them back
    with .item(); samplers draw index permutations (randperm) and read them with .tolist(),
    which on a fake tensor cost one placeholder read per element and gave no permutation.
    Integer tensors are real up to values.REAL_CPU_INT_FACTORY_MAX_NUMEL elements. Float CPU
    factories (a model initialised on the CPU) stay fake so they cost no host memory (and
    LayerNorm-sized float parameters must stay fake for FSDP)."""
    if not isinstance(out, FakeTensor) or out.device.type != "cpu":
        return out
    n = out.numel()
    small = n <= 1 or (n <= values.REAL_CPU_INT_FACTORY_MAX_NUMEL and not out.dtype.is_floating_point
                       and not out.dtype.is_complex)
    if not small:
        return out
    with unset_fake_temporarily():
        return func(*args, **kwargs)


def _real_host_copy(func: Any, args: tuple, out: Any) -> Any:
    """A copy from a virtual GPU to the CPU (.cpu(), .to('cpu')) of a tensor with a shadow gives
    a real CPU tensor holding the shadow's data, as the real copy would: the script may hand it
    to code that reads memory (torch.set_rng_state, numpy, pickling)."""
    if func is not aten._to_copy.default or not isinstance(out, FakeTensor) or out.device.type != "cpu":
        return out
    if not (args and isinstance(args[0], FakeTensor) and args[0].device.type == "cuda"):
        return out
    shadow = values.shadow_of(out)
    if shadow is None:
        return out
    if out.requires_grad:
        with unset_fake_temporarily():
            return shadow.detach().requires_grad_(True)
    return shadow


def _device_of(t: torch.Tensor) -> torch.device:
    """t.device, read as FakeTensor.device reads it without its two properties' calls: the
    observer reads devices several times per op."""
    if type(t) is ProgramFakeTensor:
        return _META if t.fake_mode.in_kernel_invocation else t._fake_device
    return t.device


_MAX_REMEMBERED_ENTRIES = 1 << 17


def _holds_cpu_tensor(args: tuple, kwargs: dict) -> bool:
    """Whether the op has a tensor argument off the GPU (whose pinned memory, part of its
    signature, FakeTensorMode's dispatch-cache key does not know)."""
    return any(isinstance(x, torch.Tensor) and _device_of(x).type != "cuda"
               for x in torch.utils._pytree.arg_tree_leaves(*args, **kwargs))


def _tensor_key(t: torch.Tensor, rt: rt_mod.Runtime) -> tuple:
    dev = _device_of(t)
    pinned = dev.type == "cpu" and rt.storage_is_pinned(t.untyped_storage())
    return (t.shape, t.dtype, t.stride(), dev, pinned)  # torch.Size hashes and compares as a tuple


def _signature_key(func: Any, args: tuple, kwargs: dict, rt: rt_mod.Runtime) -> tuple[tuple, int]:
    """A hashable key equal for calls with equal signatures, and the op's CUDA device (-1: none).

    Float scalars are left out so that, e.g., a changing learning rate does not create a new
    signature every step (they do not change kernel times)."""
    positional, device = _sequence_key(args, -1, rt)
    parts: list[Any] = [func, *positional]
    for k, v in kwargs.items():
        if isinstance(v, torch.Tensor):
            key = _tensor_key(v, rt)
            parts.append((k, key))
            if device < 0 and key[3].type == "cuda":
                device = key[3].index or 0
        elif isinstance(v, float):
            parts.append((k, float))
        elif isinstance(v, (list, tuple)):
            # an `out=` list (FSDP2's split_with_sizes_copy): its tensors by signature, never
            # the tensors themselves, which rt.sig_ids would keep alive for the whole run
            sub, device = _sequence_key(v, device, rt)
            parts.append((k, sub))
        else:
            if device < 0 and isinstance(v, torch.device) and v.type == "cuda":
                device = v.index if v.index is not None else torch._C._accelerator_getDeviceIndex()
            parts.append((k, v))
    return tuple(parts), device


def _sequence_key(a: list | tuple, device: int, rt: rt_mod.Runtime) -> tuple[tuple, int]:
    """_signature_key's part for a sequence of arguments (the positional ones, a list argument),
    and the op's device updated from it. Nested lists and tuples (FSDP2's split sizes, a
    flex-attention BlockMask) are keyed the same way, so that no tensor itself ends up in the key."""
    sub = []
    for x in a:
        if isinstance(x, torch.Tensor):
            key = _tensor_key(x, rt)
            sub.append(key)
            if device < 0 and key[3].type == "cuda":
                device = key[3].index or 0
        elif isinstance(x, float):
            sub.append(float)
        elif isinstance(x, (list, tuple)):
            part, device = _sequence_key(x, device, rt)
            sub.append(part)
        else:
            sub.append(x)
    return tuple(sub), device


# --- ops answered here ----------------------------------------------------------------------
def _local_scalar_dense(obs: OpObserver, func: Any, args: tuple, kwargs: dict) -> Any:
    """t.item(): a virtual tensor, or a subclass wrapping one (DTensor), reads its value
    (interpose/values/policy.py); a wrapper is asked here, before its own dispatch would reach
    FakeTensor's DataDependentOutputException."""
    t = args[0]
    if not values.is_virtual(t):
        with unset_fake_temporarily():
            return func(*args, **kwargs)
    if obs.rt.capturing and t.device.type == "cuda":
        device = t.device.index or 0
        cuda_graphs.check_sync_allowed("reading a value (.item(), float(t), bool(t))", device,
                                       current_stream_id(device))
    obs._report(func, args, kwargs, None)
    return values.scalar_value(t)


def _is_nonzero(obs: OpObserver, func: Any, args: tuple, kwargs: dict) -> Any:
    """bool(t): FakeTensorMode would decompose it into .item() below this mode."""
    t = args[0]
    if not values.is_virtual(t):
        with unset_fake_temporarily():
            return func(*args, **kwargs)
    obs._report(aten._local_scalar_dense.default, (t,), {}, None)
    return bool(values.scalar_value(t))


def _equal(obs: OpObserver, func: Any, args: tuple, kwargs: dict) -> Any:
    """torch.equal reads data: real tensors compare for real, virtual ones read as equal."""
    if not any(values.is_virtual(a) for a in args):
        with unset_fake_temporarily():
            return func(*args, **kwargs)
    obs._report(func, args, kwargs, None)
    if tuple(args[0].shape) != tuple(args[1].shape):
        return False
    shadows = [values.shadow_of(a) if values.is_virtual(a) else a for a in args[:2]]
    if all(s is not None for s in shadows):  # both hold real data (a shadow or a real tensor)
        with unset_fake_temporarily():
            return func(*shadows)
    return True


def _pin_memory(obs: OpObserver, func: Any, args: tuple, kwargs: dict) -> Any:
    t = args[0]
    if _is_fake(t):
        out = aten.clone.default(t)  # page-locked copy of the data; fake, so free
    else:
        with unset_fake_temporarily():
            out = func(*args, **kwargs)
    obs.rt.mark_pinned(out.untyped_storage())
    obs._report(func, args, kwargs, out)
    return out


def _is_pinned(obs: OpObserver, func: Any, args: tuple, kwargs: dict) -> Any:
    t = args[0]
    return t.device.type == "cpu" and obs.rt.storage_is_pinned(t.untyped_storage())


def _record_stream(obs: OpObserver, func: Any, args: tuple, kwargs: dict) -> Any:
    # Tensor.record_stream delays the reuse of a block until the other stream's work is done;
    # the allocator model treats such frees as immediate (documented in phantora/engine/memory.py).
    return None


def install_storage_resize(rt: rt_mod.Runtime) -> None:
    """UntypedStorage.resize_ is no aten op (a fake tensor's meta storage is resized in place
    without dispatch), so the observer never sees it; wrap it to keep the allocator model's
    block in step with the storage's size."""
    resize = torch.UntypedStorage.resize_

    def resize_(self: torch.UntypedStorage, size: int) -> torch.UntypedStorage:
        out = resize(self, size)
        try:
            rt.resize_storage(self, current_stream_id)
        except OutOfMemory as e:
            raise torch.OutOfMemoryError(str(e)) from None
        return out

    resize_.__doc__ = resize.__doc__
    torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]


_SPECIAL = {
    aten._local_scalar_dense.default: _local_scalar_dense,
    aten.is_nonzero.default: _is_nonzero,
    aten.equal.default: _equal,
    aten._pin_memory.default: _pin_memory,
    aten.is_pinned.default: _is_pinned,
    aten.record_stream.default: _record_stream,
}
_SPECIAL.update(data_dependent.data_dependent_handlers())
_SPECIAL.update(routing.routing_handlers())
