"""Custom CUDA extensions built at run time (`torch.utils.cpp_extension.load` / `load_inline`).

A framework that JIT-builds a CUDA extension (DeepSpeed's FusedAdam, Apex-style multi-tensor
kernels) hands nvcc sources phantora has never seen run: their kernels cannot be timed from
source, and compiled they would run on tensors that hold no data. So a CUDA extension is never
compiled. `load` returns a module in its place whose functions are:

  * kernels with a known cost model (KNOWN_KERNELS): a Python function that issues one op of
    the `cuda_extension` namespace with the kernel's tensors, so the op is observed, accounted
    and timed like any aten op (phantora/cost/families.py QUALIFIED_FAMILIES);
  * every other function the sources export (their pybind11 `.def("name", ...)` or
    load_inline's `functions`): a callable that raises NotImplementedError naming the rank, the
    extension, the function and what to change, when called (a module may be loaded and never
    used, which is fine).

C++-only extensions (no CUDA sources, `with_cuda` not set) build and load as usual: their code
runs on the CPU. Extensions imported as prebuilt modules are not covered (their CUDA code would
run on tensors without data); see docs/frameworks/deepspeed.md.
"""

from __future__ import annotations

import functools
import re
import types
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from interpose.on_import import patch_when_imported
from interpose.runtime import rank_label

_DEF = re.compile(r"""\.def\(\s*"(\w+)\"""")
_LIBRARY = "cuda_extension"
_lib: Any = None  # the torch.library.Library holding the known kernels' ops, made at first use


