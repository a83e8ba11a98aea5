"""torch.compile with autotuning asked for through options (as TorchTitan compiles its flex
attention): the run compiles with heuristic choices and says so (NoValidChoicesError before)."""
import torch
from torch.nn.attention.flex_attention import flex_attention, create_block_mask
B,H,S,D=2,4,1024,16
q,k,v=(torch.randn(B,H,S,D,device="cuda",dtype=torch.bfloat16,requires_grad=True) for _ in range(3))
bm=create_block_mask(lambda b,h,qi,ki: qi>=ki,None,None,S,S,device="cuda")
f=torch.compile(flex_attention, options={"max_autotune": True, "coordinate_descent_tuning": True, "triton.cudagraphs": False})
o=f(q,k,v,block_mask=bm)
o.sum().backward()
torch.cuda.synchronize(); print("ok autotune_options")
