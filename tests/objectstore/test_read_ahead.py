"""The remote read-ahead (stream/reading/readahead.py), measured at the server: which bytes each piece asks
for, how many connections are open at once and reused, and how much memory the read-ahead holds.

Independent references: piece boundaries come from the plan model of tests/core/test_plan_oracle.py
(contiguous runs of the epoch's samples), byte offsets from Python's `tarfile`, memory from
`tracemalloc`, connections and requests from the servers' own logs (RangeHTTPServer, in front of the
S3 test server for s3://). Nothing here asserts a time.
"""
import contextlib
import os
import pathlib
import subprocess
import sys
import tarfile
import time
import tracemalloc

import numpy as np
import pytest

import wdsprep
from tests.core.test_integrity import _check, corrupted  # noqa: F401 (a fixture, used by name)
from tests.core.test_plan_oracle import model_global, model_worker_stream, simulated_worker
from tests.timeouts import EVENT, SUBPROCESS, wait_for
from wdsprep.errors import ShardError
from wdsprep.shards.codec import Encoder
from wdsprep.shards.manifest import Manifest
from wdsprep.shards.writer import ShardWriter
from wdsprep.testing import RangeHTTPServer
from wdsprep.testing.httpserver import Shaping
from wdsprep.upload import upload

COUNTS = [23, 1, 30, 7, 40, 2, 17]  # uneven: pieces start and end mid-shard for most worlds


def _write_shards(directory: pathlib.Path, counts, elements: int) -> pathlib.Path:
    """Shards of exactly `counts[i]` samples, keys `s<shard>x<i>` (the plan model's), each sample a
    float32 array of `elements` and a dict."""
    directory.mkdir(parents=True)
    rng = np.random.default_rng(5)
    rows = []
    for shard, count in enumerate(counts):
        writer = ShardWriter(str(directory), f"train-{shard:05d}", shard_bytes=1 << 40, encoder=Encoder("none"))
        with writer:
            for i in range(count):
                writer.write(f"s{shard:02d}x{i:02d}", {"value": rng.standard_normal(elements).astype(np.float32), "meta": {"i": i}})
        rows.extend(row.as_dict() for row in writer.rows)
    (directory / "manifest.json").write_bytes(Manifest("test", {}, "fp", {"train": rows}).dumps())
    return directory


@pytest.fixture(scope="module")
def uneven(tmp_path_factory) -> pathlib.Path:
    return _write_shards(tmp_path_factory.mktemp("read-ahead") / "uneven", COUNTS, 1000)  # ~4.6 KB a sample


@pytest.fixture(scope="module")
def large(tmp_path_factory) -> pathlib.Path:
    return _write_shards(tmp_path_factory.mktemp("read-ahead") / "large", [100] * 6, 4000)  # 6 shards of ~1.6 MB


def _layout(path: pathlib.Path) -> tuple[list[int], int]:
    """(header offset of each sample's first member, offset of the index member), by `tarfile`."""
    starts, keys, index_at = [], [], None
    with tarfile.open(path) as tar:
        for info in tar.getmembers():
            if info.name.startswith("__"):
                index_at = info.offset
                continue
            key = info.name.split(".", 1)[0]
            if not keys or keys[-1] != key:
                keys.append(key)
                starts.append(info.offset)
    return starts, index_at


def _expected_spans(root: pathlib.Path, keys: list[str]) -> dict[str, list[tuple[int, int]]]:
    """Shard name -> the byte spans [a, b) of the runs of consecutive samples in `keys`."""
    spans: dict[str, list[tuple[int, int]]] = {}
    run = None
    for key in keys + [None]:
        shard, i = (int(key[1:3]), int(key[4:6])) if key else (None, None)
        if run and (shard != run[0] or i != run[2]):
            name = f"train-{run[0]:05d}-00.tar"
            starts, index_at = _layout(root / name)
            spans.setdefault(name, []).append((starts[run[1]], starts[run[2]] if run[2] < len(starts) else index_at))
            run = None
        if key is not None:
            run = [shard, i, i + 1] if run is None else [run[0], run[1], i + 1]
    return spans


