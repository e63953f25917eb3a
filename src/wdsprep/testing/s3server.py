"""An S3-compatible server for tests: moto's backend in a thread on 127.0.0.1, instrumented.

moto's `ThreadedMotoServer` serves the backend as-is; this wraps the same WSGI app to record every
request (method, bucket, key, query, status), so tests can count completed uploads per key, and to
inject faults (a GET body cut mid-stream or sent slowly, PUTs held at a gate, PUTs refused or stored
corrupted).
"""
from __future__ import annotations

import contextlib
import logging
import socket
import threading
from typing import Callable, Iterator
from urllib.parse import parse_qs, unquote

from ._faults import FaultPlan, trickled
from ._environment import WithEnvironment
from ._threaded import ServedInThread

AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
}


class S3Server(ServedInThread, WithEnvironment):
    """`with S3Server() as s3: ...` — `s3.endpoint`, `s3.env`, `s3.environment()`, `s3.client()`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.host = host
        self.port = port
        self.faults = FaultPlan()
        self._corrupting: set[tuple[str, str]] = set()
        self.requests: list[dict] = []
        self._lock = threading.Lock()

    # -- lifecycle
    def start(self) -> "S3Server":
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no per-request lines in test output
        self._backend = DomainDispatcherApplication(create_backend_app)
        server = make_server(self.host, self.port, self._app, threaded=True, request_handler=MotoRequestHandler)
        self.port = server.server_address[1]
        return self._serve(server, "s3-test-server")

    def stop(self) -> None:
        if self.faults.gate is not None:
            self.faults.gate.release(fail=True)
        super().stop()

    # -- client side
    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        return {**AWS_ENV, "AWS_ENDPOINT_URL": self.endpoint}

    def client(self):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    # -- observations
    def completed_uploads(self, bucket: str | None = None) -> dict[str, int]:
        """Key -> number of successful object writes (PUT object, CompleteMultipartUpload, copy)."""
        counts: dict[str, int] = {}
        with self._lock:
            requests = list(self.requests)
        for r in requests:
            if bucket is not None and r["bucket"] != bucket or not r["key"] or r["status"] != 200:
                continue
            query = r["query"]
            single_put = r["method"] == "PUT" and "partNumber" not in query and "uploadId" not in query
            complete = r["method"] == "POST" and "uploadId" in query
            if (single_put or complete) and not any(q in query for q in ("tagging", "acl", "retention")):
                counts[r["key"]] = counts.get(r["key"], 0) + 1
        return counts

    def clear_log(self) -> None:
        with self._lock:
            self.requests.clear()

    # -- faults
    def drop_get(self, bucket: str, key: str, at_byte: int, times: int = 1) -> None:
        """Cut the next GET body(ies) of the object after `at_byte` bytes and close the connection."""
        self.faults.drop_once(f"{bucket}/{key}", at_byte, times)

    def trickle_gets(self, bucket: str, key: str, rate: float) -> None:
        """Send every GET body of the object at `rate` bytes per second (headers at once)."""
        self.faults.trickle(f"{bucket}/{key}", rate)

    def refuse_puts(self, bucket: str, key: str, times: int = 1) -> None:
        """Answer the next PUT(s) of the object 400 InvalidArgument (an error botocore does not retry itself)."""
        self.faults.on_next_puts(f"{bucket}/{key}", "refuse", times)

    def corrupt_puts(self, bucket: str, key: str, times: int = 1) -> None:
        """Accept the next PUT(s) of the object, then flip one byte of what is stored (metadata kept): a
        storage fault that only re-reading the object can see."""
        self.faults.on_next_puts(f"{bucket}/{key}", "corrupt", times)

    def _corrupt_stored(self, bucket: str, key: str) -> None:
        client = self.client()
        self._corrupting.add((bucket, key))  # our own rewrite below is not one of the planned PUTs
        try:
            stored = client.get_object(Bucket=bucket, Key=key)
            data = bytearray(stored["Body"].read())
            data[len(data) // 2] ^= 0x01
            client.put_object(Bucket=bucket, Key=key, Body=bytes(data), Metadata=stored.get("Metadata") or {})
        finally:
            self._corrupting.discard((bucket, key))

    def hold_puts_after(self, after: int, match: Callable[[str], bool] = lambda key: key.endswith(".tar"), timeout: float = 60.0):
        """PUTs (objects and parts) of matching keys beyond the first `after` wait for `gate.release()`."""
        self._gate_match = match
        return self.faults.hold_after(after, timeout)

    # -- the wrapped WSGI app
    def _app(self, environ, start_response):
        method = environ["REQUEST_METHOD"]
        path = unquote(environ.get("PATH_INFO", ""))
        bucket, _, key = path.lstrip("/").partition("/")
        query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        record = {"method": method, "bucket": bucket, "key": key, "query": query, "status": None,
                  "range": environ.get("HTTP_RANGE")}
        with self._lock:
            self.requests.append(record)

        if method == "PUT" and key and self.faults.gate is not None and getattr(self, "_gate_match", None) and self._gate_match(key):
            if not self.faults.pass_gate():
                record["status"] = 503
                start_response("503 Service Unavailable", [("Content-Type", "application/xml")])
                return [b"<Error><Code>SlowDown</Code><Message>held by the test gate</Message></Error>"]

        planned = method == "PUT" and key and "uploadId" not in query and (bucket, key) not in self._corrupting
        put_fault = self.faults.take_put_fault(f"{bucket}/{key}") if planned else None
        if put_fault == "refuse":
            environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))  # drain the body before answering
            record["status"] = 400
            start_response("400 Bad Request", [("Content-Type", "application/xml")])
            return [b"<Error><Code>InvalidArgument</Code><Message>refused by the test fault plan</Message></Error>"]

        def recording_start_response(status, headers, exc_info=None):
            record["status"] = int(status.split()[0])
            return start_response(status, headers, exc_info)

        body = self._backend(environ, recording_start_response)
        if put_fault == "corrupt" and record["status"] == 200:
            body = list(body)  # the backend has stored the object once its answer is read
            self._corrupt_stored(bucket, key)
        rate = self.faults.trickle_rate(f"{bucket}/{key}") if method == "GET" and key else None
        if rate is not None:
            return trickled(b"".join(body), rate)
        cut = self.faults.take_drop(f"{bucket}/{key}") if method == "GET" and key else None
        if cut is None:
            return body
        return _cut_body(body, cut, environ.get("werkzeug.socket"))


def _cut_body(body, cut: int, sock) -> Iterator[bytes]:
    """Yield the first `cut` bytes of a WSGI body, then drop the connection (a dropped stream)."""
    sent = 0
    try:
        for chunk in body:
            if sent + len(chunk) >= cut:
                yield chunk[: cut - sent]
                break
            sent += len(chunk)
            yield chunk
    finally:
        close = getattr(body, "close", None)
        if close:
            close()
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    raise ConnectionAbortedError("test fault: connection dropped mid-body")
