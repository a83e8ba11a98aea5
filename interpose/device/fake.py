"""FakeTensorMode set up for whole-program use on virtual CUDA devices, with the fixes stock
FakeTensor needs for that (each one is a trap documented in notes/torch-interposition.md).
"""

from __future__ import annotations

import builtins
import threading
import types
import warnings
from typing import Any

import torch
from torch._subclasses import fake_tensor as _ft
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from interpose.values import policy as values


class VirtualCudaFakeMode(FakeTensorMode):
    """FakeTensorMode that never initialises a real device.

    Once torch.cuda.is_available() says True, FakeTensorMode would run real CUDA kernels for
    constant propagation (avoid_device_init flips to False); there is no CUDA here."""

    @property
    def avoid_device_init(self) -> bool:  # type: ignore[override]
        return True

    # While a fake kernel runs, FakeTensor.device reads "meta" (in_kernel_invocation). Stock
    # FakeTensorMode keeps that flag on the mode, shared by all threads, so a thread reading a
    # tensor's device while another ran an op saw "meta" (nn.DataParallel's replica threads:
    # Transformers' mask code's `.to(result.device)` moved the mask to meta, at random). The
    # flag belongs to the thread running the kernel, as the meta dispatch key it goes with is.
    @property
    def in_kernel_invocation(self) -> bool:  # type: ignore[override]
        # read at every FakeTensor.device: the plain lookup, not a call
        flag = self.__dict__.get("_phantora_kernel_flag")
        return flag is not None and flag.active

    @in_kernel_invocation.setter
    def in_kernel_invocation(self, active: bool) -> None:
        self._kernel_flag().active = active

    def __deepcopy__(self, memo: dict) -> "VirtualCudaFakeMode":
        # The one mode of the process, not state of a tensor: a deepcopied FakeTensor (Lightning's
        # ModelCheckpoint copies the model's state) keeps it, as stock FakeTensorMode's copy would
        # have shared everything but the thread-local flag, which cannot be copied.
        memo[id(self)] = self
        return self

    def _kernel_flag(self) -> "_KernelFlag":
        flag = self.__dict__.get("_phantora_kernel_flag")
        if flag is None:
            flag = self.__dict__.setdefault("_phantora_kernel_flag", _KernelFlag())
        return flag

    # FakeTensorMode reuses an op's outputs when the op, its scalars and its tensors' metadata
    # repeat (its dispatch cache), so a steady training step never runs a fake kernel; what it
    # still pays per op is the cache key. Stock builds it per tensor as a TensorMetadata dataclass
    # (suggest_memory_format, the sparse checks, a field-by-field flatten): about a fifth of a
    # GPT step's CPU under phantora. For the plain strided tensors of this mode the same facts go
    # into the key as one tuple: everything TensorMetadata holds for such a tensor, less
    # memory_format, which its shape and strides decide. Anything else (sparse, symbolic,
    # constants, another mode's tensors, torch.Size, dicts) takes the stock path, and a key of
    # this form never equals a stock one (the marker), so the class-wide cache stays sound.
    def _prep_args_for_hash(self, result: list, args: Any, state: Any, id_hashed_objects: list) -> None:
        if type(args) is not list and type(args) is not tuple:
            return super()._prep_args_for_hash(result, args, state, id_hashed_objects)
        result.append(type(args))
        result.append(f"length_{len(args)}")
        for arg in args:
            cls = type(arg)
            if cls in _KEYED_AS_VALUES:  # as stock keys a scalar: 1 and 1.0 give different dtypes
                result.append(cls)
                result.append(arg)
            elif (cls is ProgramFakeTensor and arg.fake_mode is self and arg.constant is None
                  and arg.layout == torch.strided and not arg._has_symbolic_sizes_strides):
                result.append(_STRIDED_TENSOR)
                result.append((arg.dtype, arg.shape, arg.stride(), arg.fake_device, arg.storage_offset(),
                               arg.untyped_storage().nbytes(), arg.requires_grad, arg.is_quantized, arg.is_conj(),
                               arg.is_neg(), arg.is_inference()))
            else:
                super()._prep_args_for_hash(result, iter((arg,)), state, id_hashed_objects)

    # Which cache entry answered an op the observer runs (CacheHitWatch): the first key made after
    # the observer's call is its op's (nothing runs before it on FakeTensorMode's dispatch), a
    # miss or bypass goes on to _dispatch_impl before any op inside it, and a hit builds its
    # outputs from the entry before anything else runs.
    def _cache_key(self, state: Any, func: Any, args: Any, kwargs: Any) -> Any:
        watch = cache_hit_watch
        if watch.func is not None:
            watch.armed = func is watch.func
            watch.func = None
        return super()._cache_key(state, func, args, kwargs)

    def _dispatch_impl(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        cache_hit_watch.armed = False
        return super()._dispatch_impl(func, types, args, kwargs)

    def _output_from_cache_entry(self, state: Any, entry: Any, key: Any, func: Any, args: Any) -> Any:
        watch = cache_hit_watch
        if watch.armed:
            watch.armed = False
            watch.entry = entry
        return super()._output_from_cache_entry(state, entry, key, func, args)

    # A dispatch-cache hit still builds each output: stock does it through a generator context
    # manager (in_kernel_invocation_manager), a generator per shape and stride, and FakeTensor's
    # general __new__ (argument checks, device normalisation, five memo descriptors): about a
    # fifth of a GPT step's CPU under phantora. For the plain outputs of this mode (no shape
    # environment, strided, not conjugate or negative, a device with its index) the same tensor is
    # made here with the same guards entered directly, and its Python attributes copied from one
    # stock-built tensor of this mode (`_stock_attributes`), so they are whatever this torch's
    # FakeTensor.__new__ sets. Anything else takes the stock path.
    def _get_output_tensor_from_cache_entry(self, state: Any, entry: Any, key: Any, func: Any,
                                            args: Any) -> Any:
        metadata = entry.metadata
        if (entry.inplace_idx is not None or metadata is None or self.shape_env is not None
                or metadata.layout is not torch.strided or metadata.is_conj or metadata.is_neg
                or metadata.is_sparse or _ft.FakeTensorConfig.debug):
            return super()._get_output_tensor_from_cache_entry(state, entry, key, func, args)
        device = metadata.device
        attributes = self._stock_attributes()
        if attributes is None or (device.type == "cuda" and device.index is None):
            return super()._get_output_tensor_from_cache_entry(state, entry, key, func, args)
        storage = None
        if isinstance(func, torch._ops.OpOverload) and func.is_view:  # the input's storage, as stock
            view_arg = args[entry.view_idx]
            if not isinstance(view_arg, FakeTensor):
                raise AssertionError("view_arg must be a FakeTensor")
            storage = view_arg.untyped_storage()
        flag = self._kernel_flag()
        prior = flag.active
        with torch._C._DisableTorchDispatch():  # in_kernel_invocation_manager, without its generator
            flag.active = True
            with torch._C._PreserveDispatchKeyGuard():
                torch._C._set_meta_in_tls_dispatch_include(True)
                try:
                    empty = torch.empty_strided(metadata.shape, metadata.stride, dtype=metadata.dtype,
                                                layout=metadata.layout, device="meta",
                                                requires_grad=metadata.requires_grad)
                    if storage is not None:
                        empty.set_(storage, metadata.storage_offset, metadata.shape, metadata.stride)
                finally:
                    flag.active = prior
        out = torch.Tensor._make_subclass(ProgramFakeTensor, empty, empty.requires_grad, dispatch_device=True,
                                          device_for_backend_keys=device)
        if not self._allow_unsafe_data_ptr_access:
            torch._C._set_throw_on_mutable_data_ptr(out)
        else:
            torch._C._set_warn_deprecated_on_mutable_data_ptr(out)
        out.__dict__.update(attributes)
        out._fake_device = device
        return out

    def _stock_attributes(self) -> dict | None:
        """The Python attributes FakeTensor.__new__ gives a tensor of this mode (its fake device
        aside), read once from a tensor it made; None where they are not plain values (then the
        fast output path is not used)."""
        attributes = self.__dict__.get("_phantora_stock_attributes", False)
        if attributes is not False:
            return attributes
        with torch._C._DisableTorchDispatch():
            elem = torch.empty(0, device="meta")
        sample = _stock_fake_new(ProgramFakeTensor, self, elem, torch.device("cpu"))
        attributes = dict(sample.__dict__)
        if (attributes.pop("_fake_device", None) != torch.device("cpu") or attributes.get("fake_mode") is not self
                or any(v is not None for k, v in attributes.items() if k != "fake_mode")):
            attributes = None
        self.__dict__["_phantora_stock_attributes"] = attributes
        return attributes


# VirtualCudaFakeMode's own versions of FakeTensorMode's per-op methods (faster ones giving the
# same results, and the cache-hit watch): benchmarks/bench_pipeline.py compares phantora against
# FakeTensorMode with the stock ones.
PER_OP_OVERRIDES = ("_prep_args_for_hash", "_get_output_tensor_from_cache_entry", "_cache_key", "_dispatch_impl",
                    "_output_from_cache_entry")


class CacheHitWatch(threading.local):
    """The dispatch-cache entry that answered the op the observer runs on this thread, if the
    cache answered it: `watch(func)` before calling it, `take()` after. One entry always gives the
    same op on the same metadata, so the observer reuses what it derived from it
    (interpose/ops/observer.py)."""

    func: Any = None
    armed = False
    entry: Any = None

    def watch(self, func: Any) -> None:
        self.func, self.armed, self.entry = func, False, None

    def take(self) -> Any:
        entry = self.entry
        self.func, self.armed, self.entry = None, False, None
        return entry


cache_hit_watch = CacheHitWatch()


class _KernelFlag(threading.local):
    """Whether this thread is running a fake kernel (VirtualCudaFakeMode.in_kernel_invocation)."""

    active = False


class _StridedTensorKey:
    """Marks a dispatch-cache key entry made by VirtualCudaFakeMode._prep_args_for_hash."""

    def __repr__(self) -> str:
        return "<phantora strided tensor>"


_STRIDED_TENSOR = _StridedTensorKey()
# Argument types whose value is the key (stock FakeTensorMode keys them by type and value too)
_KEYED_AS_VALUES = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                              torch.memory_format})


