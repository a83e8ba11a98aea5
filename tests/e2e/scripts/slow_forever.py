import threading, torch
x = torch.randn(512, 512, device="cuda")
print("STARTED", flush=True)
while True:
    x = x @ x
    threading.Event().wait(0.05)  # real wait: keeps the trace small
