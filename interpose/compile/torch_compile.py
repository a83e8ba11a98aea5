"""torch.compile on virtual GPUs: Dynamo, AOTAutograd and Inductor compile the user's code as on
a GPU machine, and the compiled code runs on virtual tensors, launching the kernels Inductor
decided on.

* The op observer declares `ignore_compile_internals`: Dynamo traces frames while it is on the
  mode stack, compiles with every dispatch mode off (its own fake tensors, no op reported), and
  the compiled artifact runs with the modes back on.
* Inductor generates its code for the simulated GPU: Dynamo's CUDA device interface and Triton's
  driver answer for the virtual GPU (its compute capability, SM count, shared memory), so the
  choices Inductor makes from them (block sizes, split reductions, persistent reductions) are
  the ones it makes on that GPU. Nothing is compiled for a GPU and nothing is autotuned.
* What the compiled code runs is Inductor's generated wrapper: its buffer allocations and extern
  kernels (GEMMs, attention, convolutions) are aten ops the observer reports as for eager code;
  each generated Triton kernel is reported as one fused kernel (interpose/compile/compiled_kernels.py).
  Triton kernels the program launches itself (`kernel[grid](...)`) reach the virtual driver's
  launcher, one kernel per launch (interpose/compile/user_kernels.py).
  Ops of compiled code carry OP_COMPILED: they pay the launch, not the eager Python around ops.
* Compilation is host work done once: while it runs, the program's clock stands still (Dynamo
  times itself; none of it is the simulated program's time) and at its end the host is charged
  the modelled compile time (phantora/cost/host.py), shown as one `torch.compile` host slice.
* A backend phantora cannot see inside (a custom `backend=` callable) is refused with one line
  that says why, rather than silently running its (real CUDA) code or eager ops.
* Inductor needs Triton to generate its CUDA code, on either torch build (the CPU wheel does not
  bring it; phantora's install does, and no GPU is needed). Where Triton cannot be imported, the
  Inductor backend is refused at the call, never run as eager ops.
* Compile-time fake tensors see no real GPU (interpose/device/fake.py: avoid_device_init), so a
  `torch.tensor(..., device="cuda")` in traced code becomes a host constant lifted and then moved
  to the device, where a GPU machine lifts a device constant. Inductor folds one-element
  constants into `full` either way; here the fold replaces the move and leaves the lift unused,
  which a flex_attention mask's subgraph could not lower, so that lift is dropped: Inductor then
  lowers the graph a GPU machine lowers.
"""

from __future__ import annotations

import sys
import types
from typing import Any, Callable

import torch

from interpose.on_import import patch_when_imported

from phantora import protocol as P

# Backends whose compiled code phantora runs: Inductor's (its kernels are simulated), and
# torch's own debugging backends that run the captured graph's aten ops (reported one by one).
SIMULATED_BACKENDS = frozenset({"inductor", "eager", "aot_eager", "aot_eager_default_partitioner",
                                "aot_eager_decomp_partition", "cudagraphs"})


class UnsupportedBackend(RuntimeError):
    pass


class TritonMissing(UnsupportedBackend):
    pass


NO_TRITON = ("phantora: torch.compile's Inductor backend generates Triton kernels, which phantora simulates, and "
             "this Python cannot import Triton ({why}); install it (`pip install 'triton>=3.7'`; phantora's own "
             "install brings it, the CPU build of torch does not), or compile with backend='aot_eager' to run the "
             "captured graphs as eager aten ops")
_pending_warnings: list[str] = []  # said before the process became a rank (sent at its first compiled run)


