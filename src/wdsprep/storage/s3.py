"""`s3://BUCKET/KEY` URLs (boto3; endpoint from `AWS_ENDPOINT_URL(_S3)` like the AWS CLI): read
through a `ResumingStream` (Range requests, `If-Match` on the first ETag), written by `S3Store`
(conversion output and upload destination on S3 or any S3-compatible store).

The only local staging is the shard being written: the writer fills a temporary file in a
per-process staging directory, and `publish` uploads it (one PUT, or a multipart upload for large
shards) and deletes it. Every object written from a file carries its sha256 as user metadata
(`x-amz-meta-sha256`), computed from the very bytes sent; the transfer itself is integrity-checked
by botocore's request checksums. `sha256(name)` answers from that metadata with one HEAD, and
`content_sha256(name)` re-reads the object to check it for real (what `wdsprep upload` does after
each upload). An S3 PUT is atomic: an object is either absent or complete under its final name.

`S3StreamWriter` is the `wb` side of webdataset's `gopen("s3://...")`: a multipart upload fed from
memory, part by part, with no local file at all. Publication is explicit: the object appears under
its key only on a clean `close()`. Leaving a `with` block by an exception, a `close()` made while an
exception is being handled (webdataset's `TarWriter.__exit__` closes its stream without passing the
exception on), and garbage collection of an unclosed writer all abort the upload instead, so a
truncated tar is never published.
"""
from __future__ import annotations

import hashlib
import io
import os
import sys
import threading
from typing import Iterator

from ..errors import ConfigError, ShardError
from ..readoptions import MIN_S3_PART_BYTES, ReadOptions
from .base import ObjectStore
from .files import file_sha256
from .http import HttpBody
from .resuming import ResumingScheme, range_header

MIB = 1 << 20
MIN_PART_BYTES = MIN_S3_PART_BYTES  # S3's minimum for every part but the last
SHA256_METADATA = "sha256"

POOL = 32  # connections per client at least; raised by `s3_client(connections)`

_clients: dict = {}  # (pid, endpoint, credentials, region, timeout) -> (pool size, client)
_sessions: dict = {}  # (endpoint, credentials, region) -> boto3 Session: kept across forks
_clients_lock = threading.Lock()


def _client_key() -> tuple:
    env = os.environ
    return (
        os.getpid(),
        env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL"),
        env.get("AWS_ACCESS_KEY_ID"),
        env.get("AWS_PROFILE"),
        env.get("AWS_DEFAULT_REGION") or env.get("AWS_REGION"),
    )


def s3_client(connections: int = 0, timeout: float | None = None):
    """A boto3 S3 client per process, environment and `timeout` (seconds per connect and read;
    default: the environment's now, `ReadOptions`), its connection pool holding at least
    `max(POOL, connections)`; endpoint from AWS_ENDPOINT_URL(_S3) like the AWS CLI. Custom endpoints
    (MinIO, Ceph, moto) get path-style addressing unless `AWS_S3_ADDRESSING_STYLE` says otherwise.

    Clients are per process (a forked DataLoader worker makes its own: sockets are never shared), but
    made from one boto3 Session per environment that forked workers inherit with its service models
    already loaded: a worker's client costs milliseconds instead of the ~0.1 s (more when workers
    start together) of loading them again."""
    timeout = ReadOptions.from_environment().timeout if timeout is None else timeout
    key = (*_client_key(), timeout)
    wanted = max(POOL, connections)
    held = _clients.get(key)
    if held is not None and held[0] >= wanted:
        return held[1]
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise ShardError("s3://", "s3:// URLs need boto3: pip install 'wdsprep[s3]'") from None
    endpoint = key[1]
    style = os.environ.get("AWS_S3_ADDRESSING_STYLE") or ("path" if endpoint else "auto")
    config = Config(
        connect_timeout=timeout,
        read_timeout=timeout,
        retries={"max_attempts": 3, "mode": "standard"},
        s3={"addressing_style": style},
        max_pool_connections=wanted,
    )
    with _clients_lock:
        held = _clients.get(key)
        if held is None or held[0] < wanted:
            session = _sessions.get(key[1:-1])
            if session is None:
                # a Session per environment: boto3's default session is not thread-safe to create clients from
                session = _sessions[key[1:-1]] = boto3.session.Session()
            held = _clients[key] = (wanted, session.client("s3", endpoint_url=endpoint, config=config))
    return held[1]


