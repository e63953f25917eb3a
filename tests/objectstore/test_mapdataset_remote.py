"""`wdsprep.MapDataset` over HTTP and S3: every source's samples against `tarfile` (the reference of
tests/core/mapsources.py), a flipped byte, and what the server saw: one Range request per contiguous
run of a batch within a shard, requests of different shards at once, one index request per shard,
none at all once the shard cache holds the shards; the read side's settings taken as
`wdsprep.dataset` takes them (`read_options=`, keywords, the environment). Requests and connections
are counted by the RangeHTTPServer (in front of the S3 test server for s3://); byte spans come from
`tarfile`."""
import collections
import hashlib
import pathlib
import shutil
import tarfile
import threading

import pytest
from torch.utils.data import DataLoader, DistributedSampler

import wdsprep
from tests.core.mapsources import SOURCES, convert_source, same_raw, tar_reference
from tests.objectstore.test_read_ahead import _layout, _remote
from wdsprep.errors import ShardError
from wdsprep.testing import RangeHTTPServer
from wdsprep.testing.httpserver import Shaping

KINDS = ["http", "s3"]


@pytest.fixture(scope="module", params=sorted(SOURCES))
def converted(request, tmp_path_factory):
    out, split = convert_source(request.param, tmp_path_factory.mktemp(request.param))
    return out, split, tar_reference(out, split)


@pytest.fixture(scope="module")
def generic(tmp_path_factory):
    out, split = convert_source("generic", tmp_path_factory.mktemp("generic"))
    return out, split, tar_reference(out, split)


def _spans(path: pathlib.Path) -> tuple[list[tuple[int, int]], int]:
    """([first header, end) of each sample of the shard, the index member's header offset), by `tarfile`."""
    starts, index_at = _layout(path)
    return list(zip(starts, starts[1:] + [index_at])), index_at


def _asked(requests: list[dict]) -> list[tuple[str, int, int]]:
    """(shard name, first byte, end) of every GET of a shard, in the order the server got them."""
    out = []
    for r in requests:
        name = r["name"].rsplit("/", 1)[-1]
        if r["method"] == "GET" and name.endswith(".tar"):
            first, last = r["range"][len("bytes="):].split("-") if r["range"] else (0, -1)
            out.append((name, int(first), int(last) + 1))
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_every_position_over_http_and_s3(converted, s3_server, kind):
    out, split, reference = converted
    with _remote(kind, out, s3_server) as (base, _):
        ds = wdsprep.MapDataset(f"{base}/manifest.json", split, decode=False)
        assert len(ds) == len(reference)
        for i, expected in enumerate(reference):
            same_raw(ds[i], expected)
        batch = list(range(len(reference)))[::-1]
        for sample, i in zip(ds.__getitems__(batch), batch):
            same_raw(sample, reference[i])


@pytest.mark.parametrize("kind", KINDS)
def test_a_flipped_byte_fails_that_sample_only_over_http_and_s3(generic, tmp_path, s3_server, kind):
    """Sample k's member flipped: k fails naming the shard and the member; k - 1 and k + 1 read,
    alone and in one batch, where the request that brings them both brings k's bytes too (the gap)."""
    out, split, reference = generic
    root = tmp_path / "shards"
    shutil.copytree(out, root)
    k = next(i for i in range(20, len(reference) - 1)
             if reference[i - 1]["__shard__"] == reference[i]["__shard__"] == reference[i + 1]["__shard__"])
    name, key = reference[k]["__shard__"], reference[k]["__key__"]
    with tarfile.open(root / name) as archive:
        info = archive.getmember(f"{key}.array.npy.zst")
    data = bytearray((root / name).read_bytes())
    data[info.offset_data + 100] ^= 0x01
    with _remote(kind, root, s3_server) as (base, server):  # uploaded intact (upload checks), then changed
        if kind == "http":
            (root / name).write_bytes(bytes(data))
        else:
            s3_server.client().put_object(Bucket=base[len("s3://"):].split("/")[0], Key=f"d/{name}", Body=bytes(data))
        ds = wdsprep.MapDataset(f"{base}/manifest.json", split, decode=False)
        with pytest.raises(ShardError, match=rf"{name}: member {key}\.array\.npy\.zst: corrupt"):
            ds[k]
        server.clear_log()
        got = ds.__getitems__([k + 1, k - 1])
        same_raw(got[0], reference[k + 1])
        same_raw(got[1], reference[k - 1])
        spans, _ = _spans(root / name)
        first = k - reference.index(next(s for s in reference if s["__shard__"] == name))
        assert _asked(server.requests) == [(name, spans[first - 1][0], spans[first + 1][1])]  # one request, k inside
        with pytest.raises(ShardError, match=rf"member {key}\.array"):
            ds.__getitems__([k - 1, k, k + 1])