def _point_dynamo_at_virtual_cuda() -> None:
    """Dynamo's CUDA device interface bound torch.cuda's functions when torch._dynamo was
    imported (before phantora replaced them): rebind them to the virtual GPU's."""
    from torch._dynamo import device_interface as di

    cuda = torch.cuda
    iface = di.CudaInterface
    for name in ("current_device", "set_device", "device_count", "stream", "current_stream", "set_stream",
                 "synchronize", "get_device_properties", "is_bf16_supported"):
        setattr(iface, name, staticmethod(getattr(cuda, name)))
    iface.exchange_device = staticmethod(cuda._exchange_device)
    iface.maybe_exchange_device = staticmethod(cuda._maybe_exchange_device)
    iface.get_raw_stream = staticmethod(_raw_stream)
    iface.Event = cuda.Event
    iface.Stream = cuda.Stream


def _raw_stream(device: int = 0) -> int:
    """What generated code passes as `stream=`: phantora's id of the device's current stream."""
    return torch._C._accelerator_getStream(device).stream_id


def _empty_strided_cuda(size: Any, stride: Any, dtype: torch.dtype) -> torch.Tensor:
    """Inductor's buffer allocation (torch._C._dynamo.guards._empty_strided_cuda calls the CUDA
    allocator directly, beside dispatch): a virtual tensor on the current device, allocated
    through the observer like every other."""
    return torch.empty_strided(size, stride, dtype=dtype,
                               device=torch.device("cuda", torch._C._accelerator_getDeviceIndex()))


def _reinterpret_tensor(base: torch.Tensor, size: Any, stride: Any, offset_increment: int = 0) -> torch.Tensor:
    """Inductor's view of a buffer with another size and stride (a C++ helper that makes the
    view beside dispatch, which on a virtual tensor loses its device): the same view, made by
    an op."""
    return base.as_strided(size, stride, base.storage_offset() + offset_increment)


def _install_virtual_triton_driver(gpu: Any, report: Callable[..., None]) -> None:
    """Triton's CUDA driver loads libcuda to learn the current GPU; this one answers for the
    simulated GPU (what Inductor asks while generating code: target, device properties). Kernels
    the program launches itself (`kernel[grid](...)`, compiled by Triton for real) get a
    placeholder module and a launcher that reports each launch as one kernel
    (interpose/compile/user_kernels.py); Inductor's kernels never reach it."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.driver import CudaDriver
    from triton.runtime import driver as triton_driver

    from interpose.compile import user_kernels

    major, minor = gpu.capability

    class _Utils:
        def get_device_properties(self, device: int) -> dict[str, int]:
            props = torch.cuda.get_device_properties(device)  # asked when compiling (a process may see no GPU)
            return {"max_shared_mem": props.shared_memory_per_block_optin,
                    "multiprocessor_count": props.multi_processor_count, "max_num_regs": gpu.regs_per_sm,
                    "warpSize": gpu.warp_size, "sm_clock_rate": props.clock_rate,
                    "mem_clock_rate": props.memory_clock_rate, "mem_bus_width": props.memory_bus_width}

        def get_device_capability(self, device: int) -> tuple[int, int]:
            return (major, minor)

        load_binary = staticmethod(user_kernels.load_binary)
        unload_module = staticmethod(user_kernels.unload_module)

    class VirtualCudaDriver(CudaDriver):
        def __init__(self) -> None:
            self.utils = _Utils()
            self.launcher_cls = user_kernels.launcher_class(report)
            self.get_device_capability = lambda device=None: (major, minor)
            self.get_current_stream = _raw_stream
            self.get_current_device = lambda: torch._C._accelerator_getDeviceIndex()
            self.set_current_device = torch.cuda.set_device

        def get_current_target(self) -> GPUTarget:
            return GPUTarget("cuda", major * 10 + minor, 32)

    triton_driver.set_active(VirtualCudaDriver())


class CompileClock:
    """Keeps the program's clock still while torch compiles, and charges the compile once. The
    compiler's own Python (Dynamo, AOTAutograd, Inductor) is bracketed as phantora's work, so
    neither host clock counts it: the modelled charge stands for it, the same whatever Inductor's
    on-disk cache holds (a cold cache ran ~1.7 s more counted Python than a warm one)."""

    def __init__(self, rt: Any, clock: Any) -> None:
        self.rt = rt
        self.clock = clock
        self.kernels = 0  # Triton kernels generated by the current compile
        self.graphs = 0  # graphs Inductor compiled in it (a frame Dynamo finds no graph in: none)
        self.compiling = 0  # torch.compiles under way (Dynamo calls start/end for the outermost only)

    def start(self, args: Any = None) -> None:
        self.kernels = 0
        self.graphs = 0
        self.compiling += 1
        rt = self.rt
        while _pending_warnings and rt.active and rt.client.connected:
            rt.client.record([P.R_WARN, _pending_warnings.pop()])
        self.clock.hold()
        rt.python_time.enter()

    def end(self, args: Any = None) -> None:
        rt = self.rt
        rt.python_time.exit()
        self.clock.release()
        self.compiling -= 1
        if rt.active and rt.client.connected:
            # one host slice per compiled graph, the kernels generated on the first
            for i in range(self.graphs):
                rt.client.record([P.R_HOST, "compile", self.kernels if i == 0 else 0])

    def triton_compile(self, compile_kernel: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Triton compiling a kernel the program launches itself (at its first launch), bracketed
        as a torch.compile is and charged one kernel's modelled compile: its Python front end,
        which a warm on-disk Triton cache skips, does not count. Inside a torch.compile the
        graph's charge stands for it."""
        if self.compiling:
            return compile_kernel(*args, **kwargs)
        rt = self.rt
        self.clock.hold()
        try:
            with rt.python_time.own_work:
                return compile_kernel(*args, **kwargs)
        finally:
            self.clock.release()
            if rt.active and rt.client.connected:
                rt.client.record([P.R_HOST, "triton_compile", 1])

    def count_kernel(self) -> None:
        self.kernels += 1

    def count_graph(self) -> None:
        self.graphs += 1


