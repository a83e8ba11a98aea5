"""Expert parallelism by hand, 2 ranks, 2 experts (expert e on rank e), top-1 routing: the
dispatcher every stack implements (counts -> all_to_all of counts -> .tolist() split sizes ->
all_to_all of the tokens -> the local expert's GEMM -> all_to_all back). With a routing file of
fractions [0.75, 0.25] each rank sends 1,536 of its 2,048 tokens to expert 0 (kept on rank 0 or
sent there) and 512 to expert 1.

Prints `ok` lines and, per rank, the sizes it used, for the test to check against its hand count.
"""

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(rank)
N, D, H, E = 2048, 1024, 4096, 2
torch.manual_seed(0)
gate = torch.nn.Linear(D, E, bias=False, device="cuda", dtype=torch.bfloat16)
w1 = torch.randn(D, H, device="cuda", dtype=torch.bfloat16)  # this rank's expert
x = torch.randn(N, D, device="cuda", dtype=torch.bfloat16)

scores = gate(x).float().softmax(-1)
expert = torch.topk(scores, 1, dim=-1).indices.view(-1)
counts = torch.bincount(expert, minlength=E)
received_counts = torch.empty_like(counts)
dist.all_to_all_single(received_counts, counts)
send = counts.tolist()  # expert e lives on rank e: one split per rank
recv = received_counts.tolist()
order = torch.argsort(expert, stable=True)
tokens = x[order]
got = torch.empty(sum(recv), D, device="cuda", dtype=torch.bfloat16)
dist.all_to_all_single(got, tokens, recv, send)
h = got @ w1  # the expert's GEMM over the tokens it received
back = torch.empty(N, H, device="cuda", dtype=torch.bfloat16)
dist.all_to_all_single(back, h, send, recv)
torch.cuda.synchronize()
print(f"rank {rank} send {send} recv {recv} gemm_rows {got.shape[0]}", flush=True)
assert sum(send) == N and back.shape == (N, H)
print(f"ok rank {rank}", flush=True)
dist.destroy_process_group()
