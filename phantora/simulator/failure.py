"""A failure inside the simulator itself (a bug, or an input no validation caught).

It ends the run as a script error does: the ranks are stopped, the trace is closed, the exit code
is 1, and the user sees one line saying which part of the simulator failed, with what exception,
and where the full traceback was written (for a bug report) instead of a raw traceback.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from pathlib import Path

import phantora

_PACKAGE_DIR = Path(phantora.__file__).resolve().parent
# Sub-packages named in words a user can report.
_COMPONENTS = {"net": "the network model", "engine": "the engine", "trace": "the trace writer",
               "cost": "the cost model", "simulator": "the simulator server", "query": "the trace reader"}


@dataclass
class SimulatorFailure:
    component: str  # "the network model (phantora/net/network.py:188 in finish_time)"
    error: str  # "TypeError: Integer exceeds 64-bit range"
    during: str  # what the simulator was doing: "simulating rank 0's messages"
    traceback: str
    details: Path | None = None  # where the traceback was written, once it is

    @classmethod
    def from_exception(cls, exc: BaseException, during: str) -> "SimulatorFailure":
        return cls(_component(exc), f"{type(exc).__name__}: {exc}".strip().splitlines()[0], during,
                   "".join(traceback.format_exception(exc)))

    @property
    def message(self) -> str:
        where = f"; full traceback in {self.details}" if self.details is not None else ""
        return (f"phantora: simulator failure in {self.component} while {self.during}: {self.error}; "
                f"the run was stopped{where}")

    def write_details(self, path: Path) -> None:
        try:
            path.write_text(f"{self.message}\n\n{self.traceback}")
        except OSError:
            return
        self.details = path


def _component(exc: BaseException) -> str:
    """The innermost frame inside phantora's own code: the part that failed (a frame in a library
    it calls, or in a replaced function, is attributed to its phantora caller)."""
    found = "the simulator"
    for frame in traceback.extract_tb(exc.__traceback__):
        try:
            rel = Path(frame.filename).resolve().relative_to(_PACKAGE_DIR)
        except ValueError:
            continue
        name = _COMPONENTS.get(rel.parts[0], "the simulator") if len(rel.parts) > 1 else "the simulator"
        found = f"{name} (phantora/{rel.as_posix()}:{frame.lineno} in {frame.name})"
    return found
