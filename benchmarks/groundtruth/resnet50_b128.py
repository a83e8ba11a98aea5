"""ResNet-50 training steps exactly as in shared/groundtruth/README.md (h100_resnet50_b128).

Plain PyTorch; the same program runs unchanged on a real GPU and under phantora:
    python benchmarks/groundtruth/resnet50_b128.py
    phantora trace -o run.json -- python benchmarks/groundtruth/resnet50_b128.py

ResNet-50 v1.5 (stride 2 in the 3x3 conv of each stage's first block), defined here because
torchvision is not installed beside the CPU torch build. Input 128 x 3 x 224 x 224 fp32 and
int64 labels in pinned host memory, copied non_blocking on a side stream (image converted to
channels_last there), the next batch's copy issued before this step's forward; channels_last
model; bf16 autocast forward and loss; SGD lr 0.1 momentum 0.9 (foreach); zero_grad(None).
Timed with synchronize + perf_counter: 4 warm-up steps, then --steps timed; prints the median.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += x if self.downsample is None else self.downsample(x)
        return self.relu(out)


class ResNet50(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages, cin = [], 64
        for i, (width, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3))):
            layer = []
            for b in range(blocks):
                layer.append(Bottleneck(cin, width, 2 if (b == 0 and i > 0) else 1))
                cin = width * Bottleneck.expansion
            stages.append(nn.Sequential(*layer))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--steps", type=int, default=15)
    args = ap.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda")
    model = ResNet50().to(device).to(memory_format=torch.channels_last)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    host_x = torch.randn(args.batch, 3, 224, 224).pin_memory()
    host_y = torch.randint(0, 1000, (args.batch,)).pin_memory()
    copy_stream = torch.cuda.Stream()

    def issue_copy() -> tuple[torch.Tensor, torch.Tensor]:
        with torch.cuda.stream(copy_stream):
            x = host_x.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
            y = host_y.to(device, non_blocking=True)
        return x, y

    nxt = issue_copy()
    times = []
    for step in range(args.warmup + args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        torch.cuda.current_stream().wait_stream(copy_stream)
        x, y = nxt
        x.record_stream(torch.cuda.current_stream())
        y.record_stream(torch.cuda.current_stream())
        nxt = issue_copy()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    print(f"ResNet-50: {params:,} parameters, batch {args.batch} x 3 x 224 x 224, "
          f"on {torch.cuda.get_device_name(device)}")
    print(f"median step {statistics.median(times):.2f} ms (min {min(times):.2f}), "
          f"{args.batch / statistics.median(times) * 1e3:,.0f} images/s")
    print(f"peak memory allocated {torch.cuda.max_memory_allocated():,} bytes, "
          f"reserved {torch.cuda.max_memory_reserved():,}")


if __name__ == "__main__":
    main()
