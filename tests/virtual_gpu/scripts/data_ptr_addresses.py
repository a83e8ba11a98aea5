"""data_ptr() of tensors without data: distinct among live storages, views offset from their
base, 0 for no memory, as on a GPU. Accelerate's FSDP2 prepare keys the optimizer's parameters
by data_ptr() (of the model on the CPU, then of the sharded parameters on the GPU)."""
import torch

a, b = torch.empty(1000, device="cuda"), torch.empty(1000, device="cuda")
assert a.data_ptr() != b.data_ptr() and a.data_ptr() != 0 and a.data_ptr() % 512 == 0, (a.data_ptr(), b.data_ptr())
assert a[10:].data_ptr() == a.data_ptr() + 10 * 4 and a.view(10, 100).data_ptr() == a.data_ptr()
assert torch.empty(0, device="cuda").data_ptr() == 0
print("ok cuda_addresses")

model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
on_cpu = {p.data_ptr() for p in model.parameters()}
assert len(on_cpu) == 4 and 0 not in on_cpu, on_cpu
model.cuda()
on_gpu = [p.data_ptr() for p in model.parameters()]
assert len(set(on_gpu)) == 4 and 0 not in on_gpu and on_gpu == [p.data_ptr() for p in model.parameters()], on_gpu
print("ok parameter_addresses")
