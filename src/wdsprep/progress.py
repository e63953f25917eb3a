"""The progress of a long command, on stderr: one home for counting, rates and byte sizes.

`Progress` counts items and bytes (`advance`) and draws a line from its counts: by default its bar
(`label [####----] items/total bytes rate/s ETA`), or the caller's own line (`line=`, a function of
the Progress, for a command with more to say: `fetch rawnind` adds retries, scenes, active transfers).

Modes: "bar" redraws the line in place (at most every `BAR_EVERY` seconds); "log" writes
`label line` as a line of its own every `every` seconds; "none" draws nothing. "auto" (the default)
is a bar on a terminal, else log lines when `every` is given, else nothing; `quiet` is "none".
A caller's own line changes length, so it is cleared before each redraw (`\\r\\x1b[K`); the bar
line is drawn over itself (`\\r`).
`refresh()` draws when a drawing is due, for work that can stall between advances (a timer calls
it); `close()` ends the display: in bar mode the line once more and a newline, in log mode a last
line `label done: line`.

Invariant: what is drawn is what was counted, once. A caller that reports the same quantity
elsewhere (fetch's report `bytes_downloaded`) reads it from here instead of keeping its own count.
"""
from __future__ import annotations

import sys
import time
from typing import Callable

BAR_EVERY = 0.2  # seconds between redraws of a bar


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


class Progress:
    def __init__(self, label: str, total_items: int, total_bytes: int = 0, *, quiet: bool = False, stream=None,
                 mode: str = "auto", every: float | None = None, line: Callable[[Progress], str] | None = None):
        self.stream = stream or sys.stderr
        terminal = hasattr(self.stream, "isatty") and self.stream.isatty()
        if quiet:
            mode = "none"
        elif mode == "auto":
            mode = "bar" if terminal else ("log" if every is not None else "none")
        self.mode = mode
        self.enabled = mode != "none"
        self.every = every if mode == "log" else BAR_EVERY
        self.label = label
        self.line = line
        self.total_items = total_items
        self.total_bytes = total_bytes
        self.items = 0
        self.bytes = 0
        self.start = time.monotonic()
        self._last = 0.0 if mode == "bar" else self.start

    @property
    def rate(self) -> float:
        """Bytes per second since the start."""
        return self.bytes / max(time.monotonic() - self.start, 1e-9)

    def advance(self, items: int = 1, nbytes: int = 0) -> None:
        self.items += items
        self.bytes += nbytes
        self.refresh(finished=self.mode == "bar" and self.items >= self.total_items)

    def refresh(self, finished: bool = False) -> None:
        """Draw if a drawing is due (or `finished`)."""
        now = time.monotonic()
        if self.enabled and (finished or now - self._last >= self.every):
            self._last = now
            self._draw(now)

    def _bar(self, now: float) -> str:
        elapsed = max(now - self.start, 1e-9)
        fraction = self.items / self.total_items if self.total_items else 1.0
        if self.total_bytes:
            fraction = max(fraction, self.bytes / self.total_bytes)
        eta = (elapsed / fraction - elapsed) if fraction > 0 else 0.0
        width = 24
        filled = int(width * min(fraction, 1.0))
        bar = "#" * filled + "-" * (width - filled)
        return (
            f"{self.label} [{bar}] {self.items}/{self.total_items} "
            f"{human_bytes(self.bytes)} {human_bytes(self.bytes / elapsed)}/s ETA {eta:4.0f}s"
        )

    def _text(self, now: float) -> str:
        return self.line(self) if self.line is not None else self._bar(now)

    def _draw(self, now: float) -> None:
        if self.mode == "log":
            self.stream.write(f"{self.label} {self._text(now)}\n")
        else:
            self.stream.write(("\r\x1b[K" if self.line is not None else "\r") + self._text(now))
        self.stream.flush()

    def close(self) -> None:
        if self.mode == "bar":
            self._draw(time.monotonic())
            self.stream.write("\n")
        elif self.mode == "log":
            self.stream.write(f"{self.label} done: {self._text(time.monotonic())}\n")
        else:
            return
        self.stream.flush()