def _ranges(requests: list[dict]) -> dict[str, list[tuple[int, int]]]:
    """Shard name -> the byte spans [a, b) the requests for it asked for (each must have an end)."""
    asked: dict[str, list[tuple[int, int]]] = {}
    for r in requests:
        name = r["name"].rsplit("/", 1)[-1]
        if not name.endswith(".tar"):
            continue
        assert r["method"] == "GET" and r["range"], f"{name}: a request without a Range ({r})"
        first, last = r["range"][len("bytes="):].split("-")
        assert last, f"{name}: an open-ended Range ({r['range']}) would send bytes past the piece"
        asked.setdefault(name, []).append((int(first), int(last) + 1))
    return asked


def _check_own_bytes_only(root: pathlib.Path, streams: list[list[str]], requests: list[dict]) -> None:
    """`streams`: the keys each process reads (one list: one process). Every body byte of their pieces
    asked for once; nothing else but each shard's index, at most once per process reading it."""
    expected: dict[str, list[tuple[int, int]]] = {}
    readers: dict[str, int] = {}
    for keys in streams:
        for name, spans in _expected_spans(root, keys).items():
            expected.setdefault(name, []).extend(spans)
            readers[name] = readers.get(name, 0) + 1
    asked = _ranges(requests)
    assert set(asked) == set(expected)
    for name, spans in expected.items():
        size = (root / name).stat().st_size
        _, index_at = _layout(root / name)
        body = [0] * size
        for a, b in asked[name]:
            for x in range(a, b):
                body[x] += 1
        allowed = [0] * size
        for a, b in spans:
            allowed[a:b] = [1] * (b - a)
        for x in range(index_at, size):
            allowed[x] = 2
        stray = [x for x in range(size) if body[x] and not allowed[x]]
        assert not stray, f"{name}: bytes {stray[0]}.. asked for, outside its pieces {spans} and index"
        twice = [x for x in range(size) if allowed[x] == 1 and body[x] != 1]
        assert not twice, f"{name}: byte {twice[0]} of a piece asked for {body[twice[0]]} times (pieces {spans})"
        assert max(body[index_at:]) <= readers[name], f"{name}: its index asked for more than once per process"


@pytest.mark.parametrize("world, workers", [(1, 1), (3, 1), (1, 3), (2, 2), (5, 2)])
def test_each_piece_asks_for_its_own_bytes_only(uneven, world, workers):
    """A worker whose run starts or ends mid-shard asks for its own bytes (plus the shard's index),
    never for the shard from byte 0; a shard split between workers crosses the wire once."""
    counts = COUNTS
    with RangeHTTPServer(uneven) as server:
        for rank in range(world):
            for worker in range(workers):
                plan = dict(world=world, rank=rank, equalize=None, buffer=0, seed=0, epoch=0)
                keys = model_worker_stream(model_global(counts, 0, 0, False), workers=workers, worker=worker, **plan)
                with simulated_worker(worker, workers):
                    dataset = wdsprep.dataset(f"{server.url}/manifest.json", "train", shuffle_shards=False, equalize=None,
                                              rank=rank, world_size=world, prefetch_bytes=256 << 10, max_connections=2)
                    server.clear_log()
                    got = [sample["__key__"] for sample in dataset]
                assert got == keys
                _check_own_bytes_only(uneven, [keys], server.requests)


def test_each_piece_asks_for_its_own_bytes_only_from_dataloader_workers(uneven):
    with RangeHTTPServer(uneven) as server:
        dataset = wdsprep.dataset(f"{server.url}/manifest.json", "train", shuffle_shards=False, equalize=None,
                                  prefetch_bytes=256 << 10, max_connections=2)
        server.clear_log()
        loader = wdsprep.Loader(dataset, batch_size=None, num_workers=2)
        got = sorted(sample["__key__"] for sample in loader)
        assert got == sorted(model_global(COUNTS, 0, 0, False))
        plan = dict(world=1, rank=0, equalize=None, buffer=0, seed=0, epoch=0)
        streams = [model_worker_stream(model_global(COUNTS, 0, 0, False), workers=2, worker=w, **plan) for w in (0, 1)]
        _check_own_bytes_only(uneven, streams, server.requests)


