"""Weight initialisation as frameworks do it, on a virtual GPU (TorchTitan's llama3 init)."""
import torch

# torch 2.14's nn.init.trunc_normal_ resamples until no element lies outside [a, b] (it reads
# `mask.any()` each round): the draw must read a value inside the bounds or the loop never ends
w = torch.empty(2048, 256, device="cuda")
s = 256 ** -0.5
torch.nn.init.trunc_normal_(w, std=s, a=-3 * s, b=3 * s)  # TorchTitan's output projection init
torch.nn.init.trunc_normal_(w, mean=0.0, std=0.02)  # its linear init (bounds +-2 absolute)
torch.nn.init.trunc_normal_(w, std=1.0, a=-0.3, b=0.3)  # narrow: the uniform-proposal sampler
torch.nn.init.uniform_(w, -0.1, 0.1)
assert -0.1 <= w.max().item() <= 0.1
torch.nn.init.normal_(w, mean=0.5, std=0.01)
assert abs(w.mean().item() - 0.5) < 0.05
print("ok trunc_normal_ends")

# a model built on the meta device (TorchTitan, then to_empty on the GPU): meta tensors have no data
with torch.device("meta"):
    freqs = 1.0 / (500000 ** (torch.arange(0, 16, 2)[:8].float() / 16))
    t = torch.arange(64).float()
assert freqs.is_meta and torch.outer(t, freqs).shape == (64, 8)
print("ok meta_build")
