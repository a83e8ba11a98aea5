"""Helpers for the viewer tests: finding (or installing) Chromium, and running `phantora view`."""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_TRACE = ROOT / "sample_traces" / "ddp_2gpu.json.gz"
STANDIN_DIR = Path(__file__).resolve().parent / "standin_ui"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
APT_TIMEOUT_S = 900


def find_chromium() -> str | None:
    if os.environ.get("PHANTORA_CHROMIUM"):
        return os.environ["PHANTORA_CHROMIUM"]
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def install_chromium() -> str | None:
    """apt-get install Debian's chromium; None on success, else why it could not be done."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "not running as root, so apt-get cannot install it (install the chromium package yourself)"
    if not shutil.which("apt-get"):
        return "no apt-get on this machine (install Chromium yourself or set PHANTORA_CHROMIUM)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    lock = ["-o", "DPkg::Lock::Timeout=300"]
    try:
        subprocess.run(["apt-get", *lock, "update"], env=env, capture_output=True, timeout=APT_TIMEOUT_S, check=True)
        subprocess.run(["apt-get", *lock, "install", "-y", "--no-install-recommends", "chromium"], env=env,
                       capture_output=True, timeout=APT_TIMEOUT_S, check=True)
    except subprocess.TimeoutExpired:
        return f"apt-get install chromium did not finish within {APT_TIMEOUT_S} s"
    except subprocess.CalledProcessError as e:
        tail = (e.stderr or b"").decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return f"apt-get failed ({e.returncode}): {tail[0]}"
    return None


@dataclass
class RunningView:
    proc: subprocess.Popen
    dashboard: str
    trace_url: str
    lines: list[str]

    def stop(self) -> tuple[int, str]:
        """Ctrl-C, as a user would; returns (exit code, stderr)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.proc.returncode, self.proc.stderr.read() if self.proc.stderr else ""


def _interruptible() -> None:
    """In the child: Ctrl-C reaches it as it reaches a foreground command. When the tests run as
    a background job (`cmd &` in a script), SIGINT is ignored and children inherit that, so
    stop() would find a server that never hears its Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_view(trace: Path, *args: str, timeout: float = 120) -> RunningView:
    """`phantora view --no-browser --port 0 TRACE`, once it has printed its URLs."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "phantora.cli", "view", "--no-browser", "--port", "0", *args,
                             str(trace)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                            preexec_fn=_interruptible)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []
    urls: dict[str, str] = {}
    while "trace" not in urls:
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            proc.kill()
            raise AssertionError(f"phantora view printed no URLs within {timeout} s: {seen}") from None
        if line is None:
            proc.wait()
            raise AssertionError(f"phantora view ended ({proc.returncode}) before serving: {seen} "
                                 f"{proc.stderr.read() if proc.stderr else ''}")
        seen.append(line)
        key, _, value = line.strip().partition(": ")
        if key in ("dashboard", "trace", "Perfetto UI"):
            urls[key] = value.strip()
    return RunningView(proc, urls["dashboard"], urls["trace"], seen)