def _triton_missing() -> str | None:
    """Why Triton's CUDA backend cannot be imported, or None when it can (torch._inductor imports
    it anyway where it is installed, so this costs nothing then)."""
    try:
        import triton.backends.nvidia.driver  # noqa: F401
    except ImportError as e:
        return str(e) or type(e).__name__
    return None


def _warn(rt: Any, text: str) -> None:
    """A line for the run's summary (sent once the process is a rank)."""
    if rt.active and rt.client.connected:
        rt.client.record([P.R_WARN, text])
    else:
        _pending_warnings.append(text)


def _is_torchs_own(backend: Any) -> bool:
    """A backend object torch itself passes (torch.cond and other higher-order ops compile
    their bodies with torch's eager backends): it runs the captured aten ops."""
    module = getattr(backend, "__module__", None) or type(backend).__module__
    return module == "torch" or module.startswith("torch.")


# Inductor options that benchmark candidate kernels on the GPU (torch/_inductor/config.py).
AUTOTUNE_OPTIONS = frozenset({"max_autotune", "max_autotune_gemm", "max_autotune_pointwise", "coordinate_descent_tuning"})


def _refuse_opaque_backends(rt: Any, triton_missing: str | None) -> None:
    """torch.compile(backend=callable): phantora runs the compiled code it knows (Inductor's
    generated wrapper and kernels, or graphs of aten ops); a user backend may run anything (real
    CUDA code, another compiler), which phantora cannot simulate, so it says so at the call."""
    original = torch.compile

    def compile(model: Any = None, *args: Any, **kwargs: Any) -> Any:
        backend = kwargs.get("backend", "inductor")
        if not isinstance(backend, str) and backend is not None and not _is_torchs_own(backend):
            name = getattr(backend, "__name__", type(backend).__name__)
            raise UnsupportedBackend(
                f"phantora: torch.compile(backend={name}) runs code phantora cannot see inside; "
                f"use the default Inductor backend (or 'eager' / 'aot_eager'), whose kernels phantora simulates")
        if isinstance(backend, str) and backend not in SIMULATED_BACKENDS:
            raise UnsupportedBackend(
                f"phantora: torch.compile(backend={backend!r}) is not simulated; use the default Inductor backend "
                f"(or one of {', '.join(sorted(SIMULATED_BACKENDS - {'inductor'}))})")
        mode = kwargs.get("mode")
        if isinstance(mode, str) and mode.startswith("max-autotune"):
            # Autotuning benchmarks candidate kernels on the GPU; there is none to time them on.
            # The same graphs compile with Inductor's heuristic choices (and CUDA graphs where
            # max-autotune enables them), and the summary says so.
            _warn(rt, f"torch.compile(mode={mode!r}): autotuning is not simulated; compiled with Inductor's "
                      "heuristic kernel choices (GEMMs stay cuBLAS)" + ("" if "no-cudagraphs" in mode else
                                                                         ", with CUDA graphs as the mode has them"))
            kwargs = {**kwargs, "mode": "default" if "no-cudagraphs" in mode else "reduce-overhead"}
        options = kwargs.get("options")
        tuned = sorted(k for k in AUTOTUNE_OPTIONS if isinstance(options, dict) and options.get(k))
        if tuned:
            # The same as the max-autotune modes, asked for by options (TorchTitan compiles its
            # flex attention with max_autotune and coordinate_descent_tuning): every candidate
            # would be benchmarked on a GPU, none can be, and Inductor raises NoValidChoicesError.
            _warn(rt, f"torch.compile(options={{{', '.join(repr(k) + ': True' for k in tuned)}}}): autotuning is "
                      "not simulated; compiled with Inductor's heuristic kernel choices")
            kwargs = {**kwargs, "options": {**options, **{k: False for k in tuned}}}
        if triton_missing and backend in ("inductor", None):
            # Inductor needs Triton to generate CUDA kernels (the CUDA wheel of torch brings it,
            # the CPU wheel does not, phantora's install does): running the graphs as eager ops
            # instead would predict the eager program, so the call fails and says why.
            raise TritonMissing(NO_TRITON.format(why=triton_missing))
        return original(model, *args, **kwargs)

    compile.__doc__ = original.__doc__
    compile.__wrapped__ = original  # type: ignore[attr-defined]
    torch.compile = compile