def _from_meta_and_device(self: Any, fake_mode: Any, t: torch.Tensor, device: torch.device,
                          pytype: Any = None, dispatch_keys: Any = None) -> FakeTensor:
    # Stock code memoizes these outputs in a WeakValueDictionary; the weakref it leaves on the
    # tensor makes Module.cuda()/.to() fail intermittently ("Couldn't swap ... has weakref").
    return FakeTensor(fake_mode, t, device, pytype=pytype, dispatch_keys=dispatch_keys)


_tensor_data = torch._C.TensorBase.data


def _get_data(self: torch.Tensor) -> torch.Tensor:
    return _tensor_data.__get__(self)


def _set_data(self: torch.Tensor, new: torch.Tensor) -> None:
    # `param.data = fake_cuda_tensor` (FSDP2's _move_states_to_device) swaps the TensorImpl but
    # would leave the FakeTensor's Python-side fake_device at its old value.
    _tensor_data.__set__(self, new)
    if isinstance(self, FakeTensor) and isinstance(new, FakeTensor):
        self.fake_device = new.fake_device


# --- the class a program's tensors have ---------------------------------------------------------
#
# On a GPU a program's tensors are plain: `type(t) == torch.Tensor`. Frameworks choose paths with
# that test: Transformer Engine offers its fused attention backends (cuDNN, FlashAttention 3) only
# when `type(q) in (torch.Tensor, Float8Tensor, ...)` (dot_product_attention/utils.py), and falls
# back to its unfused attention (two batched GEMMs around a softmax over [b, h, s, s] scores)
# otherwise; its CPU offload and Megatron's CUDA graphs test the same way. Under phantora the class
# is FakeTensor, so every such test took the path of a tensor subclass. The program's tensors (those
# of phantora's mode, not the FakeTensors torch.compile makes for itself) are instances of a
# FakeTensor subclass whose class compares equal (==, and so `in` a list or tuple) to torch.Tensor.
# `is` still tells them apart. It also compares equal to FakeTensor and hashes as FakeTensor, so a
# dict or set keyed by class (Dynamo's type dispatch, pytree, singledispatch, copyreg) finds
# FakeTensor's entry, as it did before the subclass existed. A parameter of the program is such a
# tensor marked `_is_param` (nn.Parameter of a tensor subclass), so its class compares equal to
# torch.Tensor too, where a GPU's is nn.Parameter; isinstance(p, nn.Parameter) holds on both.


