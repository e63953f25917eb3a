"""`wdsprep reindex DIR_OR_URL`: shards of an older conversion (no index member, rows without index
fields) get their index, keep their samples' bytes, and then read on the indexed path, locally
and remotely; an interrupted run resumes; a damaged shard is left as it is and named.

The older conversion is made here from a current one the way older versions wrote it: each shard's
samples followed by the two end blocks, its row's size and sha256 of those bytes, no index fields
(with `hashlib` and `json`). The oracle for the result is the current conversion itself: its
shards are exactly an older shard's samples plus the index, so reindexing must give them back
byte for byte.
"""
import hashlib
import json
import os
import pathlib
import shutil
import tarfile

import numpy as np
import pytest

import wdsprep
from wdsprep.errors import ShardError
from wdsprep.testing import RangeHTTPServer, S3Server
from wdsprep.testing.conformance import assert_rows_index_their_shards, balanced_units, read_manifest, run_cli, shard_bytes

from .shardsets import INDEX_FIELDS, make_older


def write_input(directory: pathlib.Path) -> pathlib.Path:
    rng = np.random.default_rng(4)
    (directory / "train").mkdir(parents=True)
    for i in range(300):
        np.save(directory / "train" / f"s{i:04d}.array.npy", rng.standard_normal(64).astype(np.float32))
        (directory / "train" / f"s{i:04d}.meta.json").write_text(json.dumps({"i": i}))
    return directory


@pytest.fixture(scope="module")
def conversions(tmp_path_factory):
    """(input, the current conversion, an older copy of it): one unit, rolled over and balanced."""
    root = tmp_path_factory.mktemp("reindex")
    native = write_input(root / "in")
    current = root / "current"
    status, _, err = run_cli("convert", "generic", native, current, "--shard-bytes", "200KB", "--quiet")
    assert status == 0, err
    assert balanced_units(current, 200_000)
    older = root / "older"
    shutil.copytree(current, older)
    make_older(older)
    return native, current, older


def reindex(location) -> tuple[int, str, str]:
    return run_cli("reindex", location, "--quiet")


def identities(directory: pathlib.Path) -> dict[str, tuple]:
    return {path.name: (path.stat().st_ino, path.stat().st_mtime_ns) for path in directory.glob("*.tar")}


def keys_read(manifest_url: str) -> list[str]:
    return [sample["__key__"] for sample in wdsprep.dataset(manifest_url, "train", shuffle_shards=False).compose(wdsprep.decode())]


def test_reindex_gives_older_shards_back_their_index_byte_for_byte(conversions, tmp_path):
    native, current, older = conversions
    work = tmp_path / "older"
    shutil.copytree(older, work)
    with RangeHTTPServer(tmp_path) as server:  # before: remote reads refuse the shards, naming the command
        with pytest.raises(ShardError, match="wdsprep reindex"):
            keys_read(server.url_of("older/manifest.json"))
    status, out, err = reindex(work)
    assert status == 0, err
    assert f"{len(shard_bytes(work))} shards indexed, 0 had an index already" in out
    assert shard_bytes(work) == shard_bytes(current)
    assert read_manifest(work)["splits"] == read_manifest(current)["splits"]
    assert assert_rows_index_their_shards(work) == len(shard_bytes(work))
    with RangeHTTPServer(tmp_path) as server:
        assert keys_read(server.url_of("older/manifest.json")) == [f"s{i:04d}" for i in range(300)]
    assert run_cli("verify", work, "--quiet")[0] == 0
    before = identities(work)
    status, out, _ = reindex(work)  # again: nothing to do, nothing written
    assert status == 0 and "0 shards indexed" in out and identities(work) == before


def test_after_reindex_a_conversion_rerun_reuses_every_unit(conversions, tmp_path):
    native, current, older = conversions
    work = tmp_path / "older"
    shutil.copytree(older, work)
    assert reindex(work)[0] == 0
    before = identities(work)
    status, _, err = run_cli("convert", "generic", native, work, "--shard-bytes", "200KB", "--quiet")
    assert status == 0, err
    assert read_manifest(work)["timing"]["units_built"] == 0 and identities(work) == before
    assert read_manifest(work)["splits"] == read_manifest(current)["splits"]


