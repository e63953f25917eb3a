"""Streaming shards from http:// and s3://: Range resume after a dropped connection, clear errors,
a floor on the rate a body arrives at, plain webdataset over s3://."""
import json
import threading
import time

import pytest
import webdataset as wds

import wdsprep
from tests.timeouts import EVENT, SUBPROCESS
from wdsprep.errors import ShardError
from wdsprep.readoptions import ReadOptions
from wdsprep.shards.tarformat import iter_samples
from wdsprep.storage import gopen, resuming
from wdsprep.storage.http import http_open_at
from wdsprep.stream import iter_shard
from wdsprep.upload import upload


def _rows(shard_dir, split="train"):
    return json.loads((shard_dir / "manifest.json").read_bytes())["splits"][split]["shards"]


def _local_samples(path):
    with open(path, "rb") as stream:
        return list(iter_samples(stream, str(path)))


def _same_samples(got, expected):
    assert [s["__key__"] for s in got] == [s["__key__"] for s in expected]
    for a, b in zip(got, expected):
        assert {k: bytes(v) for k, v in a.items() if not k.startswith("__")} == {
            k: bytes(v) for k, v in b.items() if not k.startswith("__")
        }


@pytest.mark.parametrize("where", ["header", "middle", "near_end"])
def test_http_dropped_connection_resumes_by_range(http_server, generic_shards, where):
    row = _rows(generic_shards)[0]
    name = row["name"]
    cut = {"header": 700, "middle": row["bytes"] // 2 + 77, "near_end": row["bytes"] - 3000}[where]
    http_server.drop_once(name, cut)
    got = list(iter_shard(http_server.url_of(name)))
    _same_samples(got, _local_samples(generic_shards / name))  # every sample once, bytes intact
    requests = http_server.requests_for(name)
    assert [r["range"] for r in requests] == [None, f"bytes={cut}-"]
    assert [r["status"] for r in requests] == [200, 206]


def test_http_several_drops_in_one_shard(http_server, generic_shards):
    name = _rows(generic_shards)[2]["name"]
    http_server.drop_once(name, 50_000, times=3)  # each re-request is cut again 50 KB later
    got = list(iter_shard(http_server.url_of(name)))
    _same_samples(got, _local_samples(generic_shards / name))
    assert [r["range"] for r in http_server.requests_for(name)] == [None, "bytes=50000-", "bytes=100000-", "bytes=150000-"]


def test_s3_dropped_connection_resumes_by_range(s3, bucket, generic_shards):
    url = f"s3://{bucket}/g"
    upload(str(generic_shards), url)
    name = _rows(generic_shards)[4]["name"]
    s3.clear_log()
    s3.drop_get(bucket, f"g/{name}", 123_457)
    got = list(iter_shard(f"{url}/{name}"))
    _same_samples(got, _local_samples(generic_shards / name))
    gets = [r for r in s3.requests if r["method"] == "GET" and r["key"] == f"g/{name}"]
    assert [r["range"] for r in gets] == [None, "bytes=123457-"]


def test_dataset_over_http_with_drops_yields_each_sample_once(http_server, generic_shards):
    rows = _rows(generic_shards)
    for row in rows[::2]:
        http_server.drop_once(row["name"], row["bytes"] // 3)
    keys = [s["__key__"] for s in wdsprep.dataset(f"{http_server.url}/manifest.json", "train", equalize=None)]
    assert sorted(keys) == [f"sample{i:06d}" for i in range(100)]
    cut = [r for r in http_server.requests if r["cut"]]
    assert sorted(r["name"] for r in cut) == sorted(row["name"] for row in rows[::2])
    for r in cut:  # each cut answered by one request for the rest of its range, from the first byte missing
        first, last = map(int, r["range"][len("bytes="):].split("-"))
        rest = [q for q in http_server.requests_for(r["name"]) if q["range"] == f"bytes={first + r['sent']}-{last}"]
        assert len(rest) == 1, (r, http_server.requests_for(r["name"]))
    for row in rows:  # every byte of every shard came over the wire once, the cut ones included
        assert sum(q["sent"] for q in http_server.requests_for(row["name"])) == row["bytes"], row["name"]


def test_transient_errors_are_retried(http_server, generic_shards):
    name = _rows(generic_shards)[1]["name"]
    http_server.fail_next(name, 503, times=2)
    got = list(iter_shard(http_server.url_of(name)))
    _same_samples(got, _local_samples(generic_shards / name))


def test_missing_shard_fails_at_once_naming_the_url(http_server, s3, bucket):
    url = http_server.url_of("train-99999-00.tar")
    with pytest.raises(ShardError, match=f"{url}: HTTP 404"):
        list(iter_shard(url))
    assert len(http_server.requests_for("train-99999-00.tar")) == 1  # no retries on a permanent error
    with pytest.raises(ShardError, match=f"s3://{bucket}/nope.tar: no such object"):
        list(iter_shard(f"s3://{bucket}/nope.tar"))
    with pytest.raises(ShardError, match="s3://no-such-bucket-x/a.tar: no such bucket"):
        list(iter_shard("s3://no-such-bucket-x/a.tar"))


def test_unreachable_server_gives_up_with_bounded_retries():
    import socket

    with socket.socket() as probe:  # a free port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/x.tar"
    stream = None
    with pytest.raises(ShardError, match=f"{url}: giving up after 3 attempts"):
        stream = resuming.ResumingStream(url, http_open_at(url), ReadOptions(retries=2))
    assert stream is None


def test_plain_webdataset_reads_s3_and_http(s3, bucket, generic_shards, http_server):
    gopen.register_webdataset_schemes()
    url = f"s3://{bucket}/plain"
    upload(str(generic_shards), url)
    expected = sorted(f"sample{i:06d}" for i in range(100))
    for base in (url, http_server.url):
        urls = wdsprep.urls(f"{base}/manifest.json", "train")
        samples = list(wds.WebDataset(urls, shardshuffle=False).decode())
        assert sorted(s["__key__"] for s in samples) == expected
        assert samples[0]["array.npy.zst"] is not None


def test_import_wdsprep_registers_s3_with_webdataset():
    import subprocess
    import sys

    # `import webdataset.gopen as g` would bind the gopen *function*, which shadows the module;
    # `import wdsprep` does not import webdataset (torch) itself: it registers when webdataset loads
    for imports in ("import wdsprep, webdataset", "import webdataset, wdsprep"):
        code = f"import sys; {imports}; print('s3' in sys.modules['webdataset.gopen'].gopen_schemes)"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=SUBPROCESS)
        assert out.stdout.strip() == "True", (imports, out.stderr)
    light = "import sys, wdsprep; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", light], capture_output=True, text=True, timeout=SUBPROCESS)
    assert out.stdout.strip() == "False", out.stderr