def _define_ops() -> None:
    """The ops that stand for known extension kernels: they mutate their outputs in place and
    return nothing, so their fake implementations have nothing to do."""
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library(_LIBRARY, "DEF")
    _lib.define(
        "multi_tensor_adam(int chunk_size, Tensor noop_flag, Tensor[] grads, Tensor(a!)[] params, "
        "Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, float lr, float beta1, float beta2, float eps, "
        "int step, int mode, int bias_correction, float weight_decay) -> ()")

    def nothing(*args: Any) -> None:
        return None

    _lib.impl("multi_tensor_adam", nothing, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{_LIBRARY}::multi_tensor_adam", nothing, lib=_lib)


def multi_tensor_adam(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Sequence[Sequence[torch.Tensor]],
                      lr: float, beta1: float, beta2: float, epsilon: float, step: int, mode: int,
                      bias_correction: int, weight_decay: float) -> None:
    """DeepSpeed's csrc/adam multi_tensor_adam (Apex's amp_C.multi_tensor_adam has the same
    signature): Adam over [grads, params, exp_avgs, exp_avg_sqs] in chunks of chunk_size."""
    if len(tensor_lists) != 4:
        raise NotImplementedError(
            f"phantora: multi_tensor_adam with {len(tensor_lists)} tensor lists; the cost model knows "
            "[grads, params, exp_avgs, exp_avg_sqs] only")
    grads, params, exp_avgs, exp_avg_sqs = (list(lst) for lst in tensor_lists)
    _define_ops()
    with torch.no_grad():  # the kernel writes through data pointers; autograd never sees it
        torch.ops.cuda_extension.multi_tensor_adam(
            int(chunk_size), noop_flag, grads, params, exp_avgs, exp_avg_sqs, float(lr), float(beta1),
            float(beta2), float(epsilon), int(step), int(mode), int(bias_correction), float(weight_decay))


# Exported function name -> the stand-in that issues its op. Its cost model is in
# phantora/cost/optimizers.py (extension_multi_tensor_adam).
KNOWN_KERNELS: dict[str, Callable[..., Any]] = {"multi_tensor_adam": multi_tensor_adam}


def _unmodelled(ext: str, fn: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"phantora: rank {rank_label()}: {ext}.{fn} is a kernel of the custom CUDA extension '{ext}' "
            f"(built at run time with torch.utils.cpp_extension). phantora does not compile CUDA "
            f"extensions and cannot time a kernel from its source; it models only "
            f"{', '.join(sorted(KNOWN_KERNELS))}. To run this program under phantora, use the PyTorch "
            f"implementation of this operation (for DeepSpeed's optimizers: \"torch_adam\": true in the "
            f"optimizer params, or a torch.optim optimizer), or add a cost model for {fn} "
            f"(interpose/device/cuda_extensions.py, phantora/cost).")
    call.__name__ = fn
    return call


def _exported(sources: Sequence[str]) -> list[str]:
    """Function names the pybind11 module of these source texts defines."""
    names: list[str] = []
    for text in sources:
        names.extend(n for n in _DEF.findall(text) if n not in names)
    return names


def _read(paths: Sequence[str | Path]) -> list[str]:
    texts = []
    for p in paths:
        try:
            texts.append(Path(p).read_text(errors="replace"))
        except OSError:
            pass  # a missing source fails the real build; here it only hides its exports
    return texts


def extension_module(name: str, functions: Sequence[str]) -> types.ModuleType:
    """The module `load` returns for a CUDA extension: known kernels and raising stand-ins."""
    module = types.ModuleType(name, f"phantora stand-in for the custom CUDA extension '{name}' (not compiled)")
    for fn in functions:
        setattr(module, fn, KNOWN_KERNELS.get(fn) or _unmodelled(name, fn))

    def missing(attr: str) -> Any:
        raise AttributeError(f"module '{name}' (phantora stand-in for a custom CUDA extension) has no "
                             f"attribute '{attr}'; its sources export {', '.join(functions) or 'nothing phantora found'}")

    module.__getattr__ = missing  # type: ignore[method-assign]
    return module


def _is_cuda(paths: Sequence[str], with_cuda: bool | None) -> bool:
    if with_cuda is not None:
        return with_cuda
    return any(str(p).endswith((".cu", ".cuh")) for p in paths)


def _patch(cpp_extension: types.ModuleType) -> None:
    original_load = cpp_extension.load
    original_inline = cpp_extension.load_inline

    @functools.wraps(original_load)
    def load(name: str, sources: str | list[str], *args: Any, **kwargs: Any) -> Any:
        paths = [sources] if isinstance(sources, str) else list(sources)
        if not _is_cuda(paths, kwargs.get("with_cuda")):
            return original_load(name, sources, *args, **kwargs)
        if not kwargs.get("is_python_module", True):
            raise NotImplementedError(
                f"phantora: rank {rank_label()}: the custom CUDA extension '{name}' registers its kernels as "
                f"torch ops (is_python_module=False); phantora does not compile CUDA extensions and cannot "
                f"time a kernel from its source. Use PyTorch ops instead under phantora.")
        return extension_module(name, _exported(_read(paths)))

    @functools.wraps(original_inline)
    def load_inline(name: str, cpp_sources: str | list[str], cuda_sources: str | list[str] | None = None,
                    *args: Any, **kwargs: Any) -> Any:
        with_cuda = kwargs.get("with_cuda")
        if not (cuda_sources or with_cuda) or with_cuda is False:
            return original_inline(name, cpp_sources, cuda_sources, *args, **kwargs)
        functions = kwargs.get("functions")
        if functions is None and len(args) >= 2:  # positional: sycl_sources, functions
            functions = args[1]
        if isinstance(functions, str):
            names = [functions]
        elif functions:
            names = list(functions)
        else:
            texts = [cpp_sources] if isinstance(cpp_sources, str) else list(cpp_sources)
            names = _exported(texts)
        return extension_module(name, names)

    cpp_extension.load = load
    cpp_extension.load_inline = load_inline


def install_cuda_extensions() -> None:
    # importing cpp_extension eagerly would cost every rank a setuptools import (~0.25 s)
    patch_when_imported("torch.utils.cpp_extension", _patch)
