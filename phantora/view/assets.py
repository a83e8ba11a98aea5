"""Where the dashboard's static files (the repository's `viewer/` folder) are on this machine.

In a source checkout (and an editable install) they sit next to the `phantora` package. A built
wheel installs them as data files under `<prefix>/share/phantora/viewer` (pyproject.toml's
`[tool.setuptools.data-files]`): the installed distribution's file list says where that prefix
is, whatever the install scheme (venv, --user, system).
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

# The files the dashboard cannot work without; a folder missing one of them is not the dashboard.
REQUIRED = ("index.html", "app.js")
# Only plain file names are served: no folders, no hidden files.
_SERVABLE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class ViewerAssetsMissing(RuntimeError):
    pass


def _is_viewer_dir(path: Path) -> bool:
    return all((path / name).is_file() for name in REQUIRED)


CHECKOUT_VIEWER = Path(__file__).resolve().parents[2] / "viewer"


def viewer_dir(checkout: Path = CHECKOUT_VIEWER) -> Path:
    """The folder holding index.html, app.js and the rest of the dashboard."""
    if _is_viewer_dir(checkout):
        return checkout
    try:
        files = importlib.metadata.files("phantora") or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.parts[-3:] == ("phantora", "viewer", "index.html"):
            installed = Path(f.locate()).resolve().parent
            if _is_viewer_dir(installed):
                return installed
    raise ViewerAssetsMissing(
        f"the dashboard's files (viewer/index.html, viewer/app.js) are neither in {checkout.parent} nor "
        "in the installed phantora package; reinstall phantora (pip install .) from a full checkout")


def servable_files(folder: Path) -> dict[str, Path]:
    """Name -> path of each plain file directly inside `folder` (what the server may send)."""
    return {p.name: p for p in sorted(folder.iterdir()) if p.is_file() and _SERVABLE_NAME.match(p.name)}
