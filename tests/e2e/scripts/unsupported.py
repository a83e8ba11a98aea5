import torch
torch.zeros(1, device="cuda")
torch.cuda.utilization()
