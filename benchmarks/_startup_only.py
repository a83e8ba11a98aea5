"""The FSDP2 example's start without its training: its imports (torch, torch.distributed, FSDP,
the GPT model), joining the process group and one all-reduce (bench_startup.py)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import fsdp_train  # noqa: E402,F401  (the example's imports)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
dist.all_reduce(torch.ones(1, device="cuda"))
dist.destroy_process_group()
