"""`wdsprep upload` and `wdsprep convert ... s3://`: resumable, verified, manifest last."""
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import webdataset as wds

import wdsprep
from tests.timeouts import EVENT as DEADLINE
from wdsprep.conversion import convert
from wdsprep.errors import ManifestError, UploadError
from wdsprep.storage import read_url
from wdsprep.storage.s3 import S3Store
from wdsprep.stream import load_manifest
from wdsprep.upload import upload


def _manifest_rows(shard_dir):
    manifest = json.loads((shard_dir / "manifest.json").read_bytes())
    return [row for split in manifest["splits"].values() for row in split["shards"]]


def _table_rows(shard_dir):
    """Each split's sample and shard table, as an upload writes them beside the shards."""
    manifest = json.loads((shard_dir / "manifest.json").read_bytes())
    return [{"name": entry["file"], "sha256": entry["sha256"]}
            for kind in ("sample_tables", "shard_tables") for entry in manifest["tables"][kind].values()]


def _object_sha256(client, bucket, key):
    return hashlib.sha256(client.get_object(Bucket=bucket, Key=key)["Body"].read()).hexdigest()


class ManifestWatcher(threading.Thread):
    """A reader polling the destination during an upload: it must see no manifest, or a manifest
    whose every shard is present and hashes to its row."""

    def __init__(self, url, expected_manifest: bytes):
        super().__init__(daemon=True)
        self.url = url
        self.expected = json.loads(expected_manifest)
        self.seen = {"absent": 0, "complete": 0}
        self.problems = []
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.observe()
            time.sleep(0.02)
        self.observe()

    def observe(self):
        try:
            manifest = load_manifest(self.url)
        except ManifestError:
            self.seen["absent"] += 1
            return
        try:
            assert json.loads(manifest.dumps()) == self.expected
            for split in manifest.splits:
                urls, rows = manifest.shard_urls(split), manifest.shards(split)
                assert len(urls) == len(rows) == len(self.expected["splits"][split]["shards"]), split
                for url, row in zip(urls, rows):
                    data = read_url(url)
                    assert hashlib.sha256(data).hexdigest() == row["sha256"], url
            self.seen["complete"] += 1
        except Exception as error:  # recorded, asserted by the test
            self.problems.append(repr(error))


def _upload_command(shard_dir, url, *extra):
    return [sys.executable, "-m", "wdsprep", "upload", str(shard_dir), url, "--quiet", *extra]


