"""A rank that reads another rank's contribution after the store's host has left still gets it:
the host waits for every rank at destroy_process_group / exit (interpose/distributed/process_group.py)."""

from __future__ import annotations

import sys

from tests.virtual_gpu.harness import assert_ran, run_traced


def test_rank_0_does_not_take_the_store_away_before_rank_1_has_read(tmp_path):
    proc, _ = run_traced(tmp_path, sys.executable, "exit_rendezvous.py", options=("--nproc-per-node", "2"))
    assert_ran(proc, "rank 0 left", "rank 1 read after rank 0 left")
