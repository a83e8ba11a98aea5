"""An installed phantora (its packages in a site-packages) gives the traced command's processes
its two packages only, never the rest of its own environment: the command may run another
environment's Python (a CUDA build of torch, a framework's venv), whose own packages must win.
Before, the whole site-packages went on the command's PYTHONPATH: a script run by the test suite's
CUDA-build Python imported torch 2.13.0+cpu from phantora's venv, and Megatron-LM's Python 3.12
venv failed on the 3.11 venv's orjson (`No module named 'orjson.orjson'`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from phantora.simulator.launch import PACKAGE_ROOT, import_dir

ROOT = Path(__file__).resolve().parents[2]


def test_a_checkout_is_put_on_the_path_as_it_is(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PHANTORA_CACHE_DIR", str(tmp_path / "cache"))
    assert PACKAGE_ROOT == ROOT  # the suite runs from the checkout
    assert import_dir(ROOT) == ROOT
    assert not (tmp_path / "cache").exists()


def _installed_layout(tmp_path: Path) -> Path:
    """A site-packages as pip leaves it: phantora's packages, its dist-info, and another package
    of phantora's environment (`decoy`) that a command run by another Python must not see."""
    site = tmp_path / "venv" / "lib" / "site-packages"
    site.mkdir(parents=True)
    for name in ("phantora", "interpose"):  # copies: phantora finds its root through resolved paths
        shutil.copytree(ROOT / name, site / name, ignore=shutil.ignore_patterns("__pycache__"))
    (site / "phantora-0.1.0.dist-info").mkdir()
    (site / "decoy.py").write_text("RAISE = 1\n")
    return site


def test_an_installed_phantora_gives_a_folder_of_its_two_packages_only(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PHANTORA_CACHE_DIR", str(tmp_path / "cache"))
    site = _installed_layout(tmp_path)
    folder = import_dir(site)
    assert folder != site and folder.is_relative_to(tmp_path / "cache")
    assert sorted(p.name for p in folder.iterdir()) == ["interpose", "phantora"]
    assert (folder / "phantora").resolve() == (site / "phantora").resolve()
    assert import_dir(site) == folder  # made once, then reused
    # another installation gets its own folder
    other = tmp_path / "other" / "site-packages"
    other.mkdir(parents=True)
    assert import_dir(other) not in (folder, other)


def test_a_traced_command_imports_its_own_packages_not_phantoras_environment(tmp_path: Path) -> None:
    site = _installed_layout(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PHANTORA_CACHE_DIR"] = str(tmp_path / "cache")
    script = ("import importlib.util, interpose; "
              "print('decoy', importlib.util.find_spec('decoy') is not None, 'interpose', interpose.__file__)")
    # the launcher imported from the installed layout, run from elsewhere, as `pip install` leaves it
    launcher = f"import sys; sys.path.insert(0, {str(site)!r}); from phantora.cli import main; main()"
    proc = subprocess.run([sys.executable, "-c", launcher, "trace", "-o", str(tmp_path / "run.json"), "--",
                           sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("decoy "))
    _, seen, _, where = line.split()
    assert seen == "False", line  # the rest of phantora's environment stays off the command's path
    assert Path(where).resolve() == site / "interpose" / "__init__.py"  # phantora's own packages are on it


def test_phantoras_code_imported_through_the_folder_is_not_counted_as_the_programs(tmp_path: Path,
                                                                                    monkeypatch) -> None:
    """The counted host leaves out code from phantora's files; a traced command of an installed
    phantora imports them through the folder's links, and code objects keep the linked path. Before,
    only the resolved site-packages path was left out, so phantora's own Python in the rank
    processes counted as the program's (the README example: 26.23 ms a step installed, 26.19 ms
    from a checkout)."""
    monkeypatch.setenv("PHANTORA_CACHE_DIR", str(tmp_path / "cache"))
    folder = import_dir(_installed_layout(tmp_path))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(folder)
    script = ("import json, interpose.host.python_work as m, phantora.cache as c; "
              "print(json.dumps([[m.load.__code__.co_filename, c.cache_dir.__code__.co_filename], "
              "list(m.excluded_prefixes())]))")
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    files, excluded = json.loads(proc.stdout.splitlines()[-1])
    assert all(f.startswith(str(folder)) for f in files), files  # imported through the links
    assert all(f.startswith(tuple(excluded)) for f in files), (files, excluded)
