"""Each worker says who it is on stdout and on stderr (tests/e2e/test_torchrun_output.py)."""
import os
import sys

import torch

rank = os.environ["RANK"]
error_file = "set" if os.environ.get("TORCHELASTIC_ERROR_FILE") else "unset"
# One write a line: torchrun starts its workers with `python -u`, where print() writes the text and
# its newline separately, so two workers sharing the console can splice their lines together.
sys.stdout.write(f"out from rank {rank} role {os.environ['ROLE_NAME']} error file {error_file}\n")
sys.stderr.write(f"err from rank {rank}\n")
sys.stdout.write(f"phantora's variables: {sorted(k for k in os.environ if k.startswith('PHANTORA_RANK_'))}\n")
torch.ones(2, device="cuda").add_(1)
