import torch
torch.zeros(1, device="cuda")
g = torch.cuda.CUDAGraph()
