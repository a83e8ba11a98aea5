"""`phantora view`: serve one trace to ui.perfetto.dev and to a local dashboard.

    serve(Path("run.json"), port=9001, open_browser=True)   # blocks until Ctrl-C

The dashboard (the repository's `viewer/` folder: HTML, CSS, JS, no build step) reads two JSON
documents the server computes once at start (`phantora.view.dashboard`): the trace's
`TraceSummary` (the same code as `phantora summary`) and its counters over time. The server
(`phantora.view.server`) listens on 127.0.0.1 only and serves nothing but those, the
dashboard's files and the trace.
"""

from __future__ import annotations

import webbrowser
from collections.abc import Callable
from pathlib import Path

from phantora.view.assets import ViewerAssetsMissing, servable_files, viewer_dir
from phantora.view.server import (PERFETTO_DEEP_LINK_PORT, PortInUse, PortNotAllowed, TraceFile, ViewHTTPServer,
                                  ViewUrls, build_routes)

__all__ = ["serve", "PortInUse", "PortNotAllowed", "ViewerAssetsMissing", "ViewUrls", "PERFETTO_DEEP_LINK_PORT"]


def serve(trace: Path, port: int = PERFETTO_DEEP_LINK_PORT, open_browser: bool = True,
          echo: Callable[[str], None] = print) -> None:
    """Serve `trace` and the dashboard until interrupted (KeyboardInterrupt propagates).

    Raises PortInUse / PortNotAllowed before reading the trace, and the query package's
    TraceFileError if the trace cannot be read.
    """
    from phantora.view.dashboard import build_dashboard

    static = servable_files(viewer_dir())
    # Bind first: a taken port is reported at once, not after a long load.
    server = ViewHTTPServer(port, routes={})
    try:
        urls = server.urls(trace.name)
        echo(f"phantora view: reading {trace} ...")
        dashboard = build_dashboard(trace)
        for warning in dashboard.summary.warnings:
            echo(f"phantora view: {warning}")
        server.routes = build_routes(TraceFile(trace), static, dashboard.api_documents(urls))
        echo(f"phantora view: serving {trace.name} on http://127.0.0.1:{server.port} (Ctrl-C to stop)")
        echo(f"  dashboard:   {urls.dashboard}")
        if urls.perfetto:
            echo(f"  Perfetto UI: {urls.perfetto}")
        else:
            echo(f"  Perfetto UI: press \"Open in Perfetto UI\" on the dashboard (ui.perfetto.dev loads url= links "
                 f"only from 127.0.0.1:{PERFETTO_DEEP_LINK_PORT}; use --port {PERFETTO_DEEP_LINK_PORT} for a direct link)")
        echo(f"  trace:       {urls.trace}")
        if open_browser:
            webbrowser.open(urls.dashboard)
            if urls.perfetto:
                webbrowser.open(urls.perfetto)
        server.serve_forever()
    finally:
        server.server_close()
