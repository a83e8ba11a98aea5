"""Each worker says who it is on stdout and on stderr (tests/e2e/test_torchrun_output.py)."""
import os
import sys

import torch

rank = os.environ["RANK"]
error_file = "set" if os.environ.get("TORCHELASTIC_ERROR_FILE") else "unset"
print(f"out from rank {rank} role {os.environ['ROLE_NAME']} error file {error_file}", flush=True)
print(f"err from rank {rank}", file=sys.stderr, flush=True)
print("phantora's variables:", sorted(k for k in os.environ if k.startswith("PHANTORA_RANK_")), flush=True)
torch.ones(2, device="cuda").add_(1)
