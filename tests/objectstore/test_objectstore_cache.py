"""The optional local shard cache: off by default, bounded in bytes (LRU), verified entries only; an
entry damaged on disk is named, dropped and read again from its URL; a FIFO at an entry name is refused."""
import json
import os
import warnings

import pytest

import wdsprep
from wdsprep.stream.reading.cache import ShardCache


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

    from wdsprep.stream.reading import cache as cache_module
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
    from wdsprep.stream.reading import cache as cache_module
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


# ---------------------------------------------------------------- a cache entry damaged on disk
def _flip_member(path, key: str) -> None:
    """Flip the last data byte of the first member of sample `key` in the tar at `path` (found by
    `tarfile`): the file keeps its size, only a member's digest tells."""
    import tarfile

    with tarfile.open(path) as archive:
        info = next(m for m in archive.getmembers() if m.name.partition(".")[0] == key)
    data = bytearray(path.read_bytes())
    data[info.offset_data + info.size - 1] ^= 0x01
    path.write_bytes(bytes(data))


def _raw(samples) -> dict:
    """key -> {member: bytes} of raw samples (what the user gets), bookkeeping left out."""
    return {s["__key__"]: {k: bytes(v) for k, v in s.items() if not k.startswith("__")} for s in samples}


@pytest.fixture(scope="module")
def large_shards(tmp_path_factory):
    """12 generic samples of ~320 KB (each larger than a local read window: read alone), 3 shards."""
    import numpy as np

    from wdsprep.conversion import convert

    root = tmp_path_factory.mktemp("large")
    rng = np.random.default_rng(7)
    (root / "input" / "train").mkdir(parents=True)
    for i in range(12):
        np.save(root / "input" / "train" / f"sample{i:06d}.array.npy", rng.standard_normal(80_000).astype(np.float32))
        (root / "input" / "train" / f"sample{i:06d}.meta.json").write_text(json.dumps({"index": i}))
    convert("generic", str(root / "input"), str(root / "shards"), shard_bytes="1300KB")
    return root / "shards"


