"""`wdsprep reindex DIR_OR_URL`: shards of an older conversion (no index member, rows without index
fields) get their index, keep their samples' bytes, and then read on the indexed path, locally
and remotely; an interrupted run resumes; a damaged shard is left as it is and named.

The older conversion is made here from a current one the way older versions wrote it: each shard's
samples followed by the two end blocks, its row's size and sha256 of those bytes, no index fields
(with `hashlib` and `json`). The oracle for the result is the current conversion itself: its
shards are exactly an older shard's samples plus the index, so reindexing must give them back
byte for byte.
"""
import errno
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile

import msgpack
import numpy as np
import pytest

import wdsprep
from wdsprep.errors import ShardError
from wdsprep.testing import RangeHTTPServer, S3Server
from wdsprep.conformance import (assert_rows_index_their_shards, balanced_units, read_manifest, run_cli, shard_bytes,
                                        tar_samples)

from tests.timeouts import SUBPROCESS

from .shardsets import INDEX_FIELDS, journal_records, make_older, write_older_journal


def write_input(directory: pathlib.Path) -> pathlib.Path:
    rng = np.random.default_rng(4)
    (directory / "train").mkdir(parents=True)
    for i in range(300):
        np.save(directory / "train" / f"s{i:04d}.array.npy", rng.standard_normal(64).astype(np.float32))
        # 200 short floats: msgpack writes more than the JSON the unit was planned by, so units roll over
        (directory / "train" / f"s{i:04d}.meta.json").write_text(json.dumps({"i": i, "w": [0.5] * 200}))
    return directory


@pytest.fixture(scope="module")
def conversions(tmp_path_factory):
    """(input, the current conversion, an older copy of it): units rolled over and balanced."""
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


def write_manifest(directory: pathlib.Path, manifest: dict) -> None:
    """`manifest` with its split and overall byte and sample totals added up again, as manifest.json."""
    for entry in manifest["splits"].values():
        entry["bytes"] = sum(row["bytes"] for row in entry["shards"])
        entry["samples"] = sum(row["samples"] for row in entry["shards"])
    manifest["totals"].update(bytes=sum(entry["bytes"] for entry in manifest["splits"].values()),
                              samples=sum(entry["samples"] for entry in manifest["splits"].values()),
                              shards=sum(len(entry["shards"]) for entry in manifest["splits"].values()))
    (directory / "manifest.json").write_text(json.dumps(manifest))


def index_of(path: pathlib.Path) -> dict:
    """A shard's `__wdsprep_index__` member, read with tarfile and msgpack."""
    with tarfile.open(path) as archive:
        member = archive.getmembers()[-1]
        assert member.name == "__wdsprep_index__"
        return msgpack.unpackb(archive.extractfile(member).read())


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
    assert (status, err.strip().splitlines()) == (130, ["wdsprep: interrupted (re-run the same command to resume)"]), err
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


def test_a_shard_written_by_another_tar_writer_with_plain_or_extended_headers_is_indexed(conversions, tmp_path):
    """Python's tarfile in ustar format (its own header bytes) is indexed keeping every sample byte;
    in PAX format (extended records before members), which `verify` reads as well, each member gets
    a plain header of its own and the index names the shard it replaced (`reindexed_from`)."""
    native, current, older = conversions
    for form in (tarfile.USTAR_FORMAT, tarfile.PAX_FORMAT):
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
        write_manifest(work, manifest)
        assert run_cli("verify", work, "--quiet")[0] == 0
        status, out, err = reindex(work)
        assert status == 0, err
        assert assert_rows_index_their_shards(work) == len(shard_bytes(work))
        assert keys_read(str(work / "manifest.json")) == [f"s{i:04d}" for i in range(300)]
        with tarfile.open(path) as rebuilt:
            assert all(info.pax_headers == {} for info in rebuilt.getmembers())
            assert [(info.name, rebuilt.extractfile(info).read()) for info in rebuilt.getmembers()[:-1]] == \
                [(info.name, data) for info, data in members]
        assert index_of(path).get("reindexed_from") == (row["sha256"] if form == tarfile.PAX_FORMAT else None)


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
    assert status == 2 and len(err.strip().splitlines()) == 1 and "cannot write" in err, err  # a bad argument
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
    units = len({row["unit"] for row in read_manifest(current)["splits"]["train"]["shards"]})
    assert read_manifest(work)["timing"]["units_built"] == units and read_manifest(work)["timing"]["units_reused"] == 0
    assert shard_bytes(work) == shard_bytes(current)
    assert read_manifest(work)["splits"] == read_manifest(current)["splits"]
    assert assert_rows_index_their_shards(work) == len(shard_bytes(work))


