"""Fixtures shared by every test directory.

`cuda_torch_python`: a Python interpreter with the CUDA build of torch (torch==2.14.1+cu130), used
as the *user side* of traced runs to check that phantora works on both torch builds without a GPU.
It is $PHANTORA_CUDA_TORCH_PYTHON when set; otherwise a virtual environment is built once under
phantora's cache dir (pip takes the ~5.5 GB CUDA build from the local wheel mirror: measured 83 s
for `python -m venv` + `pip install torch==2.14.1` on the 2-core CI machine, 14 s more for phantora's
dependencies) and reused by later runs.

`frameworks_cuda_python`: the same interpreter with the frameworks that need torch 2.14 installed
into it as their docs tell a GPU user to (FRAMEWORKS_CUDA below): TorchTitan, and Megatron-Core,
whose 0.19 wheels declare Python >= 3.12 but install and run on 3.11 with --ignore-requires-python.
Both import `triton` without declaring it; the CUDA build of torch brings it. Measured about 25 s
on top of the CUDA environment.

`te_cuda_python`: the CUDA build of torch with Transformer Engine's Python layer installed as
`pip install "phantora[te]"` installs it (the `te` extra). Its own environment, which sees the
CUDA environment's packages through a .pth file: with TE importable, Megatron-Core switches to TE's
optimizers and multi-tensor kernels, so the frameworks' environment stays without it.

`megatron_te_python`: that TE environment once the frameworks are installed into the CUDA
environment it sees, for Megatron-Core with Transformer Engine's layer spec.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from interpose.device.shim_build import cache_dir
from interpose.launch.warm import DIR_ENV as WARM_DIR_ENV, IDLE_ENV as WARM_IDLE_ENV

ROOT = Path(__file__).resolve().parents[1]
CUDA_TORCH = "torch==2.14.1"

# The suite runs `phantora trace` with the modelled host and without start-up costs unless a test
# asks for them. The default, counted host is deterministic too, but it charges what each rank's
# own Python runs, and ranks are not symmetric (rank 0 logs, saves, prints): --ranks auto, which
# mirrors rank 0's records to the ranks it stands for, then differs from --ranks all by rank 0's
# extra Python (examples/fsdp_train.py at 4 ranks: 1.35 ms of a 2.97 s first step, up to 0.4 us of a
# 31.9 ms step), where many tests compare them exactly. It also costs each traced run the
# counter's tracing of the program's Python (~15% wall on the GPT example), over a suite that starts
# hundreds of traced runs. The defaults (counted host, start-up costs) are tested where they are the
# subject: tests/e2e/test_host_time.py (same trace under load, counted Python against `dis`),
# tests/host/, and each framework's measured-host test.
os.environ.setdefault("PHANTORA_HOST_TIME", "modelled")
os.environ.setdefault("PHANTORA_STARTUP_COSTS", "0")


@pytest.fixture(scope="session", autouse=True)
def warm_fork_servers() -> Iterator[None]:
    """The suite's traced runs start their ranks from warm fork servers (phantora/simulator/
    forkserver.py): hundreds of runs would otherwise each import torch and torch._dynamo (~5 s of
    CPU). Tests of a fresh process's start set PHANTORA_FORK_SERVER=0 or drop the directory. Each
    pytest-xdist worker has its own servers; they are stopped when the session ends."""
    if os.environ.get(WARM_DIR_ENV) is not None:  # the caller's choice ("" turns them off)
        yield
        return
    folder = tempfile.mkdtemp(prefix="phantora-fs-")  # short: a socket's path has room for 107 bytes
    os.environ[WARM_DIR_ENV] = folder
    # a test that sets its own environment gets a server of its own: let those go sooner (~370 MB each)
    os.environ.setdefault(WARM_IDLE_ENV, "60")
    try:
        yield
    finally:
        del os.environ[WARM_DIR_ENV]
        for pid_file in Path(folder).glob("*.pid"):
            try:
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                pass
        shutil.rmtree(folder, ignore_errors=True)


def _torch_cuda_version(python: str) -> str:
    proc = subprocess.run([python, "-c", "import torch; print(torch.version.cuda)"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, f"{python} cannot import torch:\n{proc.stderr[-2000:]}"
    return proc.stdout.strip()


def _build_cuda_venv(venv: Path) -> None:
    """User-side environment: the CUDA build of torch plus phantora's runtime dependencies
    (phantora and interpose themselves come from this checkout through `phantora trace`'s
    PYTHONPATH)."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=300)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    proc = subprocess.run([*pip, CUDA_TORCH, *deps], capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        pytest.fail(f"could not install {CUDA_TORCH} (CUDA build) into {venv}; set PHANTORA_CUDA_TORCH_PYTHON "
                    f"to a Python that has a CUDA build of torch instead:\n{proc.stderr[-3000:]}")


