"""NVIDIA Transformer Engine on a virtual GPU: TE's own Python, phantora's compiled parts.

Transformer Engine (pip `transformer_engine`, the pure-Python wheel) is a Python layer over two
compiled libraries that only a CUDA machine can build or run: the core library
`libtransformer_engine.so`, which `transformer_engine.common` loads with ctypes at import (after
cuDNN, NVRTC and cuRAND), and the PyTorch extension `transformer_engine_torch`, which
`transformer_engine.pytorch` loads by file path (common.load_framework_extension). Under phantora,
`import transformer_engine` (finder.py) gives TE's own package, unchanged, from a folder that also
holds phantora's `transformer_engine_torch` (native/extension.c, filled by extension.py), where TE
looks for an extension it built in place. The native loads of the core library and the CUDA
libraries are skipped as in TE's own build (NVTE_PROJECT_BUILDING, for the duration of the
package's import only): the core library's only use from Python is that load.

This package's __init__ and finder.py do not import torch (the finder is installed at interpreter
start, before torch).
"""

from interpose.device.transformer_engine.finder import install_transformer_engine

__all__ = ["install_transformer_engine"]