@contextlib.contextmanager
def _remote(kind: str, root: pathlib.Path, s3_server, shaping: Shaping | None = None):
    """(base URL of the shards, the RangeHTTPServer whose log sees every request): files served
    over HTTP, or uploaded to the S3 test server with the HTTP server in front of it as a proxy."""
    if kind == "http":
        with RangeHTTPServer(root, shaping=shaping) as server:
            yield server.url, server
        return
    with s3_server.environment():
        bucket = s3_server.create_bucket(f"ahead-{os.getpid()}-{time.monotonic_ns()}")
        upload(str(root), f"s3://{bucket}/d")
        with RangeHTTPServer(upstream=s3_server.endpoint, shaping=shaping) as proxy:
            os.environ["AWS_ENDPOINT_URL"] = proxy.url
            yield f"s3://{bucket}/d", proxy


@pytest.mark.parametrize("kind", ["http", "s3"])
def test_connections_stay_within_the_bound_and_are_reused(large, s3_server, kind):
    """At most `max_connections` open per worker (so at once), more than one used (the link is kept
    full), and far fewer TCP connections than requests (keep-alive)."""
    with _remote(kind, large, s3_server, Shaping(latency=0.03)) as (base, server):
        dataset = wdsprep.dataset(f"{base}/manifest.json", "train", equalize=None, prefetch_bytes=1 << 20,
                                  max_connections=3)
        server.clear_log()
        assert sum(1 for _ in dataset) == 600
        stats = server.stats()
        assert stats["requests"] >= 20, stats  # ranges of at most 1 MiB / 6 over 9.6 MB
        assert 2 <= stats["peak_connections"] <= 3, stats
        assert stats["connections"] <= 3, stats  # the pool's, reused for every request
        assert stats["sent"] == sum((large / n).stat().st_size for n in os.listdir(large) if n.endswith(".tar"))

        # two DataLoader workers: each its own pool and bound (the main process keeps its idle ones open)
        server.clear_log()
        idle = server.stats()["peak_connections"]
        loader = wdsprep.Loader(dataset, batch_size=50, num_workers=2)
        assert sum(len(batch["__key__"]) for batch in loader) == 600
        stats = server.stats()
        assert stats["peak_connections"] <= idle + 2 * 3 and stats["connections"] <= 2 * 3, (idle, stats)
        assert stats["requests"] >= 20, stats


def test_by_default_a_rank_sends_32_requests_at_once_shared_by_its_workers(large, monkeypatch):
    """Without `max_connections`: one process up to RANK_CONNECTIONS (32) at once, each of 2 workers
    up to half of them (small ranges and a 50 ms first byte, so that many are in flight)."""
    from wdsprep import readoptions

    monkeypatch.setattr(readoptions, "MIN_RANGE", 4096)
    monkeypatch.delenv("WDSPREP_MAX_CONNECTIONS", raising=False)
    with RangeHTTPServer(large, shaping=Shaping(latency=0.05)) as server:
        dataset = wdsprep.dataset(server.url_of("manifest.json"), "train", equalize=None, prefetch_bytes=2 << 20)
        server.clear_log()
        assert sum(1 for _ in dataset) == 600
        assert server.stats()["peak_connections"] == 32, server.stats()  # 2 MiB / 64: 32 KiB ranges

        server.clear_log()
        idle = server.stats()["peak_connections"]
        assert sum(len(batch["__key__"]) for batch in wdsprep.Loader(dataset, batch_size=50, num_workers=2)) == 600
        stats = server.stats()
        assert 16 < stats["connections"] <= 32 and stats["peak_connections"] <= idle + 32, (idle, stats)  # new ones: the workers'


