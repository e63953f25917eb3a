"""A plain HTTP file server for tests and benchmarks: GET/HEAD with `Range`, HTTP/1.1 keep-alive,
a request and connection log, fault injection, and optional link shaping.

`RangeHTTPServer(root)` serves the files under `root` on 127.0.0.1 (free port). With
`upstream="http://HOST:PORT"` it serves nothing itself but forwards every request there (a reverse
proxy: `S3Server`, or a cloud emulator of `emulators.py`, behind it is an endpoint with the same
shaping, the same log and the same faults, planned by the request's path).

What it records: `requests`, one dict per request (method, name, range, status, `conn`: the number
of the TCP connection it came on, `sent`: body bytes written, `cut`: the body was cut by a planned
drop, `arrived` / `answered`: the server's event count when its request line was read and when its
answer was written, so that which requests overlapped is known without a clock), per connection:
`connections` (how many were accepted), `open_connections` and `peak_connections` (the most open at
once), and `peak_requests` (the most requests being answered at once). `round_trips()` counts the
client's sequential waits from the log.

Faults (file mode): `drop_once(name, at_byte)` cuts the next response body of `name` after
`at_byte` bytes and closes the connection (the client sees a dropped stream); `fail_next(name,
status, times)` answers the next requests with an error status (and closes the connection);
`trickle(name, rate)` sends every body of `name` at `rate` bytes/s (headers at once). Proxy mode
also holds writes at a gate (`hold_writes_after`).

Shaping (`Shaping`, for benchmarks; all off by default): `rate` bytes/s per connection, `total`
bytes/s over all connections, `latency` seconds before the first byte of every response, `setup`
seconds before a new connection's first request is read (a TCP + TLS handshake's round trips).
Rates are paced in 256 KiB writes.
"""
from __future__ import annotations

import http.client
import os
import shutil
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

from ._faults import FaultPlan, hang_up, trickled
from ._ranges import byte_range
from ._threaded import ServedInThread

CHUNK = 1 << 18  # bytes read, written and paced at a time: a shaped link costs the server little CPU
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
              "transfer-encoding", "upgrade", "host", "expect"}


@dataclass
class Shaping:
    """A link to shape every response like: None / 0 leave that dimension unshaped."""

    rate: float | None = None  # bytes/s per connection
    total: float | None = None  # bytes/s over all connections
    latency: float = 0.0  # seconds before the first byte of each response
    setup: float = 0.0  # seconds before a new connection's first request is read