@pytest.mark.parametrize("kind", KINDS)
def test_a_batch_in_one_shard_is_one_request_per_contiguous_run(generic, s3_server, kind):
    """gap_bytes=0: samples a, a+1 and a+3, a+4 of one shard (asked in any order) are two requests,
    for exactly their bytes; the shard's index one request, at first use only. With the default gap
    (256 KiB, samples of ~17 KB) the same batch is one request, sample a+2's bytes read and dropped."""
    out, split, reference = generic
    shard = next(name for name, count in collections.Counter(s["__shard__"] for s in reference).items() if count >= 5)
    a = next(i for i, s in enumerate(reference) if s["__shard__"] == shard)
    spans, index_at = _spans(out / shard)
    size = (out / shard).stat().st_size
    batch = [a + 4, a, a + 3, a + 1]
    with _remote(kind, out, s3_server) as (base, server):
        ds = wdsprep.MapDataset(f"{base}/manifest.json", split, decode=False, gap_bytes=0)
        server.clear_log()
        for sample, i in zip(ds.__getitems__(batch), batch):
            same_raw(sample, reference[i])
        asked = _asked(server.requests)
        assert asked[0] == (shard, index_at, size)  # the index first, alone
        assert sorted(asked[1:]) == [(shard, spans[0][0], spans[1][1]), (shard, spans[3][0], spans[4][1])]
        assert ds.stats["requests"] == 2 and ds.stats["index_requests"] == 1  # what benchmarks read

        server.clear_log()
        for sample, i in zip(ds.__getitems__(batch), batch):
            same_raw(sample, reference[i])
        assert sorted(_asked(server.requests)) == sorted(asked[1:])  # the index is kept

        coalesced = wdsprep.MapDataset(f"{base}/manifest.json", split, decode=False)
        coalesced.access.index(coalesced.locate(a)[0])  # read beforehand: only the batch is counted
        server.clear_log()
        for sample, i in zip(coalesced.__getitems__(batch), batch):
            same_raw(sample, reference[i])
        assert _asked(server.requests) == [(shard, spans[0][0], spans[4][1])]


@pytest.mark.parametrize("kind", KINDS)
def test_requests_of_different_shards_go_at_once(generic, s3_server, kind):
    """One sample from each of 4 shards, each response 50 ms late: 4 requests, on 4 connections at
    once (one after another, keep-alive would have used one)."""
    out, split, reference = generic
    firsts = {}
    for i, sample in enumerate(reference):
        firsts.setdefault(sample["__shard__"], i)
    batch = list(firsts.values())[:4]
    with _remote(kind, out, s3_server, Shaping(latency=0.05)) as (base, server):
        ds = wdsprep.MapDataset(f"{base}/manifest.json", split, decode=False, max_connections=4)
        ds.access.indexes([ds.locate(i)[0] for i in batch])
        server.clear_log()
        for sample, i in zip(ds.__getitems__(batch), batch):
            same_raw(sample, reference[i])
        stats = server.stats()
        assert len(_asked(server.requests)) == 4
        assert stats["peak_connections"] >= 4, stats