def with_shard(work: pathlib.Path, name: str, data: bytes, samples: int | None = None) -> None:
    """Put `data` in place of shard `name`, its manifest row (and `_units.json`'s) describing it."""
    (work / name).write_bytes(data)
    manifest = read_manifest(work)
    rows = [row for row in manifest["splits"]["train"]["shards"] if row["name"] == name]
    rows[0].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    if samples is not None:
        rows[0]["samples"] = samples
    write_manifest(work, manifest)
    head, records = journal_records(work)
    for record in records:
        record["rows"] = [dict(row, **{k: v for k, v in rows[0].items() if k != "unit_digest"}) if row["name"] == name else row
                          for row in record["rows"]]
    write_older_journal(work, head, records)


@pytest.mark.parametrize("writer", ["the tar command", "tarfile's defaults"])
def test_a_shard_padded_to_whole_tar_records_is_indexed_and_then_reads_remotely(conversions, tmp_path, writer):
    """GNU tar (and Python's tarfile) end an archive with zeros up to a whole 10,240-byte record:
    `verify` accepts such a shard, so reindex must index it, and the result then reads over HTTP."""
    native, current, older = conversions
    work = tmp_path / "older"
    shutil.copytree(older, work)
    name = sorted(shard_bytes(work))[0]
    members = tmp_path / "members"
    with tarfile.open(work / name) as archive:
        names = archive.getnames()
        archive.extractall(members, filter="data")
    data_path = tmp_path / "by-another-writer.tar"
    if writer == "the tar command":
        subprocess.run(["tar", "-cf", str(data_path), "-C", str(members), *names], check=True)
    else:
        with tarfile.open(data_path, "w") as target:
            for member in names:
                target.add(members / member, arcname=member)
    data = data_path.read_bytes()
    assert len(data) % 10240 == 0 and len(data) - len(data.rstrip(b"\0")) > 1024  # whole records, more than two zero blocks
    with_shard(work, name, data)
    assert run_cli("verify", work, "--quiet")[0] == 0
    status, out, err = reindex(work)
    assert status == 0, err
    assert assert_rows_index_their_shards(work) == len(shard_bytes(work))
    with tarfile.open(work / name) as rebuilt:
        assert [(info.name, rebuilt.extractfile(info).read()) for info in rebuilt.getmembers()[:-1]] == \
            [(member, (members / member).read_bytes()) for member in names]
    # the tar command writes one plain header per member: only zeros were left out; tarfile adds PAX records (mtime)
    assert ("reindexed_from" in index_of(work / name)) == (writer == "tarfile's defaults")
    with RangeHTTPServer(tmp_path) as server:
        assert keys_read(server.url_of("older/manifest.json")) == [f"s{i:04d}" for i in range(300)]


def first_indexed_balance(work: pathlib.Path, current: pathlib.Path) -> tuple[str, int]:
    """What the first indexed format wrote when it balanced a unit's last two shards: the first cut
    after `cut` samples (its index dropped, no index fields), and the tail made of the first one's
    bytes from the cut to its end blocks -- its index member included -- followed by the last one's
    (its own index too) and the end blocks, its row without index fields. (shard name, samples)"""
    first, last = sorted(shard_bytes(current))[-2:]
    a, b = (current / first).read_bytes(), (current / last).read_bytes()
    samples_a, samples_b = tar_samples(current / first), tar_samples(current / last)
    cut = len(samples_a) // 2
    at = samples_a[cut][1][0].offset
    with_shard(work, first, a[:at] + bytes(1024), cut)
    tail = a[:-1024][at:] + b[:-1024] + bytes(1024)
    with_shard(work, last, tail, len(samples_a) - cut + len(samples_b))
    return last, tail.count(b"__wdsprep_index__\0")


