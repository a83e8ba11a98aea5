"""A training loop whose DataLoader workers are the bottleneck with one worker and not with four.

Arguments: workers, CPU ms per sample (a busy loop on the worker's own CPU clock), or with a third
argument `spin`, iterations of spin_loop.spin per sample (a fixed amount of Python: what the counted
host charges does not depend on this machine); a batch is 4 samples; the training step's GPU work (fp32 4096^2
GEMMs forward and backward) is about 17 ms on an H100. Prints the simulated time per step over
steps 3-16."""
import json
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset


sys.path.insert(0, str(Path(__file__).parent))
from spin_loop import spin  # noqa: E402


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


class SpinSamples(SlowSamples):
    def __init__(self, iterations: int) -> None:
        self.iterations = iterations

    def __getitem__(self, i: int) -> torch.Tensor:
        spin(self.iterations)
        return torch.zeros(16)


def main() -> None:
    workers = int(sys.argv[1])
    data = SpinSamples(int(sys.argv[2])) if sys.argv[3:] == ["spin"] else SlowSamples(float(sys.argv[2]) / 1e3)
    loader = DataLoader(data, batch_size=4, num_workers=workers)
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
