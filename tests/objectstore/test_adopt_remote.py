"""`wdsprep index` of WebDataset tars on an HTTP server (a brace pattern of URLs) and in S3 (the moto
test server): indexed and streamed equal to the same tars indexed locally and to plain webdataset;
`MapDataset[i]` reads one sample by one bounded Range request (the server's log); a shard replaced
on the server is refused by its ETag; a URL that 404s is one line and nothing is written. Then the
plan and resume oracles (tests/core/test_plan_oracle.py) on webdataset-written shards served over
HTTP and S3, adopted by URL, read through the read-ahead with a tiny budget."""
import json
import os
import pathlib
import tarfile
import time

import pytest

import wdsprep
from tests.core import test_plan_oracle as oracle
from tests.core.adoptdata import counted_webdataset_shards, plain_samples, shardwriter_shards, wdsprep_samples
from tests.objectstore.test_remote_oracles import _tiny_read_ahead  # noqa: F401 (its tiny read-ahead, module-wide)
from wdsprep.adopt import adopt
from wdsprep.conformance import run_cli
from wdsprep.errors import ShardError
from wdsprep.testing import RangeHTTPServer


def _put(s3_server, bucket: str, folder: pathlib.Path, prefix: str) -> None:
    client = s3_server.client()
    for path in sorted(folder.glob("*.tar")):
        client.put_object(Bucket=bucket, Key=f"{prefix}/{path.name}", Body=path.read_bytes())


@pytest.fixture
def shards(tmp_path):
    folder = tmp_path / "shards"
    tars = shardwriter_shards(folder, count=23, maxcount=5)
    run_cli("index", folder, "--out", tmp_path / "local", "--quiet")
    return folder, tars


def _rows(out):
    return [{k: v for k, v in row.items() if k in ("samples", "bytes", "sha256", "data_end", "index_digest")}
            for row in json.loads((pathlib.Path(out) / "manifest.json").read_text())["splits"]["train"]["shards"]]


