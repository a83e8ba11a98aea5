"""What a long run is doing, while it runs.

On a terminal: one status line (rich's transient status: drawn in place, cleared at the end)
with the phase, each rank's optimizer steps (the trace's step markers), the simulated time and the
wall time. Elsewhere (a CI log, a pipe): the same as a plain line every `every_s` seconds.
`--quiet` turns both off. Either way, notices of what may be a hang are printed once each: a
collective that has waited `every_s` for a missing member, a rank that has sent nothing for
`every_s` (a rank spinning in pure Python, or stuck outside the GPU).

The server builds a RunStatus about four times a second at most; drawing costs no simulation
time (rich redraws from its own thread).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import IO

REFRESH_S = 0.25  # at most this often the server builds a status


@dataclass
class RunStatus:
    ranks_expected: int  # 0 while unknown (COMMAND runs its own launcher)
    ranks_connected: int
    ranks_done: int
    steps: dict[int, int]  # rank -> optimizer steps so far
    simulated_ns: int
    wall_s: float

    @property
    def phase(self) -> str:
        if self.ranks_connected == 0:
            return "starting ranks (importing torch)"
        if self.ranks_expected and self.ranks_connected < self.ranks_expected:
            return f"starting ranks ({self.ranks_connected}/{self.ranks_expected} connected)"
        if self.ranks_done:
            return f"finishing ({self.ranks_done}/{self.ranks_connected} ranks done)"
        return "running"

    def line(self) -> str:
        parts = [self.phase]
        if self.steps:
            values = sorted(set(self.steps.values()))
            if len(values) == 1:
                parts.append(f"step {values[0]} on {len(self.steps)} rank(s)")
            else:
                parts.append("steps " + " ".join(f"r{r}:{n}" for r, n in sorted(self.steps.items())))
        if self.ranks_connected:
            parts.append(f"simulated {self.simulated_ns / 1e9:.3f} s")
        parts.append(f"wall {_clock(self.wall_s)}")
        return " | ".join(parts)


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m}:{s:02d}" if m < 60 else f"{m // 60}:{m % 60:02d}:{s:02d}"


@dataclass
class Progress:
    """Shows RunStatus updates: a live line on a terminal, periodic lines elsewhere, or nothing."""

    quiet: bool = False
    every_s: float = 30.0
    stream: IO[str] = field(default_factory=lambda: sys.stderr)
    _status: object = None  # rich.status.Status while drawn
    _console: object = None
    _next_line_s: float = 0.0
    _noticed: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._next_line_s = time.monotonic() + self.every_s
        if self.quiet or not _is_terminal(self.stream):
            return
        from rich.console import Console

        self._console = Console(file=self.stream)
        self._status = self._console.status("starting ranks (importing torch)", spinner="dots")
        self._status.start()  # type: ignore[attr-defined]

    @property
    def live(self) -> bool:
        return self._status is not None

    def update(self, status: RunStatus) -> None:
        if self._status is not None:
            self._status.update(status.line())  # type: ignore[attr-defined]
        elif not self.quiet and time.monotonic() >= self._next_line_s:
            self._next_line_s = time.monotonic() + self.every_s
            self._print(f"phantora: {status.line()}")

    def notice(self, key: str, message: str) -> None:
        """A possible hang, said once (also with --quiet: it is a diagnosis, not progress)."""
        if key in self._noticed:
            return
        self._noticed.add(key)
        self._print(f"phantora: {message}")

    def _print(self, text: str) -> None:
        if self._console is not None:  # above the live line, which stays at the bottom
            self._console.print(text, markup=False, highlight=False, soft_wrap=True)  # type: ignore[attr-defined]
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self._status is not None:
            self._status.stop()  # type: ignore[attr-defined]  # transient: the line is cleared
            self._status = None


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