def test_skipping_large_members_inside_a_remote_shard_uses_range(tmp_path, s3, bucket):
    """Resuming inside a shard (or a worker starting mid-shard) skips samples: large members are not
    transferred, small ones are read through; the samples after the skip are the same either way."""
    import numpy as np

    from wdsprep.conversion import convert
    from wdsprep.testing import RangeHTTPServer

    rng = np.random.default_rng(0)
    (tmp_path / "in" / "train").mkdir(parents=True)
    for i in range(6):
        np.save(tmp_path / "in" / "train" / f"big{i:02d}.array.npy", rng.standard_normal(400_000).astype(np.float32))
    manifest = convert("generic", str(tmp_path / "in"), str(tmp_path / "out"), shard_bytes="100MB", codec="none")
    (row,) = manifest.splits["train"]
    local = _local_samples(tmp_path / "out" / row["name"])
    with RangeHTTPServer(tmp_path / "out") as server:
        url = server.url_of(row["name"])
        got = list(iter_shard(url, skip=4))
        _same_samples(got, local[4:])
        ranges = [r["range"] for r in server.requests_for(row["name"])]
        assert ranges[0] is None and len(ranges) >= 4  # one Range request per skipped 1.6 MB member
        assert all(r.startswith("bytes=") for r in ranges[1:])
        # each request started where the previous member ended: nothing skipped was transferred whole
        starts = [int(r[6:-1]) for r in ranges[1:]]
        assert starts == sorted(starts) and starts[-1] < row["bytes"]
    upload(str(tmp_path / "out"), f"s3://{bucket}/big")
    s3.clear_log()
    _same_samples(list(iter_shard(f"s3://{bucket}/big/{row['name']}", skip=5)), local[5:])
    gets = [r for r in s3.requests if r["method"] == "GET" and r["key"].endswith(row["name"])]
    assert len(gets) >= 5 and all(r["range"] for r in gets[1:])


