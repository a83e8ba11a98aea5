"""A training loop whose DataLoader workers are the bottleneck with one worker and not with four.

Arguments: workers, CPU ms per sample. Each sample costs that much CPU in the worker (a busy loop
on the worker's own CPU clock), a batch is 4 samples; the training step's GPU work (fp32 4096^2
GEMMs forward and backward) is about 17 ms on an H100. Prints the simulated time per step over
steps 3-16."""
import json
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class SlowSamples(Dataset):
    def __init__(self, cpu_s: float) -> None:
        self.cpu_s = cpu_s

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        c0 = time.thread_time()
        while time.thread_time() - c0 < self.cpu_s:
            pass
        return torch.zeros(16)


def main() -> None:
    workers, sample_ms = int(sys.argv[1]), float(sys.argv[2])
    loader = DataLoader(SlowSamples(sample_ms / 1e3), batch_size=4, num_workers=workers)
    p = torch.nn.Parameter(torch.zeros(4096, 4096, device="cuda"))
    opt = torch.optim.SGD([p], lr=0.0)
    for i, batch in enumerate(loader):
        batch = batch.cuda(non_blocking=True)
        loss = ((p @ p) @ p).sum() + batch.sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        if i == 1:
            t1 = time.perf_counter()
    t2 = time.perf_counter()
    print(json.dumps({"per_batch_s": (t2 - t1) / 14}))


if __name__ == "__main__":
    main()