def test_the_tail_shard_of_a_unit_balanced_by_the_first_indexed_format_is_indexed(conversions, tmp_path, monkeypatch):
    """That tail shard holds a stale index member followed by more samples. `verify` reads it (the
    member is metadata to every tar reader), so reindex must index it: the samples kept, the stale
    index members left out, and the new index names the shard it replaced."""
    import wdsprep.reindex as module

    native, current, older = conversions
    work = tmp_path / "older"
    shutil.copytree(older, work)
    tail, stale = first_indexed_balance(work, current)
    assert stale == 2
    old_row = next(row for row in read_manifest(work)["splits"]["train"]["shards"] if row["name"] == tail)
    old_samples = [(key, [(m.name, m.size) for m in members]) for key, members in tar_samples(work / tail)]
    assert run_cli("verify", work, "--quiet")[0] == 0
    monkeypatch.setattr(module, "replace_unit_rows", lambda *args: (_ for _ in ()).throw(KeyboardInterrupt()))
    assert reindex(work)[0] == 130  # interrupted after replacing every shard: the resumed run recognises them
    monkeypatch.undo()
    before = identities(work)
    status, out, err = reindex(work)
    assert status == 0, err
    assert f"0 shards indexed" not in out and identities(work) == before
    assert assert_rows_index_their_shards(work) == len(shard_bytes(work))
    assert [(key, [(m.name, m.size) for m in members]) for key, members in tar_samples(work / tail)] == old_samples
    assert index_of(work / tail)["reindexed_from"] == old_row["sha256"]
    assert keys_read(str(work / "manifest.json")) == [f"s{i:04d}" for i in range(300)]
    with RangeHTTPServer(tmp_path) as server:
        assert keys_read(server.url_of("older/manifest.json")) == [f"s{i:04d}" for i in range(300)]
    assert run_cli("verify", work, "--quiet")[0] == 0


def test_a_failure_at_the_moment_a_shard_is_replaced_loses_nothing(conversions, tmp_path, monkeypatch):
    """The new shard is renamed over the old one: when that rename fails, the old shard is still
    there, the manifest (written last) still lists it, and everything verifies."""
    native, current, older = conversions
    work = tmp_path / "older"
    shutil.copytree(older, work)
    victim = sorted(shard_bytes(work))[0]  # the first replaced: the manifest still matches every shard after it fails
    real_replace, real_remove = os.replace, os.remove

    def failing_replace(source, target, *args, **kwargs):
        if str(target).endswith(victim):
            raise OSError(errno.EIO, "injected failure at the rename")
        return real_replace(source, target, *args, **kwargs)

    removed = []
    monkeypatch.setattr(os, "replace", failing_replace)
    monkeypatch.setattr(os, "remove", lambda path, *a, **k: (removed.append(str(path)), real_remove(path, *a, **k)))
    status, _, err = reindex(work)
    monkeypatch.undo()
    assert status == 1 and len(err.strip().splitlines()) == 1 and victim in err and "injected" in err, err
    assert (work / victim).read_bytes() == (older / victim).read_bytes()
    assert (work / "manifest.json").read_bytes() == (older / "manifest.json").read_bytes()
    assert not list(work.glob("*.tmp")) and not any(path.endswith(".tar") for path in removed)
    assert run_cli("verify", work, "--quiet")[0] == 0
    status, _, err = reindex(work)  # and the next run finishes the work
    assert status == 0, err
    assert shard_bytes(work) == shard_bytes(current)


def test_the_lock_refusal_names_the_reindex_that_holds_the_directory(conversions, tmp_path, monkeypatch):
    import wdsprep.reindex as module

    native, current, older = conversions
    work = tmp_path / "older"
    shutil.copytree(older, work)
    real, refusals = module._reindex_shard, []

    def meanwhile(*args):
        if not refusals:  # while this reindex holds the directory: another reindex, a convert
            for command in (["reindex", str(work)], ["convert", "generic", str(native), str(work), "--shard-bytes", "200KB"]):
                refusals.append(subprocess.run([sys.executable, "-m", "wdsprep", *command, "--quiet"],
                                               capture_output=True, text=True, timeout=SUBPROCESS))
        return real(*args)

    monkeypatch.setattr(module, "_reindex_shard", meanwhile)
    status, _, err = reindex(work)
    assert status == 0, err
    for refused in refusals:
        assert refused.returncode == 1 and refused.stderr.strip().splitlines() == [
            f"wdsprep: error: {work}: output directory in use by another wdsprep reindex (pid {os.getpid()}); "
            "wait for it to finish or choose another output"], refused.stderr