def test_a_server_that_never_answers_is_given_up_after_its_retries(monkeypatch):
    import socket

    monkeypatch.setenv("WDSPREP_TIMEOUT", "0.3")  # read when the request is made
    with socket.socket() as silent:  # accepts connections (backlog) and never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/x.tar"
        with pytest.raises(ShardError, match=f"{url}: giving up after 2 attempts"):
            resuming.ResumingStream(url, http_open_at(url), ReadOptions(retries=1))


def _read_in_thread(make):
    """`list(make())` in a thread: (result or raised exception), or a failed test when it has not
    ended after EVENT seconds (a read that never ends must fail, not hang the session)."""
    outcome = []

    def run():
        try:
            outcome.append(list(make()))
        except Exception as error:  # noqa: BLE001 -- handed to the test
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(EVENT)
    assert outcome, f"the read had not ended after {EVENT:.0f} s"
    return outcome[0]


@pytest.mark.parametrize("scheme", ["http", "s3"])
def test_a_server_that_trickles_bytes_ends_in_one_error(monkeypatch, http_server, s3, bucket, generic_shards, scheme):
    """A body that never stops arriving but comes at 100 bytes/s: each window of waiting below the
    floor re-requests the rest (like a dropped connection), and after `retries` such windows in a
    row the read fails with one error naming the URL and the rate (the per-read timeout alone
    never fires: a byte comes every 0.1 s)."""
    monkeypatch.setenv("WDSPREP_MIN_RATE", "2000")
    monkeypatch.setenv("WDSPREP_RATE_WINDOW", "0.5")
    name = _rows(generic_shards)[1]["name"]
    if scheme == "http":
        manifest, url = http_server.url_of("manifest.json"), http_server.url_of(name)
        http_server.trickle(name, 100)
    else:
        upload(str(generic_shards), f"s3://{bucket}/g")
        manifest, url = f"s3://{bucket}/g/manifest.json", f"s3://{bucket}/g/{name}"
        s3.trickle_gets(bucket, f"g/{name}", 100)
        s3.clear_log()
    outcome = _read_in_thread(lambda: wdsprep.dataset(manifest, "train", shuffle_shards=False, equalize=None))
    assert isinstance(outcome, ShardError), outcome
    message = str(outcome)
    assert message.startswith(f"{url}: stream failed at byte ") and "slower than 2000 bytes/s" in message, message
    assert "6 times in a row" in message  # the default 5 retries, then the error
    if scheme == "http":
        ranges = [r["range"] for r in http_server.requests_for(name)]
    else:
        ranges = [r["range"] for r in s3.requests if r["method"] == "GET" and r["key"] == f"g/{name}"]
    ranges = [r for r in ranges if r is not None]  # (the shard's own stream is opened, unread, first)
    assert len(ranges) == 6 and all(r.startswith("bytes=") for r in ranges)  # the index's read, re-requested 5 times
    starts = [int(r[6:].split("-")[0]) for r in ranges]
    assert starts == sorted(starts)  # each re-request goes on from the bytes already received


