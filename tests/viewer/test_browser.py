"""The dashboard in a real headless Chromium: it shows the trace's numbers, loads nothing from
outside this machine, and hands the trace to the Perfetto UI by the postMessage handshake
(against a local stand-in for ui.perfetto.dev)."""

from __future__ import annotations

import base64
import os
import shutil
import time
from pathlib import Path

import pytest

from .helpers import SAMPLE_TRACE


def open_dashboard(browser, url: str, **context_options):
    context = browser.new_context(viewport={"width": 1400, "height": 900}, **context_options)
    page = context.new_page()
    problems: list[str] = []
    requests: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    context.on("request", lambda r: requests.append(r.url))
    start = time.perf_counter()
    page.goto(url)
    page.wait_for_selector("html[data-state]", timeout=30_000)
    load_s = time.perf_counter() - start
    return context, page, problems, requests, load_s


def save_screenshot(page, tmp_path: Path) -> Path:
    shot = tmp_path / "dashboard.png"
    page.screenshot(path=str(shot), full_page=True)
    if os.environ.get("PHANTORA_SCREENSHOT_DIR"):
        keep = Path(os.environ["PHANTORA_SCREENSHOT_DIR"])
        keep.mkdir(parents=True, exist_ok=True)
        shot = Path(shutil.copy(shot, keep / shot.name))
    print(f"\ndashboard screenshot: {shot}")
    return shot


def test_open_in_perfetto_handshake_sends_the_trace_bytes(browser, view_sample, standin_ui):
    context, page, problems, requests, _ = open_dashboard(browser, f"{view_sample.dashboard}?perfetto_origin={standin_ui}")
    try:
        assert page.evaluate("document.documentElement.dataset.state") == "ready"
        with page.expect_popup() as popup_info:
            page.click("#open-perfetto")
        ui = popup_info.value
        ui.wait_for_function("window.received !== null", timeout=30_000)
        got = ui.evaluate("window.received")
        pings = ui.evaluate("window.pings")
        assert base64.b64decode(got["base64"]) == SAMPLE_TRACE.read_bytes()
        assert got["byteLength"] == SAMPLE_TRACE.stat().st_size
        assert got["fileName"] == SAMPLE_TRACE.name and SAMPLE_TRACE.name in got["title"]
        assert got["origin"] == view_sample.dashboard.rstrip("/") and got["fromOpener"]
        assert pings >= 1
        page.wait_for_function("document.getElementById('perfetto-status').textContent.startsWith('Sent')")
        assert not problems, problems
    finally:
        context.close()


def test_perfetto_origin_parameter_accepts_only_local_stand_ins(browser, view_sample):
    context, page, problems, _, _ = open_dashboard(browser, f"{view_sample.dashboard}?perfetto_origin=https://evil.example")
    try:
        assert page.is_disabled("#open-perfetto")
        assert "perfetto_origin must be http://127.0.0.1" in page.text_content("#perfetto-status")
    finally:
        context.close()


def test_dashboard_loads_nothing_from_outside(browser, view_sample):
    context, page, problems, requests, _ = open_dashboard(browser, view_sample.dashboard)
    try:
        assert page.evaluate("document.documentElement.dataset.state") == "ready"
        assert requests and all(u.startswith(view_sample.dashboard) for u in requests), requests
        assert not problems, problems
    finally:
        context.close()
