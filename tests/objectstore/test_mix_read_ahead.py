"""Remote parts of a mix share one read-ahead: what a worker sends at once, counted at the server.

Two parts served over HTTP with a 50 ms first byte (so that every connection the readers may open is
open at once): a mix of them never has more requests in flight than one dataset with the same
`max_connections` (the worker's connections are divided among its remote parts, not given to each),
and every sample of both parts arrives, checked, in the mix's order (the model of
tests/core/test_mix_oracle.py)."""
import collections

import pytest

import wdsprep
from tests.objectstore.test_read_ahead import _write_shards
from wdsprep.testing import RangeHTTPServer
from wdsprep.testing.httpserver import Shaping


@pytest.fixture(scope="module")
def two_parts(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix-read-ahead")
    _write_shards(root / "a", [100] * 4, 2000)  # 8 KB samples
    _write_shards(root / "b", [100] * 2, 2000)
    return root


def test_remote_parts_share_the_workers_connections(two_parts, monkeypatch):
    from wdsprep import readoptions

    monkeypatch.setattr(readoptions, "MIN_RANGE", 4096)  # small ranges: many requests in flight
    with RangeHTTPServer(two_parts, shaping=Shaping(latency=0.05)) as server:
        parts = [wdsprep.Part(server.url_of("a/manifest.json"), name="a"),
                 wdsprep.Part(server.url_of("b/manifest.json"), name="b")]
        alone = wdsprep.dataset(server.url_of("a/manifest.json"), "train", equalize=None, max_connections=8,
                                prefetch_bytes=1 << 20)
        server.clear_log()
        assert sum(1 for _ in alone) == 400
        one_dataset = server.stats()["peak_connections"]
        assert one_dataset == 8, server.stats()  # the bound is reached by one dataset alone

        mixed = wdsprep.mix(parts, mode="epochized", equalize=None, max_connections=8, prefetch_bytes=1 << 20)
        server.clear_log()
        got = collections.Counter(sample["__part__"] for sample in mixed)
        assert got == {"a": 400, "b": 200}
        assert server.stats()["peak_connections"] <= 8, server.stats()  # not 8 per part
