"""The stacks under phantora's defaults: the counted host and a fresh process's start-up costs
(tests/conftest.py runs the rest of the suite with the modelled host and without them). Each run
checks what the defaults add and that the stack's own figures show it: the program's counted Python
(the framework's loop, hooks, logging) in every step, the start-up costs in the first step (and
NCCL's communicators where there are collectives), the framework's own first step or runtime long
accordingly (docs/host-time.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from phantora.query import load
from phantora.query.summary import summarize
from phantora.trace.check import load_chrome_trace
from tests.frameworks.test_huggingface import TRAINER, trace, trainer_logs
from tests.frameworks.test_lightning import run_lightning
from tests.frameworks.torchtitan.run import torchtitan


@pytest.fixture
def defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PHANTORA_HOST_TIME", "counted")
    monkeypatch.setenv("PHANTORA_STARTUP_COSTS", "1")


def startup_slices(trace_path: Path) -> dict[str, int]:
    names: dict[str, int] = {}
    for e in load_chrome_trace(trace_path)["traceEvents"]:
        if e.get("cat") == "startup":
            names[e["name"].removeprefix("start-up: ")] = names.get(e["name"].removeprefix("start-up: "), 0) + 1
    return names


def check_host(trace_path: Path) -> None:
    with load(trace_path, engine="builtin") as db:
        s = summarize(db)
    assert s.host is not None and s.host.mode == "counted"
    assert s.host.per_step_ns.get("python", 0) > 0
    first = {name for name, _, _ in s.host.first_step_startup}
    assert {"CUDA context creation", "kernel module load"} <= first


def test_lightning_one_gpu(tmp_path: Path, defaults: None) -> None:
    run = run_lightning(tmp_path, progress_bar="tqdm")
    assert run.proc.returncode == 0, run.detail()
    check_host(run.trace)
    # the first step holds the start-up (its own timer starts at the first step's end)
    with load(run.trace, engine="builtin") as db:
        steps = summarize(db).steps.per_rank[0].durations_ns
    assert len(steps) >= 3 and steps[0] > 100e6 + 3 * max(steps[1:]), steps


def test_trainer_gpt2_one_gpu(tmp_path: Path, defaults: None) -> None:
    run = trace(tmp_path, [sys.executable, TRAINER, "--model", "gpt2", "--steps", "3"], 1,
                env={"CUDA_VISIBLE_DEVICES": "0"})
    check_host(run.trace)
    runtime = [log["train_runtime"] for log in trainer_logs(run.proc.stdout) if "train_runtime" in log]
    assert runtime and runtime[-1] > 0.3  # the start-up costs are in the Trainer's own train_runtime


def test_torchtitan_fsdp_two_gpus(tmp_path: Path, frameworks_cuda_python: str, defaults: None) -> None:
    run = torchtitan(tmp_path, frameworks_cuda_python, 2, "--training.steps", "3")
    assert run.proc.returncode == 0, run.output[-4000:]
    check_host(run.trace)
    assert startup_slices(run.trace).get("NCCL communicator init", 0) >= 2  # each rank, its groups
