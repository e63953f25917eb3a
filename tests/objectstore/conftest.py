"""Fixtures: the session's S3 server (tests/conftest.py) with this test's AWS variables, a
Range-capable HTTP server on 127.0.0.1, and small generic shards of deliberately uneven sizes (23
and 1 samples alternating)."""
import itertools
import os
import pathlib

import pytest

from wdsprep.conversion import convert
from wdsprep.sources.generic import SOURCE as GENERIC
from wdsprep.storage import resuming
from wdsprep.testing import RangeHTTPServer

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
