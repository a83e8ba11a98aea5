"""A tensor's device read in one thread while another thread's op is inside its (fake) kernel:
nn.DataParallel's replica threads do this all the time (Transformers' mask code moves a mask
to `result.device`). On a GPU the device is always the tensor's own; under phantora the
kernel-time "meta" device of one thread must not leak into another."""
import threading

import torch
from torch._subclasses.fake_tensor import in_kernel_invocation_manager

t = torch.zeros(4, device="cuda")
inside, read = threading.Event(), threading.Event()
seen = []


def reader() -> None:
    inside.wait()
    seen.append(t.device)
    seen.append((t + 1).device)  # and ops from this thread still run
    read.set()


thread = threading.Thread(target=reader)
thread.start()
# what the simulation's dispatch does around every fake kernel, held while the other thread reads
with in_kernel_invocation_manager(t.fake_mode):
    inside.set()
    read.wait(30)
thread.join()
assert seen == [torch.device("cuda", 0)] * 2, seen
print("ok device_read_during_other_threads_kernel")

# the real pattern: DataParallel replicas reading devices and moving tensors to them
model = torch.nn.DataParallel(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()).cuda())


class Mask(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(200):
            x = x * torch.ones((), dtype=torch.bool, device=x.device).to(x.device)
        return x


masked = torch.nn.DataParallel(Mask().cuda())
for _ in range(3):
    out = masked(model(torch.randn(64, 64, device="cuda")))
    assert out.device == torch.device("cuda", 0)
print("ok data_parallel_device_reads")
