"""`phantora view` as users run it: URLs printed, Ctrl-C, and the errors they can hit."""

from __future__ import annotations

import gzip
import socket
import urllib.request

import pytest
from click.testing import CliRunner

from phantora.cli import main
from phantora.view.server import ViewHTTPServer
from .helpers import SAMPLE_TRACE, start_view


def test_prints_urls_and_stops_on_ctrl_c_with_exit_0():
    running = start_view(SAMPLE_TRACE)
    try:
        assert running.dashboard.startswith("http://127.0.0.1:") and running.dashboard.endswith("/")
        assert running.trace_url == running.dashboard + SAMPLE_TRACE.name
        with urllib.request.urlopen(running.trace_url, timeout=10) as r:
            assert r.read() == SAMPLE_TRACE.read_bytes()
        # --port 0 is not 9001, so no url= deep link, and the output says why
        text = "\n".join(running.lines)
        assert "ui.perfetto.dev/#!/?url=" not in text
        assert "127.0.0.1:9001" in text and "Open in Perfetto UI" in text
    finally:
        code, stderr = running.stop()
    assert code == 0
    assert "Traceback" not in stderr and "stopped" in stderr


def test_port_in_use_names_the_port_and_the_way_out():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(main, ["view", "--no-browser", "--port", str(port), str(SAMPLE_TRACE)])
    assert result.exit_code == 1
    assert f"port {port}" in result.output and "--port" in result.output
    assert "127.0.0.1:9001" in result.output  # the deep link only works there: say so
    assert "Traceback" not in result.output


def test_missing_trace_is_a_usage_error():
    result = CliRunner().invoke(main, ["view", "--no-browser", "no/such/run.json"])
    assert result.exit_code == 2
    assert "no/such/run.json" in result.output and "does not exist" in result.output


# mtime=0: the same bytes in every pytest-xdist worker's collection
@pytest.mark.parametrize("content", [b"this is not a trace", gzip.compress(b"{\"traceEvents\": [ {\"ph\": ", mtime=0)],
                         ids=["text", "truncated-gzip-json"])
def test_corrupt_trace_is_a_one_line_error(tmp_path, content):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    result = CliRunner().invoke(main, ["view", "--no-browser", "--port", "0", str(bad)])
    assert result.exit_code == 1, result.output
    error = [line for line in result.output.splitlines() if line.startswith("phantora: ")]
    assert len(error) == 1 and "bad.json" in error[0]
    assert "Traceback" not in result.output


def test_opens_the_dashboard_in_a_browser_unless_told_not_to(monkeypatch):
    opened: list[str] = []
    monkeypatch.setattr("webbrowser.open", lambda url, *a, **k: opened.append(url))

    def interrupted(self, poll_interval=0.5):  # a user pressing Ctrl-C at once
        raise KeyboardInterrupt

    monkeypatch.setattr(ViewHTTPServer, "serve_forever", interrupted)
    result = CliRunner().invoke(main, ["view", "--port", "0", str(SAMPLE_TRACE)])
    assert result.exit_code == 0, result.output
    assert len(opened) == 1 and opened[0].startswith("http://127.0.0.1:") and opened[0].endswith("/")
    opened.clear()
    result = CliRunner().invoke(main, ["view", "--no-browser", "--port", "0", str(SAMPLE_TRACE)])
    assert result.exit_code == 0 and opened == []
