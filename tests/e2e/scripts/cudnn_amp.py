"""Checks, from inside a traced script, two things a real GPU does for an fp16 CNN:
cuDNN keeps channels_last tensors channels_last through convolutions (forward and backward),
and GradScaler steps the optimizer (no inf/NaN in the gradients of a healthy run)."""
import torch
import torch.nn as nn

CL = torch.channels_last
conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False).cuda().to(memory_format=CL)
conv2 = nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False).cuda().to(memory_format=CL)
x = torch.randn(4, 3, 32, 32, device="cuda").to(memory_format=CL)

y1 = conv1(x)
assert y1.is_contiguous(memory_format=CL), y1.stride()
y2 = conv2(torch.relu(y1))
assert y2.is_contiguous(memory_format=CL), y2.stride()
y2.sum().backward()
assert conv2.weight.grad.is_contiguous(memory_format=CL), conv2.weight.grad.stride()
assert conv1.weight.grad.is_contiguous(memory_format=CL), conv1.weight.grad.stride()

# NCHW in, NCHW out (cuDNN keeps the layout it is given); float64 stays NCHW on cuDNN.
plain = nn.Conv2d(3, 8, 3).cuda()
assert plain(torch.randn(2, 3, 16, 16, device="cuda")).is_contiguous()
dbl = nn.Conv2d(3, 8, 3).cuda().double().to(memory_format=CL)
assert dbl(torch.randn(2, 3, 16, 16, device="cuda", dtype=torch.float64).to(memory_format=CL)).is_contiguous()

opt = torch.optim.SGD(list(conv1.parameters()) + list(conv2.parameters()), lr=0.1, momentum=0.9, foreach=True)
scaler = torch.amp.GradScaler("cuda")
for _ in range(2):
    with torch.autocast("cuda", dtype=torch.float16):
        loss = conv2(torch.relu(conv1(x))).float().mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
# SGD keeps a momentum buffer per parameter from its first step on: GradScaler did not skip it.
assert all("momentum_buffer" in opt.state[p] for p in conv1.parameters()), "GradScaler skipped the step"
print("CUDNN_AMP_OK")