@pytest.mark.parametrize("kind", KINDS)
def test_a_batch_of_many_shards_keeps_to_max_connections_on_the_read_aheads_threads(generic, s3_server, kind):
    """One sample from each of 6 shards with max_connections=2, each response 50 ms late: 6 requests,
    never more than 2 answered at once but 2 at once, and sent by the read-ahead's fetching threads
    (`readahead.Requests`), not by the caller or a pool of random access's own."""
    out, split, reference = generic
    firsts = {}
    for i, sample in enumerate(reference):
        firsts.setdefault(sample["__shard__"], i)
    batch = list(firsts.values())[:6]
    assert len(batch) == 6
    with _remote(kind, out, s3_server, Shaping(latency=0.05)) as (base, server):
        ds = wdsprep.MapDataset(f"{base}/manifest.json", split, decode=False, max_connections=2)
        ds.access.indexes([ds.locate(i)[0] for i in batch])
        server.clear_log()
        senders = set()
        fetch = ds.access._fetch

        def fetch_and_note(*arguments):
            senders.add(threading.current_thread().name.rsplit("-", 1)[0])
            return fetch(*arguments)

        ds.access._fetch = fetch_and_note
        for sample, i in zip(ds.__getitems__(batch), batch):
            same_raw(sample, reference[i])
        stats = server.stats()
        assert len(_asked(server.requests)) == 6
        assert stats["peak_requests"] == 2, stats
        assert senders == {"wdsprep-access"}


@pytest.mark.parametrize("kind", KINDS)
def test_the_cache_serves_every_pass_after_the_first(generic, tmp_path, s3_server, kind):
    """cache_dir: the first pass downloads each shard it touches once, whole (no index request); a
    new dataset on the same cache, and DataLoader workers, make no request at all."""
    out, split, reference = generic
    cache = tmp_path / "cache"
    with _remote(kind, out, s3_server) as (base, server):
        server.clear_log()
        ds = wdsprep.MapDataset(f"{base}/manifest.json", split, decode=False, cache_dir=cache)
        for start in range(0, len(reference), 16):
            for sample, i in zip(ds.__getitems__(list(range(start, start + 16))[: len(reference) - start]),
                                 range(start, len(reference))):
                same_raw(sample, reference[i])
        asked = _asked(server.requests)
        shards = sorted({sample["__shard__"] for sample in reference})
        assert sorted(name for name, _, _ in asked) == shards  # once each
        assert all(first == 0 for _, first, _ in asked)
        assert ds.stats["downloads"] == len(shards) and ds.stats["requests"] == ds.stats["index_requests"] == 0

        server.clear_log()
        again = wdsprep.MapDataset(f"{base}/manifest.json", split, decode=False, cache_dir=cache)
        for i in (0, 77, len(reference) - 1):
            same_raw(again[i], reference[i])
        loader = DataLoader(again, batch_size=10, num_workers=2, collate_fn=lambda batch: len(batch))
        assert sum(loader) == len(reference)
        assert _asked(server.requests) == []


def test_a_damaged_cache_entry_is_named_dropped_and_downloaded_again(generic, tmp_path, s3_server):
    """A cached shard whose member was altered on disk (same size) was reported under the server's
    URL and never downloaded again. Now the read that meets it drops it with one warning line naming
    the cached file, downloads the shard again (one request) and returns the reference's samples; the
    new entry is the server's bytes. A shard altered on the server still fails, naming its URL."""
    from tests.objectstore.test_objectstore_cache import _flip_member

    out, split, reference = generic
    cache = tmp_path / "cache"
    with _remote("http", out, s3_server) as (base, server):
        ds = wdsprep.MapDataset(f"{base}/manifest.json", split, decode=False, cache_dir=cache)
        for i, expected in enumerate(reference):
            same_raw(ds[i], expected)
        k = next(i for i in range(1, len(reference) - 1)
                 if reference[i - 1]["__shard__"] == reference[i]["__shard__"] == reference[i + 1]["__shard__"])
        shard = reference[k]["__shard__"]
        entry = cache / f"{hashlib.sha256((out / shard).read_bytes()).hexdigest()}.tar"  # named by its content
        _flip_member(entry, reference[k]["__key__"])
        server.clear_log()
        again = wdsprep.MapDataset(f"{base}/manifest.json", split, decode=False, cache_dir=cache)
        same_raw(again[k - 1], reference[k - 1])  # its index and this sample check out: read from the entry
        assert _asked(server.requests) == []
        with pytest.warns(UserWarning) as warned:
            for sample, i in zip(again.__getitems__([k - 1, k, k + 1]), (k - 1, k, k + 1)):
                same_raw(sample, reference[i])
        url = f"{base}/{shard}"
        assert [str(w.message) for w in warned] == [
            f"{entry}: cached copy of {url} failed its check (member {reference[k]['__key__']}.array.npy.zst: corrupt "
            f"(its header, data or padding differ from the shard's index)); dropped it, reading the shard from {url} again"]
        assert [(name, first) for name, first, _ in _asked(server.requests)] == [(shard, 0)]  # downloaded whole, once
        assert entry.read_bytes() == (out / shard).read_bytes()
        for i in (k - 1, k, k + 1):
            same_raw(again[i], reference[i])
        assert len(_asked(server.requests)) == 1

        served = next(i for i, sample in enumerate(reference) if sample["__shard__"] != shard)  # not cached yet here
        _flip_member(out / reference[served]["__shard__"], reference[served]["__key__"])
        try:
            fresh = wdsprep.MapDataset(f"{base}/manifest.json", split, decode=False, cache_dir=tmp_path / "other")
            with pytest.raises(ShardError, match=rf"^{base}/{reference[served]['__shard__']}: sha256 differs"):
                fresh[served]
        finally:
            _flip_member(out / reference[served]["__shard__"], reference[served]["__key__"])  # flipped back


