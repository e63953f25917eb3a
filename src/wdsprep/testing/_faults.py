"""Fault plans shared by the test servers: drop a response body after N bytes, send one slowly,
hold requests."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Iterator


@dataclass
class Drop:
    """Cut the next `times` GET bodies of a name after `at_byte` bytes of the response body."""

    at_byte: int
    times: int = 1


@dataclass
class Gate:
    """Requests matching the gate beyond the first `after` wait until `release()`; then they pass
    through, or fail with 503 without reaching the backend when released with `fail=True`."""

    after: int
    timeout: float = 60.0
    seen: int = 0
    waiting: int = 0
    fail: bool = False
    event: threading.Event = field(default_factory=threading.Event)

    def release(self, fail: bool = False) -> None:
        self.fail = fail
        self.event.set()


class FaultPlan:
    def __init__(self):
        self.lock = threading.Lock()
        self.drops: dict[str, Drop] = {}
        self.gate: Gate | None = None
        self.put_faults: dict[str, list] = {}  # name -> [kind ("refuse" | "corrupt"), times left]
        self.trickles: dict[str, float] = {}  # name -> bytes per second every GET body of it is sent at

    def trickle(self, name: str, rate: float) -> None:
        with self.lock:
            self.trickles[name] = rate

    def trickle_rate(self, name: str) -> float | None:
        with self.lock:
            return self.trickles.get(name)

    def drop_once(self, name: str, at_byte: int, times: int = 1) -> None:
        with self.lock:
            self.drops[name] = Drop(at_byte, times)

    def take_drop(self, name: str, length: int | None = None) -> int | None:
        """The byte at which to cut this response, consuming one planned drop (None: serve fully).
        A response of known `length` that ends before the cut point is served whole and leaves the
        drop planned (a short ranged read, e.g. of a shard's index, is not the stream to cut)."""
        with self.lock:
            drop = self.drops.get(name)
            if drop is None or drop.times <= 0 or (length is not None and length <= drop.at_byte):
                return None
            drop.times -= 1
            return drop.at_byte

    def on_next_puts(self, name: str, kind: str, times: int) -> None:
        with self.lock:
            self.put_faults[name] = [kind, times]

    def take_put_fault(self, name: str) -> str | None:
        """The fault for this PUT ("refuse" or "corrupt"), consuming one planned use (None: none)."""
        with self.lock:
            fault = self.put_faults.get(name)
            if fault is None or fault[1] <= 0:
                return None
            fault[1] -= 1
            return fault[0]

    def hold_after(self, after: int, timeout: float = 60.0) -> Gate:
        with self.lock:
            self.gate = Gate(after, timeout)
            return self.gate

    def pass_gate(self) -> bool:
        """Called for a gated request; True to proceed, False to fail it (503)."""
        with self.lock:
            gate = self.gate
            if gate is None:
                return True
            gate.seen += 1
            if gate.seen <= gate.after:
                return True
            gate.waiting += 1
        gate.event.wait(gate.timeout)
        with self.lock:
            gate.waiting -= 1
        return not gate.fail


def trickled(data: bytes, rate: float) -> Iterator[bytes]:
    """`data` in pieces sent at `rate` bytes per second (ten pieces a second): a server that answers
    at once and then never quite stops sending."""
    piece = max(1, int(rate / 10))
    for start in range(0, len(data), piece):
        yield data[start : start + piece]
        time.sleep(0.1)
