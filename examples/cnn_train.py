"""Train a small ResNet on random images, with a side-stream prefetcher for input copies.

Plain PyTorch: runs unchanged on a real GPU, and under phantora on a virtual one:
    python examples/cnn_train.py
    phantora trace -o run.json -- python examples/cnn_train.py

DataLoader with worker processes and pinned memory; the next batch is copied to the GPU on a
separate CUDA stream while the current one computes (wait_stream + record_stream); fp16
autocast with GradScaler; SGD with momentum (foreach); steps timed with CUDA events.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class RandomImages(Dataset):
    def __init__(self, n: int, size: int, classes: int) -> None:
        self.n, self.size, self.classes = n, size, classes

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(i)
        return torch.randn(3, self.size, self.size, generator=g), i % self.classes


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    def __init__(self, classes: int, widths: tuple[int, ...] = (64, 128, 256, 512)) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        layers, cin = [], widths[0]
        for i, w in enumerate(widths):
            layers += [BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)]
            cin = w
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class CudaPrefetcher:
    """Copies batch i+1 to the GPU on its own stream while batch i is being computed."""

    def __init__(self, loader: DataLoader, device: torch.device) -> None:
        self.it = iter(loader)
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.next = None
        self._preload()

    def _preload(self) -> None:
        try:
            x, y = next(self.it)
        except StopIteration:
            self.next = None
            return
        with torch.cuda.stream(self.stream):
            self.next = (x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True))

    def __iter__(self) -> "CudaPrefetcher":
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.next is None:
            raise StopIteration
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        x, y = self.next
        x.record_stream(torch.cuda.current_stream(self.device))
        y.record_stream(torch.cuda.current_stream(self.device))
        self._preload()
        return x, y


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--image", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda")
    classes = 100
    model = ResNet(classes).to(device).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4, foreach=True)
    scaler = torch.amp.GradScaler("cuda")
    data = RandomImages(args.batch * args.steps, args.image, classes)
    loader = DataLoader(data, batch_size=args.batch, num_workers=args.workers, pin_memory=True, drop_last=True)
    print(f"ResNet-18-style: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
          f"batch {args.batch} x 3 x {args.image} x {args.image}, {args.workers} loader workers, "
          f"on {torch.cuda.get_device_name(device)}")

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for step, (x, y) in enumerate(CudaPrefetcher(loader, device)):
        start.record()
        x = x.to(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end)
        times.append(ms)
        print(f"step {step}: loss {loss.item():.3f}, GPU time {ms:.2f} ms, "
              f"{args.batch / ms * 1000:,.0f} images/s")
    steady = times[1:] or times
    print(f"mean step time (after the first): {sum(steady) / len(steady):.2f} ms")
    print(f"peak memory allocated: {torch.cuda.max_memory_allocated() / 2**30:.3f} GiB")


if __name__ == "__main__":
    main()