def test_distributed_sampler_and_workers_over_http(generic, s3_server):
    out, split, reference = generic
    with _remote("http", out, s3_server) as (base, _):
        ds = wdsprep.MapDataset(f"{base}/manifest.json", split, decode=False)
        ds[0]  # a client, a thread pool and an index in this process: the workers make their own
        seen = []
        for rank in (0, 1):
            sampler = DistributedSampler(ds, num_replicas=2, rank=rank, seed=1)
            loader = DataLoader(ds, batch_size=8, sampler=sampler, num_workers=2,
                                collate_fn=lambda batch: [s["__key__"] for s in batch])
            seen += [key for batch in loader for key in batch]
        assert collections.Counter(seen) == collections.Counter(s["__key__"] for s in reference)


# ------------------------------------------------------- the read side's settings, as wdsprep.dataset takes them
def _batch_of_one_shard(out, reference):
    """(shard, a batch of positions a+4, a, a+3, a+1 in it, the byte spans `tarfile` gives its samples)."""
    shard = next(name for name, count in collections.Counter(s["__shard__"] for s in reference).items() if count >= 5)
    a = next(i for i, s in enumerate(reference) if s["__shard__"] == shard)
    return shard, [a + 4, a, a + 3, a + 1], _spans(out / shard)[0]


def test_read_options_and_keywords_set_what_a_batch_costs(generic):
    """`read_options=ReadOptions(gap_bytes=0)`: two requests for the two runs of the batch, as the
    keyword `gap_bytes=0` gives; a keyword overrides the options given (1 MiB: one request)."""
    out, split, reference = generic
    shard, batch, spans = _batch_of_one_shard(out, reference)
    two_runs = [(shard, spans[0][0], spans[1][1]), (shard, spans[3][0], spans[4][1])]
    made = {
        "read_options": dict(read_options=wdsprep.ReadOptions(gap_bytes=0)),
        "keyword over read_options": dict(read_options=wdsprep.ReadOptions(gap_bytes=1 << 20), gap_bytes=0),
        "keyword over the default": dict(gap_bytes="1MiB"),
    }
    expected = {"read_options": two_runs, "keyword over read_options": two_runs,
                "keyword over the default": [(shard, spans[0][0], spans[4][1])]}
    with RangeHTTPServer(out) as server:
        for case, keywords in made.items():
            ds = wdsprep.MapDataset(server.url_of("manifest.json"), split, decode=False, **keywords)
            ds.access.index(ds.locate(batch[0])[0])  # read beforehand: only the batch is counted
            server.clear_log()
            for sample, i in zip(ds.__getitems__(batch), batch):
                same_raw(sample, reference[i])
            assert sorted(_asked(server.requests)) == expected[case], case


