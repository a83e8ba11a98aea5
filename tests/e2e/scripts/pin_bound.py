"""A training loop whose DataLoader pin-memory thread is the bottleneck: 2 workers hand over
16 MiB batches that cost them little, the thread pins each (a 16 MiB host copy), and the GPU
step (an fp32 1024^2 GEMM) is far shorter. Prints the simulated time of each step after the first."""
import json
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Zeros(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.zeros(1 << 20)  # 4 MiB: 16 MiB a batch


def main() -> None:
    loader = DataLoader(Zeros(), batch_size=4, num_workers=2, pin_memory=True)
    p = torch.nn.Parameter(torch.zeros(1024, 1024, device="cuda"))
    opt = torch.optim.SGD([p], lr=0.0)
    ends = []
    for batch in loader:
        assert batch.is_pinned()
        batch = batch.cuda(non_blocking=True)
        loss = (p @ p).sum() + batch.sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        ends.append(time.perf_counter())
    print(json.dumps({"steps_s": [b - a for a, b in zip(ends, ends[1:])]}))


if __name__ == "__main__":
    main()