class _ComparesAsTensor(type(FakeTensor)):  # type: ignore[misc]
    def __eq__(cls, other: object) -> bool:
        return cls is other or other is torch.Tensor or other is FakeTensor

    def __ne__(cls, other: object) -> bool:
        return not _ComparesAsTensor.__eq__(cls, other)

    def __hash__(cls) -> int:
        return hash(FakeTensor)


class ProgramFakeTensor(FakeTensor, metaclass=_ComparesAsTensor):
    """A FakeTensor of phantora's mode: the tensors the program holds."""

    __slots__ = ()

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        # A wrapper subclass may call its inner data's __torch_dispatch__ itself, with its own
        # `types` (Transformer Engine's Float8Tensor slices its `_data` so). On a GPU that data is
        # a plain tensor, whose __torch_dispatch__ runs the op; FakeTensor's would answer
        # NotImplemented. The dispatcher passes only types some argument has, so a type no
        # argument has marks such a call.
        if _called_directly(types, args, kwargs):
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)


def _called_directly(types: Any, args: tuple, kwargs: dict | None) -> bool:
    foreign = [t for t in types if not issubclass(t, FakeTensor) and t is not torch.Tensor]
    if not foreign:  # the dispatcher's usual call: no leaf to look at
        return False
    leaves = torch.utils._pytree.arg_tree_leaves(*args, **(kwargs or {}))
    return any(not any(isinstance(x, t) for x in leaves) for t in foreign)


