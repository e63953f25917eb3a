"""A plain HTTP file server for tests: GET/HEAD with `Range`, request log, fault injection.

`RangeHTTPServer(root)` serves the files under `root` on 127.0.0.1 (free port). Faults:
`drop_once(name, at_byte)` cuts the next response body of `name` after `at_byte` bytes and closes
the connection (the client sees a dropped stream); `fail_next(name, status, times)` answers the next
requests with an error status; `trickle(name, rate)` sends every body of `name` at `rate` bytes/s.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

from ._faults import FaultPlan, trickled

CHUNK = 1 << 16


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"
    protocol_version = "HTTP/1.0"  # one request per connection: a drop never poisons the next one

    def log_message(self, format, *args):  # quiet
        pass

    def do_HEAD(self):
        self._serve(head=True)

    def do_GET(self):
        self._serve(head=False)

    def _serve(self, head: bool) -> None:
        owner = self.server.owner
        name = unquote(urlsplit(self.path).path).lstrip("/")
        record = {"method": self.command, "name": name, "range": self.headers.get("Range"), "status": None}
        with owner.lock:
            owner.requests.append(record)
        status = owner.take_failure(name)
        if status:
            record["status"] = status
            self.send_error(status)
            return
        path = os.path.realpath(os.path.join(owner.root, name))
        if not path.startswith(owner.root + os.sep) or not os.path.isfile(path):
            record["status"] = 404
            self.send_error(404)
            return
        size = os.path.getsize(path)
        start, stop = 0, size
        header = self.headers.get("Range")
        if header:
            match = re.fullmatch(r"bytes=(\d*)-(\d*)", header.strip())
            if not match or (match.group(1) == "" and match.group(2) == ""):
                record["status"] = 416
                self.send_error(416)
                return
            if match.group(1) == "":  # suffix range: the last N bytes
                start = max(0, size - int(match.group(2)))
            else:
                start = int(match.group(1))
                if match.group(2):
                    stop = min(size, int(match.group(2)) + 1)
            if start >= size and size > 0:
                record["status"] = 416
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.end_headers()
                return
        partial = header is not None
        record["status"] = 206 if partial else 200
        self.send_response(record["status"])
        self.send_header("Content-Type", "application/x-tar")
        self.send_header("Content-Length", str(stop - start))
        self.send_header("Accept-Ranges", "bytes")
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
                    self.wfile.write(piece)
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
                self.wfile.write(block)
                remaining -= len(block)
        if cut is not None:
            self.wfile.flush()
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.close_connection = True


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):  # a client that hangs up is not an error here
        pass


class RangeHTTPServer:
    def __init__(self, root: str | os.PathLike, host: str = "127.0.0.1", port: int = 0):
        self.root = os.path.realpath(str(root))
        self.host = host
        self.port = port
        self.faults = FaultPlan()
        self.lock = threading.Lock()
        self.requests: list[dict] = []
        self._failures: dict[str, list[int]] = {}
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> "RangeHTTPServer":
        self._server = _Server((self.host, self.port), _Handler)
        self._server.owner = self
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="http-test-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> "RangeHTTPServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

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
        with self.lock:
            self._failures.setdefault(name, []).extend([status] * times)

    def take_failure(self, name: str) -> int | None:
        with self.lock:
            queue = self._failures.get(name)
            return queue.pop(0) if queue else None

    def requests_for(self, name: str) -> list[dict]:
        with self.lock:
            return [r for r in self.requests if r["name"] == name]

    def clear_log(self) -> None:
        with self.lock:
            self.requests.clear()


def copy_tree(source: str, destination: str) -> None:
    """Copy a shard directory under a server root (test setup helper)."""
    shutil.copytree(source, destination, dirs_exist_ok=True)
