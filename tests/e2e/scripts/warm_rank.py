"""Prints, as one JSON line, what started this process: whether torch was imported before the
script's own import (it is in a process forked from a fork server), its parent and grandparent,
directory, argv, one variable of the caller's (WARM_PROBE) and the GPUs it sees. `--sleep S`:
then waits S seconds of real time (select's timeout: the virtual clock has time.sleep)."""
import json
import os
import select
import sys
from pathlib import Path

torch_before = "torch" in sys.modules
import torch  # noqa: E402

parent = os.getppid()
grandparent = int(Path(f"/proc/{parent}/stat").read_text().rsplit(")", 1)[1].split()[1])
x = torch.ones(8, device="cuda")
print("WARMINFO " + json.dumps({
    "torch_before": torch_before, "pid": os.getpid(), "parent": parent, "grandparent": grandparent,
    "cwd": os.getcwd(), "argv": sys.argv, "probe": os.environ.get("WARM_PROBE"),
    "devices": torch.cuda.device_count(), "sum": x.sum().item()}), flush=True)
if "--sleep" in sys.argv:
    select.select([], [], [], float(sys.argv[sys.argv.index("--sleep") + 1]))
