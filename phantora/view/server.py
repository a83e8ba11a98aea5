"""The HTTP server behind `phantora view`: one trace, the dashboard's files and its JSON API.

It listens on 127.0.0.1 only and answers GET and HEAD for a fixed set of paths decided at start
(no file-system lookup per request, so there is nothing to traverse and nothing to list):

    /                     the dashboard (viewer/index.html)
    /static/<name>        the dashboard's other files (viewer/<name>)
    /api/<name>.json      the dashboard's data, computed once at start
    /<trace file name>    the trace, byte for byte, with the CORS header ui.perfetto.dev needs

It writes nothing to disk.
"""

from __future__ import annotations

import errno
import shutil
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, unquote

HOST = "127.0.0.1"
# ui.perfetto.dev's Content-Security-Policy lets it fetch `url=` traces from this origin only.
PERFETTO_DEEP_LINK_PORT = 9001
PERFETTO_UI = "https://ui.perfetto.dev"

_CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".json": "application/json",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".txt": "text/plain; charset=utf-8",
}
# The dashboard loads nothing from anywhere but this server (no CDN), and the policy says so.
_DASHBOARD_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                  "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
_COMMON_HEADERS = (("X-Content-Type-Options", "nosniff"), ("Cache-Control", "no-store"),
                   ("Referrer-Policy", "no-referrer"))


class PortInUse(OSError):
    def __init__(self, port: int) -> None:
        self.port = port
        super().__init__(f"port {port} on {HOST} is already in use")


class PortNotAllowed(OSError):
    def __init__(self, port: int) -> None:
        self.port = port
        super().__init__(f"not allowed to listen on port {port} of {HOST}")


@dataclass(frozen=True)
class StaticBody:
    body: bytes
    content_type: str
    extra_headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class TraceFile:
    """The trace, streamed from disk on each request (it may be large)."""
    path: Path

    @property
    def name(self) -> str:
        return self.path.name


@dataclass(frozen=True)
class ViewUrls:
    dashboard: str
    trace: str
    # None when the server is not on 127.0.0.1:9001, where ui.perfetto.dev cannot fetch from.
    perfetto: str | None


def content_type(name: str) -> str:
    return _CONTENT_TYPES.get(Path(name).suffix.lower(), "application/octet-stream")


def build_routes(trace: TraceFile, static: Mapping[str, Path], api: Mapping[str, bytes]) -> dict[str, StaticBody | TraceFile]:
    """Path (decoded) -> what it serves. The set is fixed here; anything else is a 404."""
    routes: dict[str, StaticBody | TraceFile] = {}
    for name, path in static.items():
        headers = (("Content-Security-Policy", _DASHBOARD_CSP),) if name.endswith(".html") else ()
        routes[f"/static/{name}"] = StaticBody(path.read_bytes(), content_type(name), headers)
    if "/static/index.html" in routes:
        routes["/"] = routes["/static/index.html"]
    for name, body in api.items():
        routes[f"/api/{name}"] = StaticBody(body, "application/json")
    # Last, so nothing can shadow it (the trace name has no "/", the other routes all do).
    routes[f"/{trace.name}"] = trace
    return routes


class _Handler(BaseHTTPRequestHandler):
    server: ViewHTTPServer
    server_version = "phantora-view"
    sys_version = ""

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's name)
        pass  # the console shows the URLs; per-request lines would drown them

    def _send_headers(self, status: HTTPStatus, ctype: str, length: int, extra: tuple[tuple[str, str], ...] = ()) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(length))
        for k, v in _COMMON_HEADERS + extra:
            self.send_header(k, v)
        self.end_headers()

    def _send_error(self, status: HTTPStatus, text: str, extra: tuple[tuple[str, str], ...] = ()) -> None:
        body = f"{status.value} {status.phrase}: {text}\n".encode()
        self._send_headers(status, "text/plain; charset=utf-8", len(body), extra)
        if self.command != "HEAD":
            self.wfile.write(body)

    def _host_allowed(self) -> bool:
        # A page on another site that rebinds its DNS name to 127.0.0.1 sends its own name as Host:
        # answering only our own names keeps such pages from reading the trace.
        host = self.headers.get("Host")
        port = self.server.server_address[1]
        return host is None or host in (f"{HOST}:{port}", f"localhost:{port}")

    def _route(self) -> StaticBody | TraceFile | None:
        target = self.path.split("?", 1)[0].split("#", 1)[0]
        if not target.startswith("/"):
            return None
        return self.server.routes.get(unquote(target, errors="strict"))

    def _serve(self) -> None:
        if not self._host_allowed():
            self._send_error(HTTPStatus.FORBIDDEN, "unknown Host header; open the URL phantora view printed")
            return
        try:
            resource = self._route()
        except UnicodeDecodeError:
            resource = None
        if resource is None:
            self._send_error(HTTPStatus.NOT_FOUND, "this server has only the dashboard and the trace")
        elif isinstance(resource, StaticBody):
            self._send_headers(HTTPStatus.OK, resource.content_type, len(resource.body), resource.extra_headers)
            if self.command != "HEAD":
                self.wfile.write(resource.body)
        else:
            self._send_trace(resource)

    def _send_trace(self, trace: TraceFile) -> None:
        try:
            f = trace.path.open("rb")
        except OSError as e:
            self._send_error(HTTPStatus.NOT_FOUND, f"cannot read the trace: {e.strerror}")
            return
        with f:
            size = Path(f.name).stat().st_size
            ctype = "application/json" if trace.name.endswith(".json") else "application/octet-stream"
            self._send_headers(HTTPStatus.OK, ctype, size,
                               (("Access-Control-Allow-Origin", PERFETTO_UI),
                                ("Content-Disposition", f"inline; filename*=UTF-8''{quote(trace.name)}")))
            if self.command != "HEAD":
                shutil.copyfileobj(f, self.wfile, 1 << 20)

    do_GET = _serve
    do_HEAD = _serve

    def _method_not_allowed(self) -> None:
        self._send_error(HTTPStatus.METHOD_NOT_ALLOWED, "only GET and HEAD", (("Allow", "GET, HEAD"),))

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _method_not_allowed


class ViewHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, routes: dict[str, StaticBody | TraceFile]) -> None:
        self.routes = routes
        try:
            super().__init__((HOST, port), _Handler)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise PortInUse(port) from None
            if e.errno == errno.EACCES:
                raise PortNotAllowed(port) from None
            raise

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def urls(self, trace_name: str) -> ViewUrls:
        base = f"http://{HOST}:{self.port}"
        trace_url = f"{base}/{quote(trace_name)}"
        perfetto = f"{PERFETTO_UI}/#!/?url={trace_url}" if self.port == PERFETTO_DEEP_LINK_PORT else None
        return ViewUrls(dashboard=f"{base}/", trace=trace_url, perfetto=perfetto)


def start_in_thread(server: ViewHTTPServer) -> threading.Thread:
    """Serve from a daemon thread (tests, embedding); stop with server.shutdown()."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="phantora-view",
                              daemon=True)
    thread.start()
    return thread
