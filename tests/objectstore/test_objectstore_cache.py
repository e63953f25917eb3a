"""The optional local shard cache: off by default, bounded in bytes (LRU), verified entries only."""
import json
import os

import wdsprep
from wdsprep.stream.cache import ShardCache


def _rows(shard_dir, split="train"):
    return json.loads((shard_dir / "manifest.json").read_bytes())["splits"][split]["shards"]


def _keys(dataset):
    return [s["__key__"] for s in dataset]


def test_cache_serves_repeated_epochs(http_server, generic_shards, tmp_path):
    rows = _rows(generic_shards)
    manifest = f"{http_server.url}/manifest.json"
    plain = _keys(wdsprep.dataset(manifest, "train", equalize=None))
    dataset = wdsprep.dataset(manifest, "train", equalize=None, cache_dir=str(tmp_path / "cache"),
                              cache_bytes=sum(r["bytes"] for r in rows))
    http_server.clear_log()
    assert _keys(dataset) == plain
    # each shard's body is fetched once; its sample index is not asked for again: the plain pass above
    # loaded it in this process (indexes are kept per process by URL and index digest)
    whole = [r["name"] for r in http_server.requests if r["range"] in (None, "bytes=0-")]
    indexes = [(r["name"], r["range"]) for r in http_server.requests if r["range"] not in (None, "bytes=0-")]
    assert sorted(whole) == sorted(r["name"] for r in rows)
    assert indexes == []
    http_server.clear_log()
    second = _keys(dataset)  # the next epoch (another shard order): no request at all
    assert sorted(second) == sorted(plain) and http_server.requests == []
    assert dataset.cache.hits == len(rows)


def test_cache_stays_within_its_byte_bound_keeping_the_most_recent(http_server, generic_shards, tmp_path):
    rows = _rows(generic_shards)
    bound = rows[0]["bytes"] + rows[2]["bytes"] + 10_000  # room for about two big shards
    cache_dir = tmp_path / "cache"
    dataset = wdsprep.dataset(f"{http_server.url}/manifest.json", "train", shuffle_shards=False, equalize=None,
                              cache_dir=str(cache_dir), cache_bytes=bound)
    assert sorted(_keys(dataset)) == [f"sample{i:06d}" for i in range(100)]
    entries = sorted(p for p in os.listdir(cache_dir) if p.endswith(".tar"))
    assert sum(os.path.getsize(cache_dir / p) for p in entries) <= bound
    assert not [p for p in os.listdir(cache_dir) if p.endswith(".part")]
    # LRU: what is left is the tail of the read order that fits; entries are named by sha256, byte-identical
    kept, total = [], 0
    for row in reversed(rows):
        if total + row["bytes"] > bound:
            break
        kept.append(row)
        total += row["bytes"]
    assert entries == sorted(f"{r['sha256']}.tar" for r in kept)
    for row in kept:
        assert (cache_dir / f"{row['sha256']}.tar").read_bytes() == (generic_shards / row["name"]).read_bytes()


def test_cache_keeps_nothing_from_a_partial_or_corrupt_read(tmp_path, monkeypatch):
    import hashlib

    from wdsprep.stream import cache as cache_module
    from wdsprep.testing import RangeHTTPServer

    monkeypatch.setattr(cache_module, "DRAIN_BYTES", 4096)  # closing may finish a read only this close to the end
    blob = os.urandom(4 << 20)
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "big.tar").write_bytes(blob)
    digest = hashlib.sha256(blob).hexdigest()
    cache = ShardCache(tmp_path / "c", 10e6)
    with RangeHTTPServer(tmp_path / "www") as server:
        url = server.url_of("big.tar")
        with cache.open(url, digest, len(blob)) as stream:
            stream.read(5000)  # a reader that stops early
        assert os.listdir(tmp_path / "c") == []
        with cache.open(url, "0" * 64, len(blob)) as stream:
            assert stream.read() == blob  # complete, but not the bytes the manifest promised
        assert os.listdir(tmp_path / "c") == []
        with cache.open(url, digest, len(blob)) as stream:
            stream.read()
        assert os.listdir(tmp_path / "c") == [f"{digest}.tar"]
        server.clear_log()
        with cache.open(url, digest, len(blob)) as stream:
            assert stream.read() == blob
        assert server.requests == [] and cache.hits == 1


def test_no_cache_by_default_and_local_shards_are_never_copied(generic_shards, tmp_path):
    dataset = wdsprep.dataset(str(generic_shards), "train")
    assert dataset.cache is None
    cached = wdsprep.dataset(str(generic_shards), "train", cache_dir=str(tmp_path / "c"), cache_bytes=1e9)
    assert sorted(_keys(cached)) == sorted(_keys(dataset))
    assert os.listdir(tmp_path / "c") == []


def test_a_shard_split_between_two_workers_is_downloaded_once(tmp_path, monkeypatch):
    """A tail piece (start > 0) seeks past the head instead of downloading it through the tee."""
    import hashlib
    import io
    import tarfile

    from wdsprep.shards.tarformat import iter_samples
    from wdsprep.stream import cache as cache_module
    from wdsprep.storage import resuming
    from wdsprep.testing import RangeHTTPServer

    monkeypatch.setattr(cache_module, "DRAIN_BYTES", 4096)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(64):
            data = os.urandom(256 << 10)
            info = tarfile.TarInfo(f"s{i:04d}.bin")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    blob = buffer.getvalue()
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "split.tar").write_bytes(blob)
    digest = hashlib.sha256(blob).hexdigest()

    received = [0]
    original = resuming.ResumingStream.readinto

    def counting(self, target):
        n = original(self, target)
        received[0] += n or 0
        return n

    monkeypatch.setattr(resuming.ResumingStream, "readinto", counting)
    from wdsprep.storage import open_url

    cache = ShardCache(tmp_path / "c", 1e9)

    def two_workers(opener, url):
        received[0] = 0
        keys = []
        for start, stop in ((0, 32), (32, 64)):  # two neighbouring workers' pieces of one shard
            with opener(url) as stream:
                for got, sample in enumerate(iter_samples(stream, url, skip=start)):
                    if start + got == stop:
                        break
                    keys.append(sample["__key__"])
        assert keys == [f"s{i:04d}" for i in range(64)]
        return received[0]

    with RangeHTTPServer(tmp_path / "www") as server:
        url = server.url_of("split.tar")
        plain = two_workers(open_url, url)  # no cache: each piece by itself, the tail by Range
        cached = two_workers(lambda u: cache.open(u, digest, len(blob)), url)
    # the cache adds at most one read-ahead block to the head piece and one to the tail piece (before
    # the fix, the tail piece downloaded the whole shard from byte 0 through the tee: + half a shard)
    assert cached <= plain + 2 * (1 << 20) + 4096, (cached, plain, len(blob))
    assert cached < plain + len(blob) // 4
    assert os.listdir(tmp_path / "c") == []  # neither piece was a whole read: no entry, no leftover .part
