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

from phantora.query import load
from phantora.query.summary import summarize
from phantora.view.dashboard import TOP_KERNELS

from .helpers import ROOT, SAMPLE_TRACE, start_view


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


def save_screenshot(page, tmp_path: Path, name: str) -> Path:
    shot = tmp_path / f"dashboard_{name}.png"
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


def ms_text(ms: float) -> str:
    """How the dashboard prints milliseconds (fmt.ms in viewer/app.js)."""
    return f"{ms:.1f}" if ms >= 100 else f"{ms:.2f}" if ms >= 10 else f"{ms:.3f}"


def close(a: str | None, b: float) -> bool:
    return a is not None and abs(float(a) - b) <= 1e-9 * max(1.0, abs(b))


@pytest.mark.parametrize("trace_name", ["ddp_2gpu.json.gz", "tp_fsdp2_4gpu.json.gz"])
def test_dashboard_shows_the_summary_of_the_trace(browser, tmp_path, trace_name):
    trace = ROOT / "sample_traces" / trace_name
    with load(trace) as db:
        summary = summarize(db, top=TOP_KERNELS)
        link_peaks = dict(db.query(
            "SELECT substr(t.name, 6, length(t.name) - 17), max(c.value) FROM counter c "
            "JOIN process_counter_track t ON c.track_id = t.id JOIN process p ON t.upid = p.upid "
            "WHERE p.name = 'network' AND t.name GLOB 'link * utilization' GROUP BY t.id").rows)
    running = start_view(trace)
    try:
        context, page, problems, _, load_s = open_dashboard(browser, running.dashboard)
        try:
            assert page.evaluate("document.documentElement.dataset.state") == "ready"
            print(f"\n{trace_name}: dashboard ready {load_s * 1000:.0f} ms after navigation started")
            steps = summary.steps
            assert steps.source == "step markers" and steps.stats is not None

            # headline cards
            card = page.locator("#cards .card[data-key=step-mean-ms]")
            assert close(card.get_attribute("data-value"), steps.stats.mean_ns / 1e6)
            assert ms_text(steps.stats.mean_ns / 1e6) in card.inner_text()
            assert close(page.get_attribute("#cards .card[data-key=mfu]", "data-value"), summary.overall.mfu)
            assert f"{summary.overall.mfu * 100:.1f}%" in page.inner_text("#cards .card[data-key=mfu]")
            assert close(page.get_attribute("#cards .card[data-key=tflops]", "data-value"), summary.overall.tflops)
            assert page.get_attribute("#cards .card[data-key=rollbacks]", "data-value") == str(summary.rollbacks)
            assert page.get_attribute("#cards .card[data-key=unknown-ops]", "data-value") == str(len(summary.unknown_ops))
            peak = max(m.allocated_bytes for m in summary.memory)
            assert close(page.get_attribute("#cards .card[data-key=peak-allocated]", "data-value"), peak)

            # step times: one bar per rank and step, and the table
            for rank_steps in steps.per_rank:
                for i, dur in enumerate(rank_steps.durations_ns):
                    bar = page.locator(f"#step-chart rect[data-rank='{rank_steps.rank}'][data-step='{i}']")
                    assert close(bar.get_attribute("data-ms"), dur / 1e6)
                row = page.locator(f"#step-table tr[data-rank='{rank_steps.rank}']")
                assert close(row.get_attribute("data-mean-step-ms"), rank_steps.stats.mean_ns / 1e6)
                assert row.locator("td.mean").inner_text() == ms_text(rank_steps.stats.mean_ns / 1e6)
            overall = page.locator("#step-table tr[data-overall]")
            assert [c for c in overall.locator("td").all_inner_texts()[2:]] == [ms_text(d / 1e6) for d in steps.overall_ns]

            # compute / exposed comm / idle per GPU: bar segments and table
            assert page.locator("#breakdown-chart g[data-rank]").count() == len(summary.gpus)
            for g in summary.gpus:
                row = page.locator(f"#breakdown-chart g[data-rank='{g.rank}'][data-device='{g.device}']")
                for part, ns in (("compute", g.compute_ns), ("exposed-comm", g.exposed_comm_ns), ("idle", g.idle_ns)):
                    assert close(row.locator(f"rect[data-part='{part}']").get_attribute("data-ms"), ns / 1e6), part
                cells = page.locator(f"#breakdown-table tr[data-rank='{g.rank}'][data-device='{g.device}'] td")
                assert cells.nth(2).inner_text() == ms_text(g.compute_ns / 1e6)
                assert cells.nth(8).inner_text() == f"{g.mfu * 100:.1f}%"

            # memory: a line per GPU and kind, peaks in the legend
            legend = page.inner_text("#memory-chart .legend")
            for m in summary.memory:
                for kind in ("allocated", "reserved"):
                    assert page.locator(f"#memory-chart path[data-rank='{m.rank}'][data-device='{m.device}']"
                                        f"[data-kind='{kind}']").count() == 1
                assert f"rank {m.rank} cuda:{m.device}: peak {m.allocated_bytes / 2**30:.2f} GiB allocated" in legend

            # network links: one strip per link counter, with its peak
            strips = page.locator("#network-chart g[data-link]")
            assert strips.count() == len(link_peaks) > 0
            for name, peak_util in link_peaks.items():
                strip = page.locator(f"#network-chart g[data-link='{name}']")
                assert close(strip.get_attribute("data-peak-utilization"), peak_util)

            # top kernels, in order
            rows = page.locator("#kernel-table tbody tr")
            assert rows.count() == len(summary.top_kernels)
            for i, k in enumerate(summary.top_kernels):
                assert rows.nth(i).get_attribute("data-kernel") == k.name
                assert rows.nth(i).get_attribute("data-count") == str(k.count)
                assert close(rows.nth(i).get_attribute("data-total-ms"), k.total_ns / 1e6)

            # rollbacks: the count and one mark per rollback instant
            assert page.get_attribute("#rollbacks p", "data-rollbacks") == str(summary.rollbacks)
            assert page.locator("#rollbacks svg line[stroke='#c0392b']").count() == summary.rollbacks

            assert not problems, problems
            save_screenshot(page, tmp_path, trace_name.split(".")[0])
        finally:
            context.close()
    finally:
        code, stderr = running.stop()
    assert code == 0, stderr
