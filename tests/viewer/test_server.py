"""The `phantora view` HTTP server, with raw http.client requests (no browser): what it serves,
the CORS header ui.perfetto.dev needs, and everything it must refuse."""

from __future__ import annotations

import http.client
import socket
from pathlib import Path

import pytest

from phantora.view.assets import servable_files, viewer_dir
from phantora.view.server import PortInUse, TraceFile, ViewHTTPServer, build_routes, start_in_thread

TRACE_BYTES = b'{"traceEvents": [], "metadata": {"gpu": "h100-sxm-80gb"}}'
SECRET = b"not for the browser"


@pytest.fixture
def served(tmp_path):
    """A server for a tiny trace in a folder that also holds a file it must never serve."""
    (tmp_path / "secret.txt").write_bytes(SECRET)
    trace = tmp_path / "my run.json"
    trace.write_bytes(TRACE_BYTES)
    api = {"summary.json": b'{"file": "my run.json"}', "series.json": b'{"span_ms": 1.0}'}
    server = ViewHTTPServer(0, build_routes(TraceFile(trace), servable_files(viewer_dir()), api))
    start_in_thread(server)
    yield server, tmp_path
    server.shutdown()
    server.server_close()


def request(server: ViewHTTPServer, method: str, target: str, headers: dict | None = None,
            body: bytes | None = None) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        # skip_host: some tests send their own Host header
        conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
        all_headers = {"Host": f"127.0.0.1:{server.port}", **(headers or {})}
        if body is not None:
            all_headers["Content-Length"] = str(len(body))
        for k, v in all_headers.items():
            conn.putheader(k, v)
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_binds_loopback_127_0_0_1_only(served):
    server, _ = served
    assert server.server_address[0] == "127.0.0.1"
    # 127.0.0.2 reaches this machine's loopback too: a server bound to 0.0.0.0 would answer there
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", server.port), timeout=5).close()


def local_ipv4_addresses() -> set[str]:
    """This machine's own IPv4 addresses, from the kernel's routing table (Linux)."""
    try:
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
    except OSError:
        return set()
    return {lines[i - 1].split()[-1] for i, line in enumerate(lines) if i and line.strip() == "/32 host LOCAL"}


def test_not_reachable_on_the_machines_other_addresses(served):
    server, _ = served
    others = sorted(a for a in local_ipv4_addresses() if not a.startswith("127."))
    if not others:
        pytest.skip("this machine has no IPv4 address besides loopback to try (or no /proc/net/fib_trie)")
    for addr in others:  # the machine's own addresses: the connection never leaves it
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((addr, server.port), timeout=5).close()


def test_trace_is_served_byte_for_byte_with_the_perfetto_cors_header(served):
    server, _ = served
    status, headers, body = request(server, "GET", "/my%20run.json")
    assert status == 200
    assert body == TRACE_BYTES
    assert headers["access-control-allow-origin"] == "https://ui.perfetto.dev"
    assert headers["content-length"] == str(len(TRACE_BYTES))


def test_head_gives_headers_without_body(served):
    server, _ = served
    status, headers, body = request(server, "HEAD", "/my%20run.json")
    assert status == 200 and body == b""
    assert headers["content-length"] == str(len(TRACE_BYTES))
    assert headers["access-control-allow-origin"] == "https://ui.perfetto.dev"