ProgramFakeTensor.__name__ = ProgramFakeTensor.__qualname__ = "FakeTensor"
_stock_fake_new = FakeTensor.__new__


def _fake_tensor_new(cls: type, fake_mode: Any, *args: Any, **kwargs: Any) -> FakeTensor:
    # Every FakeTensor is made by FakeTensor(mode, ...) (fake_tensor.py, fake_impls.py); the mode
    # tells the program's tensors from torch.compile's.
    if cls is FakeTensor and isinstance(fake_mode, VirtualCudaFakeMode):
        cls = ProgramFakeTensor
    return _stock_fake_new(cls, fake_mode, *args, **kwargs)


# --- Module.to() / .cuda() / .half(): the path real device tensors take ------------------------
#
# On a real GPU, `module.to("cuda")` converts each parameter with `param.data = converted` (and
# `param.grad.data = ...`): the Parameter objects stay the same, so an optimizer built earlier,
# attributes set on a parameter, and weakrefs / weakref.finalize on it (DeepSpeed puts one on
# every parameter) all keep working. torch's Module._apply sends FakeTensor parameters down
# `torch.utils.swap_tensors` instead, because a stock FakeTensor's `.data =` would keep its old
# fake_device; swap_tensors refuses any tensor with a weakref ("Couldn't swap Linear.weight"), and
# where it succeeds it also trades the parameter's __dict__ away. phantora's `.data` setter
# (`_set_data`) carries fake_device, so its FakeTensors take the real-tensor path.

_orig_compatible_shallow_copy = torch._has_compatible_shallow_copy_type


