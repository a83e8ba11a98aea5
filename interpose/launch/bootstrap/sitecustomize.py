"""phantora's bootstrap, put first on PYTHONPATH by `phantora trace` so every Python process
the traced command starts (torchrun workers, mp.spawn children) runs it at start-up.

It does nothing unless PHANTORA_SOCKET is set, then hands the process to a warm fork server if
one is wanted (interpose/launch/handoff.py), else arranges for virtual GPUs to be installed when
the process imports torch, and finally runs the sitecustomize it shadows, if any.
`python -S` and `python -I` skip site customisation, so processes started that way are not
simulated (docs/virtual-gpu.md says so).
"""

import importlib.machinery
import importlib.util
import os
import sys


def _install() -> None:
    if not os.environ.get("PHANTORA_SOCKET"):
        return
    try:
        from interpose.launch.handoff import hand_off
        from interpose.launch.hook import install_import_hook
    except ImportError as e:
        sys.stderr.write(
            f"phantora: cannot import its interposition package in {sys.executable} ({e}); "
            "install phantora into the environment that runs your script\n"
        )
        raise
    hand_off()  # with a warm fork server, it runs this process and this one only stands in for it
    install_import_hook()


def _chain_next_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if os.path.abspath(entry or os.curdir) == here:
            continue
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry])
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return


_install()
_chain_next_sitecustomize()
