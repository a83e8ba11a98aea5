"""Device addresses of virtual GPU tensors.

A FakeTensor's storage holds no memory, so its data_ptr() is 0 for every tensor (plus the
view's offset). On a GPU every live storage has its own address, and programs key tensors by
it: Accelerate's FSDP2 prepare maps the optimizer's parameters (of the model still on the CPU)
to the sharded ones through `data_ptr()`, and with every address 0 it mapped all of them to
one parameter (the optimizer then updated one tensor N times and never the others). A tensor
on a virtual GPU reports the address of its storage's block in the simulated caching allocator
(interpose/runtime.py), which is distinct among live storages and reused after a free, as the
real allocator's is; a CPU tensor without data, its storage's address in this process.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor


def install_virtual_addresses(rt: Any) -> None:
    original = torch.Tensor.data_ptr

    def data_ptr(self: torch.Tensor) -> int:
        storage = self.untyped_storage()
        if storage.nbytes() == 0:
            return 0  # no memory: a null pointer, as the allocators give
        device = self.fake_device
        address = rt.storage_address(storage, device.index or 0) if device.type == "cuda" else 0
        # Elsewhere (a model built on the CPU, whose tensors hold no data either) the storage's own
        # address stands in: distinct among live storages and stable while one lives, as malloc's.
        return (address or storage._cdata) + self.storage_offset() * self.element_size()

    data_ptr.__doc__ = original.__doc__
    FakeTensor.data_ptr = data_ptr  # type: ignore[method-assign]