def _mark_compiled_runs(compile_clock: CompileClock) -> None:
    """Every op an Inductor-compiled graph runs is launched by generated code; each graph
    Inductor compiles is counted for the compile's host time."""
    from torch._inductor.output_code import CompiledFxGraph

    from interpose.ops.observer import compiled_code

    post_compile = CompiledFxGraph.post_compile

    def counted_post_compile(self: Any, *args: Any, **kwargs: Any) -> None:
        # every compiled graph passes here, fresh from Inductor or from its cache (whose state
        # on this machine must not change the simulated time)
        compile_clock.count_graph()
        return post_compile(self, *args, **kwargs)

    CompiledFxGraph.post_compile = counted_post_compile  # type: ignore[method-assign]
    call = CompiledFxGraph.__call__

    def __call__(self: Any, inputs: Any) -> Any:
        with compiled_code():
            return call(self, inputs)

    CompiledFxGraph.__call__ = __call__  # type: ignore[method-assign]


def _never_convert_own_frames() -> None:
    """Code Dynamo generates calls some of phantora's functions directly (it rebuilds a stream
    with torch.accelerator.current_stream, which is phantora's): such a call must run as it is.
    Converting its frame traced phantora's own code, which graph-broke and rebuilt the stream
    again, without end. Inside traced user code phantora's functions are inlined as before.
    Every code object of phantora's modules (interpose and phantora: a skipped frame's callees are
    looked at one by one) is marked, as Dynamo skips torch's own files: methods held as
    staticmethod (every `__new__`), classmethod or property, and the functions defined inside
    them. Missing `Stream.__new__` left torch.cuda.current_stream() in a compiled function one
    graph break (and a warning about a builtin Dynamo cannot trace) that a GPU does not have."""
    from torch._dynamo.eval_frame import skip_code

    for name, module in list(sys.modules.items()):
        if not name.startswith(("interpose.", "phantora.")) or module is None:
            continue
        for value in list(vars(module).values()):
            members = [value] if isinstance(value, types.FunctionType) else (
                list(vars(value).values()) if isinstance(value, type) and value.__module__ == name else [])
            for member in members:
                for fn in _functions_of(member):
                    if fn.__module__ == name:
                        for code in _code_objects(fn.__code__):
                            skip_code(code)


