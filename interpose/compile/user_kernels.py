"""Triton kernels the program launches itself (`@triton.jit` functions called as
`kernel[grid](...)`, Liger / Unsloth / TorchTitan-style fused kernels), on virtual GPUs.

Triton compiles such a kernel for real on the CPU (its ptxas is bundled; phantora's virtual
Triton driver, interpose/compile/torch_compile.py, answers for the simulated GPU), then asks the
driver for a launcher (`driver.active.launcher_cls(src, metadata)`) and a loaded module
(`utils.load_binary`). Here the module is a placeholder and the launcher reports ONE kernel per
launch to the simulator (OpObserver.report_kernel), named after the JIT function, with signature
`triton_user::<function name>` (phantora/cost/fused.py `user_triton_kernel`). Inductor's
generated kernels never come here: their wrapper launches VirtualTritonKernel.run
(interpose/compile/compiled_kernels.py), which never asks the driver for a launcher.

What a launch moves is its tensor arguments (a host tensor descriptor counts as its base), each
counted once over the elements its view addresses (a tensor passed twice, once). Which of them
it writes comes from the JIT function's Python source (`written_params`): the parameters that
reach the pointer of a `tl.store` / `tl.atomic_*`, directly or through assignments
(`ptrs = out + offs`, `tl.make_block_ptr(base=out, ...)`, `tl.advance`,
`desc = tl.make_tensor_descriptor(out, ...); desc.store(...)`), also through the jit functions
it calls. Reads are the other tensor arguments, plus written ones the kernel also loads (or
updates atomically). Elements: the largest tensor argument's. Where the source cannot be read,
every tensor argument counts as read and written.

Tensors the kernel writes read as unknown afterwards (the value policy's placeholder); tensors
it only reads keep their values (a MoE kernel reads group offsets phantora needs).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any, Callable

import torch

from interpose.values import policy as values
from phantora.ops import OpSignature, TensorMeta

# The signature namespace of user-launched Triton kernels (phantora/cost/families.py).
NAMESPACE = "triton_user"

# Placeholder results of utils.load_binary: (module, function, n_regs, n_spills, n_max_threads).
# n_max_threads bounds num_warps * warp_size (CompiledKernel._init_handles checks it): 1024 as
# on every NVIDIA GPU since Fermi.
MAX_THREADS_PER_BLOCK = 1024
_MODULE = object()
_FUNCTION = object()


def load_binary(name: str, kernel: Any, shared: int, device: int) -> tuple:
    return (_MODULE, _FUNCTION, 32, 0, MAX_THREADS_PER_BLOCK)


def unload_module(module: Any) -> None:
    return None


# --- which parameters a kernel writes (its source, by ast) ---------------------------------------

_LOADS = frozenset({"load", "gather"})  # results are data, not pointers
_STORES = frozenset({"store", "scatter"})


class _Flow:
    """Which parameters each name of a jit function derives from, by a dataflow over its
    assignments (iterated to a fixpoint for loops), and which reach a store's or load's pointer."""

    def __init__(self, fn: ast.FunctionDef, params: list[str], globals_: dict, depth: int) -> None:
        self.derives: dict[str, set[str]] = {p: {p} for p in params}
        self.globals = globals_
        self.depth = depth
        self.written: set[str] = set()
        self.loaded: set[str] = set()
        self.fn = fn

    def of(self, node: ast.AST | None) -> set[str]:
        """The parameters an expression's value derives from (a load's result derives from none)."""
        if node is None:
            return set()
        if isinstance(node, ast.Name):
            return set(self.derives.get(node.id, ()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _LOADS:
            return set()
        out: set[str] = set()
        for child in ast.iter_child_nodes(node):
            if isinstance(node, ast.Call) and child is node.func and not isinstance(child, ast.Attribute):
                continue
            if isinstance(node, ast.Attribute) and child is node.value and node.attr in ("dtype", "shape"):
                continue
            out |= self.of(child)
        return out

    def assign(self, target: ast.AST, sources: set[str], augment: bool = False) -> None:
        if isinstance(target, ast.Name):
            if augment:
                self.derives.setdefault(target.id, set()).update(sources)
            else:
                self.derives[target.id] = set(self.derives.get(target.id, ())) | sources
        elif isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self.assign(t, sources, augment)

    def call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute):
            attr = func.attr
            receiver = self.of(func.value)
            pointer = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg in
                                                           ("pointer", "ptr", "base")), None)
            if attr in _STORES or attr.startswith("atomic_"):
                # desc.store(offsets, value) writes through the descriptor; tl.store(ptr, value) through ptr
                target = receiver or self.of(pointer)
                self.written |= target
                if attr.startswith("atomic_"):
                    self.loaded |= target
            elif attr in _LOADS:
                self.loaded |= receiver or self.of(pointer)
        elif isinstance(func, ast.Name) and self.depth < 4:
            callee = self.globals.get(func.id)
            inner = getattr(callee, "fn", None)
            if inner is not None and hasattr(callee, "arg_names"):  # another @triton.jit function
                w, r = _params_accessed(inner, self.depth + 1)
                names = list(callee.arg_names)
                bound = {names[i]: self.of(a) for i, a in enumerate(node.args) if i < len(names)}
                bound.update({k.arg: self.of(k.value) for k in node.keywords if k.arg})
                for p, srcs in bound.items():
                    if p in w:
                        self.written |= srcs
                    if p in r:
                        self.loaded |= srcs

    def run(self) -> None:
        for _ in range(16):  # to a fixpoint: loops carry pointers around (ptrs += BLOCK * stride)
            before = ({k: len(v) for k, v in self.derives.items()}, len(self.written), len(self.loaded))
            for node in ast.walk(self.fn):
                if isinstance(node, ast.Assign):
                    srcs = self.of(node.value)
                    for t in node.targets:
                        self.assign(t, srcs)
                elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
                    self.assign(node.target, self.of(node.value), augment=True)
                elif isinstance(node, (ast.For, ast.comprehension)):
                    self.assign(node.target, self.of(node.iter))
                elif isinstance(node, ast.Call):
                    self.call(node)
            if before == ({k: len(v) for k, v in self.derives.items()}, len(self.written), len(self.loaded)):
                return


_accessed: dict[Any, tuple[frozenset[str], frozenset[str]] | None] = {}


def _params_accessed(fn: Callable[..., Any], depth: int = 0) -> tuple[frozenset[str], frozenset[str]] | None:
    """(parameters written, parameters loaded) of a jit function's Python function, or None when
    its source cannot be read. Cached per function."""
    if fn in _accessed:
        return _accessed[fn]
    _accessed[fn] = (frozenset(), frozenset())  # a recursive call sees nothing
    result = None
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        node = next(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    except (OSError, TypeError, SyntaxError, StopIteration):
        node = None
    if node is not None:
        params = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
        flow = _Flow(node, params, getattr(fn, "__globals__", {}), depth)
        flow.run()
        result = (frozenset(flow.written & set(params)), frozenset(flow.loaded & set(params)))
    _accessed[fn] = result
    return result


def written_params(jit_fn: Any) -> frozenset[str] | None:
    """The parameters of a @triton.jit function whose memory the kernel writes (None: unknown)."""
    accessed = _params_accessed(getattr(jit_fn, "fn", jit_fn))
    return None if accessed is None else accessed[0]


# --- the launcher -----------------------------------------------------------------------------------


def _tensor(a: Any) -> torch.Tensor | None:
    """The tensor an argument passes: itself, or a host tensor descriptor's base."""
    if isinstance(a, torch.Tensor):
        return a
    base = getattr(a, "base", None)
    return base if isinstance(base, torch.Tensor) else None