def test_upload_killed_halfway_then_rerun_uploads_nothing_twice(s3, bucket, generic_shards):
    rows = _manifest_rows(generic_shards)
    url = f"s3://{bucket}/generic"
    manifest_bytes = (generic_shards / "manifest.json").read_bytes()
    # shards above 200 KB go up as multipart uploads (one part each), the small ones as single PUTs
    options = ("--workers", "1", "--multipart-bytes", "200KB")

    gate = s3.hold_puts_after(5, timeout=DEADLINE)
    watcher = ManifestWatcher(url, manifest_bytes)
    watcher.start()
    process = subprocess.Popen(_upload_command(generic_shards, url, *options), env=os.environ.copy(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + DEADLINE
    while gate.waiting == 0 and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.02)
    assert gate.waiting >= 1, process.communicate(timeout=DEADLINE)
    process.send_signal(signal.SIGKILL)  # killed halfway, a shard in flight
    process.wait(timeout=DEADLINE)
    gate.release(fail=True)
    s3.faults.gate = None

    client = s3.client()
    listing = client.list_objects_v2(Bucket=bucket, Prefix="generic/").get("Contents", [])
    present = {item["Key"].split("/", 1)[1] for item in listing}
    assert "manifest.json" not in present
    assert 0 < len(present) < len(rows)
    first_run = s3.completed_uploads(bucket)

    result = subprocess.run(_upload_command(generic_shards, url, *options), env=os.environ.copy(),
                            capture_output=True, text=True, timeout=DEADLINE)
    watcher.stop.set()
    watcher.join(timeout=DEADLINE)
    assert result.returncode == 0, result.stderr
    assert f"{sum(name.endswith('.tar') for name in present)} already there" in result.stdout

    # nothing uploaded twice: one completed write per shard and sample table over both runs, the manifest once
    rows += _table_rows(generic_shards)
    uploads = s3.completed_uploads(bucket)
    assert uploads == {f"generic/{row['name']}": 1 for row in rows} | {"generic/manifest.json": 1}
    assert all(first_run.get(key, 0) <= 1 for key in first_run)
    # no abandoned multipart upload left behind
    assert not client.list_multipart_uploads(Bucket=bucket).get("Uploads")
    # every object verified independently
    for row in rows:
        assert _object_sha256(client, bucket, f"generic/{row['name']}") == row["sha256"]
    assert client.get_object(Bucket=bucket, Key="generic/manifest.json")["Body"].read() == manifest_bytes
    # a reader during the uploads saw no manifest, or the complete dataset, never anything else
    assert watcher.problems == []
    assert watcher.seen["absent"] >= 1 and watcher.seen["complete"] >= 1
    # and the uploaded dataset streams back whole
    keys = [s["__key__"] for s in wdsprep.dataset(url, "train", equalize=None)]
    assert sorted(keys) == [f"sample{i:06d}" for i in range(100)]


def test_upload_replacing_a_dataset_hides_the_old_manifest_first(s3, bucket, generic_shards, tmp_path):
    url = f"s3://{bucket}/ds"
    upload(str(generic_shards), url)
    # a different dataset (other seed) under the same names
    from wdsprep.sources.generic import SOURCE

    SOURCE.synth(str(tmp_path / "in"), seed=99, size="small", samples=100, splits={"train": 100, "valid": 20})
    convert("generic", str(tmp_path / "in"), str(tmp_path / "out"), shard_bytes="400KB")
    gate = s3.hold_puts_after(2, timeout=DEADLINE)
    outcome = {}
    worker = threading.Thread(target=lambda: outcome.setdefault("report", upload(str(tmp_path / "out"), url, workers=1)))
    worker.start()
    deadline = time.monotonic() + DEADLINE
    while gate.waiting == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    with pytest.raises(ManifestError):  # mid-replacement: no manifest at all
        load_manifest(url)
    gate.release()
    worker.join(timeout=DEADLINE)
    assert load_manifest(url).dumps() == (tmp_path / "out" / "manifest.json").read_bytes()
    assert len(outcome["report"].uploaded) == len(_manifest_rows(tmp_path / "out"))


def test_upload_to_file_url_is_verified_and_resumable(generic_shards, tmp_path):
    destination = tmp_path / "copy"
    report = upload(str(generic_shards), f"file://{destination}")
    rows = _manifest_rows(generic_shards)
    assert sorted(report.uploaded) == sorted(r["name"] for r in rows) and report.manifest_written
    for row in rows:
        assert (destination / row["name"]).read_bytes() == (generic_shards / row["name"]).read_bytes()
    # a lost shard is put back, the others skipped
    (destination / rows[2]["name"]).unlink()
    again = upload(str(generic_shards), f"file://{destination}")
    assert again.uploaded == [rows[2]["name"]] and len(again.skipped) == len(rows) - 1
    assert not [p for p in destination.iterdir() if p.name.endswith(".tmp")]


def test_upload_refuses_a_corrupt_local_shard(s3, bucket, generic_shards, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(generic_shards, broken)
    row = _manifest_rows(broken)[3]
    data = bytearray((broken / row["name"]).read_bytes())
    data[1000] ^= 0xFF
    (broken / row["name"]).write_bytes(bytes(data))
    with pytest.raises(UploadError, match=row["name"]):
        upload(str(broken), f"s3://{bucket}/x", workers=2)
    with pytest.raises(ManifestError):
        load_manifest(f"s3://{bucket}/x")


def test_cli_upload_reports_and_exits_nonzero_without_manifest(s3, bucket, tmp_path):
    (tmp_path / "empty").mkdir()
    result = subprocess.run(_upload_command(tmp_path / "empty", f"s3://{bucket}/y"), env=os.environ.copy(),
                            capture_output=True, text=True, timeout=DEADLINE)
    assert result.returncode == 1
    assert "manifest.json: no manifest" in result.stderr and "Traceback" not in result.stderr


def test_multipart_upload_of_a_large_shard(s3, bucket, tmp_path):
    store = S3Store(f"s3://{bucket}/big", multipart_bytes=5 << 20, part_bytes=5 << 20)
    blob = np.random.default_rng(0).integers(0, 256, 11 << 20, dtype=np.uint8).tobytes()
    (tmp_path / "big.tar").write_bytes(blob)
    store.upload_file(str(tmp_path / "big.tar"), "big.tar")
    digest = hashlib.sha256(blob).hexdigest()
    parts = [r for r in s3.requests if r["bucket"] == bucket and r["method"] == "PUT" and "partNumber" in r["query"]]
    assert len(parts) == 3  # 5 + 5 + 1 MiB
    assert store.stat("big.tar") == len(blob)
    assert store.sha256("big.tar") == digest == store.content_sha256("big.tar")
    assert (tmp_path / "big.tar").exists()  # upload keeps the source; publish() removes it


def test_convert_writes_straight_to_s3_staging_one_shard(s3, bucket, generic_shards, monkeypatch):
    input_dir = generic_shards.parent / "input"
    staged, staging_dirs = [], set()
    original = S3Store.publish

    def publish(self, local_path, name):
        staging_dirs.add(os.path.dirname(local_path))
        staged.append(sorted(os.listdir(os.path.dirname(local_path))))
        original(self, local_path, name)
        assert not os.path.exists(local_path)

    monkeypatch.setattr(S3Store, "publish", publish)
    url = f"s3://{bucket}/direct"
    manifest = convert("generic", str(input_dir), url, shard_bytes="400KB")
    local = json.loads((generic_shards / "manifest.json").read_bytes())
    # the same bytes as a local conversion
    assert {s: [r["sha256"] for r in rows] for s, rows in manifest.splits.items()} == {
        s: [r["sha256"] for r in split["shards"]] for s, split in local["splits"].items()
    }
    # the only local staging was the shard being written, removed once uploaded
    assert staged and all(len(listing) == 1 for listing in staged)
    assert all(os.listdir(d) == [] for d in staging_dirs)
    # resumable against the bucket: a re-run rebuilds nothing and uploads nothing
    before = s3.completed_uploads(bucket)
    again = convert("generic", str(input_dir), url, shard_bytes="400KB")
    assert again.timing["units_built"] == 0
    shard_uploads = {k: v for k, v in s3.completed_uploads(bucket).items() if k.endswith(".tar")}
    assert shard_uploads == {k: v for k, v in before.items() if k.endswith(".tar")}
    assert sorted(s["__key__"] for s in wdsprep.dataset(url, "valid", equalize=None)) == [f"sample{i:06d}" for i in range(20)]


def test_webdataset_tarwriter_streams_to_s3(s3, bucket):
    from wdsprep.storage.gopen import register_webdataset_schemes

    register_webdataset_schemes()
    url = f"s3://{bucket}/wds/shard-000.tar"
    with wds.TarWriter(url) as sink:
        for i in range(5):
            sink.write({"__key__": f"k{i}", "txt": f"value {i}"})
    got = [(s["__key__"], s["txt"]) for s in wds.WebDataset(url, shardshuffle=False).decode()]
    assert got == [(f"k{i}", f"value {i}") for i in range(5)]


def test_upload_hides_an_identical_manifest_while_a_missing_shard_goes_back_up(s3, bucket, generic_shards):
    url = f"s3://{bucket}/same"
    upload(str(generic_shards), url)
    lost = _manifest_rows(generic_shards)[1]["name"]
    s3.client().delete_object(Bucket=bucket, Key=f"same/{lost}")  # the manifest stays, identical to ours
    gate = s3.hold_puts_after(0, timeout=DEADLINE)
    outcome = {}
    worker = threading.Thread(target=lambda: outcome.setdefault("report", upload(str(generic_shards), url, workers=1)))
    worker.start()
    try:
        deadline = time.monotonic() + DEADLINE
        while gate.waiting == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert gate.waiting >= 1
        with pytest.raises(ManifestError):  # the dataset is incomplete: no manifest may be visible
            load_manifest(url)
    finally:
        gate.release()
        worker.join(timeout=DEADLINE)
    report = outcome["report"]
    assert report.uploaded == [lost] and report.manifest_written
    assert load_manifest(url).dumps() == (generic_shards / "manifest.json").read_bytes()
    # nothing to upload: an identical manifest is left alone
    again = upload(str(generic_shards), url)
    assert again.uploaded == [] and not again.manifest_written


def test_an_exception_inside_a_tarwriter_on_s3_publishes_nothing(s3, bucket):
    import gc

    from wdsprep.storage.gopen import register_webdataset_schemes
    from wdsprep.storage.s3 import S3StreamWriter

    register_webdataset_schemes()
    client = s3.client()

    def keys():
        return [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="fail/").get("Contents", [])]

    url = f"s3://{bucket}/fail/shard-000.tar"
    with pytest.raises(RuntimeError):
        with wds.TarWriter(url) as sink:
            for i in range(3):
                sink.write({"__key__": f"k{i}", "bin": os.urandom(3 << 20)})  # spans a multipart part
            raise RuntimeError("the producer failed halfway")
    assert keys() == []
    assert client.list_multipart_uploads(Bucket=bucket, Prefix="fail/").get("Uploads", []) == []
    # the writer itself: an exception in its `with` aborts, and a writer dropped unclosed publishes nothing
    with pytest.raises(ValueError):
        with S3StreamWriter(f"s3://{bucket}/fail/direct.tar") as out:
            out.write(b"x" * 1000)
            raise ValueError("stop")
    dropped = S3StreamWriter(f"s3://{bucket}/fail/dropped.tar")
    dropped.write(b"y" * 1000)
    del dropped
    gc.collect()
    assert keys() == []
    # a clean close still publishes
    with wds.TarWriter(f"s3://{bucket}/fail/ok.tar") as sink:
        sink.write({"__key__": "k", "txt": "v"})
    assert keys() == ["fail/ok.tar"]