def _functions_of(member: Any) -> list:
    """The plain functions a module or class member holds."""
    if isinstance(member, types.FunctionType):
        return [member]
    if isinstance(member, (staticmethod, classmethod)):
        return _functions_of(member.__func__)
    if isinstance(member, property):
        return [f for f in (member.fget, member.fset, member.fdel) if isinstance(f, types.FunctionType)]
    return []


def _code_objects(code: types.CodeType) -> list:
    """`code` and the code of every function, lambda and comprehension defined inside it."""
    found = [code]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found.extend(_code_objects(const))
    return found


JOINT_GRAPH = "torch._inductor.fx_passes.joint_graph"


def _drop_lifts_folded_away(joint_graph: Any) -> None:
    """Inductor's uniform-value constant folding, as it runs on a GPU machine. With no real GPU
    under the compile's fake tensors, `torch.tensor(0, device="cuda")` (torch traces `idx[0]` in a
    flex_attention mask_mod as `idx[torch.tensor(0)]`, TransformGetItemToIndex) traces as a host
    constant, its lift (`lift_fresh_copy`) and a move to the device (`device_put`); a GPU machine
    lifts a device constant directly. The folding replaces a one-element constant with `full` on
    its device: there the lift, here the move, which leaves the lift without users. In an
    inference graph nothing removes it from a higher-order op's subgraph (Inductor's dead-code
    pass is off), and Inductor's lowering of a flex mask or score subgraph cannot lower a lift of
    a constant (AttributeError: 'Tensor' object has no attribute 'get_dtype'). A lift whose uses
    the folding replaced is dropped, so Inductor lowers the graph it lowers on a GPU machine."""
    fold = joint_graph.constant_fold_uniform_value
    if getattr(fold, "_phantora_drops_lifts", False):
        return
    lift = torch.ops.aten.lift_fresh_copy.default

    def constant_fold_uniform_value(gm: torch.fx.GraphModule) -> None:
        used = [n for n in gm.graph.find_nodes(op="call_function", target=lift) if n.users]
        fold(gm)
        remaining = set(gm.graph.find_nodes(op="call_function", target=lift))
        dropped = [n for n in used if n in remaining and not n.users]
        for n in dropped:
            gm.graph.erase_node(n)
        if dropped:
            gm.recompile()

    constant_fold_uniform_value.__wrapped__ = fold  # type: ignore[attr-defined]
    constant_fold_uniform_value._phantora_drops_lifts = True  # type: ignore[attr-defined]
    joint_graph.constant_fold_uniform_value = constant_fold_uniform_value


def _patch_joint_graph_passes() -> None:
    # importing the passes at start-up would cost every rank ~2.5 s, compiling or not
    patch_when_imported(JOINT_GRAPH, _drop_lifts_folded_away)