def _has_compatible_shallow_copy_type(input: torch.Tensor, from_: torch.Tensor) -> bool:
    """`input.data = from_` is only sound between two FakeTensors or two plain tensors: a plain
    Tensor object holding a FakeTensor's TensorImpl would dispatch as a plain tensor. A real CPU
    parameter (`nn.Parameter(torch.from_numpy(a))`) moved to a virtual GPU therefore becomes a new
    Parameter, as torch does for any FakeTensor result of a real parameter."""
    if isinstance(input, FakeTensor) != isinstance(from_, FakeTensor):
        return False
    return _orig_compatible_shallow_copy(input, from_)


class _NoTensorIsThis:
    """Stands for FakeTensor in torch's Module._apply: no tensor is an instance of it."""


class _FakeTensorModuleSeenFromApply:
    """torch._subclasses.fake_tensor as Module._apply imports it: FakeTensor is _NoTensorIsThis."""

    FakeTensor = _NoTensorIsThis

    def __init__(self, module: Any) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


def _import_for_module_apply(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (),
                             level: int = 0) -> Any:
    module = builtins.__import__(name, globals, locals, fromlist, level)
    if name == "torch._subclasses.fake_tensor" and fromlist and "FakeTensor" in fromlist:
        return _FakeTensorModuleSeenFromApply(module)
    return module


def _module_apply_as_for_device_tensors() -> Any:
    """torch's own Module._apply (whatever this torch version's is), with its FakeTensor special
    cases off: `_apply` imports FakeTensor inside the function, so a copy of the function whose
    builtins resolve that import to _NoTensorIsThis decides set_data / swap / overwrite exactly as
    for real device tensors (the __future__ flags included). The copy keeps the module's live
    globals; a function's builtins are fixed when it is created, hence the brief swap."""
    original = torch.nn.Module._apply
    module_globals = original.__globals__
    saved = module_globals["__builtins__"]
    module_globals["__builtins__"] = dict(vars(builtins), __import__=_import_for_module_apply)
    try:
        clone = types.FunctionType(original.__code__, module_globals, original.__name__,
                                   original.__defaults__, original.__closure__)
    finally:
        module_globals["__builtins__"] = saved
    clone.__qualname__ = original.__qualname__
    clone.__doc__ = original.__doc__
    clone.__kwdefaults__ = original.__kwdefaults__
    return clone


def _install_module_conversion() -> None:
    torch._has_compatible_shallow_copy_type = _has_compatible_shallow_copy_type
    torch.nn.Module._apply = _module_apply_as_for_device_tensors()  # type: ignore[method-assign]


def _fake_tolist(self: torch.Tensor) -> Any:
    if values.is_virtual(self):  # a FakeTensor, or a DTensor around one
        self.item() if self.numel() == 1 else torch.ops.aten._local_scalar_dense.default(self.reshape(-1)[0])
        return values.tolist_value(self)
    return _orig_tolist(self)


def _fake_format(self: torch.Tensor, spec: str) -> str:
    if values.is_virtual(self) and self.dim() == 0:
        return format(self.item(), spec)
    return _orig_format(self, spec)


def _fake_repr(self: torch.Tensor, *, tensor_contents: Any = None) -> str:
    """print(t) on a virtual GPU tensor: torch's layout, and a plain statement that no data exists."""
    parts = [f"size={tuple(self.shape)}", f"dtype={self.dtype}"]
    if self.device.type != "cpu":
        parts.append(f"device='{self.device}'")
    if self.grad_fn is not None:
        parts.append(f"grad_fn=<{type(self.grad_fn).__name__}>")
    elif self.requires_grad:
        parts.append("requires_grad=True")
    return f"tensor(<no data: virtual>, {', '.join(parts)})"


