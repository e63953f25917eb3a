"""A progress line (items, bytes, rate, ETA) on a terminal; silent otherwise or when quiet."""
from __future__ import annotations

import sys
import time


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


class Progress:
    def __init__(self, label: str, total_items: int, total_bytes: int = 0, *, quiet: bool = False, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = not quiet and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.label = label
        self.total_items = total_items
        self.total_bytes = total_bytes
        self.items = 0
        self.bytes = 0
        self.start = time.monotonic()
        self._last = 0.0

    def advance(self, items: int = 1, nbytes: int = 0) -> None:
        self.items += items
        self.bytes += nbytes
        now = time.monotonic()
        if self.enabled and (now - self._last > 0.2 or self.items >= self.total_items):
            self._last = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        elapsed = max(now - self.start, 1e-9)
        rate = self.bytes / elapsed
        fraction = self.items / self.total_items if self.total_items else 1.0
        if self.total_bytes:
            fraction = max(fraction, self.bytes / self.total_bytes)
        eta = (elapsed / fraction - elapsed) if fraction > 0 else 0.0
        width = 24
        filled = int(width * min(fraction, 1.0))
        bar = "#" * filled + "-" * (width - filled)
        line = (
            f"\r{self.label} [{bar}] {self.items}/{self.total_items} "
            f"{human_bytes(self.bytes)} {human_bytes(rate)}/s ETA {eta:4.0f}s"
        )
        self.stream.write(line)
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()
