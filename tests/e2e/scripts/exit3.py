import sys, torch
torch.ones(4, device="cuda").sum()
sys.exit(3)
