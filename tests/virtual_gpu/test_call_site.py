"""A collective's call site (the trace's "call site", mismatch and timeout messages) names the
program's line, never phantora's own files, and for a program that is an installed framework run
as a module, that framework's line (interpose/distributed/process_group.py `call_site`)."""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor

from interpose.distributed.process_group import call_site
from interpose.host.python_work import own_source_dirs

SITE_PACKAGES = f"{sys.prefix}/lib/python3.11/site-packages"


def chain(*files: str):
    """A function whose call runs one frame per file, outermost first, the innermost asking for the
    call site (as the process group does when a collective is issued)."""
    inner = call_site
    for depth, path in enumerate(reversed(files)):
        namespace = {"inner": inner}
        exec(compile(f"def level_{depth}():\n    return inner()\n", path, "exec"), namespace)
        inner = namespace[f"level_{depth}"]
    return inner


def in_fresh_thread(fn):
    """fn's result, called where no frame of this test file is on the stack (the program's frames
    are only those fn brings)."""
    with ThreadPoolExecutor(1) as pool:  # its worker's frames are the standard library's
        return pool.submit(fn).result(timeout=30)


def test_phantoras_own_files_are_never_the_call_site():
    for own in own_source_dirs():
        site = in_fresh_thread(chain("/home/u/train.py", os.path.join(own, "ops", "observer.py")))
        assert site.startswith("/home/u/train.py:2 in "), site


def test_the_programs_line_is_preferred_to_an_installed_librarys():
    site = in_fresh_thread(chain("/home/u/train.py", f"{SITE_PACKAGES}/typing_extensions.py",
                                 os.path.join(own_source_dirs()[0], "ops", "observer.py")))
    assert site.startswith("/home/u/train.py:2 in "), site


def test_a_framework_run_as_a_module_is_its_own_call_site():
    # torchrun -m torchtitan.train: every frame of the program is installed
    titan = f"{SITE_PACKAGES}/torchtitan/train.py"
    site = in_fresh_thread(chain(f"{SITE_PACKAGES}/torchtitan/__main__.py", titan,
                                 os.path.join(own_source_dirs()[0], "ops", "observer.py")))
    assert site.startswith(f"{titan}:2 in "), site