@pytest.mark.parametrize("stop", ["before the manifest", "after two shards"])
def test_an_interrupted_reindex_resumes_and_meanwhile_no_wrong_sample_is_read(conversions, tmp_path, monkeypatch, stop):
    import wdsprep.reindex as module

    native, current, older = conversions
    work = tmp_path / "older"
    shutil.copytree(older, work)
    manifest_before = (work / "manifest.json").read_bytes()
    if stop == "before the manifest":
        monkeypatch.setattr(module, "replace_unit_rows", lambda *args: (_ for _ in ()).throw(KeyboardInterrupt()))
    else:
        real, calls = module._reindex_shard, []

        def interrupted(*args):
            calls.append(1)
            if len(calls) == 3:
                raise KeyboardInterrupt()
            return real(*args)

        monkeypatch.setattr(module, "_reindex_shard", interrupted)
    status, _, err = reindex(work)
    assert status == 130 and len(err.strip().splitlines()) == 1, err
    monkeypatch.undo()
    assert (work / "manifest.json").read_bytes() == manifest_before  # the manifest is written last
    assert not list(work.glob("*.tmp"))
    replaced = [name for name, data in shard_bytes(work).items() if data == shard_bytes(current)[name]]
    assert replaced and (stop == "after two shards") == (len(replaced) == 2)
    keys, error = [], None
    try:  # the old manifest over replaced shards: an error, never a sample of another shape
        for sample in wdsprep.dataset(str(work / "manifest.json"), "train", shuffle_shards=False):
            keys.append(sample["__key__"])
    except ShardError as caught:
        error = caught
    assert error is not None and replaced[0] in str(error)
    assert keys == [f"s{i:04d}" for i in range(len(keys))]
    before = identities(work)
    status, out, err = reindex(work)
    assert status == 0, err
    assert shard_bytes(work) == shard_bytes(current)
    assert read_manifest(work)["splits"] == read_manifest(current)["splits"]
    assert all(identities(work)[name] == before[name] for name in replaced)  # recognised, not written again


@pytest.mark.parametrize("where", ["a tar header", "array data", "padding"])
def test_a_damaged_older_shard_is_named_and_left_as_it_is(conversions, tmp_path, where):
    """A flipped byte in a header breaks the walk; in data or padding only the check of the rebuilt
    samples against the row's sha256 sees it. Either way: named, not indexed, not changed."""
    native, current, older = conversions
    work = tmp_path / "older"
    shutil.copytree(older, work)
    victim = sorted(work.glob("*.tar"))[1]
    with tarfile.open(victim) as archive:
        info = archive.getmembers()[7]
    at = {"a tar header": info.offset + 3, "array data": info.offset_data + info.size // 2,
          "padding": info.offset_data + info.size + (-info.size % 512) - 1}[where]
    assert info.size % 512, "the member must have padding"
    data = bytearray(victim.read_bytes())
    data[at] ^= 0x01
    victim.write_bytes(bytes(data))
    old_row = next(row for row in read_manifest(older)["splits"]["train"]["shards"] if row["name"] == victim.name)
    status, out, err = reindex(work)
    assert status == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and victim.name in lines[0] and "left as it is" in lines[0], err
    assert victim.read_bytes() == bytes(data)
    rows = {row["name"]: row for row in read_manifest(work)["splits"]["train"]["shards"]}
    assert rows[victim.name] == old_row
    assert all(all(row.get(field) is not None for field in INDEX_FIELDS) for name, row in rows.items() if name != victim.name)
    with pytest.raises(ShardError, match=victim.name):
        keys_read(str(work / "manifest.json"))


def test_a_shard_written_by_another_tar_writer_is_indexed_or_refused_in_one_line(conversions, tmp_path):
    """Python's tarfile in ustar format (its own header bytes) is indexed and reads back the same
    samples; in PAX format (extended headers before members) it cannot be, and says so in one line."""
    native, current, older = conversions
    for form, ok in ((tarfile.USTAR_FORMAT, True), (tarfile.PAX_FORMAT, False)):
        work = tmp_path / f"older-{form}"
        shutil.copytree(older, work)
        manifest = read_manifest(work)
        row = manifest["splits"]["train"]["shards"][0]
        path = work / row["name"]
        with tarfile.open(path) as source:
            members = [(info, source.extractfile(info).read()) for info in source.getmembers()]
        with tarfile.open(path, "w", format=form) as target:
            for info, data in members:
                info.pax_headers = {"comment": "x"} if form == tarfile.PAX_FORMAT else {}
                target.addfile(info, __import__("io").BytesIO(data))
        data = path.read_bytes()
        data = data.rstrip(b"\0")
        data += bytes(-len(data) % 512) + bytes(1024)
        path.write_bytes(data)
        row.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
        manifest["splits"]["train"]["bytes"] = sum(r["bytes"] for r in manifest["splits"]["train"]["shards"])
        manifest["totals"]["bytes"] = manifest["splits"]["train"]["bytes"]
        (work / "manifest.json").write_text(json.dumps(manifest))
        status, out, err = reindex(work)
        if ok:
            assert status == 0, err
            assert assert_rows_index_their_shards(work) == len(shard_bytes(work))
            assert keys_read(str(work / "manifest.json")) == [f"s{i:04d}" for i in range(300)]
        else:
            assert status == 1 and len(err.strip().splitlines()) == 1 and row["name"] in err and "cannot be indexed" in err, err


