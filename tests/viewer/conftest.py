"""Fixtures for the viewer tests: a running `phantora view`, a headless Chromium (Debian's,
installed here with apt-get when missing and we are root), and a stand-in for the Perfetto UI."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from .helpers import SAMPLE_TRACE, STANDIN_DIR, RunningView, find_chromium, install_chromium, start_view


@pytest.fixture(scope="session")
def chromium_executable() -> str:
    path = find_chromium()
    if path is None:
        why = install_chromium()
        path = find_chromium()
        if path is None:
            pytest.skip(f"no Chromium for the browser tests: {why or 'installed, but not found on PATH'}")
    return path


@pytest.fixture(scope="session")
def browser(chromium_executable: str) -> Iterator[object]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed: pip install '.[test]'")
    with sync_playwright() as p:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
        b = p.chromium.launch(executable_path=chromium_executable, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def view_sample() -> Iterator[RunningView]:
    running = start_view(SAMPLE_TRACE)
    yield running
    running.stop()


@pytest.fixture(scope="session")
def standin_ui() -> Iterator[str]:
    """A page on another local port that plays the Perfetto UI's side of the postMessage
    handshake; returns its origin."""

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(STANDIN_DIR)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
