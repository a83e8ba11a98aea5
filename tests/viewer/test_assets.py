"""Finding the dashboard's files in a source checkout and in an installed package."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest

from phantora.view import assets
from phantora.view.assets import ViewerAssetsMissing, servable_files, viewer_dir

ROOT = Path(__file__).resolve().parents[2]


def test_checkout_viewer_folder_is_found():
    assert viewer_dir() == ROOT / "viewer"
    names = set(servable_files(viewer_dir()))
    assert {"index.html", "app.js", "charts.js", "perfetto.js", "style.css"} <= names


def test_installed_data_files_are_found(tmp_path, monkeypatch):
    # What a wheel install leaves: <prefix>/share/phantora/viewer, listed in the distribution's
    # RECORD relative to site-packages.
    site = tmp_path / "lib" / "python3" / "site-packages"
    share = tmp_path / "share" / "phantora" / "viewer"
    share.mkdir(parents=True)
    site.mkdir(parents=True)
    for name in ("index.html", "app.js"):
        (share / name).write_text(name)

    class Dist:
        def locate_file(self, path):
            return site / path

    def files(name):
        assert name == "phantora"
        out = []
        for rel in ("phantora/__init__.py", "../../../share/phantora/viewer/index.html",
                    "../../../share/phantora/viewer/app.js"):
            p = importlib.metadata.PackagePath(rel)
            p.dist = Dist()
            out.append(p)
        return out

    monkeypatch.setattr(assets.importlib.metadata, "files", files)
    assert viewer_dir(checkout=tmp_path / "no-checkout") == share.resolve()


def test_missing_files_are_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(assets.importlib.metadata, "files", lambda name: [])
    with pytest.raises(ViewerAssetsMissing, match="viewer/index.html"):
        viewer_dir(checkout=tmp_path)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib is in the standard library from Python 3.11")
def test_pyproject_installs_every_dashboard_file():
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    data_files = config["tool"]["setuptools"]["data-files"]
    assert data_files == {"share/phantora/viewer": ["viewer/*"]}
    # "viewer/*" takes plain files only: the dashboard must not grow subfolders
    assert all(p.is_file() for p in (ROOT / "viewer").iterdir())
