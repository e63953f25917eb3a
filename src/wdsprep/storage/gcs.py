"""`gs://BUCKET/KEY` URLs (Google Cloud Storage): read with plain ranged GETs of the JSON API's media
downloads (`{endpoint}/download/storage/v1/b/BUCKET/o/KEY?alt=media`) over the process's pooled
`urllib3` connections (storage/http.py), so a gs:// shard gets the read-ahead, retries, rate floor and
same-object check of every remote read; written by `GCSStore` through google-cloud-storage (uploads,
listing, metadata).

Credentials are the ones Google's own tools use: application default credentials
(`GOOGLE_APPLICATION_CREDENTIALS`, `gcloud auth application-default login`, a VM's service account),
made once per process and refreshed when they expire; `STORAGE_EMULATOR_HOST` (what
google-cloud-storage honours) points both sides at an emulator, which needs none. Clients are per
process: a DataLoader worker forked from a process that has one makes its own (`_per_process`).

Writing. A shard goes up as one request, or above `multipart_bytes` as a resumable upload in
`part_bytes` chunks; either way the object appears under its name only when complete (a GCS
object is written whole or not at all), carrying its sha256 as custom metadata (`sha256(name)`
answers from it; `content_sha256` re-reads). An abandoned resumable session is no object and
expires on its own, so there is nothing to clean.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from urllib.parse import quote

from ..errors import ConfigError, ShardError
from ..readoptions import ReadOptions
from .base import ObjectStore, per_process
from .http import HttpGetScheme
from .s3 import SHA256_METADATA

ENDPOINT = "https://storage.googleapis.com"
SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
CHUNK = 256 << 10  # resumable upload chunks are multiples of this
INSTALL = "gs:// URLs need google-cloud-storage: pip install 'wdsprep[gcs]'"
NO_CREDENTIALS = ("no Google Cloud credentials found: set GOOGLE_APPLICATION_CREDENTIALS to a key file, or run "
                  "`gcloud auth application-default login` (STORAGE_EMULATOR_HOST for an emulator)")

def _per_process(what: str, make):
    return per_process((what, os.environ.get("STORAGE_EMULATOR_HOST"), os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")),
                       make)


def emulator() -> str | None:
    """The emulator's base URL from STORAGE_EMULATOR_HOST (`host:port` or a URL), or None."""
    host = os.environ.get("STORAGE_EMULATOR_HOST", "").strip().rstrip("/")
    if not host:
        return None
    return host if "://" in host else f"http://{host}"


def split_gs(url: str) -> tuple[str, str]:
    bucket, _, key = url[len("gs://") :].partition("/")
    if not bucket:
        raise ShardError(url, "a gs:// URL needs a bucket: gs://BUCKET/KEY")
    return bucket, key


def credentials(where: str = "gs://"):
    """This process's application default credentials, valid now (None with an emulator); errors name `where`."""
    if emulator() is not None:
        return None
    try:
        import google.auth
        import google.auth.exceptions
        import google.auth.transport.requests
    except ImportError:
        raise ShardError(where, INSTALL) from None

    def make():
        try:
            found, _ = google.auth.default(scopes=[SCOPE])
        except google.auth.exceptions.DefaultCredentialsError as error:
            return error
        return found, threading.Lock()

    held = _per_process("credentials", make)
    if isinstance(held, Exception):  # found none: said the same way on every use
        raise ShardError(where, f"{NO_CREDENTIALS} ({str(held).splitlines()[0]})")
    found, lock = held
    if not found.valid:
        with lock:
            if not found.valid:
                try:
                    found.refresh(google.auth.transport.requests.Request())
                except google.auth.exceptions.GoogleAuthError as error:
                    raise ShardError(where, f"cannot refresh the Google Cloud credentials ({error})") from None
    return found


class GCSScheme(HttpGetScheme):
    writable = True
    webdataset = True  # plain `wds.WebDataset(urls)` reads through it (storage/gopen.py)
    example = "gs://BUCKET/PREFIX"

    def locate(self, url: str) -> tuple[str, dict]:
        bucket, key = split_gs(url)
        if not key:
            raise ShardError(url, "a gs:// URL to read needs an object name: gs://BUCKET/KEY")
        base = emulator() or ENDPOINT
        found = credentials(url)
        headers = {} if found is None else {"Authorization": f"Bearer {found.token}"}
        return f"{base}/download/storage/v1/b/{quote(bucket, safe='')}/o/{quote(key, safe='')}?alt=media", headers

    def explain(self, status: int, headers, body: bytes) -> str:
        """A permanent error of the JSON API in one line: the store's own message where it gives one."""
        try:
            message = json.loads(body)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = body.decode(errors="replace").strip().splitlines()[0] if body.strip() else ""
        if status == 404:
            bucket_missing = "bucket" in message.lower() and "object" not in message.lower()
            return "no such bucket" if bucket_missing else "no such object"
        if status in (401, 403):
            return f"access denied (HTTP {status}{': ' + message if message else ''})"
        return f"HTTP {status}{': ' + message if message else ''}"

    def store(self, url: str, **options) -> "GCSStore":
        return GCSStore(url, **options)


