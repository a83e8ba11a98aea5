"""What /proc says about the processes a benchmark started (Linux): memory and the process tree.

Ranks forked by phantora's fork server are the server's children, not the launcher's: walk the
whole tree.
"""

from __future__ import annotations

import re
from pathlib import Path


def pss_kib(pid: int) -> int:
    """Proportional set size (shared pages split between the processes sharing them), KiB."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    m = re.search(r"^Pss:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) if m else 0


def descendants(pid: int) -> list[int]:
    """Every process under `pid`."""
    found, todo = [], [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                kids = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found
