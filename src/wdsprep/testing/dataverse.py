"""A Dataverse-compatible file server for a local directory, with fault injection (`wdsprep serve
dataverse DIR` runs one in the foreground; the rawnind tests and `make shards` start one in a thread).

Serves the two endpoints the RawNIND tools use:
  GET /api/datasets/:persistentId?persistentId=<doi>       the dataset JSON (file listing)
  GET /api/access/datafile/<id>                            a file (Range: bytes=a-b supported)
  GET /api/access/datafile/:persistentId?persistentId=<pid>
The directory holds `dataverse_dataset.json`; files are found by name anywhere below it.

Faults (for tests and the benchmark) are set on `Faults` by file name or id: HTTP 500s, a
dropped connection mid-body, corrupted bytes, a 404, a delay before answering, and a per-connection
rate limit. `Faults` is the test servers' shared `FaultPlan` (wdsprep/testing/_faults.py) with the
tables of a fault file as its front: each fault is planned, counted and used up there, and a cut
body hangs up the way every test server's does. Every request is logged (in memory, and as JSON
lines to a file when asked), so a test can see which files were fetched and which requests asked
for a Range.
"""
from __future__ import annotations

import json
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from ._faults import FaultPlan, hang_up
from ._ranges import byte_range
from ._threaded import ServedInThread

LISTING_NAME = "dataverse_dataset.json"


# a fault file's table -> how one of its entries (file name or id: value) is planned in the FaultPlan
FAULT_TABLES = {
    "error_500": lambda plan, key, times: plan.fail_next(key, 500, int(times)),
    "missing": lambda plan, key, _: plan.fail_next(key, 404, -1),
    "drop_after": lambda plan, key, at: plan.drop_once(key, int(at[0]), int(at[1])),
    "corrupt": lambda plan, key, times: plan.corrupt_next(key, int(times)),
    "delay": lambda plan, key, seconds: plan.pause(key, float(seconds)),
}


class Faults(FaultPlan):
    """Fault injection keyed by file name or str(file id), from the tables of a fault file:
    `error_500` {name: times}, `drop_after` {name: (byte, times)}, `corrupt` {name: times},
    `missing` [name, ...], `delay` {name: seconds}; times -1 means every request. Setting a table
    (`faults.error_500 = {name: 1}`, also on a running server) plans its entries in the `FaultPlan`
    (FAULT_TABLES); `rate_limit` (bytes per second per connection, None: unlimited) paces every body."""

    def __init__(self, rate_limit: float | None = None, **tables):
        super().__init__()
        unknown = set(tables) - set(FAULT_TABLES)
        if unknown:
            raise TypeError(f"Faults() got unknown fault tables {sorted(unknown)} (known: {', '.join(FAULT_TABLES)})")
        self.rate_limit = rate_limit
        for table, entries in tables.items():
            setattr(self, table, entries)

    def __setattr__(self, name: str, value: Any) -> None:
        plan = FAULT_TABLES.get(name)
        if plan is None:
            return super().__setattr__(name, value)
        for key, entry in (value.items() if isinstance(value, dict) else dict.fromkeys(value or ()).items()):
            plan(self, str(key), entry)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Faults":
        return cls(data.get("rate_limit"), **{table: data[table] for table in FAULT_TABLES if table in data})


