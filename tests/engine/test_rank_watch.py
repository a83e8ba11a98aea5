"""The launcher's report names a failed process by its global rank: with representative ranks
(--ranks 0,4,7) the third process is rank 7, not "rank 2" as it was reported (TorchTitan's
validation_tp_cp_pp under --ranks auto)."""

from __future__ import annotations

from types import SimpleNamespace

from phantora.simulator.launch import RankWatch


class _Exited:
    def __init__(self, code: int) -> None:
        self.returncode = code

    def poll(self) -> int:
        return self.returncode


def test_a_failed_representative_is_named_by_its_rank():
    watch = RankWatch(SimpleNamespace(failure=None, stop=lambda: None))
    watch.procs.extend([_Exited(0), _Exited(0), _Exited(1)])
    watch.ranks = [0, 4, 7]
    assert not watch.keep_going()  # every process has ended
    assert watch.report() == ["rank 7 exited with code 1 (the first rank to fail: the root cause)"]
    assert watch.exit_code() == 1
