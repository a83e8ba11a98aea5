"""A few optimizer steps with a real-time pause each (so a status line has time to show)."""
import threading

import torch

model = torch.nn.Linear(256, 256, device="cuda")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    model(torch.randn(64, 256, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
    torch.cuda.synchronize()
    threading.Event().wait(0.6)
print("done", flush=True)
