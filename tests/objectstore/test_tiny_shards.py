"""Many tiny shards over HTTP: one-sample shards made by `wdsprep convert` at a tiny `--shard-bytes`.

Each shard is its own object, so each costs one GET at least; what the read-ahead must do is keep
several of them in flight over its pool instead of waiting for each in turn. Measured at the
server (`RangeHTTPServer`, with a first-byte latency so that a request in flight stays in flight):
the most requests it answered at once, and its count of the client's sequential waits
(`round_trips`: the longest chain of requests each sent after the one before it was answered).
Samples are compared with the arrays written as input (numpy), byte offsets with `tarfile`; nothing
here asserts a time.
"""
import pathlib
import subprocess
import sys
import tarfile

import numpy as np
import pytest
import webdataset as wds

import wdsprep
from tests.timeouts import SUBPROCESS
from wdsprep.errors import ShardError
from wdsprep.testing import RangeHTTPServer
from wdsprep.testing.httpserver import Shaping

SAMPLES = 48
CONNECTIONS = 8


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[pathlib.Path, dict]:
    """(shard directory, key -> the array written as input): one sample per shard."""
    root = tmp_path_factory.mktemp("tiny-shards")
    rng = np.random.default_rng(11)
    arrays = {}
    (root / "in" / "train").mkdir(parents=True)
    for i in range(SAMPLES):
        key = f"sample{i:03d}"
        arrays[key] = rng.standard_normal(300).astype(np.float32)
        np.save(root / "in" / "train" / f"{key}.array.npy", arrays[key])
    result = subprocess.run([sys.executable, "-m", "wdsprep", "convert", "generic", str(root / "in"), str(root / "out"),
                             "--shard-bytes", "1KB", "--codec", "none", "--quiet"],
                            capture_output=True, text=True, timeout=SUBPROCESS)
    assert result.returncode == 0, result.stderr
    assert len(list((root / "out").glob("*.tar"))) == SAMPLES  # one sample each
    return root / "out", arrays


def _read(url: str, **keywords) -> list[dict]:
    dataset = wdsprep.dataset(url, "train", shuffle_shards=False, equalize=None, max_connections=CONNECTIONS, **keywords)
    return list(dataset.compose(wdsprep.decode()))


def test_tiny_shards_are_fetched_many_at_once_in_fewer_round_trips_than_shards(tiny):
    """Every sample arrives, equal to its input array; each shard is one request for all of its
    bytes (index included); several are in flight at once over the worker's pool, and the client
    waited in sequence far fewer times than there are shards."""
    out, arrays = tiny
    with RangeHTTPServer(out, shaping=Shaping(latency=0.02)) as server:
        url = server.url_of("manifest.json")
        wdsprep.dataset(url, "train")  # the manifest, fetched before the log starts
        server.clear_log()
        samples = _read(url)
        stats, round_trips = server.stats(), server.round_trips()
        requests = list(server.requests)
    assert [s["__key__"] for s in samples] == sorted(arrays)
    for sample in samples:
        np.testing.assert_array_equal(sample["array.npy"], arrays[sample["__key__"]])
    sizes = {path.name: path.stat().st_size for path in out.glob("*.tar")}
    assert sorted((r["name"], r["range"]) for r in requests if r["name"] != "manifest.json") == sorted((name, f"bytes=0-{size - 1}") for name, size in sizes.items())
    assert 1 < stats["peak_requests"] <= CONNECTIONS, stats
    assert stats["connections"] <= CONNECTIONS, stats  # one pool, reused
    assert round_trips <= SAMPLES // 4, (round_trips, stats)


def test_every_tiny_shard_is_still_checked_against_its_index(tiny, tmp_path):
    """One byte flipped in the array of one tiny shard (same size, so the manifest's size check
    passes): that sample is refused with a ShardError naming its shard, every other one arrives."""
    out, arrays = tiny
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in out.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    victim = sorted(copy.glob("*.tar"))[SAMPLES // 2]
    with tarfile.open(victim) as archive:
        member = next(m for m in archive.getmembers() if m.name.endswith(".array.npy"))
    data = bytearray(victim.read_bytes())
    data[member.offset_data + member.size - 1] ^= 0xFF  # the last byte of the array's data
    victim.write_bytes(bytes(data))
    errors = []

    def keep_going(error):
        errors.append(error)
        return True

    with RangeHTTPServer(copy, shaping=Shaping(latency=0.005)) as server:
        samples = _read(server.url_of("manifest.json"), handler=keep_going)
    assert len(errors) == 1 and isinstance(errors[0], ShardError) and victim.name in str(errors[0]), errors
    assert [s["__key__"] for s in samples] == [k for i, k in enumerate(sorted(arrays)) if i != SAMPLES // 2]
    with RangeHTTPServer(copy) as server, pytest.raises(ShardError, match=victim.name):
        _read(server.url_of("manifest.json"), handler=wds.reraise_exception)