def _after_fork_in_child() -> None:
    global _clients_lock
    _clients_lock = threading.Lock()  # a parent thread may have held it at the fork


os.register_at_fork(after_in_child=_after_fork_in_child)


def split_s3(url: str) -> tuple[str, str]:
    rest = url[len("s3://") :]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise ShardError(url, "an s3:// URL needs a bucket: s3://BUCKET/KEY")
    return bucket, key


def s3_error_code(error: Exception) -> str | None:
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        return response.get("Error", {}).get("Code")
    return None


PERMANENT_S3 = {"NoSuchKey", "404", "NoSuchBucket", "AccessDenied", "403", "InvalidRange", "InvalidAccessKeyId",
                "SignatureDoesNotMatch", "PreconditionFailed", "412"}


def _get(url: str, bucket: str, key: str, timeout: float, **kwargs) -> dict:
    """One GetObject; permanent errors as `ShardError`s naming the URL, anything else raised as is."""
    try:
        return s3_client(timeout=timeout).get_object(Bucket=bucket, Key=key, **kwargs)
    except Exception as error:
        code = s3_error_code(error)
        if code in ("NoSuchKey", "404"):
            raise ShardError(url, "no such object") from None
        if code == "NoSuchBucket":
            raise ShardError(url, "no such bucket") from None
        if code in ("PreconditionFailed", "412"):
            raise ShardError(url, "object changed while reading (ETag no longer matches)") from None
        if code in PERMANENT_S3:
            raise ShardError(url, f"S3 error {code}") from None
        raise


def _s3_open_at(url: str, end: int | None, timeout: float):
    """`open_at(offset)` for `ResumingStream`: one GetObject (with `Range` past 0, or up to `end`
    exclusive when it is given; `If-Match` the first response's ETag) -> (body, total, etag)."""
    bucket, key = split_s3(url)
    state: dict = {}

    def open_at(offset: int):
        wanted = range_header(offset, end)
        kwargs = {"Range": wanted} if wanted else {}
        if offset and state.get("etag"):
            kwargs["IfMatch"] = state["etag"]  # the same object, or a clear error
        response = _get(url, bucket, key, timeout, **kwargs)
        etag = response.get("ETag")
        state.setdefault("etag", etag)
        length = int(response["ContentLength"])
        total = offset + length
        content_range = response.get("ContentRange")
        if content_range and "/" in content_range:
            total = int(content_range.rsplit("/", 1)[1])
        body = response["Body"]
        return HttpBody(getattr(body, "_raw_stream", body), length), total, etag

    return open_at


def _not_found(error: Exception) -> bool:
    return s3_error_code(error) in ("NoSuchKey", "404", "NotFound")