@pytest.mark.parametrize("shards, shuffle_buffer", [("small", 0), ("small", 8), ("large", 0), ("large", 8)])
def test_a_damaged_cache_entry_is_named_dropped_and_read_again(generic_shards, large_shards, tmp_path, shards,
                                                               shuffle_buffer):
    """A cached shard whose member was altered on disk (same size: only the member's digest tells) was
    reported under the server's URL, every epoch, and never fetched again. Now the warning names the
    cached file, the entry is removed and the shard read on from its URL: the epoch holds every sample
    with the server's bytes; the next epoch caches the shard again. Shards of small samples (read in
    windows) and of samples larger than a window (read alone: with a shuffle buffer, when taken)."""
    from wdsprep.testing import RangeHTTPServer

    directory = generic_shards if shards == "small" else large_shards
    rows = _rows(directory)
    cache = tmp_path / "cache"
    with RangeHTTPServer(directory) as server:
        manifest = server.url_of("manifest.json")
        reference = _raw(wdsprep.dataset(manifest, "train", equalize=None))
        dataset = wdsprep.dataset(manifest, "train", equalize=None, shuffle_buffer=shuffle_buffer,
                                  cache_dir=str(cache), cache_bytes=10 * sum(r["bytes"] for r in rows))
        assert _raw(dataset) == reference  # the first epoch fills the cache
        row = max(rows, key=lambda r: r["samples"])
        entry = cache / f"{row['sha256']}.tar"
        assert entry.read_bytes() == (directory / row["name"]).read_bytes()
        keys = [key for key, _ in _tar_keys(entry)]
        _flip_member(entry, keys[len(keys) // 2])  # samples before it check out, the rest come from the URL
        server.clear_log()
        with pytest.warns(UserWarning) as warned:
            assert _raw(dataset) == reference
        messages = [str(w.message) for w in warned]
        url = server.url_of(row["name"])
        assert len(messages) == 1 and messages[0].startswith(
            f"{entry}: cached copy of {url} failed its check (member {keys[len(keys) // 2]}."), messages
        assert messages[0].endswith(f"corrupt (its header, data or padding differ from the shard's index)); "
                                    f"dropped it, reading the shard from {url} again")
        assert {r["name"] for r in server.requests} == {row["name"]}  # only the damaged one, from its URL
        assert not entry.exists() or entry.read_bytes() == (directory / row["name"]).read_bytes()
        assert _raw(dataset) == reference  # the next epoch: a miss, cached again whole
        assert entry.read_bytes() == (directory / row["name"]).read_bytes()


def _tar_keys(path):
    import tarfile

    with tarfile.open(path) as archive:
        seen = {}
        for member in archive.getmembers():
            if not member.name.startswith("__"):
                seen.setdefault(member.name.partition(".")[0], member)
    return list(seen.items())


def test_dropping_an_entry_removes_only_the_file_that_was_read(tmp_path):
    """Another process may have admitted a good copy under the entry's name since a reader opened
    the bad one: `drop` removes only the file that was read (and says so once)."""
    from wdsprep.errors import ShardError

    blob = os.urandom(4096)
    cache = ShardCache(tmp_path / "c", 1e6)
    path = tmp_path / "c" / f"{'a' * 64}.tar"
    path.write_bytes(blob)
    stream, entry = cache.open_entry("http://host/x.tar", "a" * 64, len(blob))
    stream.close()
    assert entry is not None and entry.path == str(path)
    error = ShardError("http://host/x.tar", "member k.x: corrupt")
    (tmp_path / "c" / "new").write_bytes(blob)
    os.replace(tmp_path / "c" / "new", path)  # admitted since by another reader
    with pytest.warns(UserWarning, match=f"^{path}: cached copy of http://host/x.tar failed its check "
                                         r"\(member k.x: corrupt\); dropped it"):
        cache.drop(entry, "http://host/x.tar", error)
    assert path.read_bytes() == blob  # not the file that was read: kept
    stream, entry = cache.open_entry("http://host/x.tar", "a" * 64, len(blob))
    stream.close()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        cache.drop(entry, "http://host/x.tar", error)
        cache.drop(entry, "http://host/x.tar", error)  # said and done once
    assert not path.exists() and len(said) == 1


def test_a_shard_whose_server_copy_is_bad_still_fails_naming_its_url(generic_shards, tmp_path):
    """The cache heals its own copy only: a shard altered on the server (its row unchanged) fails its
    check on the way in, is never admitted, and the error names the URL, as without a cache."""
    import shutil

    from wdsprep.errors import ShardError
    from wdsprep.testing import RangeHTTPServer

    served = tmp_path / "served"
    shutil.copytree(generic_shards, served)
    row = max(_rows(served), key=lambda r: r["samples"])
    keys = [key for key, _ in _tar_keys(served / row["name"])]
    _flip_member(served / row["name"], keys[len(keys) // 2])
    with RangeHTTPServer(served) as server:
        url = server.url_of(row["name"])
        dataset = wdsprep.dataset(server.url_of("manifest.json"), "train", equalize=None,
                                  cache_dir=str(tmp_path / "cache"), cache_bytes=1e9)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no entry to blame: nothing dropped, nothing said
            with pytest.raises(ShardError, match=rf"^{url}: member {keys[len(keys) // 2]}\.\w+.*: corrupt"):
                _raw(dataset)
    assert not (tmp_path / "cache" / f"{row['sha256']}.tar").exists()


CHILD = """
import sys
import wdsprep
from wdsprep.errors import WdsprepError
try:
    count = sum(1 for _ in wdsprep.dataset(sys.argv[1], "train", equalize=None, cache_dir=sys.argv[2], cache_bytes=1e9))
except WdsprepError as error:
    print(f"{type(error).__name__}: {error}")
    sys.exit(3)
print(count)
"""


def test_a_fifo_at_an_entry_name_is_refused_without_waiting(http_server, generic_shards, tmp_path):
    """A FIFO planted at a shard's entry name is refused in one line naming it, never opened and waited
    on, never renamed over (storage/files.py's rule; it was taken for a miss and renamed over). Run in
    a child process, so a reader that blocks on it is killed by the hang guard."""
    import subprocess
    import sys

    from tests.timeouts import EVENT

    row = _rows(generic_shards)[0]
    (tmp_path / "cache").mkdir()
    fifo = tmp_path / "cache" / f"{row['sha256']}.tar"
    os.mkfifo(fifo)
    child = subprocess.run([sys.executable, "-c", CHILD, f"{http_server.url}/manifest.json", str(tmp_path / "cache")],
                           capture_output=True, text=True, timeout=EVENT)
    assert child.returncode == 3, (child.returncode, child.stdout, child.stderr[-2000:])
    assert child.stdout.splitlines() == [
        f"ConfigError: cache_dir {tmp_path / 'cache'}: {fifo}: exists and is a FIFO, not a regular file; "
        "wdsprep replaces only regular files (remove it or choose another output)"]