class _Pace:
    """Pacing at `rate` bytes/s shared by whoever holds it: `reserve(n)` says when n bytes may go."""

    def __init__(self, rate: float):
        self.rate = rate
        self.lock = threading.Lock()
        self.next = 0.0

    def reserve(self, n: int) -> float:
        with self.lock:
            start = max(time.monotonic(), self.next)
            self.next = start + n / self.rate
            return start


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"
    protocol_version = "HTTP/1.1"  # keep-alive: one connection serves many requests

    def log_message(self, format, *args):  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as real servers do
        owner = self.server.owner
        with owner.lock:
            owner.connections += 1
            owner.open_connections += 1
            owner.peak_connections = max(owner.peak_connections, owner.open_connections)
            owner.conn_ids += 1
            self.conn_id = owner.conn_ids
        self.pace: _Pace | None = None  # this connection's rate (made by `_write` as the shaping says)
        self.upstream_conn: http.client.HTTPConnection | None = None
        if owner.shaping.setup:
            time.sleep(owner.shaping.setup)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            owner = self.server.owner
            with owner.lock:
                owner.open_connections -= 1
            if self.upstream_conn is not None:
                self.upstream_conn.close()

    def do_HEAD(self):
        self._serve(head=True)

    def do_GET(self):
        self._serve(head=False)

    def do_PUT(self):
        self._serve(head=False)

    def do_POST(self):
        self._serve(head=False)

    def do_DELETE(self):
        self._serve(head=False)

    # -- writing, shaped
    def _write(self, data: bytes, record: dict) -> None:
        owner = self.server.owner
        rate = owner.shaping.rate
        if (self.pace.rate if self.pace is not None else None) != rate:
            self.pace = _Pace(rate) if rate else None
        view = memoryview(data)
        for at in range(0, len(view), CHUNK):
            block = view[at : at + CHUNK]
            start = 0.0
            if self.pace is not None:
                start = self.pace.reserve(len(block))
            if owner.total_pace is not None:
                start = max(start, owner.total_pace.reserve(len(block)))
            delay = start - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            self._send_counted(record, block)

    def _send_counted(self, record: dict, data: bytes) -> None:
        """Write body bytes, counted in `sent` before the write returns: a client that has read the
        last byte may ask for `stats` before this thread runs again (counted after, it raced)."""
        record["sent"] += len(data)
        try:
            self.wfile.write(data)
        except OSError:
            record["sent"] -= len(data)  # not sent: the client went away
            raise

    def _first_byte_wait(self) -> None:
        latency = self.server.owner.shaping.latency
        if latency:
            time.sleep(latency)

    def _serve(self, head: bool) -> None:
        owner = self.server.owner
        name = unquote(urlsplit(self.path).path).lstrip("/")
        record = {"method": self.command, "name": name, "range": self.headers.get("Range"), "status": None,
                  "conn": self.conn_id, "sent": 0, "cut": False, "answered": None}
        with owner.lock:
            owner.requests.append(record)
            owner.events += 1
            record["arrived"] = owner.events
            owner.open_requests += 1
            owner.peak_requests = max(owner.peak_requests, owner.open_requests)
        try:
            if owner.upstream is not None:
                self._forward(record)
            else:
                self._serve_file(name, head, record)
        except (ConnectionError, OSError):
            self.close_connection = True  # the client hung up: nothing more on this connection
        finally:
            with owner.lock:
                owner.events += 1
                record["answered"] = owner.events
                owner.open_requests -= 1

    def _error(self, status: int, record: dict) -> None:
        record["status"] = status
        self._first_byte_wait()
        self.send_error(status)  # with Connection: close

    def _serve_file(self, name: str, head: bool, record: dict) -> None:
        owner = self.server.owner
        status = owner.faults.take_failure(name)
        if status:
            self._error(status, record)
            return
        path = os.path.realpath(os.path.join(owner.root, name))
        if not path.startswith(owner.root + os.sep) or not os.path.isfile(path):
            self._error(404, record)
            return
        size = os.path.getsize(path)
        status, start, stop, malformed = byte_range(self.headers.get("Range"), size)
        if malformed:
            self._error(416, record)
            return
        if status == 416:
            record["status"] = 416
            self._first_byte_wait()
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        partial = status == 206
        record["status"] = status
        self._first_byte_wait()
        self.send_response(record["status"])
        self.send_header("Content-Type", "application/x-tar")
        self.send_header("Content-Length", str(stop - start))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{os.stat(path).st_mtime_ns:x}-{size:x}"')
        if partial:
            self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{size}")
        self.end_headers()
        if head:
            return
        rate = owner.faults.trickle_rate(name)
        if rate is not None:
            with open(path, "rb") as handle:
                handle.seek(start)
                for piece in trickled(handle.read(stop - start), rate):
                    self._send_counted(record, piece)
                    self.wfile.flush()
            return
        cut = owner.faults.take_drop(name, stop - start)
        limit = stop - start if cut is None else min(cut, stop - start)
        with open(path, "rb") as handle:
            handle.seek(start)
            remaining = limit
            while remaining > 0:
                block = handle.read(min(CHUNK, remaining))
                if not block:
                    break
                self._write(block, record)
                remaining -= len(block)
        if cut is not None:
            record["cut"] = True
            hang_up(self)

    def _forward(self, record: dict) -> None:
        """The request sent on to `upstream` (one kept-alive connection per client connection), its
        answer sent back shaped; the faults planned for its path (`name`: the path, unquoted, without
        its query) apply to GETs as in file mode."""
        owner = self.server.owner
        length = int(self.headers.get("Content-Length") or 0)
        if self.headers.get("Transfer-Encoding"):
            self._error(501, record)  # chunked request bodies are not forwarded
            return
        body = self.rfile.read(length) if length else None
        failure = owner.faults.take_failure(record["name"]) if self.command == "GET" else None
        if failure:
            self._error(failure, record)
            return
        if self.command in ("PUT", "POST") and owner.faults.gate is not None and not owner.faults.pass_gate():
            self._error(503, record)  # a write held at the gate, released failing
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["Host"] = self.headers.get("Host", owner.upstream_host)
        self._first_byte_wait()
        for attempt in (0, 1):
            if self.upstream_conn is None:
                self.upstream_conn = http.client.HTTPConnection(owner.upstream_host, timeout=60)
            try:
                self.upstream_conn.request(self.command, self.path, body=body, headers=headers)
                response = self.upstream_conn.getresponse()
                break
            except (ConnectionError, http.client.HTTPException, OSError):
                self.upstream_conn.close()
                self.upstream_conn = None
                if attempt:
                    raise
        record["status"] = response.status
        self.send_response(response.status, response.reason)
        declared = response.getheader("Content-Length")
        data = None if declared is not None or self.command == "HEAD" else response.read()
        for key, value in response.getheaders():
            if key.lower() not in HOP_BY_HOP and not (data is not None and key.lower() == "content-length"):
                self.send_header(key, value)
        if data is not None:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command == "HEAD":
            response.read()
            return
        if data is not None:
            self._write(data, record)
            return
        rate = owner.faults.trickle_rate(record["name"]) if self.command == "GET" else None
        if rate is not None:
            for piece in trickled(response.read(), rate):
                self._send_counted(record, piece)
                self.wfile.flush()
            return
        cut = owner.faults.take_drop(record["name"], int(declared)) if self.command == "GET" else None
        left = int(declared) if cut is None else min(cut, int(declared))
        while left > 0 and (block := response.read(min(CHUNK, left))):
            self._write(block, record)
            left -= len(block)
        if cut is not None:
            record["cut"] = True
            self.upstream_conn.close()  # the rest of its answer is never read
            self.upstream_conn = None
            hang_up(self)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def handle_error(self, request, client_address):  # a client that hangs up is not an error here
        pass