class S3Store(ObjectStore):
    """A "directory" `s3://bucket/prefix` holding shards and a manifest. No lock (S3 has none: one
    conversion per prefix is the caller's rule); `sha256` answers from the upload's metadata.
    `multipart_bytes` / `part_bytes` default to the environment's when the store is opened
    (`ReadOptions`: WDSPREP_S3_MULTIPART_BYTES, WDSPREP_S3_PART_BYTES)."""

    def __init__(self, url: str, *, multipart_bytes: int | None = None, part_bytes: int | None = None, **options):
        bucket, prefix = split_s3(url.rstrip("/"))
        if not bucket:
            raise ConfigError(f"{url}: expected s3://BUCKET/PREFIX")
        self.bucket = bucket
        super().__init__(f"s3://{bucket}", prefix)
        environment = ReadOptions.from_environment()  # checked before any request
        self.multipart_bytes = int(environment.s3_multipart_bytes if multipart_bytes is None else multipart_bytes)
        self.part_bytes = max(int(environment.s3_part_bytes if part_bytes is None else part_bytes), 1)
        try:
            s3_client(timeout=environment.timeout).head_bucket(Bucket=bucket)
        except ShardError as error:  # boto3 missing
            raise ConfigError(str(error)) from None
        except Exception as error:
            code = s3_error_code(error)
            if code in ("NoSuchBucket", "404", "NotFound"):
                raise ConfigError(f"{url}: no such bucket {bucket!r}") from None
            if code in ("403", "AccessDenied"):
                raise ConfigError(f"{url}: access denied to bucket {bucket!r}") from None
            raise ConfigError(f"{url}: cannot reach the S3 endpoint ({error})") from None

    @property
    def client(self):
        return s3_client()

    # -- Store
    def upload_file(self, local_path: str, name: str, sha256: str | None = None) -> None:
        """Upload a local file (kept) as `name`, with its sha256 in the object metadata.

        Files above `multipart_bytes` go up as a multipart upload of `part_bytes` parts (aborted on
        any error, so no incomplete upload lingers)."""
        size = os.path.getsize(local_path)
        digest = sha256 or file_sha256(local_path)
        metadata = {SHA256_METADATA: digest}
        key = self.key(name)
        if size <= self.multipart_bytes:
            with open(local_path, "rb") as handle:
                self.client.put_object(Bucket=self.bucket, Key=key, Body=handle, ContentLength=size,
                                       Metadata=metadata, ContentType="application/x-tar")
            return
        part_bytes = max(self.part_bytes, MIN_PART_BYTES)
        upload = self.client.create_multipart_upload(Bucket=self.bucket, Key=key, Metadata=metadata,
                                                     ContentType="application/x-tar")
        upload_id = upload["UploadId"]
        try:
            parts = []
            with open(local_path, "rb") as handle:
                number = 1
                while block := handle.read(part_bytes):
                    answer = self.client.upload_part(Bucket=self.bucket, Key=key, UploadId=upload_id,
                                                     PartNumber=number, Body=block)
                    parts.append({"PartNumber": number, "ETag": answer["ETag"]})
                    number += 1
            self.client.complete_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id,
                                                  MultipartUpload={"Parts": parts})
        except BaseException:
            try:
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            except Exception:
                pass
            raise

    def head(self, name: str) -> dict | None:
        try:
            return self.client.head_object(Bucket=self.bucket, Key=self.key(name))
        except Exception as error:
            if _not_found(error):
                return None
            raise

    def recorded(self, name: str) -> tuple[int, str | None] | None:
        head = self.head(name)
        if head is None:
            return None
        return int(head["ContentLength"]), (head.get("Metadata") or {}).get(SHA256_METADATA)

    def read_bytes(self, name: str) -> bytes | None:
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self.key(name))
        except Exception as error:
            if _not_found(error):
                return None
            raise
        return response["Body"].read()

    def write_bytes(self, name: str, data: bytes) -> None:
        content_type = "application/json" if name.endswith(".json") else "application/octet-stream"
        self.client.put_object(Bucket=self.bucket, Key=self.key(name), Body=data, ContentType=content_type,
                               Metadata={SHA256_METADATA: hashlib.sha256(data).hexdigest()})

    def delete(self, name: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self.key(name))

    def iter_objects(self) -> Iterator[dict]:
        """Objects directly under the prefix (not in "subdirectories"): {name, size, etag}."""
        start = f"{self.prefix}/" if self.prefix else ""
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=start, Delimiter="/"):
            for item in page.get("Contents", []):
                name = item["Key"][len(start) :]
                if name:
                    yield {"name": name, "size": int(item["Size"]), "etag": item.get("ETag")}

    def list_names(self) -> list[str]:
        return sorted(item["name"] for item in self.iter_objects())

    def abort_incomplete_uploads(self, names: set[str] | None = None) -> int:
        """Abort multipart uploads left by an interrupted run (all under the prefix, or those names)."""
        start = f"{self.prefix}/" if self.prefix else ""
        aborted = 0
        paginator = self.client.get_paginator("list_multipart_uploads")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=start):
            for upload in page.get("Uploads", []):
                name = upload["Key"][len(start) :]
                if "/" in name or (names is not None and name not in names):
                    continue
                try:
                    self.client.abort_multipart_upload(Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"])
                    aborted += 1
                except Exception:
                    pass
        return aborted

    def clean_temporaries(self, names: set[str] | None = None) -> None:
        self.abort_incomplete_uploads(names)


class S3StreamWriter(io.RawIOBase):
    """A writable stream to `s3://bucket/key`: parts go up as they fill, the object appears on close."""

    def __init__(self, url: str, part_bytes: int | None = None):
        self.url = url
        self.bucket, self.key = split_s3(url)
        if not self.key:
            raise ShardError(url, "an s3:// URL to write needs a key")
        part_bytes = ReadOptions.from_environment().s3_part_bytes if part_bytes is None else part_bytes
        self.part_bytes = max(part_bytes, MIN_PART_BYTES)
        self._buffer = bytearray()
        self._upload_id: str | None = None
        self._parts: list[dict] = []

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if self.closed:
            raise ValueError("write to a closed S3 stream")
        self._buffer += data
        while len(self._buffer) >= self.part_bytes:
            self._send_part(bytes(self._buffer[: self.part_bytes]))
            del self._buffer[: self.part_bytes]
        return len(data)

    def _send_part(self, block: bytes) -> None:
        client = s3_client()
        if self._upload_id is None:
            self._upload_id = client.create_multipart_upload(Bucket=self.bucket, Key=self.key)["UploadId"]
        number = len(self._parts) + 1
        answer = client.upload_part(Bucket=self.bucket, Key=self.key, UploadId=self._upload_id, PartNumber=number, Body=block)
        self._parts.append({"PartNumber": number, "ETag": answer["ETag"]})

    def abort(self) -> None:
        if self._upload_id is not None:
            try:
                s3_client().abort_multipart_upload(Bucket=self.bucket, Key=self.key, UploadId=self._upload_id)
            except Exception:
                pass
            self._upload_id = None
        self._buffer = bytearray()
        super().close()

    def __exit__(self, exc_type, exc_value, traceback) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()

    def __del__(self) -> None:
        # io.IOBase.__del__ would close(), i.e. publish whatever was written so far: abort instead
        try:
            if not self.closed:
                self.abort()
        except Exception:
            pass

    def close(self) -> None:
        if self.closed:
            return
        if sys.exc_info()[1] is not None:
            # called while an exception unwinds (e.g. TarWriter.__exit__ after a failed write): the
            # stream is probably truncated, so do not publish it
            self.abort()
            return
        self.commit()

    def commit(self) -> None:
        """Publish what was written under the key (a clean close), whatever exception is in flight."""
        if self.closed:
            return
        try:
            client = s3_client()
            if self._upload_id is None:
                client.put_object(Bucket=self.bucket, Key=self.key, Body=bytes(self._buffer))
            else:
                if self._buffer:
                    self._send_part(bytes(self._buffer))
                client.complete_multipart_upload(Bucket=self.bucket, Key=self.key, UploadId=self._upload_id,
                                                 MultipartUpload={"Parts": self._parts})
        except BaseException:
            self.abort()
            raise
        super().close()


class S3Scheme(ResumingScheme):
    writable = True
    webdataset = True
    example = "s3://BUCKET/PREFIX"

    def open_at(self, url: str, end: int | None = None):
        return _s3_open_at(url, end, self.options.timeout)

    def connect(self, connections: int) -> None:
        s3_client(connections, self.options.timeout)

    def store(self, url: str, **options) -> S3Store:
        return S3Store(url, **options)

    def open_write(self, url: str) -> S3StreamWriter:
        return S3StreamWriter(url)


SCHEME = S3Scheme()
S3Store.reader = SCHEME