SCHEME = GCSScheme()


def storage_client():
    """This process's google-cloud-storage client (anonymous with an emulator)."""
    try:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage
    except ImportError:
        raise ConfigError(INSTALL) from None

    def make():
        if emulator() is not None:
            return storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT") or "emulator",
                                  credentials=AnonymousCredentials(),
                                  client_options={"api_endpoint": emulator()})
        try:
            found = credentials()
        except ShardError as error:
            raise ConfigError(str(error).split(": ", 1)[1]) from None
        return storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT") or getattr(found, "project_id", None)
                              or "none", credentials=found)

    return _per_process("client", make)


def _code(error: Exception) -> int | None:
    return getattr(error, "code", None)


class GCSStore(ObjectStore):
    """A "directory" `gs://bucket/prefix` of shards and a manifest (see the module docstring)."""

    reader = SCHEME

    def __init__(self, url: str, *, multipart_bytes: int | None = None, part_bytes: int | None = None, **options):
        bucket, prefix = split_gs(url.rstrip("/"))
        self.bucket_name = bucket
        super().__init__(f"gs://{bucket}", prefix)
        environment = ReadOptions.from_environment()  # checked before any request
        self.multipart_bytes = int(environment.s3_multipart_bytes if multipart_bytes is None else multipart_bytes)
        wanted = int(environment.s3_part_bytes if part_bytes is None else part_bytes)
        self.part_bytes = max(CHUNK, wanted // CHUNK * CHUNK)
        try:
            found = storage_client().lookup_bucket(bucket)
        except ConfigError as error:
            raise ConfigError(f"{url}: {error}") from None
        except Exception as error:  # noqa: BLE001 -- one line for whatever the endpoint said
            if _code(error) in (401, 403):
                raise ConfigError(f"{url}: access denied to bucket {bucket!r} ({_message(error)})") from None
            raise ConfigError(f"{url}: cannot reach Google Cloud Storage ({_message(error)})") from None
        if found is None:
            raise ConfigError(f"{url}: no such bucket {bucket!r}")
        self.bucket = found

    def _blob(self, name: str, size: int = 0):
        chunk = self.part_bytes if size > self.multipart_bytes else None  # resumable, in chunks
        return storage_client().bucket(self.bucket_name).blob(self.key(name), chunk_size=chunk)

    # -- Store
    def upload_file(self, local_path: str, name: str, sha256: str | None = None) -> None:
        from .files import file_sha256

        size = os.path.getsize(local_path)
        blob = self._blob(name, size)
        blob.metadata = {SHA256_METADATA: sha256 or file_sha256(local_path)}
        blob.upload_from_filename(local_path, content_type="application/x-tar")

    def recorded(self, name: str) -> tuple[int, str | None] | None:
        blob = storage_client().bucket(self.bucket_name).get_blob(self.key(name))
        return None if blob is None else (int(blob.size), (blob.metadata or {}).get(SHA256_METADATA))

    def read_bytes(self, name: str) -> bytes | None:
        from google.api_core.exceptions import NotFound

        try:
            return self._blob(name).download_as_bytes()
        except NotFound:
            return None

    def write_bytes(self, name: str, data: bytes) -> None:
        blob = self._blob(name)
        blob.metadata = {SHA256_METADATA: hashlib.sha256(data).hexdigest()}
        content_type = "application/json" if name.endswith(".json") else "application/octet-stream"
        blob.upload_from_string(data, content_type=content_type)

    def delete(self, name: str) -> None:
        from google.api_core.exceptions import NotFound

        try:
            self._blob(name).delete()
        except NotFound:
            pass

    def list_names(self) -> list[str]:
        start = f"{self.prefix}/" if self.prefix else ""
        blobs = storage_client().list_blobs(self.bucket_name, prefix=start, delimiter="/")
        return sorted(name for blob in blobs if (name := blob.name[len(start) :]))


def _message(error: Exception) -> str:
    text = getattr(error, "message", None) or str(error)
    return text.strip().splitlines()[0] if text.strip() else type(error).__name__

