"""Real op signatures for the cost-model tests, captured from small training steps run on
fake tensors.

Signatures are captured the way phantora's interposer sees them: a TorchDispatchMode inside a
FakeTensorMode observes every post-autograd aten op. The CPU build of torch cannot make fake
CUDA tensors without phantora's native shim, so the steps run on fake CPU tensors and every
"cpu" device in the captured signatures is rewritten to "cuda:0". Where the CPU and CUDA op
paths differ (fused attention), the models call the CUDA ops explicitly.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from interpose.ops.signature import signature_of
from phantora.ops import OpSignature, TensorMeta

from phantora.cost.measurements import H100_CALIBRATION as CALIBRATION  # noqa: E402


class SignatureRecorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.signatures: list[OpSignature] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        self.signatures.append(signature_of(func, args, kwargs, result))
        return result


def on_cuda(a):
    """Rewrite cpu tensors in a signature argument to cuda:0."""
    if isinstance(a, TensorMeta):
        return dataclasses.replace(a, device="cuda:0") if a.device == "cpu" else a
    if isinstance(a, tuple):
        return tuple(on_cuda(x) for x in a)
    return a


def sig_on_cuda(sig: OpSignature) -> OpSignature:
    return dataclasses.replace(sig, args=tuple(on_cuda(a) for a in sig.args),
                               outputs=tuple(on_cuda(o) for o in sig.outputs))


def capture(step: Callable[[], None]) -> list[OpSignature]:
    """Run `step` on fake tensors and return the signatures of every aten op it dispatched,
    moved to cuda:0. `step` builds its own modules and inputs inside the fake mode."""
    recorder = SignatureRecorder()
    with FakeTensorMode():
        with recorder:
            step()
    return [sig_on_cuda(s) for s in recorder.signatures]


# --- workloads ---------------------------------------------------------------------------

class Block(nn.Module):
    """A GPT-2 block whose attention calls the fused CUDA SDPA op explicitly."""

    def __init__(self, d: int, heads: int, backend: str) -> None:
        super().__init__()
        self.heads, self.backend = heads, backend
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        if self.backend == "flash":
            y = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)[0]
        else:
            y = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, True)[0]
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class TinyGPT(nn.Module):
    def __init__(self, vocab=8192, d=1024, heads=16, layers=2, seq=1024, backend="flash") -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, backend) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = F.dropout(self.wte(idx) + self.wpe(pos), 0.1, self.training)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def gpt_step(fused: bool, backend: str = "flash", batch: int = 8, seq: int = 1024) -> None:
    model = TinyGPT(seq=seq, backend=backend)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=fused, foreach=not fused)
    idx = torch.randint(0, 8192, (batch, seq))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(idx)
    loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), idx.view(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, 2, 1))
        self.body = nn.Sequential(
            nn.Conv2d(64, 128, 3, 1, 1, bias=False), nn.BatchNorm2d(128), nn.ReLU(inplace=True),
            nn.Conv2d(128, 128, 3, 1, 1, groups=128, bias=False),  # depthwise
            nn.Conv2d(128, 256, 1, bias=False), nn.BatchNorm2d(256), nn.ReLU(inplace=True),
        )
        self.head = nn.Linear(256, 100)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.body(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def cnn_step(batch: int = 32) -> None:
    model = SmallCNN()  # NCHW: Module.to(memory_format=...) trips FakeTensor's weakref swap
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)
    x = torch.randn(batch, 3, 224, 224)
    y = torch.randint(0, 100, (batch,))
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()


# --- an op zoo: one or two calls per family, forward and backward ---------------------------

def _zoo_gemm() -> None:
    a, b = torch.randn(64, 32, requires_grad=True), torch.randn(32, 48, requires_grad=True)
    bias = torch.randn(48, requires_grad=True)
    (a @ b).sum().backward()
    torch.addmm(bias, a, b).sum().backward()
    x, y = torch.randn(4, 16, 8, requires_grad=True), torch.randn(4, 8, 12, requires_grad=True)
    torch.bmm(x, y).sum().backward()
    torch.baddbmm(torch.randn(4, 16, 12), x, y).sum().backward()
    torch.mv(a, torch.randn(32))
    torch.addmv(torch.randn(64), a, torch.randn(32))
    torch.dot(torch.randn(32), torch.randn(32))
    torch.addr(torch.randn(64, 32), torch.randn(64), torch.randn(32))
    torch.ops.aten._addmm_activation(bias, a, b, use_gelu=True)
    torch.cdist(torch.randn(2, 10, 8), torch.randn(2, 12, 8))
    torch.einsum("bij,bjk->bik", x, y)


def _zoo_conv() -> None:
    x = torch.randn(2, 8, 16, 16, requires_grad=True)
    w = torch.randn(16, 8, 3, 3, requires_grad=True)
    F.conv2d(x, w, torch.randn(16, requires_grad=True), stride=2, padding=1).sum().backward()
    F.conv2d(x, torch.randn(8, 1, 3, 3, requires_grad=True), padding=1, groups=8).sum().backward()
    F.conv_transpose2d(x, torch.randn(8, 4, 4, 4, requires_grad=True), stride=2).sum().backward()
    F.conv1d(torch.randn(2, 4, 32, requires_grad=True), torch.randn(6, 4, 5, requires_grad=True)).sum().backward()
    F.conv3d(torch.randn(1, 2, 6, 6, 6), torch.randn(4, 2, 3, 3, 3))
    torch.conv_tbc(torch.randn(10, 2, 4), torch.randn(3, 4, 6), torch.randn(6), 1)


def _zoo_attention() -> None:
    q = torch.randn(2, 4, 64, 16, requires_grad=True)
    torch.ops.aten._scaled_dot_product_flash_attention(q, q, q, 0.0, True)[0].sum().backward()
    torch.ops.aten._scaled_dot_product_efficient_attention(q, q, q, None, True, 0.0, False)[0].sum().backward()
    torch.ops.aten._scaled_dot_product_cudnn_attention(q, q, q, None, True, 0.0, True)[0].sum().backward()
    qs = torch.randn(2, 64, 4, 16)  # [B, S, H, D]
    torch.ops.aten._efficient_attention_forward(qs, qs, qs, None, None, None, None, None, 0.0, 1, True)


def _zoo_norm() -> None:
    x = torch.randn(8, 32, requires_grad=True)
    F.layer_norm(x, (32,), torch.randn(32, requires_grad=True), torch.randn(32, requires_grad=True)).sum().backward()
    img = torch.randn(4, 8, 6, 6, requires_grad=True)
    bn = nn.BatchNorm2d(8)
    bn(img).sum().backward()
    bn.eval()
    bn(img)
    F.group_norm(img, 2, torch.randn(8, requires_grad=True), torch.randn(8, requires_grad=True)).sum().backward()
    F.softmax(x, -1).sum().backward()
    F.log_softmax(torch.randn(4, 2048, requires_grad=True), -1).sum().backward()
    torch._weight_norm(torch.randn(6, 4, requires_grad=True), torch.randn(6, 1, requires_grad=True), 0).sum().backward()


def _zoo_pointwise() -> None:
    x = torch.randn(16, 16, requires_grad=True)
    y = F.gelu(x) * torch.sigmoid(x) + F.silu(x).clamp(-1, 1) - x.pow(2) / 3
    y = torch.where(x > 0, y, torch.zeros(()))
    y.masked_fill(x < -1, 0.0).sum().backward()
    z = torch.randn(16)
    z.relu_().add_(1).mul_(2)
    (z == 0) | (z > 1)
    z.to(torch.bfloat16).float()
    F.dropout(torch.randn(16), 0.5, True)
    torch.native_dropout(torch.randn(16), 0.5, True)


def _zoo_reduction() -> None:
    x = torch.randn(8, 64)
    x.sum(0), x.mean(), x.amax(-1), x.var(0), x.norm(), torch.logsumexp(x, -1), x.argmax(1)
    x.cumsum(1), torch.sort(x, -1), torch.topk(x, 5), x.std(), x.max(), x.min(0), x.any(), x.prod(1)


def _zoo_indexing() -> None:
    emb = nn.Embedding(100, 16)
    idx = torch.randint(0, 100, (4, 8))
    emb(idx).sum().backward()
    x = torch.randn(32, 16, requires_grad=True)
    i = torch.randint(0, 32, (10,))
    x[i].sum().backward()
    x.detach().index_put_((i,), torch.randn(10, 16), accumulate=True)
    torch.gather(x, 1, torch.randint(0, 16, (32, 4))).sum().backward()
    torch.zeros(32, 16).scatter_add_(0, torch.randint(0, 32, (8, 16)), torch.randn(8, 16))
    torch.index_select(x, 0, i)
    torch.zeros(32, 16).index_add_(0, i, torch.randn(10, 16))
    torch.cat([x, x, x], 0).sum().backward()
    torch.stack([x, x], 1)
    x[:, 3].sum().backward()
    x[2:10].sum().backward()
    torch.zeros(4, 4).masked_scatter(torch.ones(4, 4, dtype=torch.bool), torch.randn(16))


def _zoo_movement() -> None:
    img = torch.randn(2, 4, 8, 8, requires_grad=True)
    img.flip(-1).roll(1, 2).repeat(1, 2, 1, 1).tril().sum().backward()
    F.pad(img, (1, 1, 2, 2)).sum().backward()
    F.pad(img, (1, 1, 1, 1), mode="reflect").sum().backward()
    F.interpolate(img, scale_factor=2, mode="nearest").sum().backward()
    F.interpolate(img, scale_factor=2, mode="bilinear").sum().backward()
    F.max_pool2d(img, 2).sum().backward()
    F.avg_pool2d(img, 2).sum().backward()
    F.adaptive_avg_pool2d(img, 3).sum().backward()
    F.pixel_shuffle(torch.randn(1, 16, 4, 4), 2)
    F.fold(F.unfold(img, 3), (8, 8), 3).sum().backward()
    img.t() if img.ndim == 2 else img.transpose(1, 2).contiguous()


def _zoo_loss() -> None:
    logits = torch.randn(8, 10, requires_grad=True)
    F.cross_entropy(logits, torch.randint(0, 10, (8,))).backward()
    F.cross_entropy(torch.randn(2, 5, 4, 4, requires_grad=True), torch.randint(0, 5, (2, 4, 4))).backward()
    F.mse_loss(logits, torch.randn(8, 10)).backward()
    F.binary_cross_entropy_with_logits(logits, torch.rand(8, 10)).backward()
    F.smooth_l1_loss(logits, torch.randn(8, 10)).backward()


def _zoo_optim() -> None:
    params = [nn.Parameter(torch.randn(64, 32)), nn.Parameter(torch.randn(32))]
    for p in params:
        p.grad = torch.randn_like(p)
    for opt in (torch.optim.AdamW(params, fused=True), torch.optim.Adam(params, foreach=True),
                torch.optim.SGD(params, lr=0.1, momentum=0.9, fused=True), torch.optim.Adagrad(params, fused=True)):
        opt.step()
    torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
    torch._amp_foreach_non_finite_check_and_unscale_([p.grad for p in params], torch.zeros(1), torch.ones(1))


def _zoo_misc() -> None:
    torch.fft.irfft(torch.fft.rfft(torch.randn(4, 256)))
    torch.fft.fft(torch.randn(8, 64, dtype=torch.complex64))
    torch.randn(8), torch.rand(8), torch.randint(0, 5, (8,)), torch.randperm(16)
    torch.empty(8).normal_().uniform_(), torch.bernoulli(torch.rand(8)), torch.multinomial(torch.rand(8), 2)
    torch.zeros(4), torch.ones(4), torch.full((4,), 2.0), torch.arange(10), torch.eye(4)
    torch.empty(4).fill_(1).zero_(), torch.empty_strided((4, 4), (1, 4)), torch.empty_like(torch.ones(3))


ZOO = {
    "gemm": _zoo_gemm, "conv": _zoo_conv, "attention": _zoo_attention, "norm": _zoo_norm,
    "pointwise": _zoo_pointwise, "reduction": _zoo_reduction, "indexing": _zoo_indexing,
    "movement": _zoo_movement, "loss": _zoo_loss, "optim": _zoo_optim, "misc": _zoo_misc,
}


# --- single calls profiled on a real H100 (tests/data/groundtruth/h100_kernel_profile.json) ---------------------
# Each builder makes its inputs on `device` and returns the call to time; the same builders run
# on fake CPU tensors to capture the signatures the estimator sees.

def _mm_case(m: int, n: int, k: int) -> Callable[[str], Callable[[], object]]:
    def build(device: str):
        a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
        return lambda: a @ b
    return build


def _layer_norm_case(backward: bool):
    def build(device: str):
        x = torch.randn(16384, 4096, device=device, dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(4096, device=device, dtype=torch.bfloat16, requires_grad=True)
        if not backward:
            return lambda: F.layer_norm(x, (4096,), w, w)
        y = F.layer_norm(x, (4096,), w, w)
        gy = torch.randn_like(y)
        return lambda: torch.autograd.grad(y, (x, w), gy, retain_graph=True)
    return build


def _softmax_case(device: str):
    x = torch.randn(16384, 4096, device=device, dtype=torch.bfloat16)
    return lambda: torch.softmax(x, -1)


def _cross_entropy_case(backward: bool):
    def build(device: str):
        logits = torch.randn(8192, 50304, device=device, requires_grad=True)
        target = torch.randint(0, 50304, (8192,), device=device)
        if not backward:
            return lambda: F.cross_entropy(logits, target)
        loss = F.cross_entropy(logits, target)
        return lambda: torch.autograd.grad(loss, logits, retain_graph=True)
    return build


def _embedding_backward_case(device: str):
    weight = torch.randn(50304, 768, device=device, requires_grad=True)
    ids = torch.randint(0, 50304, (8, 1024), device=device)
    out = F.embedding(ids, weight)
    g = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, weight, g, retain_graph=True)


def _attention_case(backend: str):
    def build(device: str):
        q = torch.randn(4, 16, 2048, 128, device=device, dtype=torch.bfloat16)
        if backend == "flash":
            return lambda: torch.ops.aten._scaled_dot_product_flash_attention(q, q, q, 0.0, True)
        op = {"cudnn": torch.ops.aten._scaled_dot_product_cudnn_attention,
              "efficient": torch.ops.aten._scaled_dot_product_efficient_attention}[backend]
        return lambda: op(q, q, q, None, False, 0.0, True)
    return build


def _fused_adamw_case(device: str):
    params = [torch.randn(4096, 4096, device=device) for _ in range(8)]
    grads = [torch.randn_like(p) for p in params]
    m1, m2 = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    steps = [torch.ones((), device=device) for _ in params]
    return lambda: torch._fused_adamw_(params, grads, m1, m2, [], steps, lr=1e-3, beta1=0.9, beta2=0.99,
                                       weight_decay=0.1, eps=1e-8, amsgrad=False, maximize=False)


def _tiny_add_case(device: str):
    x = torch.ones(1, device=device)
    return lambda: x.add_(1)


PROFILE_CASES = {
    "add_ 1 element": _tiny_add_case,
    **{f"mm {m}x{n}x{k} bf16": _mm_case(m, n, k) for m, n, k in (
        (2048, 2048, 2048), (1024, 1024, 4096), (1536, 2816, 4096), (1537, 2816, 4096), (256, 8192, 8192),
        (4096, 4096, 256), (8192, 8192, 256), (16, 4096, 4096))},
    "layer_norm fwd 16384x4096 bf16": _layer_norm_case(False),
    "layer_norm bwd 16384x4096 bf16": _layer_norm_case(True),
    "softmax 16384x4096 bf16": _softmax_case,
    "cross_entropy fwd 8192x50304 fp32": _cross_entropy_case(False),
    "cross_entropy bwd 8192x50304 fp32": _cross_entropy_case(True),
    "embedding bwd 8192 ids into 50304x768 fp32": _embedding_backward_case,
    **{f"sdpa {b} causal 4x16x2048x128 bf16": _attention_case(b) for b in ("cudnn", "flash", "efficient")},
    "_fused_adamw_ 8x4096^2 fp32": _fused_adamw_case,
}


def capture_call(build: Callable[[str], Callable[[], object]]) -> list[OpSignature]:
    """Signatures of one profile case's call, built and run on fake CPU tensors."""
    recorder = SignatureRecorder()
    with FakeTensorMode():
        call = build("cpu")
        with recorder:
            call()
    return [sig_on_cuda(s) for s in recorder.signatures]