def _fake_numpy(self: torch.Tensor, *, force: bool = False) -> Any:
    if isinstance(self, FakeTensor):
        import numpy as np

        if self.device.type != "cpu" and not force:
            raise TypeError(
                f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to copy "
                "the tensor to host memory first."
            )
        shadow = values.shadow_of(self)
        if shadow is not None:  # real data (copied from the CPU, or a counter computed from it)
            with _ft.unset_fake_temporarily():
                return _orig_numpy(shadow.detach(), force=True).copy()
        return np.full(tuple(self.shape), values.value_of(self), dtype=_np_dtype(self.dtype))
    return _orig_numpy(self, force=force)


def _np_dtype(dtype: torch.dtype) -> Any:
    import numpy as np

    table = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16,
             torch.int64: np.int64, torch.int32: np.int32, torch.int16: np.int16, torch.int8: np.int8,
             torch.uint8: np.uint8, torch.bool: np.bool_, torch.complex64: np.complex64,
             torch.complex128: np.complex128}
    if dtype not in table:
        raise TypeError(f"Got unsupported ScalarType {str(dtype).removeprefix('torch.')}")
    return table[dtype]


_orig_conv_memory_format = torch._C._conv_determine_backend_memory_format


def _cudnn_conv_memory_format(input: torch.Tensor, weight: torch.Tensor, backend: Any) -> torch.memory_format:
    """The layout of a convolution's output (and of convolution_backward's grad_input and
    grad_weight) on a virtual GPU: what cuDNN picks on a real one.

    FakeTensor's conv asks torch._C._select_conv_backend for the backend; without cuDNN compiled
    in (CPU build; the shim's CUDA hooks on a CUDA build) it answers the slow im2col path, whose
    outputs are NCHW. A real GPU runs the conv on cuDNN, which keeps channels-last tensors
    channels-last (ATen's cudnn_conv_suggest_memory_format). Without this a channels_last
    ResNet turned NCHW after its first conv, and every later conv was costed with two layout
    transposes that the real H100 profile of examples/cnn_train.py does not have.
    """
    fake_device = getattr(input, "fake_device", input.device)
    if fake_device.type != "cuda" or not torch.backends.cudnn.enabled:
        return _orig_conv_memory_format(input, weight, backend)
    # cuDNN keeps NCHW for float64 (ATen: "disable NHWC for float64 input").
    if input.dtype == torch.float64 or weight.dtype == torch.float64:
        return torch.contiguous_format
    from torch._prims_common import suggest_memory_format

    formats = (suggest_memory_format(input), suggest_memory_format(weight))
    if weight.dim() == 4 and torch.channels_last in formats:
        return torch.channels_last
    if weight.dim() == 5 and torch.channels_last_3d in formats:
        return torch.channels_last_3d
    return torch.contiguous_format


_orig_tolist = torch.Tensor.tolist
_orig_format = torch.Tensor.__format__
_orig_numpy = torch.Tensor.numpy
_orig_save = torch.save


def _to_meta_for_save(obj: Any) -> Any:
    """torch.save cannot pickle FakeTensors; a virtual GPU has no data to save anyway. Saving
    writes the same structure with tensors on the meta device (shapes, dtypes, no data), so
    checkpointing code runs and the file loads back."""
    from torch.utils._pytree import tree_map

    def conv(x: Any) -> Any:
        if isinstance(x, FakeTensor):
            with _ft.unset_fake_temporarily():
                m = torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype, device="meta")
            if isinstance(x, torch.nn.Parameter):
                return torch.nn.Parameter(m, requires_grad=x.requires_grad)
            return m
        return x

    return tree_map(conv, obj)


def _save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
    obj = _to_meta_for_save(obj)
    with _ft.unset_fake_temporarily():
        _orig_save(obj, f, *args, **kwargs)