def test_dashboard_files_and_api(served):
    server, _ = served
    status, headers, body = request(server, "GET", "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert body == (viewer_dir() / "index.html").read_bytes()
    # the page may load scripts only from this server: no CDN
    assert "script-src 'self'" in headers["content-security-policy"]
    status, headers, body = request(server, "GET", "/static/app.js")
    assert status == 200 and headers["content-type"].startswith("text/javascript")
    assert body == (viewer_dir() / "app.js").read_bytes()
    status, headers, body = request(server, "GET", "/api/summary.json?x=1")
    assert status == 200 and headers["content-type"] == "application/json"
    assert body == b'{"file": "my run.json"}'
    # the dashboard itself does not carry the CORS header: only the trace is for ui.perfetto.dev
    assert "access-control-allow-origin" not in headers


@pytest.mark.parametrize("target", [
    "/../secret.txt",
    "/secret.txt",
    "/static/../secret.txt",
    "/static/../../pyproject.toml",
    "/%2e%2e/secret.txt",
    "/%2E%2E/%2e%2e/pyproject.toml",
    "/static/%2e%2e/%2e%2e/pyproject.toml",
    "/static/..%2f..%2fpyproject.toml",
    "/static/..%5c..%5cpyproject.toml",
    "/..%2fsecret.txt",
    "//etc/passwd",
    "/etc/passwd",
    "/static//etc/passwd",
    "/%00",
    "/%ff%fe",
    "http://127.0.0.1/etc/passwd",
    "secret.txt",
])
def test_no_path_traversal(served, target):
    server, folder = served
    status, _, body = request(server, "GET", target)
    assert status in (400, 404), (target, status)
    assert SECRET not in body and b"[project]" not in body and b"root:" not in body


def test_no_absolute_paths(served):
    server, folder = served
    for path in (folder / "secret.txt", folder / "my run.json", viewer_dir() / "app.js"):
        status, _, body = request(server, "GET", str(path).replace(" ", "%20"))
        assert status == 404, path
    status, _, body = request(server, "GET", "/" + str(folder / "secret.txt"))
    assert status == 404 and SECRET not in body


@pytest.mark.parametrize("target", ["/static/", "/static", "/api/", "/api", "/viewer/", "/?C=M;O=A"])
def test_no_directory_listing(served, target):
    server, _ = served
    status, _, body = request(server, "GET", target)
    if target.startswith("/?"):  # the query string is ignored: this is the dashboard page
        assert status == 200 and b"Open in Perfetto UI" in body
    else:
        assert status == 404
        assert b"app.js" not in body and b"index.html" not in body


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
def test_only_get_and_head(served, method):
    server, _ = served
    status, headers, _ = request(server, method, "/my%20run.json", body=b"overwrite")
    assert status == 405
    assert headers["allow"] == "GET, HEAD"


def test_unknown_methods_are_not_implemented(served):
    server, _ = served
    status, _, _ = request(server, "PROPFIND", "/")
    assert status == 501


def test_writes_nothing(served):
    server, folder = served
    watched = [folder, viewer_dir()]

    def snapshot() -> dict[Path, tuple[int, int]]:
        return {p: (p.stat().st_size, p.stat().st_mtime_ns) for d in watched for p in d.rglob("*")}

    before = snapshot()
    for method, target in [("PUT", "/my%20run.json"), ("POST", "/new.json"), ("PUT", "/static/app.js"),
                           ("DELETE", "/my%20run.json"), ("GET", "/my%20run.json"), ("GET", "/")]:
        request(server, method, target, body=b"x" * 100)
    assert snapshot() == before


def test_rejects_foreign_host_header(served):
    # DNS rebinding: another site's page reaching 127.0.0.1 under its own name
    server, _ = served
    status, _, body = request(server, "GET", "/my%20run.json", headers={"Host": f"evil.example:{server.port}"})
    assert status == 403 and TRACE_BYTES not in body
    status, _, body = request(server, "GET", "/my%20run.json", headers={"Host": f"localhost:{server.port}"})
    assert status == 200 and body == TRACE_BYTES


def test_port_in_use_is_reported(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(PortInUse) as e:
            ViewHTTPServer(port, {})
        assert e.value.port == port


def test_urls_give_a_perfetto_deep_link_only_on_port_9001(served):
    server, _ = served
    urls = server.urls("my run.json")
    assert urls.dashboard == f"http://127.0.0.1:{server.port}/"
    assert urls.trace == f"http://127.0.0.1:{server.port}/my%20run.json"
    assert server.port != 9001 and urls.perfetto is None
    try:
        on_9001 = ViewHTTPServer(9001, {})
    except PortInUse:
        pytest.skip("port 9001 is taken on this machine (another phantora view?)")
    try:
        assert on_9001.urls("run.json").perfetto == "https://ui.perfetto.dev/#!/?url=http://127.0.0.1:9001/run.json"
    finally:
        on_9001.server_close()