class DataverseDirectory:
    """The dataset JSON of a directory and where each listed file lives."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        listing_path = os.path.join(self.root, LISTING_NAME)
        try:
            with open(listing_path, "rb") as handle:
                self.listing_bytes = handle.read()
            self.listing = json.loads(self.listing_bytes)
            files = self.listing["data"]["latestVersion"]["files"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{listing_path}: not a Dataverse dataset JSON ({error})") from None
        data = self.listing["data"]
        self.doi = data["latestVersion"].get("datasetPersistentId") or f"{data.get('protocol', 'doi')}:{data.get('authority')}/{data.get('identifier')}"
        on_disk: dict[str, str] = {}
        for directory, _, names in os.walk(self.root):
            for name in names:
                on_disk.setdefault(name, os.path.join(directory, name))
        self.by_id: dict[int, tuple[str, str | None]] = {}
        self.by_pid: dict[str, int] = {}
        for entry in files:
            datafile = entry["dataFile"]
            name = datafile.get("filename") or entry.get("label")
            self.by_id[int(datafile["id"])] = (name, on_disk.get(name))
            if datafile.get("persistentId"):
                self.by_pid[datafile["persistentId"]] = int(datafile["id"])


class DataverseServer(ServedInThread):
    """Runs the server in a thread: `with DataverseServer(dir) as server: server.url ...`."""

    def __init__(self, root: str, host: str = "127.0.0.1", port: int = 0, faults: Faults | None = None,
                 log_path: str | None = None, chunk_size: int = 64 * 1024):
        self.directory = DataverseDirectory(root)
        self.faults = faults or Faults()
        self.log: list[dict] = []
        self.active = 0  # requests being answered now (a test waits for 0 before reading the log)
        self.log_path = log_path
        self.chunk_size = chunk_size
        self._lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"app": self})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self._server = self.httpd  # closed by `stop()` even if never started

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def doi(self) -> str:
        return self.directory.doi

    def start(self) -> "DataverseServer":
        return self._serve(self.httpd, "dataverse-server")

    def record(self, entry: dict) -> None:
        with self._lock:
            self.active -= 1
            self.log.append(entry)
            if self.log_path:
                with open(self.log_path, "a", encoding="utf-8") as handle:
                    handle.write(json.dumps(entry, sort_keys=True) + "\n")

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until no request is being answered (e.g. after a client was killed mid-body)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self.active == 0:
                    return True
            time.sleep(0.01)
        return False

    def _begin(self) -> None:
        with self._lock:
            self.active += 1


class _Handler(BaseHTTPRequestHandler):
    app: DataverseServer
    protocol_version = "HTTP/1.1"
    server_version = "wdsprep-dataverse/1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet; we keep our own log
        pass

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    # ------------------------------------------------------------------------------------------
    def _send_simple(self, status: int, body: bytes, content_type: str = "application/json", head: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _error(self, status: int, message: str, head: bool) -> int:
        body = json.dumps({"status": "ERROR", "message": message}).encode()
        self._send_simple(status, body, head=head)
        return status

    def _serve(self, head: bool) -> None:
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        path = unquote(parts.path).rstrip("/")
        self.app._begin()
        entry: dict[str, Any] = {"method": self.command, "path": self.path, "range": self.headers.get("Range"),
                                 "time": time.time(), "client": self.client_address[1]}
        try:
            if path == "/api/datasets/:persistentId":
                pid = (query.get("persistentId") or [""])[0]
                if pid != self.app.doi:
                    entry["status"] = self._error(404, f"Dataset with Persistent ID {pid} not found.", head)
                else:
                    self._send_simple(200, self.app.directory.listing_bytes, head=head)
                    entry["status"] = 200
                return
            match = re.fullmatch(r"/api/access/datafile/(\d+|:persistentId)", path)
            if not match:
                entry["status"] = self._error(404, f"no such endpoint {parts.path}", head)
                return
            if match.group(1) == ":persistentId":
                pid = (query.get("persistentId") or [""])[0]
                file_id = self.app.directory.by_pid.get(pid)
            else:
                file_id = int(match.group(1))
            entry["file_id"] = file_id
            entry["status"] = self._serve_file(file_id, head, entry)
        except (BrokenPipeError, ConnectionResetError):
            entry["status"] = entry.get("status", "client-closed")
        finally:
            self.app.record(entry)

    def _serve_file(self, file_id: int | None, head: bool, entry: dict) -> int:
        app = self.app
        known = app.directory.by_id.get(file_id) if file_id is not None else None
        if known is None:
            return self._error(404, f"File not found for id {file_id}", head)
        name, path = known
        entry["file"] = name
        keys = (name, str(file_id))
        faults = app.faults
        delay = _first(faults.pause_of, keys)
        if delay:
            time.sleep(delay)
        failure = _first(faults.take_failure, keys)
        if path is None or failure == 404:
            return self._error(404, f"File not found for id {file_id}", head)
        if failure:
            return self._error(failure, "Internal Server Error (injected)", head)
        size = os.path.getsize(path)
        requested = self.headers.get("Range")
        status, start, stop, malformed = byte_range(requested, size)
        if malformed:
            return self._error(416, f"bad Range {requested!r}", head)
        if status == 416:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return 416
        end, length = stop - 1, stop - start
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Disposition", f'attachment; filename="{name}"')
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        if head:
            return status
        drop_at = _first(lambda key: faults.take_drop(key, length), keys)
        corrupt = _first(faults.take_corruption, keys)
        sent = 0
        began = time.monotonic()
        with open(path, "rb") as handle:
            handle.seek(start)
            while sent < length:
                chunk = handle.read(min(app.chunk_size, length - sent))
                if not chunk:
                    break
                if corrupt and sent == 0:
                    chunk = bytes([chunk[0] ^ 0xFF]) + chunk[1:]
                if drop_at is not None and sent + len(chunk) >= drop_at:
                    chunk = chunk[: max(drop_at - sent, 0)]
                    self.wfile.write(chunk)
                    sent += len(chunk)
                    entry["dropped_at"] = start + sent
                    hang_up(self)
                    entry["bytes"] = sent
                    return status
                self.wfile.write(chunk)
                sent += len(chunk)
                if faults.rate_limit:
                    ahead = sent / faults.rate_limit - (time.monotonic() - began)
                    if ahead > 0:
                        time.sleep(ahead)
        entry["bytes"] = sent
        if corrupt:
            entry["corrupted"] = True
        return status


def _first(take, keys: tuple[str, ...]) -> Any:
    """The first planned fault of a file under its name or its id (each lookup may use one up)."""
    for key in keys:
        value = take(key)
        if value is not None:
            return value
    return None
