"""Fixtures: the session's S3 server (tests/conftest.py) with this test's AWS variables, a
Range-capable HTTP server on 127.0.0.1, and small generic shards of deliberately uneven sizes (23
and 1 samples alternating)."""
import hashlib
import itertools
import os
import pathlib

import pytest

from wdsprep.conversion import convert
from wdsprep.sources.generic import SOURCE as GENERIC
from wdsprep.storage import resuming
from wdsprep.testing import RangeHTTPServer
from wdsprep.upload import upload

_buckets = itertools.count()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """The S3 server, with this process's AWS variables pointing at it for the test."""
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    s3_server.faults.gate = None
    s3_server.faults.drops.clear()
    s3_server.faults.put_faults.clear()
    s3_server.faults.trickles.clear()
    yield s3_server
    s3_server.faults.gate = None
    s3_server.faults.trickles.clear()


@pytest.fixture
def bucket(s3) -> str:
    return s3.create_bucket(f"test-{os.getpid()}-{next(_buckets)}")


@pytest.fixture(scope="session")
def generic_shards(tmp_path_factory) -> pathlib.Path:
    """100 generic samples in 9 shards of 23,1,23,1,23,1,23,1,4 samples, plus a 20-sample valid split."""
    root = tmp_path_factory.mktemp("generic")
    GENERIC.synth(str(root / "input"), seed=3, size="small", samples=100, splits={"train": 100, "valid": 20})
    convert("generic", str(root / "input"), str(root / "shards"), shard_bytes="400KB")
    return root / "shards"


@pytest.fixture
def http_server(generic_shards):
    with RangeHTTPServer(generic_shards) as server:
        yield server


@pytest.fixture(autouse=True)
def _fast_retries(monkeypatch):
    monkeypatch.setattr(resuming, "MAX_DELAY", 0.2)


class Remote:
    """A bucket (container, Hub repo) of one scheme's store reached through a proxy
    (`RangeHTTPServer(upstream=the emulator)`): the same request log, faults and upload gate for every
    scheme. `url(prefix)` is the store URL users write, `put(shards, prefix)` puts a shard folder
    there (`wdsprep upload`; on the Hub, a commit), `name_of(url)` the proxy's name for where an
    object's bytes come from (its path; a Hub LFS file's storage path), to plan faults and read the
    log by, `markers()` what each object's write left (S3: completed writes; GCS: its generation;
    Azure: its ETag; a re-upload changes it)."""

    def __init__(self, scheme: str, server, proxy: RangeHTTPServer, container: str):
        self.scheme, self.server, self.proxy, self.container = scheme, server, proxy, container
        self.lfs: dict[str, str] = {}  # hf: path in the repo -> the sha256 its bytes are stored by

    def url(self, prefix: str) -> str:
        if self.scheme == "hf":
            return f"hf://datasets/{self.container}/{prefix}"
        return f"{self.scheme}://{self.container}/{prefix}"

    def put(self, shard_dir, prefix: str) -> str:
        if self.scheme != "hf":
            upload(str(shard_dir), self.url(prefix), quiet=True)
            return self.url(prefix)
        from wdsprep.testing.hubserver import LFS_BYTES

        self.server.upload_folder(self.container, shard_dir, prefix)
        for path in pathlib.Path(shard_dir).iterdir():
            if path.stat().st_size >= LFS_BYTES:
                self.lfs[f"{prefix}/{path.name}"] = hashlib.sha256(path.read_bytes()).hexdigest()
        return self.url(prefix)

    def name_of(self, url: str) -> str:
        if self.scheme == "hf":
            path = url.split("/", 5)[5]
            return f"{self.server.storage}/{self.lfs[path]}" if path in self.lfs else f"datasets/{self.container}/resolve/main/{path}"
        key = url.split("://", 1)[1].split("/", 1)[1]
        return {"s3": f"{self.container}/{key}", "gs": f"download/storage/v1/b/{self.container}/o/{key}",
                "az": f"devstoreaccount1/{self.container}/{key}"}[self.scheme]

    def requests_for(self, url: str) -> list[dict]:
        return self.proxy.requests_for(self.name_of(url))

    def markers(self, prefix: str) -> dict[str, object]:
        if self.scheme == "s3":
            return {key.split("/", 1)[1]: count for key, count in self.server.completed_uploads(self.container).items()
                    if key.startswith(f"{prefix}/")}
        if self.scheme == "gs":
            from google.auth.credentials import AnonymousCredentials
            from google.cloud import storage

            client = storage.Client(project="test", credentials=AnonymousCredentials(),
                                    client_options={"api_endpoint": self.server.url})
            return {b.name.split("/", 1)[1]: b.generation for b in client.list_blobs(self.container, prefix=f"{prefix}/")}
        from azure.storage.blob import BlobServiceClient

        client = BlobServiceClient.from_connection_string(self.server.env["AZURE_STORAGE_CONNECTION_STRING"])
        return {b.name.split("/", 1)[1]: b.etag
                for b in client.get_container_client(self.container).list_blobs(name_starts_with=f"{prefix}/")}


SERVERS = {"s3": "s3_server", "gs": "gcs_server", "az": "azurite_server", "hf": "hub_server"}


def _remote(request, monkeypatch, scheme: str):
    name = f"t{os.getpid()}-{next(_buckets)}"
    server = request.getfixturevalue(SERVERS[scheme])
    upstream = {"s3": lambda: server.endpoint}.get(scheme, lambda: server.url)()
    with RangeHTTPServer(upstream=upstream) as proxy:
        if scheme == "s3":
            server.create_bucket(name)
            env = {**server.env, "AWS_ENDPOINT_URL": proxy.url}
        elif scheme == "gs":
            server.create_bucket(name)
            env = server.via(proxy.url)
        elif scheme == "az":
            server.create_container(name)
            env = server.via(proxy.url)
        else:
            name = f"org/{name}"
            server.create_repo(name, private=True)
            env = server.via(proxy.url)
        for variable, value in env.items():
            monkeypatch.setenv(variable, value)
        yield Remote(scheme, server, proxy, name)


@pytest.fixture(params=["s3", "gs", "az", "hf"])
def remote(request, monkeypatch):
    """Each remote scheme in turn (hf:// a private Hub repo), a fresh bucket, through a proxy; this
    process's environment points at the proxy for the test (children inherit it)."""
    yield from _remote(request, monkeypatch, request.param)


@pytest.fixture(params=["s3", "gs", "az"])
def writable_remote(request, monkeypatch):
    """`remote` for the schemes wdsprep writes to."""
    yield from _remote(request, monkeypatch, request.param)


@pytest.fixture(scope="session")
def hub_server():
    """The project's Hub endpoint (wdsprep.testing.HubServer), one per session."""
    from wdsprep.testing import HubServer

    with HubServer() as server:
        yield server