@pytest.mark.parametrize("prefetch_bytes", [0, None], ids=["sequential", "read-ahead"])
def test_a_consumer_that_pauses_between_samples_is_not_a_slow_stream(monkeypatch, http_server, generic_shards,
                                                                     prefetch_bytes):
    """Only time spent waiting for the body counts: a training step between samples does not (on
    the sequential stream, whose body waits while the consumer pauses, and with the read-ahead)."""
    monkeypatch.setenv("WDSPREP_MIN_RATE", "1e6")
    monkeypatch.setenv("WDSPREP_RATE_WINDOW", "0.2")
    rows = _rows(generic_shards)[:3]

    def slowly():
        for sample in wdsprep.dataset(http_server.url_of("manifest.json"), "train", shuffle_shards=False, equalize=None,
                                      prefetch_bytes=prefetch_bytes):
            if sample["__url__"].endswith(rows[2]["name"]):
                return
            time.sleep(0.05)  # 24 samples: 1.2 s of pauses against a 0.2 s window
            yield sample

    got = _read_in_thread(slowly)
    assert not isinstance(got, Exception), got
    expected = _local_samples(generic_shards / rows[0]["name"]) + _local_samples(generic_shards / rows[1]["name"])
    _same_samples(got, expected)
    for row in rows[:2]:  # nothing re-requested
        requests = http_server.requests_for(row["name"])
        if prefetch_bytes == 0:  # one request for the index, one for the samples
            assert len(requests) == 2, requests
        else:  # the shard's own bytes, each asked for once
            assert sum(r["sent"] for r in requests) == row["bytes"] and not any(r["cut"] for r in requests), requests


class _ForwardProxy:
    """A forward HTTP proxy on 127.0.0.1 (absolute-form GETs relayed by http.client, never through a
    proxy itself), noting each URL it was asked for."""

    def __init__(self):
        import http.client
        import http.server
        from urllib.parse import urlsplit

        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                seen.append(self.path)
                parts = urlsplit(self.path)
                upstream = http.client.HTTPConnection(parts.netloc, timeout=EVENT)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "proxy-connection")}
                upstream.request("GET", parts.path, headers=headers)
                response = upstream.getresponse()
                body = response.read()
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                upstream.close()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_http_reads_go_through_the_environments_proxy_unless_no_proxy_names_the_host(monkeypatch, http_server,
                                                                                      generic_shards):
    """HTTP_PROXY is honoured (the bytes come through the proxy, the same bytes) and NO_PROXY bypasses it."""
    shard = sorted(generic_shards.rglob("*.tar"))[0]
    url = f"{http_server.url}/{shard.relative_to(generic_shards).as_posix()}"
    expected = shard.read_bytes()
    proxy = _ForwardProxy()
    try:
        for variable in ("HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.delenv(variable, raising=False)
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        got = resuming.ResumingStream(url, http_open_at(url), ReadOptions(retries=0)).read()
        assert got == expected
        assert proxy.seen == [url]
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        got = resuming.ResumingStream(url, http_open_at(url), ReadOptions(retries=0)).read()
        assert got == expected
        assert proxy.seen == [url]  # the bypassed read did not reach it
    finally:
        proxy.close()


def test_a_body_closed_before_its_end_closes_its_connection(generic_shards):
    """A piece that ends mid-shard stops reading its body: the connection is closed then (the server
    sees it go), not handed back to the pool with the rest of the body still on it."""
    from tests.timeouts import wait_for
    from wdsprep.testing import RangeHTTPServer

    shard = sorted(generic_shards.rglob("*.tar"))[0]
    with RangeHTTPServer(generic_shards) as server:  # a host of its own: no pooled connection to it yet
        url = f"{server.url}/{shard.relative_to(generic_shards).as_posix()}"
        body, total, _ = http_open_at(url)(0)
        assert total == shard.stat().st_size > 1024
        assert body.readinto(bytearray(1024)) > 0
        assert server.open_connections == 1
        body.close()
        wait_for(lambda: server.open_connections == 0, "the server to see the connection closed")
