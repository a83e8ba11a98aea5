"""TorchTitan 0.3.0's own integration tests (tests/integration_tests/features.py at commit
1fdf90d3f9b7, transcribed in tests/frameworks/torchtitan/integration_list.py) pass under phantora,
each run exactly as TorchTitan's run_tests.py runs it, `phantora trace -o TRACE --` in front of
`./run_train.sh`. A fast subset: two of the 1-2 GPU tests and one compile test; the whole list
(34 tests, 41 runs, up to 8 GPUs) is benchmarks/frameworks/torchtitan_integration.py.

What TorchTitan's runner checks is each variant's exit code; on top of it, cheaply: the trace
was written, every rank logged every step, and the trace marks one ProfilerStep per step on
every rank.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from phantora.trace.check import load_chrome_trace
from tests.frameworks.torchtitan.integration_list import (COMMIT, OUTPUT_DIR, build_features_test_list, command,
                                                          runnable_tests, write_checkout)
from tests.frameworks.torchtitan.integration_run import Result, environment, run_test

# test -> (steps every rank logs, optimizer steps the trace marks per rank). llama3_debugmodel and
# sft_debugmodel train 10 steps. seed_checkpoint trains none and saves step 0; saving it, torch's
# distributed checkpoint creates AdamW's empty state by calling optimizer.step() once with zero
# gradients and lr 0 (torch/distributed/checkpoint/state_dict.py, _init_optim_state), which the
# trace marks as the one step it is. Kept to three (about 2.5 minutes on 2 busy cores, the rest of
# the 1-2 GPU tests are in the benchmark): one on 1 GPU, one on 2 with the SFT data path, one compiled.
CI_TESTS = {"seed_checkpoint": (0, 1), "sft": (10, 10), "1d_compile": (10, 10)}
TIMEOUT_S = 600


def test_list_is_torchtitans() -> None:
    """The transcription: as many tests and runs as features.py's list at the commit, the spmd
    transform applied as TorchTitan's CI applies it, and one command as run_tests.py spells it
    (each checked against the original files when transcribed)."""
    tests = build_features_test_list()
    runnable = runnable_tests()
    assert COMMIT.startswith("1fdf90d3f")
    assert (len(tests), len(runnable), sum(len(t.override_args) for t in runnable)) == (40, 34, 41)
    by_name = {t.test_name: t for t in tests}
    # typechecking and no AC added where supported; not to compile, PP-only, or the CE-loss variant
    assert by_name["default"].override_args[0][0] == "--debug.spmd_typechecking"
    assert by_name["default"].override_args[0][-1] == "activation-checkpoint:none"
    assert "--debug.spmd_typechecking" not in by_name["1d_compile"].override_args[0]
    assert "--debug.spmd_typechecking" not in by_name["pp_1f1b"].override_args[0]
    assert "--debug.spmd_typechecking" in by_name["2d_eager"].override_args[0]
    assert "--debug.spmd_typechecking" not in by_name["2d_eager"].override_args[1]
    assert by_name["seed_checkpoint"].timeout == 30
    # features.py's model_only_hf_checkpoint load path: under RUNNER_TEMP on TorchTitan's CI
    hf = {t.test_name: t for t in build_features_test_list("/ci")}["model_only_hf_checkpoint"]
    assert ("--checkpoint.initial_load_path /ci/artifacts-to-be-uploaded/model_only_hf_checkpoint/hf_checkpoint/step-10/"
            in hf.override_args[1])
    assert command(by_name["sft"], by_name["sft"].override_args[0], OUTPUT_DIR) == (
        'TORCH_TRACE="artifacts-to-be-uploaded/sft/compile_trace" NGPU=2 LOG_RANK=0,1 ./run_train.sh '
        "--dump_folder artifacts-to-be-uploaded/sft --debug.spmd_typechecking --module llama3 --config sft_debugmodel "
        "activation-checkpoint:none")


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory set up as a torchtitan checkout's root, shared by the tests as run_tests.py's
    output_dir is."""
    root = tmp_path_factory.mktemp("torchtitan-checkout")
    write_checkout(root)
    return root


def _detail(result: Result) -> str:
    v = result.variants[-1]
    return f"\n{result.cause}\n$ {v.command}\n--- output (last 6000 chars)\n{v.output[-6000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CI_TESTS))
def test_torchtitan_integration_test_passes(name: str, checkout: Path, frameworks_cuda_python: str) -> None:
    test = next(t for t in runnable_tests(str(checkout)) if t.test_name == name)
    result = run_test(test, checkout, environment(frameworks_cuda_python, checkout), timeout=TIMEOUT_S)
    # TorchTitan's runner: every variant exits 0
    assert result.passed, _detail(result)
    steps, optimizer_steps = CI_TESTS[name]
    for v in result.variants:
        assert v.trace_written, _detail(result)
        logged = {rank: list(range(1, steps + 1)) for rank in range(test.ngpu)} if steps else {}
        assert v.steps == logged, (v.steps, _detail(result))
        events = load_chrome_trace(v.trace)["traceEvents"]
        for rank in range(test.ngpu):
            marked = [e["name"] for e in events if e.get("ph") == "X" and e.get("pid") == rank + 1
                      and re.fullmatch(r"ProfilerStep#\d+", str(e.get("name")))]
            assert marked == [f"ProfilerStep#{k}" for k in range(optimizer_steps)], (rank, marked)
    if name == "seed_checkpoint":
        assert "Created seed checkpoint" in result.variants[0].output
        assert (checkout / OUTPUT_DIR / name / "checkpoint" / "step-0").is_dir()