def test_read_ahead_options_are_checked(large, monkeypatch):
    from wdsprep.errors import ConfigError

    manifest = str(large / "manifest.json")
    for options, message in (({"max_connections": 0}, "max_connections=0: must be a whole number >= 1"),
                             ({"prefetch_bytes": -1}, r"prefetch_bytes=-1: must be 0 \(no read-ahead\) or"),
                             ({"prefetch_bytes": 1000}, r"prefetch_bytes=1000: must be 0 \(no read-ahead\) or a size of at least 128KiB")):
        with pytest.raises(ConfigError, match=message):
            wdsprep.dataset(manifest, "train", **options)
    monkeypatch.setenv("WDSPREP_MAX_CONNECTIONS", "0")
    with pytest.raises(ConfigError, match="WDSPREP_MAX_CONNECTIONS='0': must be a whole number >= 1"):
        wdsprep.dataset(manifest, "train")


def test_read_ahead_holds_at_most_its_budget(large):
    """Measured with tracemalloc (the server runs in its own process): what the reading process
    allocates stays within the budget plus the socket reads in flight and the sample being read,
    against a consumer much slower than the link (the read-ahead could fetch everything)."""
    budget, connections = 256 << 10, 2
    server = subprocess.Popen([sys.executable, "-m", "wdsprep.testing", "http", str(large)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        url = server.stdout.readline().strip()
        dataset = wdsprep.dataset(f"{url}/manifest.json", "train", equalize=None, prefetch_bytes=budget,
                                  max_connections=connections)
        samples = iter(dataset)
        next(samples)  # imports and the connection pool made before measuring
        tracemalloc.start()
        try:
            count = 1
            for sample in samples:
                count += 1
                time.sleep(0.002)  # a slow consumer
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert count == 600
        sample_bytes = 4000 * 4 + 2048
        socket_reads = connections * (512 << 10)  # the HTTP client's per connection: a few 64 KiB socket reads
        # (measured: ~840 KB in all with this budget; read ahead without the budget, ~10 MB)
        assert peak <= budget + socket_reads + 4 * sample_bytes, (peak, budget)
    finally:
        server.stdin.close()
        server.wait(timeout=SUBPROCESS)


def _shards_asked(server: RangeHTTPServer) -> set[str]:
    return {r["name"] for r in server.requests if r["name"].endswith(".tar")}


LARGE_SHARDS = {f"train-{shard:05d}-00.tar" for shard in range(6)}


def _passthrough(samples):
    """A reader stage of the user's (not fused into the reader): each sample as it is."""
    yield from samples


@pytest.mark.parametrize("stage", [None, _passthrough], ids=["raw", "with a stage"])
def test_the_read_ahead_reaches_past_the_first_block_once_the_first_sample_is_taken(large, stage):
    """The start window (a first sample waits for the first shuffle block's shards only) ends when the
    consumer asks for its second sample: while it holds that one (a training step), the read-ahead
    asks for every later shard (the budget holds them all). It ended only when the consumer had gone
    through the whole block, the link idle meanwhile (bench_remote: a quarter of its speed lost).
    Raw samples go at once; with a stage of the user's, the stream makes one more before it hands one over."""
    with RangeHTTPServer(large) as server:
        dataset = wdsprep.dataset(server.url_of("manifest.json"), "train", shuffle_shards=False, shuffle_buffer=150,
                                  equalize=None)
        if stage is not None:
            dataset = dataset.compose(stage)
        server.clear_log()
        samples = iter(dataset)
        got = [next(samples)["__key__"]]
        # the first block: samples 0-149 of the unshuffled order, shards 0 and 1 (100 samples each)
        assert _shards_asked(server) <= {"train-00000-00.tar", "train-00001-00.tar"}, _shards_asked(server)
        got.append(next(samples)["__key__"])
        wait_for(lambda: _shards_asked(server) == LARGE_SHARDS, "a request of every shard while the consumer holds "
                 "its second sample", limit=EVENT / 3)
        got += [sample["__key__"] for sample in samples]
    assert sorted(got) == sorted(model_global([100] * 6, 0, 0, False)) and len(got) == 600
    assert set(got[:2]) <= set(model_global([100] * 6, 0, 0, False)[:150])


def test_loader_workers_read_past_their_first_block_while_the_first_batch_is_held(large):
    """The same with 2 DataLoader workers: while the training loop holds its first batch (each worker
    has made a batch or two of its first block), every worker's later shards are asked for."""
    with RangeHTTPServer(large) as server:
        dataset = wdsprep.dataset(server.url_of("manifest.json"), "train", shuffle_shards=False, shuffle_buffer=150,
                                  equalize=None)
        server.clear_log()
        batches = iter(wdsprep.Loader(dataset, batch_size=4, num_workers=2))
        got = list(next(batches)["__key__"])
        # worker 0 reads shards 0-2, worker 1 shards 3-5; their first blocks: shards 0, 1 and 3, 4
        wait_for(lambda: _shards_asked(server) == LARGE_SHARDS, "a request of every shard while the first batch "
                 "is held", limit=EVENT / 3)
        got += [key for batch in batches for key in batch["__key__"]]
    assert sorted(got) == sorted(model_global([100] * 6, 0, 0, False))


@pytest.mark.parametrize("kind", ["http", "s3"])
def test_a_shard_longer_or_shorter_than_its_row_is_a_shard_error(uneven, tmp_path, s3_server, kind):
    """Read-ahead asks only for the bytes the row describes: the total size every response gives
    is what catches a shard that grew (or shrank) behind the manifest's back."""
    import shutil

    name = "train-00002-00.tar"
    data = (uneven / name).read_bytes()
    root = tmp_path / kind
    shutil.copytree(uneven, root)
    with _remote(kind, root, s3_server) as (base, _):
        for changed in (data + b"\0" * 512, data[:-512]):
            if kind == "http":
                (root / name).write_bytes(changed)
            else:
                bucket = base[len("s3://"):].split("/")[0]
                s3_server.client().put_object(Bucket=bucket, Key=f"d/{name}", Body=changed)
            with pytest.raises(ShardError, match=rf"{name}: shard is {len(changed)} bytes, manifest says {len(data)}"):
                list(wdsprep.dataset(f"{base}/manifest.json", "train", shuffle_shards=False, equalize=None))


def test_a_dropped_range_resumes_at_its_first_missing_byte_over_s3(uneven, s3_server):
    with s3_server.environment():
        bucket = s3_server.create_bucket(f"drops-{os.getpid()}")
        upload(str(uneven), f"s3://{bucket}/d")
        name = "train-00004-00.tar"
        s3_server.clear_log()
        s3_server.drop_get(bucket, f"d/{name}", 50_000)
        keys = [s["__key__"] for s in wdsprep.dataset(f"s3://{bucket}/d/manifest.json", "train", shuffle_shards=False,
                                                       equalize=None, prefetch_bytes=256 << 10, max_connections=2)]
    assert keys == model_global(COUNTS, 0, 0, False)
    gets = [r["range"] for r in s3_server.requests if r["method"] == "GET" and r["key"] == f"d/{name}"]
    first, last = map(int, gets[0][len("bytes="):].split("-"))  # the first GET of the shard was cut
    assert f"bytes={first + 50_000}-{last}" in gets[1:], gets
    assert len(gets) == len(set(gets)), gets  # nothing asked for twice


@pytest.mark.parametrize("way", ["sequential stream", "ranges smaller than a member"])
def test_every_corrupted_byte_class_is_a_shard_error_over_http_read_other_ways(corrupted, monkeypatch, way):
    """tests/core/test_integrity.py's oracle over HTTP again: without the read-ahead (one stream per
    piece, `prefetch_bytes=0`), and with requests so small that every member straddles two of them
    (the read-ahead's copying path instead of its in-place one)."""
    from wdsprep import readoptions

    if way == "sequential stream":
        monkeypatch.setenv("WDSPREP_PREFETCH_BYTES", "0")
    else:
        monkeypatch.setattr(readoptions, "MIN_RANGE", 256)
        monkeypatch.setenv("WDSPREP_PREFETCH_BYTES", "1024")
        monkeypatch.setenv("WDSPREP_MAX_CONNECTIONS", "2")
    root, cases = corrupted
    with RangeHTTPServer(root) as server:
        _check(cases, lambda variant: server.url_of(f"{variant}/manifest.json"))


def test_a_piece_that_cannot_be_read_fails_alone_when_the_reader_gets_there(uneven, tmp_path):
    """A missing shard and a corrupt member, with a handler that goes on: each is one ShardError,
    raised where the reader reaches it (every sample before it yielded), and the pieces after it
    (already being fetched) are read in full."""
    import shutil

    root = tmp_path / "damaged"
    shutil.copytree(uneven, root)
    (root / "train-00002-00.tar").unlink()
    starts, _ = _layout(root / "train-00004-00.tar")
    data = bytearray((root / "train-00004-00.tar").read_bytes())
    data[starts[10] + 512 + 700] ^= 0x01  # in sample 10's first member's data
    (root / "train-00004-00.tar").write_bytes(bytes(data))
    errors = []

    def handler(error):
        errors.append(str(error))
        return True

    with RangeHTTPServer(root) as server:
        keys = [s["__key__"] for s in wdsprep.dataset(f"{server.url}/manifest.json", "train", shuffle_shards=False,
                                                       equalize=None, handler=handler, prefetch_bytes=256 << 10,
                                                       max_connections=3)]
    expected = [k for k in model_global(COUNTS, 0, 0, False)
                if not k.startswith("s02") and not (k.startswith("s04") and int(k[4:]) >= 10)]
    assert keys == expected
    assert len(errors) == 2, errors
    assert "train-00002-00.tar: HTTP 404" in errors[0]
    assert "train-00004-00.tar" in errors[1] and "s04x10" in errors[1] and "corrupt" in errors[1]


class _Trickle:
    """A body that brings one byte per read, `pause` seconds apart (a server that never stalls long
    enough for a read timeout)."""

    def __init__(self, data: bytes, pause: float):
        self.data, self.pause = data, pause

    def readinto(self, view) -> int:
        time.sleep(self.pause)
        if not self.data:
            return 0
        view[0], self.data = self.data[0], self.data[1:]
        return 1

    readinto1 = readinto  # one read of the connection

    def close(self) -> None:
        pass


def test_a_range_that_trickles_is_cut_and_given_up_after_its_retries(monkeypatch):
    """The rate floor on a bounded read (storage/resuming.py, what every read-ahead request is):
    fewer than `min_rate` bytes/s over a window of waiting is a failed attempt, re-requested from the
    first missing byte, and more than `retries` slow windows in a row end the read with a
    ShardError naming the URL and the limit (progress does not reset them)."""
    from wdsprep.readoptions import ReadOptions
    from wdsprep.storage import resuming

    options = ReadOptions(rate_window=0.1, min_rate=1000.0, retries=2)
    monkeypatch.setattr(resuming, "MAX_DELAY", 0.01)
    data = bytes(range(200))
    asked = []

    def trickling(offset):
        asked.append(offset)
        return _Trickle(data[offset:], 0.02), len(data), None

    view = memoryview(bytearray(200))
    with pytest.raises(ShardError, match=r"http://x/y\.tar: stream failed at byte \d+: slower than 1000 bytes/s.*3 times in a row"):
        resuming.read_into("http://x/y.tar", trickling, 0, view, resuming.ObjectCheck(size=200), options)
    assert len(asked) == 3 and asked[0] == 0
    assert 0 < asked[1] <= asked[2] < 200  # resumed where it stopped

    def prompt(offset):  # the same bytes at once: read in one attempt
        asked.append(offset)
        return _Trickle(data[offset:], 0), len(data), None

    asked.clear()  # a window long enough that a busy machine's pause cannot make the prompt stream slow
    patient = ReadOptions(rate_window=30.0, min_rate=1000.0, retries=2)
    assert resuming.read_into("http://x/y.tar", prompt, 0, view, resuming.ObjectCheck(size=200), patient) == 200
    assert bytes(view) == data and asked == [0]