def test_read_options_retries_override_the_environment(generic, monkeypatch):
    """WDSPREP_RETRIES=0 and a shard that answers 503 twice, at its index and again at its samples:
    the environment alone gives up at the first answer (one request); `read_options=ReadOptions(
    retries=2)` or `retries=2` reads both through the third attempt (counted by the server)."""
    out, split, reference = generic
    shard = reference[0]["__shard__"]
    monkeypatch.setenv("WDSPREP_RETRIES", "0")
    with RangeHTTPServer(out) as server:
        url = server.url_of("manifest.json")
        for keywords in (dict(read_options=wdsprep.ReadOptions(retries=2)), dict(retries=2)):
            ds = wdsprep.MapDataset(url, split, decode=False, **keywords)
            server.clear_log()
            server.fail_next(shard, 503, times=2)
            ds.access.index(0)
            server.fail_next(shard, 503, times=2)
            same_raw(ds[0], reference[0])
            assert len(server.requests_for(shard)) == 6, keywords  # (2 refused + 1) for the index, and for the sample
        ds = wdsprep.MapDataset(url, split, decode=False)
        server.clear_log()
        server.fail_next(shard, 503, times=1)
        with pytest.raises(ShardError, match=shard):
            ds[0]
        assert len(server.requests_for(shard)) == 1


def test_cache_bytes_takes_a_size_and_bounds_the_cache(generic, tmp_path):
    """`cache_bytes="10GB"`: the shard is downloaded whole into the cache once; `cache_bytes="1KB"`
    (given in `read_options`) is smaller than any shard, which is then read remotely, never cached."""
    out, split, reference = generic
    with RangeHTTPServer(out) as server:
        url = server.url_of("manifest.json")
        roomy = wdsprep.MapDataset(url, split, decode=False, cache_dir=tmp_path / "a", cache_bytes="10GB")
        same_raw(roomy[0], reference[0])
        assert roomy.stats["downloads"] == 1 and roomy.stats["requests"] == 0
        tiny = wdsprep.MapDataset(url, split, decode=False,
                                  read_options=wdsprep.ReadOptions(cache_dir=str(tmp_path / "b"), cache_bytes="1KB"))
        same_raw(tiny[0], reference[0])
        assert tiny.stats["downloads"] == 0 and tiny.stats["requests"] == 1
        assert not [p for p in (tmp_path / "b").rglob("*.tar")]


@pytest.mark.parametrize("keywords, environment, message", [
    (dict(cache_bytes="banana"), {}, "cache_bytes='banana': must be a size >= 1 bytes and at most 1PiB, e.g. 64MiB ("),
    (dict(gap_bytes=-1), {}, "gap_bytes=-1: must be a size >= 0 bytes and at most 64GiB, e.g. 64MiB ("),
    (dict(max_connections=0), {}, "max_connections=0: must be a whole number >= 1 ("),
    (dict(timeout="soon"), {}, "timeout='soon': must be a number > 0 and <= 3600 ("),
    (dict(read_options="fast"), {}, "read_options='fast': must be a wdsprep.ReadOptions"),
    ({}, {"WDSPREP_MAX_CONNECTIONS": "0"}, "WDSPREP_MAX_CONNECTIONS='0': must be a whole number >= 1 ("),
], ids=["cache_bytes", "gap_bytes", "max_connections", "timeout", "read_options", "environment"])
def test_a_bad_setting_is_one_config_error_line_before_anything_is_read(generic, monkeypatch, keywords, environment,
                                                                        message):
    out, split, _ = generic
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    with RangeHTTPServer(out) as server:
        with pytest.raises(wdsprep.ConfigError) as raised:
            wdsprep.MapDataset(server.url_of("manifest.json"), split, **keywords)
        assert server.requests == []
    assert "\n" not in str(raised.value) and str(raised.value).startswith(message), str(raised.value)


def test_an_unknown_keyword_is_a_type_error_naming_it(generic):
    out, split, _ = generic
    with pytest.raises(TypeError, match="unexpected keyword argument 'gap_byte'"):
        wdsprep.MapDataset(out, split, gap_byte=0)