def _meta(t: torch.Tensor) -> TensorMeta:
    from interpose.ops.signature import tensor_meta

    return tensor_meta(t)


def _key(t: torch.Tensor) -> tuple:
    return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)


def launch_signature(name: str, arg_names: tuple[str, ...], args: tuple,
                     accessed: tuple[frozenset[str], frozenset[str]] | None) -> tuple[OpSignature, list[torch.Tensor]]:
    """The signature of one launch (tensors read, tensors written, elements) and the tensors
    it writes."""
    seen: dict[tuple, list] = {}  # key -> [tensor, read, written]
    for i, a in enumerate(args):
        t = _tensor(a)
        if t is None:
            continue
        param = arg_names[i] if i < len(arg_names) else ""
        written = accessed is None or param in accessed[0]
        read = accessed is None or not written or param in accessed[1]
        entry = seen.setdefault(_key(t), [t, False, False])
        entry[1] |= read
        entry[2] |= written
    reads = tuple(_meta(t) for t, r, _ in seen.values() if r)
    writes = tuple(_meta(t) for t, _, w in seen.values() if w)
    elements = max((t.numel() for t, _, _ in seen.values()), default=0)
    sig = OpSignature(name=f"{NAMESPACE}::{name}", overload="default",
                      args=(reads, writes, elements, (), "user"), outputs=writes, tags=frozenset({"triton"}))
    return sig, [t for t, _, w in seen.values() if w]