def test_reindex_over_s3(conversions, monkeypatch):
    native, current, older = conversions
    with S3Server() as server:
        for name, value in server.env.items():
            monkeypatch.setenv(name, value)
        client = server.client()
        server.create_bucket("old")
        for path in older.iterdir():
            if path.is_file():
                client.put_object(Bucket="old", Key=f"set/{path.name}", Body=path.read_bytes())
        with pytest.raises(ShardError, match="wdsprep reindex"):
            keys_read("s3://old/set/manifest.json")
        status, out, err = reindex("s3://old/set")
        assert status == 0, err
        for name, data in shard_bytes(current).items():
            assert client.get_object(Bucket="old", Key=f"set/{name}")["Body"].read() == data
        manifest = json.loads(client.get_object(Bucket="old", Key="set/manifest.json")["Body"].read())
        assert manifest["splits"] == read_manifest(current)["splits"]
        assert keys_read("s3://old/set/manifest.json") == [f"s{i:04d}" for i in range(300)]


def test_reindex_of_a_read_only_url_is_one_line(conversions):
    native, current, older = conversions
    with RangeHTTPServer(older.parent) as server:
        status, _, err = reindex(server.url_of("older"))
    assert status == 1 and len(err.strip().splitlines()) == 1 and "cannot write" in err, err
    assert os.path.exists(older / "manifest.json")


def test_reindex_of_a_folder_without_a_manifest_is_one_line_and_makes_nothing(tmp_path):
    for location in (tmp_path / "empty", tmp_path / "missing"):
        if location.name == "empty":
            location.mkdir()
        status, _, err = reindex(location)
        assert status == 1 and len(err.strip().splitlines()) == 1 and "manifest" in err, err
        assert (sorted(p.name for p in location.iterdir()) if location.exists() else None) == ([] if location.name == "empty" else None)


def test_a_shard_damaged_after_an_interrupted_run_replaced_it_is_named_not_blessed(conversions, tmp_path, monkeypatch):
    """An interrupted run replaced the shards; then a data byte of one changed. The resumed run must
    not take it for its own work (its index, rebuilt from the damaged bytes, would match them): its
    samples are checked against the row of the converted shard, so it is named and left as it is."""
    import wdsprep.reindex as module

    native, current, older = conversions
    work = tmp_path / "older"
    shutil.copytree(older, work)
    monkeypatch.setattr(module, "replace_unit_rows", lambda *args: (_ for _ in ()).throw(KeyboardInterrupt()))
    assert reindex(work)[0] == 130
    monkeypatch.undo()
    victim = sorted(work.glob("*.tar"))[0]
    with tarfile.open(victim) as archive:
        info = archive.getmembers()[4]
    data = bytearray(victim.read_bytes())
    data[info.offset_data + info.size // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    status, _, err = reindex(work)
    assert status == 1 and len(err.strip().splitlines()) == 1 and victim.name in err, err
    assert victim.read_bytes() == bytes(data)
    row = next(row for row in read_manifest(work)["splits"]["train"]["shards"] if row["name"] == victim.name)
    assert not any(field in row for field in INDEX_FIELDS)


def test_an_indexed_shard_of_other_samples_under_an_older_row_is_named_not_taken(conversions, tmp_path):
    """A shard that already has an index but holds other samples than its (older) row says -- here
    the same-named shard of another conversion -- is not taken for an interrupted run's work."""
    native, current, older = conversions
    work = tmp_path / "older"
    shutil.copytree(older, work)
    other = write_input(tmp_path / "other-in")
    np.save(other / "train" / "s0000.array.npy", np.zeros(64, np.float32))  # other samples, same sizes
    status, _, err = run_cli("convert", "generic", other, tmp_path / "other", "--shard-bytes", "200KB", "--quiet")
    assert status == 0, err
    name = "train-00000-00.tar"
    shutil.copy(tmp_path / "other" / name, work / name)
    status, _, err = reindex(work)
    assert status == 1 and len(err.strip().splitlines()) == 1 and name in err, err
    assert (work / name).read_bytes() == (tmp_path / "other" / name).read_bytes()
    row = next(row for row in read_manifest(work)["splits"]["train"]["shards"] if row["name"] == name)
    assert row == next(row for row in read_manifest(older)["splits"]["train"]["shards"] if row["name"] == name)


def test_a_conversion_rerun_over_an_older_output_builds_its_units_again_with_their_index(conversions, tmp_path):
    """Without `reindex`: converting again into an older output rebuilds the units whose recorded
    shards have no index, so the manifest a conversion writes never lists a shard without one."""
    native, current, older = conversions
    work = tmp_path / "older"
    shutil.copytree(older, work)
    status, _, err = run_cli("convert", "generic", native, work, "--shard-bytes", "200KB", "--quiet")
    assert status == 0, err
    assert read_manifest(work)["timing"]["units_built"] == 1 and read_manifest(work)["timing"]["units_reused"] == 0
    assert shard_bytes(work) == shard_bytes(current)
    assert read_manifest(work)["splits"] == read_manifest(current)["splits"]
    assert assert_rows_index_their_shards(work) == len(shard_bytes(work))