def _count_fake_tensors_as_foreach_capable() -> None:
    """Let optimizers and clip_grad_norm_ take their foreach paths on virtual GPU tensors.

    torch picks the foreach (multi-tensor) implementation only when `type(t)` is exactly
    torch.Tensor / nn.Parameter (torch/utils/_foreach_utils.py, torch/optim/optimizer.py);
    a FakeTensor fails that test, so clip_grad_norm_ ran one linalg_vector_norm and one mul_
    per parameter and `foreach=None` optimizers ran their per-parameter loops. The real H100
    profile of examples/gpt_train.py has one _foreach_norm and one _foreach_mul_ per step
    (tests/data/groundtruth/examples/profile_*.json), so on a virtual GPU the plain tensors
    a FakeTensor stands for must pass too. DTensor registers itself the same way."""
    from torch.optim import optimizer
    from torch.utils import _foreach_utils

    for supported in (_foreach_utils._foreach_supported_types, optimizer._foreach_supported_types):
        if FakeTensor not in supported:
            supported.append(FakeTensor)


# Ops with a CUDA kernel in a CUDA build of torch and only a CompositeImplicitAutograd one in the
# CPU build. Without a CUDA kernel the dispatcher decomposes them under autograd, so a virtual GPU
# on the CPU build would save the decomposition's tensors for backward (nn.RMSNorm: the input in
# fp32 and three more, 5x the bytes) instead of the op's own (the bf16 input and rstd), and run
# its ops instead of the one kernel.
_CUDA_ONLY_KERNELS = ("_fused_rms_norm", "_fused_rms_norm_backward")
_cuda_kernels: list[Any] = []  # keeps the torch.library registrations alive


def _register_cuda_kernels_of_fused_ops() -> None:
    lib = torch.library.Library("aten", "IMPL")
    for name in _CUDA_ONLY_KERNELS:
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "CUDA"):
            lib.impl(name, _cuda_kernel_placeholder(name), "CUDA")
    _cuda_kernels.append(lib)


def _cuda_kernel_placeholder(name: str) -> Any:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        # FakeTensorMode answers these ops before the CUDA key; only a tensor that escaped it gets here.
        raise RuntimeError(f"phantora: aten::{name} reached its CUDA kernel outside the virtual GPU")

    return kernel


def _quiet_data_ptr_warning() -> None:
    # torch's Tensor.__deepcopy__ asks data_ptr() of every tensor that is not a plain Tensor, and
    # a virtual tensor is a FakeTensor: deepcopy of one (Lightning's ModelCheckpoint deep-copies
    # the logged metrics) printed a FakeTensor deprecation warning that a GPU run never prints.
    warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor is deprecated",
                            category=UserWarning)


def install_fake_fixes() -> None:
    _quiet_data_ptr_warning()
    _count_fake_tensors_as_foreach_capable()
    _register_cuda_kernels_of_fused_ops()
    _ft.FakeTensorConverter.from_meta_and_device = _from_meta_and_device
    FakeTensor.__new__ = staticmethod(_fake_tensor_new)  # type: ignore[assignment]
    # Every FakeTensorMode of the process, not only phantora's: torch.compile makes its own
    # (Dynamo, AOTAutograd, Inductor's pattern matcher), and one that believes CUDA is there
    # constant-folds `torch.tensor(..., device="cuda")` with a real CUDA kernel.
    FakeTensorMode.avoid_device_init = property(lambda self: True)  # type: ignore[assignment]
    FakeTensor.data = property(_get_data, _set_data)  # type: ignore[assignment]
    _install_module_conversion()
    FakeTensor.__repr__ = _fake_repr  # type: ignore[method-assign]
    FakeTensor.__str__ = _fake_repr  # type: ignore[method-assign]
    torch.Tensor.tolist = _fake_tolist  # type: ignore[method-assign]
    # FakeTensor defines its own tolist (an .item() per element, each a D2H copy and sync); a real
    # tensor's .tolist() is one copy of the whole tensor.
    FakeTensor.tolist = _fake_tolist  # type: ignore[method-assign]
    torch.Tensor.__format__ = _fake_format  # type: ignore[method-assign]
    torch.Tensor.numpy = _fake_numpy  # type: ignore[method-assign]
    torch.save = _save
    torch._C._conv_determine_backend_memory_format = _cudnn_conv_memory_format


def make_fake_mode() -> VirtualCudaFakeMode:
    return VirtualCudaFakeMode(allow_non_fake_inputs=True)