class UserKernelLauncher:
    """What `driver.active.launcher_cls(src, metadata)` gives a compiled user kernel: called
    as Triton's launcher is (grid, stream, function, packed metadata, launch metadata, the
    enter/exit hooks, then the kernel's bound arguments in parameter order)."""

    def __init__(self, src: Any, metadata: Any, report: Callable[[OpSignature, tuple, int], None]) -> None:
        jit_fn = getattr(src, "fn", None)
        self.name = (getattr(jit_fn, "__name__", None) or getattr(metadata, "name", None) or "triton_kernel")
        self.arg_names = tuple(getattr(jit_fn, "arg_names", ()) or ())
        self.accessed = _params_accessed(getattr(jit_fn, "fn", jit_fn)) if jit_fn is not None else None
        self._report = report
        self.num_ctas = getattr(metadata, "num_ctas", 1) or 1
        self.scratch = (getattr(metadata, "global_scratch_size", 0) or 0, getattr(metadata, "global_scratch_align", 1) or 1)

    def __call__(self, grid0: int, grid1: int, grid2: int, stream: Any, function: Any, packed_metadata: Any,
                 launch_metadata: Any, launch_enter_hook: Any, launch_exit_hook: Any, *args: Any) -> None:
        if launch_enter_hook is not None:
            launch_enter_hook(launch_metadata)
        scratch = None
        size, align = self.scratch
        if size > 0 and grid0 * grid1 * grid2 > 0:
            # device-side tensor descriptors need global scratch: allocated per launch through the
            # allocator the program set (triton.set_allocator), as Triton's launcher does; without
            # one Triton's NullAllocator raises what it raises on a GPU
            from triton.runtime import _allocation

            scratch = _allocation._allocator.get()(grid0 * grid1 * grid2 * self.num_ctas * size, align, stream)
        if grid0 * grid1 * grid2 > 0:  # Triton launches nothing for an empty grid
            sig, written = launch_signature(self.name, self.arg_names, args, self.accessed)
            self._report(sig, args, int(stream) if isinstance(stream, int) else -1)
            for t in written:
                # written by code phantora does not evaluate: its data is unknown
                values.set_shadow(t, None)
                values.set_value(t, None)
        del scratch  # freed after the launch, on its stream (the caching allocator's rule)
        if launch_exit_hook is not None:
            launch_exit_hook(launch_metadata)


def launcher_class(report: Callable[[OpSignature, tuple, int], None]) -> Callable[[Any, Any], UserKernelLauncher]:
    def launcher_cls(src: Any, metadata: Any) -> UserKernelLauncher:
        return UserKernelLauncher(src, metadata, report)

    return launcher_cls
