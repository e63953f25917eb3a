"""Fault plans shared by the test servers (`RangeHTTPServer`, `S3Server`, `DataverseServer`).

One table per fault kind, keyed by the name a server knows an object by. An entry is `Planned`: a
value saying how (the byte to cut at, the status to answer with, ...) for the next `times` requests
of that name, or for every one (`times=-1`); a server's `take_*` call uses one up, under one lock, so
concurrent requests never both take the last use.

Kinds: a GET body cut after N bytes and the connection dropped (`drop_once`, `take_drop`, `hang_up`);
an error status instead of an answer (`fail_next`, `take_failure`); a GET body with its first byte
flipped (`corrupt_next`, `take_corruption`); a pause before answering (`pause`, `pause_of`); a body
sent slowly (`trickle`, `trickled`); a PUT refused or stored corrupted (`on_next_puts`,
`take_put_fault`); requests held at a gate (`hold_after`, `pass_gate`).
"""
from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator


@dataclass
class Planned:
    """A fault for the next `times` requests of a name (-1: every request); `value` says how."""

    value: Any
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
        self.drops: dict[str, Planned] = {}  # value: the body byte to cut at
        self.failures: dict[str, Planned] = {}  # value: the HTTP status to answer with
        self.corruptions: dict[str, Planned] = {}  # value: True
        self.put_faults: dict[str, Planned] = {}  # value: "refuse" | "corrupt"
        self.trickles: dict[str, Planned] = {}  # value: bytes per second every GET body is sent at
        self.pauses: dict[str, Planned] = {}  # value: seconds before every answer
        self.gate: Gate | None = None

    def _plan(self, table: dict[str, Planned], name: str, value: Any, times: int) -> None:
        with self.lock:
            table[name] = Planned(value, times)

    def _take(self, table: dict[str, Planned], name: str, applies: Callable[[Any], bool] = lambda value: True) -> Any:
        """The planned value for this request of `name`, using one of its times (None: nothing planned)."""
        with self.lock:
            planned = table.get(name)
            if planned is None or planned.times == 0 or not applies(planned.value):
                return None
            if planned.times > 0:
                planned.times -= 1
            return planned.value

    def trickle(self, name: str, rate: float) -> None:
        """Send every GET body of `name` at `rate` bytes per second."""
        self._plan(self.trickles, name, rate, -1)

    def trickle_rate(self, name: str) -> float | None:
        return self._take(self.trickles, name)

    def pause(self, name: str, seconds: float) -> None:
        """Wait `seconds` before every answer for `name`."""
        self._plan(self.pauses, name, seconds, -1)

    def pause_of(self, name: str) -> float | None:
        return self._take(self.pauses, name)

    def drop_once(self, name: str, at_byte: int, times: int = 1) -> None:
        self._plan(self.drops, name, at_byte, times)

    def take_drop(self, name: str, length: int | None = None) -> int | None:
        """The byte at which to cut this response, consuming one planned drop (None: serve fully).
        A response of known `length` that ends before the cut point is served whole and leaves the
        drop planned (a short ranged read, e.g. of a shard's index, is not the stream to cut)."""
        return self._take(self.drops, name, lambda at_byte: length is None or length > at_byte)

    def fail_next(self, name: str, status: int = 503, times: int = 1) -> None:
        self._plan(self.failures, name, status, times)

    def take_failure(self, name: str) -> int | None:
        """The error status to answer this request with, consuming one planned use (None: answer)."""
        return self._take(self.failures, name)

    def corrupt_next(self, name: str, times: int = 1) -> None:
        self._plan(self.corruptions, name, True, times)

    def take_corruption(self, name: str) -> bool | None:
        """True to flip the first byte of this GET body, consuming one planned use (None: send it as is)."""
        return self._take(self.corruptions, name)

    def on_next_puts(self, name: str, kind: str, times: int) -> None:
        self._plan(self.put_faults, name, kind, times)

    def take_put_fault(self, name: str) -> str | None:
        """The fault for this PUT ("refuse" or "corrupt"), consuming one planned use (None: none)."""
        return self._take(self.put_faults, name)

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


def hang_up(handler) -> None:
    """End a response cut short by a planned drop: flush what was written, shut the socket down so the
    client sees the stream end early, and serve nothing more on this connection."""
    handler.wfile.flush()
    try:
        handler.connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    handler.close_connection = True
