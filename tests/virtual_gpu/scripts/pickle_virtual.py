"""Virtual tensors pickle as what they are (interpose/distributed/pickling.py): through torch.multiprocessing
.spawn's arguments (what Lightning's ddp_spawn does with the LightningModule) and pickle.dumps.
On a GPU machine each of these pickles with its data; here with its shape, dtype, device, flags
and what it reads as."""

import pickle

import torch
import torch.multiprocessing as mp
from torch import nn


def check_model(model: nn.Module, scale: torch.Tensor, where: str) -> None:
    w = model.weight
    assert isinstance(w, nn.Parameter) and w.requires_grad and w.shape == (8, 4) and w.dtype == torch.float32, w
    assert w.note == "tagged by the script", where  # the script's own attribute on the tensor
    assert not model.bias.requires_grad and float(model.bias[0]) == 0.0, where  # zeros_ reads 0
    assert scale.shape == (3, 5) and not isinstance(scale, nn.Parameter) and float(scale.sum()) == 15 * 2.5, where
    print(f"ok module and tensor arrive in {where}", flush=True)


def child(index: int, model: nn.Module, scale: torch.Tensor) -> None:
    check_model(model, scale, "the spawned process")


if __name__ == "__main__":
    model = nn.Linear(4, 8)
    model.weight.note = "tagged by the script"
    nn.init.zeros_(model.bias)
    model.bias.requires_grad_(False)
    scale = torch.full((3, 5), 2.5)
    check_model(*pickle.loads(pickle.dumps((model, scale))), "pickle.loads")

    flags = torch.tensor([3, 1, 4], device="cuda")  # a small GPU tensor keeps its data (a shadow)
    back = pickle.loads(pickle.dumps(flags))
    assert back.device == flags.device and back.tolist() == [3, 1, 4], back
    print("ok a GPU tensor keeps its data", flush=True)

    mp.spawn(child, args=(model, scale), nprocs=1)