@pytest.fixture(scope="session")
def cuda_torch_python() -> str:
    python = os.environ.get("PHANTORA_CUDA_TORCH_PYTHON")
    if not python:
        venv = cache_dir() / "test-venv-cuda-torch"
        ready = venv / ".phantora-ready"
        venv.parent.mkdir(parents=True, exist_ok=True)
        with open(venv.parent / ".test-venv-cuda-torch.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent test sessions build it once
            if not ready.exists():
                _build_cuda_venv(venv)
                ready.write_text(CUDA_TORCH + "\n")
        python = str(venv / "bin" / "python")
    cuda = _torch_cuda_version(python)
    assert cuda not in ("", "None"), f"{python} has a CPU build of torch; PHANTORA_CUDA_TORCH_PYTHON must name " \
                                     "a Python with a CUDA build"
    return python


# pip invocations, in order, that put the torch-2.14 frameworks into the CUDA-build environment.
FRAMEWORKS_CUDA: tuple[tuple[str, ...], ...] = (
    ("torchtitan==0.3.0",),
    ("--ignore-requires-python", "megatron-core==0.19.2"),
    ("transformers==5.24.0", "accelerate==1.15.0"),
)


@pytest.fixture(scope="session")
def frameworks_cuda_python(cuda_torch_python: str) -> str:
    if os.environ.get("PHANTORA_CUDA_TORCH_PYTHON"):
        return cuda_torch_python  # the user's own environment: they installed the frameworks
    venv = Path(cuda_torch_python).parents[1]
    ready = venv / ".phantora-frameworks-ready"
    wanted = repr(FRAMEWORKS_CUDA) + "\n"
    with open(venv.parent / ".test-venv-cuda-torch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ready.exists() or ready.read_text() != wanted:
            for args in FRAMEWORKS_CUDA:
                proc = subprocess.run([cuda_torch_python, "-m", "pip", "install", "--quiet", *args],
                                      capture_output=True, text=True, timeout=1200)
                if proc.returncode != 0:
                    pytest.fail(f"could not install {' '.join(args)} into {venv}:\n{proc.stderr[-3000:]}")
            ready.write_text(wanted)
    return cuda_torch_python


@pytest.fixture(scope="session")
def te_cuda_python(cuda_torch_python: str) -> str:
    if os.environ.get("PHANTORA_CUDA_TORCH_PYTHON"):
        return cuda_torch_python  # the user's own environment: they installed TE
    venv = cache_dir() / "test-venv-te"
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["te"]
    ready = venv / ".phantora-ready"
    wanted = repr(extra) + "\n"
    with open(venv.parent / ".test-venv-te.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ready.exists() or ready.read_text() != wanted:
            subprocess.run([cuda_torch_python, "-m", "venv", "--clear", str(venv)], check=True, timeout=300)
            purelib = subprocess.run([cuda_torch_python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                     capture_output=True, text=True, check=True, timeout=60).stdout.strip()
            python = str(venv / "bin" / "python")
            own = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True, timeout=60).stdout.strip()
            (Path(own) / "phantora_cuda_torch.pth").write_text(purelib + "\n")
            proc = subprocess.run([python, "-m", "pip", "install", "--quiet", *extra], capture_output=True, text=True,
                                  timeout=1200)
            if proc.returncode != 0:
                pytest.fail(f"could not install {' '.join(extra)} into {venv}:\n{proc.stderr[-3000:]}")
            ready.write_text(wanted)
    return str(venv / "bin" / "python")


@pytest.fixture(scope="session")
def megatron_te_python(frameworks_cuda_python: str, te_cuda_python: str) -> str:
    """Megatron-Core (installed into the CUDA environment by `frameworks_cuda_python`, which this
    waits for) and Transformer Engine's Python layer (in `te_cuda_python`'s own environment, which
    sees the CUDA environment's packages): Megatron-Core's `--transformer-impl transformer_engine`."""
    return te_cuda_python