class RangeHTTPServer(ServedInThread):
    def __init__(self, root: str | os.PathLike | None = None, host: str = "127.0.0.1", port: int = 0, *,
                 shaping: Shaping | None = None, upstream: str | None = None):
        if (root is None) == (upstream is None):
            raise ValueError("give the directory to serve or the upstream to forward to, one of them")
        self.root = os.path.realpath(str(root)) if root is not None else None
        self.upstream = upstream
        self.upstream_host = urlsplit(upstream).netloc if upstream else None
        self.host = host
        self.port = port
        self.shaping = shaping or Shaping()
        self.total_pace = _Pace(self.shaping.total) if self.shaping.total else None
        self.faults = FaultPlan()
        self.lock = threading.Lock()
        self.requests: list[dict] = []
        self.connections = 0
        self.conn_ids = 0
        self.open_connections = 0
        self.peak_connections = 0
        self.events = 0  # requests read plus answers written so far: the log's clock
        self.open_requests = 0
        self.peak_requests = 0

    def start(self) -> "RangeHTTPServer":
        return self._serve_http(_Server, _Handler, "http-test-server")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url_of(self, name: str) -> str:
        return f"{self.url}/{name}"

    def drop_once(self, name: str, at_byte: int, times: int = 1) -> None:
        self.faults.drop_once(name, at_byte, times)

    def trickle(self, name: str, rate: float) -> None:
        """Send every GET body of `name` at `rate` bytes per second (headers at once)."""
        self.faults.trickle(name, rate)

    def fail_next(self, name: str, status: int = 503, times: int = 1) -> None:
        """Answer the next `times` requests for `name` with `status` (and close the connection)."""
        self.faults.fail_next(name, status, times)

    def hold_writes_after(self, after: int, timeout: float = 60.0):
        """Proxy mode: writes (PUT, POST) beyond the first `after` wait at the returned gate until its
        `release()` (to kill an uploader halfway, deterministically)."""
        return self.faults.hold_after(after, timeout)

    def shape(self, shaping: Shaping) -> None:
        """Shape the link like `shaping` from the next byte written on (open connections included)."""
        self.shaping = shaping
        self.total_pace = _Pace(shaping.total) if shaping.total else None

    def requests_for(self, name: str) -> list[dict]:
        with self.lock:
            return [r for r in self.requests if r["name"] == name]

    def stats(self) -> dict:
        """requests, body bytes sent, connections accepted, most connections open at once, most
        requests being answered at once."""
        with self.lock:
            return {"requests": len(self.requests), "sent": sum(r["sent"] for r in self.requests),
                    "connections": self.connections, "peak_connections": self.peak_connections,
                    "peak_requests": self.peak_requests}

    def round_trips(self) -> int:
        """The client's sequential waits in the log: the longest chain of requests each of which
        arrived after the one before it was answered (N for a client that sends N requests one at a
        time, about N / k for one that keeps k in flight)."""
        with self.lock:
            events = []  # (event count, request, arrival or not), in the order the server saw them
            for number, record in enumerate(self.requests):
                events.append((record["arrived"], number, True))
                if record["answered"] is not None:
                    events.append((record["answered"], number, False))
        chain: dict[int, int] = {}  # request -> the longest chain ending with it
        longest_answered = 0
        for _, number, arrival in sorted(events):
            if arrival:
                chain[number] = longest_answered + 1
            else:
                longest_answered = max(longest_answered, chain[number])
        return max(chain.values(), default=0)

    def clear_log(self) -> None:
        """Forget the requests and connection counts so far (the peaks restart from what is open now)."""
        with self.lock:
            self.requests.clear()
            self.connections = 0
            self.peak_connections = self.open_connections
            self.peak_requests = self.open_requests


def copy_tree(source: str, destination: str) -> None:
    """Copy a shard directory under a server root (test setup helper)."""
    shutil.copytree(source, destination, dirs_exist_ok=True)