def install_compile(observer_cls: type, rt: Any, clock: Any) -> None:
    # Dynamo compiles while the observer is active (with every mode off while it compiles) and
    # the observer sees what the compiled artifact runs.
    observer_cls.ignore_compile_internals = classmethod(lambda cls: True)  # type: ignore[attr-defined]
    _point_dynamo_at_virtual_cuda()
    # Dynamo's rules for torch's own functions (torch.cuda.current_stream is traced as a stream
    # of the graph, not inlined) are keyed by the objects torch's names held when the map was
    # first built: build it again with phantora's replacements.
    torch._dynamo.trace_rules.get_torch_obj_rule_map.cache_clear()
    torch._C._dynamo.guards._empty_strided_cuda = _empty_strided_cuda
    torch._C._dynamo.guards._reinterpret_tensor = _reinterpret_tensor
    # Inductor copies an input whose data pointer is misaligned; virtual blocks are aligned as
    # the caching allocator's are (and a fake tensor has no data pointer to ask).
    torch._C._dynamo.guards.copy_if_misaligned = lambda t: t
    torch._C._cuda_getCurrentRawStream = _raw_stream
    if not hasattr(torch._C, "_cuda_cudaCachingAllocator_is_enabled"):
        # The CPU build lacks the binding Inductor asks before it uses CUDA graphs
        # (mode="reduce-overhead"): the virtual GPU's allocator is a caching allocator.
        torch._C._cuda_cudaCachingAllocator_is_enabled = lambda: True
    triton_missing = _triton_missing()
    _refuse_opaque_backends(rt, triton_missing)

    import torch._inductor.config as inductor_config

    # Kernels are loaded, not compiled: no compile workers (each would be another interposed
    # Python process).
    inductor_config.compile_threads = 1
    # mode="reduce-overhead": CUDA graph trees manage their memory through the real caching
    # allocator's private pools and checkpoints (C++ beside phantora's allocator model); Inductor's
    # plain CUDA graphs (one torch.cuda.CUDAGraph per compiled graph, simulated by
    # interpose/device/cuda_graphs.py) capture and replay the same kernels.
    inductor_config.triton.cudagraph_trees = False
    # Inductor checks input alignment with data_ptr(); a virtual tensor answers 0 (aligned) and
    # torch warns that FakeTensor data pointers are deprecated, which a GPU user never sees.
    import warnings

    warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor is deprecated")
    # Triton >= 3.9 warns, when Inductor's kernel modules are loaded, that its default for
    # floating-point fusion in compiled kernels will change: no kernel is compiled here, so the
    # default changes nothing phantora computes (the CPU build gets the newest Triton).
    warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION is unset")
    compile_clock = CompileClock(rt, clock)
    from torch._dynamo.callback import on_compile_end, on_compile_start

    on_compile_start(compile_clock.start)
    on_compile_end(compile_clock.end)
    _mark_compiled_runs(compile_clock)
    _patch_joint_graph_passes()
    _never_convert_own_frames()
    if triton_missing:
        return

    def report(sig: Any, args: tuple, stream: int) -> None:
        device = next((a.device.index or 0 for a in args if isinstance(a, torch.Tensor) and a.device.type == "cuda"), 0)
        if stream < 0:
            stream = _raw_stream(device)
        rt.observer.report_kernel(sig, device, stream)

    _install_virtual_triton_driver(rt.config.gpu, report)
    _bracket_triton_compiles(compile_clock)
    from torch._inductor.async_compile import AsyncCompile

    from interpose.compile.compiled_kernels import virtual_kernel_loader

    AsyncCompile.triton = _counting(virtual_kernel_loader(report), compile_clock.count_kernel)


def _bracket_triton_compiles(compile_clock: CompileClock) -> None:
    """Every @triton.jit function binds `triton.compiler.compile` when it is first launched
    (JITFunction.create_binder): it gets this bracketed one (CompileClock.triton_compile)."""
    import triton.compiler as triton_compiler

    compile_kernel = triton_compiler.compile

    def compile(*args: Any, **kwargs: Any) -> Any:
        return compile_clock.triton_compile(compile_kernel, *args, **kwargs)

    triton_compiler.compile = compile


def _counting(fn: Callable[..., Any], count: Callable[[], None]) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        count()
        return fn(*args, **kwargs)

    return counted
