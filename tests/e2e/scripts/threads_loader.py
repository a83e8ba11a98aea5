"""GPU work from a user thread, and a DataLoader with worker processes and pinned memory."""
import threading
import torch
from torch.utils.data import DataLoader, TensorDataset

result = {}

def worker():
    a = torch.randn(256, 256, device="cuda")
    result["dev"] = (a @ a).device

t = threading.Thread(target=worker)
t.start()
t.join()
assert result["dev"].type == "cuda", result

# Two threads launching GPU work at the same time (FakeTensorMode itself is not thread-safe).
def busy(n):
    a = torch.randn(64, 64, device="cuda")
    for _ in range(n):
        a = torch.relu(a @ a)

threads = [threading.Thread(target=busy, args=(300,)) for _ in range(2)]
for th in threads:
    th.start()
busy(300)
for th in threads:
    th.join()

ds = TensorDataset(torch.arange(64, dtype=torch.float32).view(16, 4), torch.arange(16))
seen = 0
for x, y in DataLoader(ds, batch_size=4, num_workers=2, pin_memory=True):
    assert not isinstance(x, torch._subclasses.FakeTensor), "workers produce real tensors"
    assert x.is_pinned()
    xs = x.cuda(non_blocking=True)
    seen += int(y.sum())  # real values from the workers
assert seen == sum(range(16)), seen
print("THREADS_LOADER_OK")
