"""Issue 15, Lightning ddp_spawn: pickling a module whose tensors are virtual (FakeTensors) failed
with "Can't pickle local object 'WeakValueDictionary.__init__.<locals>.remove'" (the FakeTensor's
mode was pickled with it). Now a virtual tensor pickles as its metadata and value and is rebuilt
in the receiving process (interpose/distributed/pickling.py)."""

from __future__ import annotations

from pathlib import Path

from tests.virtual_gpu.harness import BUILDS, assert_ran, run_traced


@BUILDS
def test_virtual_tensors_pickle_through_spawn(tmp_path: Path, user_python: str) -> None:
    proc, _ = run_traced(tmp_path, user_python, "pickle_virtual.py", timeout=300)
    assert_ran(proc, "module and tensor arrive in pickle.loads", "a GPU tensor keeps its data",
               "module and tensor arrive in the spawned process")
