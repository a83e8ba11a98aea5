"""The run summary's lines about kernel times, rollbacks and stale replies say what they mean
(issue 19, point 10): counts per estimator never read as if the headline estimator timed
kernels it did not, and stale replies / early reads get a plain sentence."""

from __future__ import annotations

from types import SimpleNamespace

from phantora.simulator.launch import collective_lines, kernel_times_lines


def _result(by_estimator: dict[str, int]) -> SimpleNamespace:
    choice = SimpleNamespace(description="calibrated from t.jsonl; analytical outside its range",
                             after_run=lambda: [], notes=[])
    return SimpleNamespace(kernel_times=choice, summary=SimpleNamespace(kernels_by_estimator=by_estimator))


def test_kernel_counts_are_grouped_by_the_estimator_that_timed_them():
    lines = kernel_times_lines(_result({"analytical (outside calibrated range)": 2, "calibrated": 5,
                                        "analytical (no calibration data for this op)": 1}))
    assert lines[1] == ("    kernels timed: 5 calibrated; 3 analytical (2 outside calibrated range, "
                        "1 no calibration data for this op)")


def _summary(rollbacks: int, stale: int, error_ns: int, early: int) -> SimpleNamespace:
    return SimpleNamespace(collectives=12, comm_busy_ns=3_000_000, rollbacks=rollbacks, stale_replies=stale,
                           largest_stale_error_ns=error_ns, early_reads=early)


def test_stale_replies_and_early_reads_are_explained():
    run = SimpleNamespace(sync="optimistic")
    text = "\n".join(collective_lines(run, _summary(3, 2, 4_700, 9)))
    assert "network rollbacks 3: times the network re-simulated" in text
    assert "9 collective end(s) were read by a waiting host" in text
    assert "2 of them stale (a later rollback moved that end, by up to 4.7 us" in text
    assert "--sync conservative" not in text  # microseconds: no advice
    text = "\n".join(collective_lines(run, _summary(0, 0, 0, 4)))
    assert "none of them changed afterwards" in text
    conservative = "\n".join(collective_lines(SimpleNamespace(sync="conservative"), _summary(1, 0, 0, 0)))
    assert "0 collective end(s)" in conservative and "none stale: conservative mode holds" in conservative


def test_stale_replies_large_enough_to_move_a_step_point_to_conservative_sync():
    # the 671B at 1,024 GPUs under --ranks auto: 844 stale reads, the largest off by 121.9 ms
    text = "\n".join(collective_lines(SimpleNamespace(sync="optimistic"), _summary(1531, 844, 121_936_800, 4163)))
    assert "by up to 121936.8 us" in text
    assert "--sync conservative holds each read until the end is final" in text