def test_a_brace_pattern_of_http_urls_is_indexed_and_streamed_as_the_local_tars(shards, tmp_path):
    folder, tars = shards
    with RangeHTTPServer(folder) as server:
        pattern = f"{server.url}/shard-{{000000..{len(tars) - 1:06d}}}.tar"
        server.clear_log()
        status, _, err = run_cli("index", pattern, "--out", tmp_path / "out", "--quiet")
        assert status == 0, err
        gets = [r for r in server.requests if r["method"] == "GET"]
        assert len(gets) == len(tars) and not any(r["range"] for r in gets)  # one streaming request per shard
        assert _rows(tmp_path / "out") == _rows(tmp_path / "local")
        urls = wdsprep.urls(str(tmp_path / "out"), "train")
        assert urls == [f"{server.url}/{pathlib.Path(tar).name}" for tar in tars]
        expected = plain_samples(tars)
        got = wdsprep_samples(wdsprep.dataset(str(tmp_path / "out"), "train", shuffle_shards=False, shuffle_buffer=0))
        assert got == expected
        assert wdsprep_samples(wdsprep.dataset(str(tmp_path / "out"), "train", shuffle_shards=False, shuffle_buffer=0,
                                               prefetch_bytes=0)) == expected

        mapped = wdsprep.MapDataset(str(tmp_path / "out"), "train", decode=False)
        server.clear_log()
        position = 13
        sample = mapped[position]
        assert (sample["__key__"], {k: bytes(v) for k, v in sample.items() if not k.startswith("__")}) == expected[position]
        asked = [r for r in server.requests if r["method"] == "GET"]
        assert len(asked) == 1 and asked[0]["range"], asked  # one bounded Range request: the index is in OUT
        first, last = map(int, asked[0]["range"][len("bytes="):].split("-"))
        with tarfile.open(tars[position // 5]) as archive:  # the sample's members, by tarfile
            members = [info for info in archive if info.isreg() and info.name.startswith(expected[position][0] + ".")]
        assert first <= min(info.offset for info in members) and last < max(info.offset_data + info.size for info in members) + 512


def test_a_shard_replaced_on_the_server_is_refused_by_its_etag(shards, tmp_path):
    folder, tars = shards
    with RangeHTTPServer(folder) as server:
        status, _, err = run_cli("index", f"{server.url}/shard-{{000000..000004}}.tar", "--out", tmp_path / "out", "--quiet")
        assert status == 0, err
        victim = pathlib.Path(tars[2])
        data = victim.read_bytes()
        time.sleep(0.01)
        victim.write_bytes(data)  # the same bytes, a new mtime: the server's ETag changes
        for prefetch in (None, 0):  # the read-ahead's Range requests, and one sequential stream a piece
            with pytest.raises(ShardError) as raised:
                for sample in wdsprep.dataset(str(tmp_path / "out"), "train", shuffle_shards=False, shuffle_buffer=0,
                                              prefetch_bytes=prefetch):
                    assert sample["__url__"].rsplit("/", 1)[-1] != victim.name  # none of its samples
            assert victim.name in str(raised.value) and "indexed" in str(raised.value) and "\n" not in str(raised.value)


def test_a_url_that_404s_is_one_line_and_nothing_is_written(shards, tmp_path):
    folder, _ = shards
    with RangeHTTPServer(folder) as server:
        status, _, err = run_cli("index", f"{server.url}/shard-{{000000..000009}}.tar", "--out", tmp_path / "out", "--quiet")
    lines = err.strip().splitlines()
    assert status == 1 and len(lines) == 1 and "shard-000005.tar" in lines[0] and "404" in lines[0], err
    assert not (tmp_path / "out").exists()


def test_s3_shards_are_indexed_and_streamed_as_the_local_tars(shards, tmp_path, s3):
    folder, tars = shards
    bucket = s3.create_bucket(f"adopt-{os.getpid()}-{time.monotonic_ns()}")
    _put(s3, bucket, folder, "wds")
    status, _, err = run_cli("index", f"s3://{bucket}/wds/shard-{{000000..{len(tars) - 1:06d}}}.tar", "--out",
                             tmp_path / "out", "--quiet")
    assert status == 0, err
    assert _rows(tmp_path / "out") == _rows(tmp_path / "local")
    status, _, err = run_cli("index", f"s3://{bucket}/wds/", "--out", tmp_path / "listed", "--quiet")  # the prefix, listed
    assert status == 0 and _rows(tmp_path / "listed") == _rows(tmp_path / "local"), err
    assert all(row.get("etag") for row in json.loads((tmp_path / "out" / "manifest.json").read_text())
               ["splits"]["train"]["shards"])
    got = wdsprep_samples(wdsprep.dataset(str(tmp_path / "out"), "train", shuffle_shards=False, shuffle_buffer=0))
    assert got == plain_samples(tars)
    mapped = wdsprep.MapDataset(str(tmp_path / "out"), "train", decode=False)
    assert [mapped[i]["__key__"] for i in (0, 7, 22)] == [got[i][0] for i in (0, 7, 22)]
    status, _, err = run_cli("index", f"s3://{bucket}/wds/", "--out", f"s3://{bucket}", "--quiet")  # OUT in S3 too
    assert status == 0, err
    rows = json.loads(s3.client().get_object(Bucket=bucket, Key="manifest.json")["Body"].read())["splits"]["train"]["shards"]
    assert [row["name"] for row in rows] == [f"wds/{pathlib.Path(tar).name}" for tar in tars]  # below OUT: relative
    assert wdsprep_samples(wdsprep.dataset(f"s3://{bucket}", "train", shuffle_shards=False, shuffle_buffer=0)) == got
    s3.client().put_object(Bucket=bucket, Key="wds/shard-000001.tar", Body=pathlib.Path(tars[1]).read_bytes() + b"\0" * 512)
    with pytest.raises(ShardError, match="shard-000001.tar"):
        list(wdsprep.dataset(str(tmp_path / "out"), "train", shuffle_shards=False, shuffle_buffer=0))


# ------------------------------------------------------------------ the oracles, shards remote
@pytest.fixture(scope="module", params=["http", "s3"])
def counted_shards(request, tmp_path_factory, s3_server):
    """`counted_shards(counts, codec=..., tag=...)` -> the manifest of such shards, webdataset-written,
    served remotely and adopted by URL (OUT local)."""
    root = tmp_path_factory.mktemp(f"adopt-oracle-{request.param}")
    made: dict = {}
    with RangeHTTPServer(root) as server, s3_server.environment():
        bucket = s3_server.create_bucket(f"adopt-oracle-{os.getpid()}") if request.param == "s3" else None

        def make(counts, *, codec="none", tag=""):
            wanted = (tuple(counts), tag)
            if wanted not in made:
                name = f"set{len(made)}"
                shards = counted_webdataset_shards(root / name, list(counts), tag=tag)
                names = sorted(path.name for path in shards.glob("*.tar"))
                if bucket is None:
                    urls = [f"{server.url}/{name}/{shard}" for shard in names]
                else:
                    _put(s3_server, bucket, shards, name)
                    urls = [f"s3://{bucket}/{name}/{shard}" for shard in names]
                adopt(urls, str(root / f"{name}-out"), workers=2)
                made[wanted] = str(root / f"{name}-out" / "manifest.json")
            return made[wanted]

        yield make


test_every_rank_and_worker_reads_what_the_model_says_adopted_remote = oracle.test_every_rank_and_worker_reads_what_the_model_says
test_resume_and_resume_of_a_resumed_run_give_exactly_the_rest_adopted_remote = oracle.test_resume_and_resume_of_a_resumed_run_give_exactly_the_rest
test_elastic_resume_delivers_the_rest_exactly_once_adopted_remote = oracle.test_elastic_resume_delivers_the_rest_exactly_once


def test_every_remote_scheme_is_indexed_and_streamed_as_the_local_tars(remote, generic_shards, tmp_path):
    """s3://, gs:// (fake-gcs-server), az:// (Azurite), hf:// (a private Hub repo): tars put there (here a
    conversion's, whose index member webdataset skips as metadata) adopted by URL, read equal to plain
    webdataset on the local files, each shard's identity recorded and checked."""
    url = remote.put(generic_shards, "adopt")
    names = [row["name"] for row in json.loads((generic_shards / "manifest.json").read_text())["splits"]["train"]["shards"]]
    status, _, err = run_cli("index", *[f"{url}/{name}" for name in names], "--out", tmp_path / "out", "--quiet")
    assert status == 0, err
    rows = json.loads((tmp_path / "out" / "manifest.json").read_text())["splits"]["train"]["shards"]
    assert all(row.get("etag") for row in rows), [row.get("etag") for row in rows]  # the identity every reader checks
    expected = plain_samples([str(generic_shards / name) for name in names])
    got = wdsprep_samples(wdsprep.dataset(str(tmp_path / "out"), "train", shuffle_shards=False, shuffle_buffer=0))
    assert got == expected
    mapped = wdsprep.MapDataset(str(tmp_path / "out"), "train", decode=False)
    assert [mapped[i]["__key__"] for i in (0, len(expected) - 1)] == [expected[0][0], expected[-1][0]]
