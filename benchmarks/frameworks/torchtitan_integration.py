"""TorchTitan 0.3.0's own integration tests (tests/integration_tests/features.py, the list its CI
runs on 8 GPUs) under phantora, each run exactly as TorchTitan's run_tests.py runs it, with
`phantora trace -o TRACE --` in front of `./run_train.sh`:

    TORCH_TRACE="OUT/artifacts-to-be-uploaded/TEST/compile_trace" NGPU=N LOG_RANK=0,..,N-1 \\
        python -m phantora.cli trace -o OUT/traces/TEST.V.json -- \\
        ./run_train.sh --dump_folder OUT/artifacts-to-be-uploaded/TEST ARGS...

    python benchmarks/frameworks/torchtitan_integration.py [--test NAME]... [--only-ngpu-le N] [--out DIR] [--timeout S] [--ranks R]

The list, run_train.sh and torchtitan_recipes are transcribed from pytorch/torchtitan at commit
1fdf90d3f9b7 (tests/frameworks/torchtitan/integration_list.py); OUT is set up as a checkout's
root (run_train.sh, torchtitan_recipes/, the stand-in tests/assets of assets.py) and every
command runs from it with RUNNER_TEMP=OUT and output_dir OUT/artifacts-to-be-uploaded, as in
TorchTitan's CI workflow (model_only_hf_checkpoint's second variant loads the first's checkpoint
from $RUNNER_TEMP/artifacts-to-be-uploaded/...; without RUNNER_TEMP features.py falls back to a
relative path that TorchTitan's checkpointer refuses).
Variants of a test run in order and a test stops at its first failing variant, as
run_single_test does. A test passes when every variant exits 0, which is all TorchTitan's runner
checks. Tests run one at a time (run_tests.py --no-parallel): on a CPU each simulated GPU is a
process, and `--ngpu 8` worth of them at once would only slow every run down.

Needs the CUDA build of torch 2.14 with torchtitan 0.3.0 ($PHANTORA_CUDA_TORCH_PYTHON, or the
environment tests/conftest.py builds); SETUP below is pip-installed into it first, as a GPU user
installs what a test needs (float8_emulate_lora imports torchao). torchrun and python3 are that
environment's (its bin/ first on PATH). Nothing is fetched from the Hugging Face Hub.

Prints one row per test: name, GPUs, PASS/FAIL, the cause of a failure (the last error line of
the failing variant's output), each variant's wall seconds, and the steps TorchTitan logged; then
totals. OUT/results.jsonl holds one JSON object per test; OUT/logs/TEST.V.log each variant's
whole output and OUT/traces/TEST.V.json its trace. Each run is held to --timeout seconds of wall
(default 300); a run that outlasts the test's own `timeout` (seed_checkpoint's 30 s) is marked
as such separately, since run_tests.py would have killed it there on a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.frameworks.torchtitan.integration_list import OverrideDefinitions, runnable_tests, write_checkout  # noqa: E402
from tests.frameworks.torchtitan.integration_run import Result, environment, pip_install_missing, run_test  # noqa: E402
from tests.frameworks.torchtitan.run import cuda_python  # noqa: E402

# What a GPU user pip-installs for tests that need more than torchtitan's own requirements:
# float8_emulate_lora's Float8LinearConverter imports torchao. 0.18.0 is the newest release;
# its C++ extensions are built for another torch and are skipped with a warning, the float8
# emulation is Python (measured: imports and converts under torch 2.14.1).
SETUP: tuple[str, ...] = ("torchao==0.18.0",)
TIMEOUT_S = 300.0


def select(out: Path, names: list[str] | None = None, only_ngpu_le: int | None = None) -> list[OverrideDefinitions]:
    """The tests to run, the list built for RUNNER_TEMP=out as TorchTitan's CI builds it."""
    tests = runnable_tests(str(out))
    if names:
        known = {t.test_name for t in tests}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise SystemExit(f"unknown test(s) {unknown}; runnable: {sorted(known)}")
        tests = [t for t in tests if t.test_name in names]
    if only_ngpu_le is not None:
        tests = [t for t in tests if t.ngpu <= only_ngpu_le]
    return tests


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--test", action="append", help="run only this test (repeatable); default: every test not disabled")
    ap.add_argument("--only-ngpu-le", type=int, help="only tests on at most this many GPUs")
    ap.add_argument("--out", type=Path, default=Path("/tmp/torchtitan-integration"),
                    help="working directory (a checkout's root), logs, traces, results.jsonl; must be empty or new")
    ap.add_argument("--timeout", type=float, default=TIMEOUT_S, help="wall seconds allowed per run (default 300)")
    ap.add_argument("--ranks", help="phantora trace --ranks (all, auto, R0,R1,...); default: phantora's")
    args = ap.parse_args()
    out = args.out.resolve()
    tests = select(out, args.test, args.only_ngpu_le)
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} is not empty (run_tests.py: 'Please provide an empty output directory.')")
    py = cuda_python()
    installed = pip_install_missing(py, SETUP)
    if installed:
        print(f"installed into {py}: {' '.join(installed)}", flush=True)
    write_checkout(out)
    env = environment(py, out)
    results_path = out / "results.jsonl"
    print(f"{len(tests)} test(s), {sum(len(t.override_args) for t in tests)} run(s), in {out}", flush=True)
    results: list[Result] = []
    start = time.monotonic()
    for test in tests:
        r = run_test(test, out, env, args.timeout, args.ranks)
        results.append(r)
        with open(results_path, "a") as f:
            f.write(json.dumps(asdict(r)) + "\n")
        walls = " + ".join(f"{v.wall_s:.0f}" + ("!" if v.over_test_timeout else "") for v in r.variants)
        cpus = " + ".join(f"{v.cpu_s:.0f}" for v in r.variants)
        print(f"{r.test:32} {r.ngpu}  {'PASS' if r.passed else 'FAIL'}  {walls:>12} s  CPU {cpus:>12} s  "
              f"steps {_steps(r):12} {r.cause}", flush=True)
    total = time.monotonic() - start
    _table(results, args.timeout)
    passed = sum(r.passed for r in results)
    print(f"\n{passed}/{len(results)} passed; {sum(len(r.variants) for r in results)} runs in {total:.0f} s of wall; "
          f"results: {results_path}")
    return 0 if passed == len(results) else 1


def _steps(r: Result) -> str:
    """Per variant: the last step each rank logged, one figure where all ranks agree."""
    out = []
    for v in r.variants:
        last = {rank: max(steps) for rank, steps in v.steps.items()}
        figures = sorted(set(last.values()))
        out.append("-" if not figures else str(figures[0]) if len(figures) == 1 else "/".join(map(str, figures)))
    return ",".join(out)


def _table(results: list[Result], timeout: float) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("test", "GPUs", "result", "wall s (per variant)", "CPU s", "steps logged", "cause",
                  title=f"TorchTitan 0.3.0 integration tests (features) under phantora, {timeout:.0f} s per run")
    for r in results:
        walls = " + ".join(f"{v.wall_s:.0f}" + (" (> test timeout)" if v.over_test_timeout else "") for v in r.variants)
        if r.not_run:
            walls += f" ({r.not_run} not run)"
        table.add_row(r.test, str(r.ngpu), "PASS" if r.passed else "FAIL", walls,
                      " + ".join(f"{v.cpu_s:.0f}" for v in r.variants), _steps(r), r.cause)
    Console(width=250).print(table)


if __name__ == "__main__":
    sys.exit(main())
