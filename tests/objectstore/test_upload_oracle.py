"""Upload under injected faults, judged by what the destination holds: the number of attempts a shard
gets, verification after upload (a corrupted stored object is caught and sent again), and `file://`
uploads that never leave a partial file under a shard's final name."""
import hashlib
import json
import os
import shutil

import pytest

from wdsprep.errors import ManifestError, UploadError
from wdsprep.stream import load_manifest
from wdsprep.upload import upload


def _rows(shard_dir):
    manifest = json.loads((shard_dir / "manifest.json").read_text())
    return [row for split in sorted(manifest["splits"]) for row in manifest["splits"][split]["shards"]]


def _files(shard_dir):
    """What an upload writes besides the manifest: the shards, and each split's sample and shard table."""
    manifest = json.loads((shard_dir / "manifest.json").read_text())
    tables = [{"name": entry["file"], "sha256": entry["sha256"]}
              for kind in ("sample_tables", "shard_tables") for entry in manifest["tables"][kind].values()]
    assert len(tables) == 2 * len(manifest["splits"])
    return _rows(shard_dir) + tables


def _puts(s3, bucket, key):
    return [r for r in s3.requests if r["method"] == "PUT" and r["bucket"] == bucket and r["key"] == key
            and "uploadId" not in r["query"]]


def _stored_sha256(s3, bucket, key):
    return hashlib.sha256(s3.client().get_object(Bucket=bucket, Key=key)["Body"].read()).hexdigest()


@pytest.mark.parametrize("retries", [0, 1, 2])
def test_a_shard_gets_exactly_retries_plus_one_attempts(s3, bucket, generic_shards, retries):
    row = _rows(generic_shards)[1]
    key = f"r/{row['name']}"
    # refused on every attempt it has: an error naming the shard after retries + 1 PUTs, no manifest
    s3.refuse_puts(bucket, key, times=retries + 1)
    with pytest.raises(UploadError, match=row["name"]):
        upload(str(generic_shards), f"s3://{bucket}/r", retries=retries, workers=2)
    assert len(_puts(s3, bucket, key)) == retries + 1
    with pytest.raises(ManifestError):
        load_manifest(f"s3://{bucket}/r")
    # refused once fewer than that: it goes up on its last attempt
    s3.clear_log()
    s3.refuse_puts(bucket, key, times=retries)
    report = upload(str(generic_shards), f"s3://{bucket}/r", retries=retries, workers=2)
    assert [r["status"] for r in _puts(s3, bucket, key)] == [400] * retries + [200]
    assert row["name"] in report.uploaded and report.manifest_written
    assert _stored_sha256(s3, bucket, key) == row["sha256"]


def test_a_shard_stored_corrupted_is_caught_by_rereading_and_sent_again(s3, bucket, generic_shards):
    rows = _rows(generic_shards)
    victim = rows[2]
    key = f"c/{victim['name']}"
    s3.corrupt_puts(bucket, key, times=1)
    report = upload(str(generic_shards), f"s3://{bucket}/c", retries=1, workers=2)
    assert report.manifest_written
    assert [r["status"] for r in _puts(s3, bucket, key)][:1] == [200] and s3.completed_uploads(bucket)[key] >= 2
    for row in rows:  # what is stored is what the manifest says, byte for byte
        assert _stored_sha256(s3, bucket, f"c/{row['name']}") == row["sha256"], row["name"]


def test_a_shard_stored_corrupted_every_time_fails_without_a_manifest(s3, bucket, generic_shards):
    victim = _rows(generic_shards)[0]
    s3.corrupt_puts(bucket, f"d/{victim['name']}", times=2)
    with pytest.raises(UploadError, match=victim["name"]):
        upload(str(generic_shards), f"s3://{bucket}/d", retries=1, workers=2)
    with pytest.raises(ManifestError):
        load_manifest(f"s3://{bucket}/d")


REAL_COPY = shutil.copyfileobj


class _DiskFullOncePerFile:
    """shutil.copyfileobj that, the first time it copies a given file, writes `limit` bytes and then
    fails like a full disk."""

    def __init__(self, limit):
        self.limit, self.failed = limit, set()

    def __call__(self, source, target, length=0):
        if source.name in self.failed:
            return REAL_COPY(source, target, length or 1 << 20)
        self.failed.add(source.name)
        target.write(source.read(self.limit))
        target.flush()
        raise OSError(28, "No space left on device (injected)")


def test_file_url_upload_never_leaves_a_partial_shard_under_its_name(generic_shards, tmp_path, monkeypatch):
    rows = _files(generic_shards)
    destination = tmp_path / "copy"
    destination.mkdir()
    monkeypatch.setattr(shutil, "copyfileobj", _DiskFullOncePerFile(limit=1000))
    with pytest.raises(UploadError):
        upload(str(generic_shards), f"file://{destination}", retries=0, workers=1)
    left = sorted(p.name for p in destination.iterdir())
    assert left == [], left  # no final name over a partial file, no temporary left over, no manifest
    # one failure per shard, one retry each: every shard complete, nothing else
    monkeypatch.setattr(shutil, "copyfileobj", _DiskFullOncePerFile(limit=1000))
    report = upload(str(generic_shards), f"file://{destination}", retries=1, workers=1)
    assert report.manifest_written
    assert sorted(p.name for p in destination.iterdir()) == sorted([r["name"] for r in rows] + ["manifest.json"])
    for row in rows:
        assert (destination / row["name"]).read_bytes() == (generic_shards / row["name"]).read_bytes()


def test_file_url_upload_writes_beside_the_final_name_and_renames(generic_shards, tmp_path, monkeypatch):
    """While a shard is copied, its final name holds what it held before (nothing, or an older
    object that differs) -- never the bytes on their way -- and afterwards the new shard whole."""
    rows = _files(generic_shards)
    destination = tmp_path / "copy"
    destination.mkdir()
    stale = rows[1]["name"]
    (destination / stale).write_bytes(b"an older object under this name")
    seen = {}

    def watching(source, target, length=0):
        name = source.name.rsplit("/", 1)[-1]
        final = destination / name
        before = final.read_bytes() if final.exists() else None
        target.write(source.read(1000))  # part of the shard is on its way
        target.flush()
        during = final.read_bytes() if final.exists() else None
        seen[name] = (before, during, os.readlink(f"/proc/self/fd/{target.fileno()}"))  # the file written
        return REAL_COPY(source, target, length or 1 << 20)

    monkeypatch.setattr(shutil, "copyfileobj", watching)
    report = upload(str(generic_shards), f"file://{destination}", retries=0, workers=1)
    assert report.manifest_written and sorted(seen) == sorted(row["name"] for row in rows)
    for row in rows:
        before, during, written = seen[row["name"]]
        held = b"an older object under this name" if row["name"] == stale else None
        assert (before, during) == (held, held), row["name"]
        assert written != str(destination / row["name"]), written
        assert (destination / row["name"]).read_bytes() == (generic_shards / row["name"]).read_bytes()
