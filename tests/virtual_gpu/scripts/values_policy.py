"""One value policy for data-less tensors (interpose/values/policy.py), checked on one virtual GPU:
a placeholder reads the same number whatever way a script reads it, D2H copies keep shadows,
CPU data survives a round trip through the GPU, and CPU index tensors stay real and cheap."""
import sys

import torch


def reads(x: torch.Tensor) -> tuple[list, list]:
    """Every way a script reads a one-element tensor: (as a number, as a truth value)."""
    numbers = [
        float(int(x.to(torch.uint8))),
        x.float().item(),
        float(x.cpu().item()),
        float(x.reshape(-1).tolist()[0]),
        float(x.cpu().numpy().reshape(-1)[0]),
        float(x.to("cpu", torch.float64).item()),
        float(x.double().cpu().tolist()[0] if x.dim() else x.double().cpu().tolist()),
        float(f"{x.float().reshape(())}"),
    ]
    truths = [bool(x), x.any().item(), bool(x.bool().cpu()), bool(x.to(torch.uint8).any()), x.ne(0).all().item()]
    return numbers, truths


g = torch.randn(64, 64, device="cuda")
# a placeholder bool, a placeholder float, an isfinite result, a real (shadowed) int
cases = {
    "nan_flag": torch.isnan(g).any(),
    "inf_flag": g.isinf().any().reshape(1),
    "finite": torch.isfinite(g).all(),
    "norm": torch.linalg.vector_norm(g),
    "loss": (g.float() ** 2).mean(),
    "shadow_int": torch.tensor([3], device="cuda"),
    "shadow_bool": torch.tensor(True, device="cuda"),
}
expected = {"nan_flag": 0.0, "inf_flag": 0.0, "finite": 1.0, "norm": 1.0, "loss": 1.0, "shadow_int": 3.0,
            "shadow_bool": 1.0}
for name, x in cases.items():
    numbers, truths = reads(x)
    assert all(v == expected[name] for v in numbers), (name, numbers)
    assert all(v is bool(expected[name]) for v in truths), (name, truths)
print("ok reads_agree")

# DeepSpeed's overflow check (runtime/utils.py CheckOverflow, zero/stage_1_and_2.py), in plain torch
grads = [torch.randn(1000, device="cuda", dtype=torch.half) for _ in range(3)]
invalid = torch.zeros([1], dtype=torch.float, device="cuda")
for grad in grads:
    f = grad.float()
    invalid += f.isnan().logical_or(f.isinf()).float().max()
overflow_gpu = invalid.bool().byte()
assert overflow_gpu[0].item() == 0, overflow_gpu[0].item()
cpu_sum = float(grads[0].float().sum())
assert cpu_sum not in (float("inf"), -float("inf")) and cpu_sum == cpu_sum
overflow = any(float(x.float().sum()) in (float("inf"), -float("inf")) for x in grads)
assert torch.tensor([overflow], dtype=torch.uint8, device="cuda")[0].item() == 0  # accelerator.ByteTensor
print("ok deepspeed_overflow")

# torch.nn.utils.clip_grad_norm_: a healthy run's norm is finite and positive
p = torch.nn.Parameter(torch.randn(32, 32, device="cuda"))
p.grad = torch.randn(32, 32, device="cuda")
norm = torch.nn.utils.clip_grad_norm_([p], 1.0)
assert 0 < norm.item() < float("inf") and bool(norm.isfinite()) and not bool(norm.isnan())
print("ok grad_norm")

# D2H copies carry the shadow
counts = torch.tensor([5, 7, 11], device="cuda")
counts += 1
assert counts.cpu().tolist() == [6, 8, 12], counts.cpu().tolist()
host = torch.empty(3, dtype=torch.int64)
host.copy_(counts)
assert host.tolist() == [6, 8, 12] and counts.cpu().numpy().tolist() == [6, 8, 12]
assert int(counts.sum().cpu()) == 26
print("ok d2h_shadow")

# a float counter computed on the CPU keeps its value on the GPU (HF's total_flos)
flos = torch.tensor([1.5e12], device="cuda")  # float32, as on a GPU: 1500000026624.0
expected_flos = torch.tensor([1.5e12]).item()
assert flos.item() == expected_flos and flos.cpu().item() == expected_flos, flos.item()
assert (flos * 2).item() == 2 * expected_flos and float(flos.sum().cpu()) == expected_flos
print("ok float_counter")

# Accelerate's RNG sync: CPU generator state through the GPU and back
torch.manual_seed(1234)
state = torch.get_rng_state()
on_gpu = state.to("cuda")
back = on_gpu.cpu()
assert torch.equal(back, state), "rng state changed on its round trip"
torch.set_rng_state(back)
a = torch.rand(4)
torch.set_rng_state(state)
assert torch.equal(a, torch.rand(4))
print("ok rng_state_round_trip")

# CPU index tensors stay real, and reading them costs no per-element work
observer = sys.modules["interpose.runtime"].get().observer  # phantora's op observer: counts ops
perm = torch.randperm(100_000)
before = observer.ops_seen
items = perm.tolist()
assert sorted(items) == list(range(100_000)), "randperm is not a permutation"
assert observer.ops_seen - before <= 2, observer.ops_seen - before
ar = torch.arange(200_000)
assert ar[-1].item() == 199_999 and ar.tolist()[123_456] == 123_456
print("ok index_tensors_real")
