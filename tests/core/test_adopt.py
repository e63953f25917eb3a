"""`wdsprep index`: WebDataset tars nobody here wrote, adopted where they are (read-only), then read
through every wdsprep surface. The reference is plain webdataset reading the same tars (and
`tarfile`), the expected index field values are the ones the test wrote; the shards' folder is
read-only while it is indexed and byte-for-byte (and mode, and mtime) unchanged afterwards.
(Ranks, workers, resume and elastic resume on adopted shards: test_adopt_oracles.py; over HTTP
and S3: tests/objectstore/test_adopt_remote.py.)"""
import gzip
import json
import os
import pathlib
import shutil
import tarfile

import numpy as np
import pytest

import wdsprep
from wdsprep import adopt as adopt_module
from wdsprep.conformance import run_cli
from wdsprep.errors import ShardError

from .adoptdata import (WEBDATASET_TARS, flip_payload_byte, gnu_tar_shards, plain_samples, read_only,
                        shardwriter_shards, snapshot, tar_members, wdsprep_samples)
from .shardsets import write_counted_shards


def _index(*argv):
    status, out, err = run_cli("index", *map(str, argv), "--quiet")
    assert status == 0, err
    return out


def _stream(out, **options):
    return list(wdsprep.dataset(str(out), "train", shuffle_shards=False, shuffle_buffer=0, **options))


def _made(kind, directory):
    """Tars of one kind, in a folder of their own: (the folder, the tar paths in order)."""
    directory.mkdir()
    if kind == "shardwriter":
        return directory, shardwriter_shards(directory)
    if kind == "gnu-tar":
        tars = gnu_tar_shards(directory / "made")
        for name in tars:  # the tars alone in the folder (the tree they were made from stays outside)
            shutil.move(name, directory)
        shutil.rmtree(directory / "made")
        return directory, sorted(str(path) for path in directory.glob("*.tar"))
    tars = []
    for name in ("compressed.tar", "mpdata.tar"):  # webdataset's own test tars (different key sets)
        sub = directory / name.split(".")[0]
        sub.mkdir()
        shutil.copy(WEBDATASET_TARS / name, sub / name)
        tars.append(str(sub / name))
    with gzip.open(WEBDATASET_TARS / "sample.tgz") as packed:  # compressed as a whole: decompressed, as docs say
        (directory / "sample").mkdir()
        (directory / "sample" / "sample.tar").write_bytes(packed.read())
    tars.append(str(directory / "sample" / "sample.tar"))
    return directory, tars


@pytest.mark.parametrize("kind", ["shardwriter", "gnu-tar", "webdataset-testdata"])
def test_tars_nobody_here_wrote_are_adopted_read_only_and_read_as_plain_webdataset_reads_them(tmp_path, kind):
    folder, tars = _made(kind, tmp_path / "shards")
    splits = [tars] if kind == "shardwriter" else [[tar] for tar in tars]  # tars of the same (or unrelated) keys: one dataset each
    before = snapshot(folder)
    with read_only(folder):
        inside = snapshot(folder)
        for number, group in enumerate(splits):
            _index(*group, "--out", tmp_path / f"out{number}")
        assert snapshot(folder) == inside
    assert snapshot(folder) == before
    for number, group in enumerate(splits):
        out = tmp_path / f"out{number}"
        assert wdsprep.urls(str(out), "train") == group  # named by absolute path: OUT is elsewhere
        expected = plain_samples(group)
        assert expected, "plain webdataset finds samples"
        assert wdsprep_samples(_stream(out)) == expected
        shuffled = wdsprep_samples(wdsprep.dataset(str(out), "train", seed=3, shuffle_buffer=4))
        assert sorted(shuffled) == sorted(expected)
        mapped = wdsprep.MapDataset(str(out), "train", decode=False)
        assert [(mapped[i]["__key__"], {k: bytes(v) for k, v in mapped[i].items() if not k.startswith("__")})
                for i in range(len(mapped))] == expected


def test_gnu_tar_members_are_grouped_as_webdataset_groups_them(tmp_path):
    """The long names, the multi-dot name, the links, the name without a dot and the metadata member
    of GNU tar's archives: the keys and fields plain webdataset gives, checked against tarfile too."""
    tars = gnu_tar_shards(tmp_path)
    for tar in tars:
        _index(tar, "--out", tmp_path / f"out-{pathlib.Path(tar).stem}")
        got = dict(wdsprep_samples(_stream(tmp_path / f"out-{pathlib.Path(tar).stem}")))
        members = dict(tar_members(tar))
        long_key = next(key for key in got if key.endswith("n" * 40))
        assert len(long_key) > 100 and got[long_key]["seg.png"] == members[long_key + ".seg.png"]
        assert got["./a/x"] == {"txt": members["./a/x.txt"], "y.z.bin": members["./a/x.y.z.bin"]}
        assert set(got["./b/000"]) == {"cls", "json.gz"} and "./b/002" not in got  # the symlink: skipped
        assert "./c/zz" not in got and got["./c/k"] == {"only": b""}  # the hard link skipped, an empty member kept
        assert not any("README" in key or "__meta__" in key for key in got)


def test_decode_gives_what_webdatasets_decoders_give_and_leaves_the_rest_as_bytes(tmp_path):
    import webdataset as wds

    tars = shardwriter_shards(tmp_path / "shards", count=9)
    _index(tmp_path / "shards", "--out", tmp_path / "out")
    decoded = list(wdsprep.dataset(str(tmp_path / "out"), "train", shuffle_shards=False).compose(wdsprep.decode()))
    reference = {s["__key__"]: s for s in wds.WebDataset(tars, shardshuffle=False).decode("rgb8")}
    assert len(decoded) == len(reference) == 9
    for sample in decoded:
        ref = reference[sample["__key__"]]
        assert set(sample) == set(ref) - {"__url__", "__local_path__"}
        assert sample["cls"] == ref["cls"] and sample["json"] == ref["json"] and sample["txt"] == ref["txt"]
        assert np.array_equal(sample["npy"], ref["npy"])
        assert sample["png"].dtype == ref["png"].dtype == np.uint8 and np.array_equal(sample["png"], ref["png"])
    plain = [{k: v for k, v in s.items() if not k.startswith("__url")} for s in wds.WebDataset(tars, shardshuffle=False).decode("rgb8")]
    composed = list(wdsprep.dataset(str(tmp_path / "out"), "train", shuffle_shards=False, shuffle_buffer=0).decode("rgb8"))
    assert len(composed) == len(plain) == 9  # webdataset's own .decode() composes on top
    for mine, theirs in zip(composed, plain):
        assert mine["__key__"] == theirs["__key__"] and np.array_equal(mine["png"], theirs["png"])
        assert mine["json"] == theirs["json"] and mine["cls"] == theirs["cls"] and np.array_equal(mine["npy"], theirs["npy"])
    compressed = tmp_path / "compressed"
    compressed.mkdir()
    shutil.copy(WEBDATASET_TARS / "compressed.tar", compressed)
    _index(compressed / "compressed.tar", "--out", tmp_path / "out-gz")
    first = next(iter(wdsprep.dataset(str(tmp_path / "out-gz"), "train", shuffle_shards=False).compose(wdsprep.decode())))
    assert first == {"__key__": "compressed/0001", "txt.gz": gzip.decompress(dict(tar_members(compressed / "compressed.tar"))["compressed/0001.txt.gz"]).decode()}


def test_index_fields_select_samples_by_the_values_the_tars_hold(tmp_path):
    shardwriter_shards(tmp_path / "shards")  # sample i: cls i % 4, json label i % 5, txt "caption i"
    _index(tmp_path / "shards", "--out", tmp_path / "out", "--index-fields", "cls,json.label,txt")
    keys = {i: (f"group{i % 3}/s{i:04d}" if i % 3 == 0 else f"s{i:04d}") for i in range(30)}

    def selected(expression):
        return sorted(s["__key__"] for s in wdsprep.dataset(str(tmp_path / "out"), "train", select=expression))

    assert selected("cls == 2") == sorted(keys[i] for i in range(30) if i % 4 == 2)
    assert selected("json.label >= 3 and cls != 0") == sorted(keys[i] for i in range(30) if i % 5 >= 3 and i % 4)
    assert selected("txt == 'caption 7'") == [keys[7]]
    mapped = wdsprep.MapDataset(str(tmp_path / "out"), "train", decode=False)
    assert bytes(mapped.get(keys[12])["txt"]) == b"caption 12"
    assert [s["__key__"] for s in wdsprep.MapDataset(str(tmp_path / "out"), "train", select="cls == 3")] == \
        [keys[i] for i in range(30) if i % 4 == 3]


def test_a_mix_of_an_adopted_and_a_converted_dataset_reads_each_part_whole(tmp_path):
    shardwriter_shards(tmp_path / "shards", count=12, maxcount=5)
    _index(tmp_path / "shards", "--out", tmp_path / "out")
    converted = write_counted_shards(tmp_path / "converted", [3, 4])
    mix = wdsprep.mix([wdsprep.Part(str(tmp_path / "out"), name="adopted"), wdsprep.Part(converted, name="converted")],
                      mode="epochized", seed=5)
    got = [(sample["__part__"], sample["__key__"]) for sample in mix]
    adopted_keys = [key for key, _ in plain_samples(sorted(map(str, (tmp_path / "shards").glob("*.tar"))))]
    assert sorted(key for part, key in got if part == "adopted") == sorted(adopted_keys)
    assert sorted(key for part, key in got if part == "converted") == sorted(
        f"s{shard:02d}x{i:02d}" for shard, count in enumerate([3, 4]) for i in range(count))


def test_show_draws_an_adopted_dataset_and_verify_passes_it(tmp_path):
    pytest.importorskip("PIL")
    shardwriter_shards(tmp_path / "shards", count=8)
    _index(tmp_path / "shards", "--out", tmp_path / "out")
    status, out, err = run_cli("show", tmp_path / "out", "--out", tmp_path / "report.html", "--samples", "3", "--quiet")
    assert status == 0 and err == "", err
    page = (tmp_path / "report.html").read_text()
    assert page.count("data:image/png") >= 3 and "webdataset" in page
    status, out, err = run_cli("verify", tmp_path / "out", "--quiet")
    assert status == 0, err


def test_a_flipped_payload_byte_is_a_shard_error_naming_the_shard_before_a_wrong_sample(tmp_path):
    tars = shardwriter_shards(tmp_path / "shards", count=14)
    _index(tmp_path / "shards", "--out", tmp_path / "out")
    expected = plain_samples(tars)
    victim = tars[1]
    key, fields = plain_samples([victim])[3]
    flip_payload_byte(victim, fields["txt"])  # size and mtime kept: only the member's digest can tell
    yielded, error = [], None
    try:
        for sample in wdsprep.dataset(str(tmp_path / "out"), "train", shuffle_shards=False, shuffle_buffer=0):
            yielded.append(sample)
    except ShardError as caught:
        error = caught
    assert error is not None and victim in str(error) and f"{key}.txt" in str(error) and "\n" not in str(error)
    assert wdsprep_samples(yielded) == expected[: len(yielded)] and len(yielded) < expected.index((key, fields)) + 1
    position = [k for k, _ in expected].index(key)
    with pytest.raises(ShardError, match=victim):
        wdsprep.MapDataset(str(tmp_path / "out"), "train", decode=False)[position]
    status, _, err = run_cli("verify", tmp_path / "out", "--quiet")
    assert status == 1 and victim in err


@pytest.mark.parametrize("change", ["same size", "longer"])
def test_a_shard_replaced_after_indexing_is_refused_in_one_line_before_any_of_its_samples(tmp_path, change):
    tars = shardwriter_shards(tmp_path / "shards", count=14)
    _index(tmp_path / "shards", "--out", tmp_path / "out")
    victim = pathlib.Path(tars[0])
    data = bytearray(victim.read_bytes())
    if change == "longer":
        data += b"\0" * 10240
    replacement = tmp_path / "replacement.tar"
    replacement.write_bytes(bytes(data))  # the same samples: only its identity changed
    os.replace(replacement, victim)
    with pytest.raises(ShardError) as raised:
        next(iter(wdsprep.dataset(str(tmp_path / "out"), "train", shuffle_shards=False)))
    line = str(raised.value)
    assert str(victim) in line and "\n" not in line and ("indexed" in line or "manifest says" in line)
    with pytest.raises(ShardError, match=str(victim)):
        wdsprep.MapDataset(str(tmp_path / "out"), "train")[0]


def _bad_tars(tmp_path, server_url=None):
    good = shardwriter_shards(tmp_path / "good", count=6, maxcount=3)
    not_a_tar = tmp_path / "notatar.tar"
    not_a_tar.write_bytes(os.urandom(3000))
    truncated = tmp_path / "truncated.tar"
    whole = pathlib.Path(good[0]).read_bytes()
    truncated.write_bytes(whole[: len(whole) // 2 + 100])
    twice = tmp_path / "twice.tar"
    with tarfile.open(twice, "w") as archive:
        for name in ("a.txt", "b.txt", "a.cls"):  # key a in two places of the shard
            info = tarfile.TarInfo(name)
            info.size = 1
            archive.addfile(info, __import__("io").BytesIO(b"1"))
    across = tmp_path / "across"
    across.mkdir()
    shutil.copy(good[0], across / "one.tar")
    shutil.copy(good[0], across / "two.tar")  # the same keys in two shards
    compressed = WEBDATASET_TARS / "sample.tgz"
    return {"not a tar": ([not_a_tar], not_a_tar, "not a tar"), "truncated": ([truncated], truncated, "truncated"),
            "key twice in a shard": ([twice], twice, "two places"),
            "key in two shards": ([across / "one.tar", across / "two.tar"], across / "two.tar", "also in"),
            "compressed as a whole": ([good[1], compressed], compressed, "compressed as a whole")}


@pytest.mark.parametrize("case", ["not a tar", "truncated", "key twice in a shard", "key in two shards",
                                  "compressed as a whole", "no such file"])
def test_bad_input_is_one_line_naming_the_file_and_nothing_is_written(tmp_path, case):
    if case == "no such file":
        shards, named, words = [tmp_path / "absent.tar"], tmp_path / "absent.tar", "no such file"
    else:
        shards, named, words = _bad_tars(tmp_path)[case]
    status, out, err = run_cli("index", *shards, "--out", tmp_path / "out", "--quiet")
    lines = err.strip().splitlines()
    assert status == 1 and len(lines) == 1 and str(named) in lines[0] and words in lines[0], err
    assert not (tmp_path / "out").exists()


def test_an_interrupted_index_resumes_from_its_journal_and_writes_what_a_fresh_run_writes(tmp_path, monkeypatch):
    tars = shardwriter_shards(tmp_path / "shards", count=20, maxcount=4)
    real = adopt_module.scan_shard
    journal = tmp_path / "out" / adopt_module.JOURNAL
    monkeypatch.setattr(adopt_module, "scan_shard", _interrupted_after(3, real))
    with pytest.raises(KeyboardInterrupt):
        adopt_module.adopt([str(tmp_path / "shards")], str(tmp_path / "out"), workers=1)
    assert journal.exists() and not (tmp_path / "out" / "manifest.json").exists()
    with open(journal, "r+b") as file:  # the last record cut, as by a crash while it was written
        file.truncate(journal.stat().st_size - 9)
    monkeypatch.setattr(adopt_module, "scan_shard", _interrupted_after(2, real))
    with pytest.raises(KeyboardInterrupt):  # a second interruption: 2 whole records + 2 more
        adopt_module.adopt([str(tmp_path / "shards")], str(tmp_path / "out"), workers=1)
    monkeypatch.setattr(adopt_module, "scan_shard", real)
    report = adopt_module.adopt([str(tmp_path / "shards")], str(tmp_path / "out"), workers=2)
    assert report.reused == 4 and report.shards == len(tars)
    assert not journal.exists()
    adopt_module.adopt([str(tmp_path / "shards")], str(tmp_path / "fresh"), workers=2)
    for name in ("train.index", "train.samples", "train.shards"):
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "fresh" / name).read_bytes(), name
    # a journal of other shards (or another split, or other fields) is started again, not reused
    monkeypatch.setattr(adopt_module, "scan_shard", _interrupted_after(1, real))
    with pytest.raises(KeyboardInterrupt):
        adopt_module.adopt(tars[:3], str(tmp_path / "other"), workers=1)
    assert (tmp_path / "other" / adopt_module.JOURNAL).exists()
    monkeypatch.setattr(adopt_module, "scan_shard", real)
    assert adopt_module.adopt(tars[:2], str(tmp_path / "other"), workers=1).reused == 0


def _interrupted_after(count, real):
    """`scan_shard` that scans `count` shards, then is interrupted (Ctrl-C)."""
    scanned = []

    def scan(url, *args, **kwargs):
        if len(scanned) == count:
            raise KeyboardInterrupt
        scanned.append(url)
        return real(url, *args, **kwargs)

    return scan


def test_a_second_split_is_added_beside_the_first(tmp_path):
    shardwriter_shards(tmp_path / "train", count=8, maxcount=3, tag="t")
    shardwriter_shards(tmp_path / "valid", count=5, maxcount=3, tag="v")
    _index(tmp_path / "train", "--out", tmp_path / "out")
    _index(tmp_path / "valid", "--out", tmp_path / "out", "--split", "valid")
    for split, count in (("train", 8), ("valid", 5)):
        assert len(list(wdsprep.dataset(str(tmp_path / "out"), split))) == count
    status, _, err = run_cli("inspect", tmp_path / "out")
    assert status == 0, err


def test_shards_below_out_are_named_relative_to_it(tmp_path):
    tars = shardwriter_shards(tmp_path / "data" / "shards", count=6, maxcount=3)
    _index(tmp_path / "data" / "shards", "--out", tmp_path / "data")
    rows = json.loads((tmp_path / "data" / "manifest.json").read_text())["splits"]["train"]["shards"]
    assert [row["name"] for row in rows] == [f"shards/{pathlib.Path(tar).name}" for tar in tars]
    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "data", moved, copy_function=shutil.copy2)  # mtimes kept: the same files
    assert wdsprep_samples(_stream(moved)) == plain_samples(sorted(str(p) for p in (moved / "shards").glob("*.tar")))


@pytest.mark.parametrize("name", ["../escape.txt", "/etc/abs.txt", "ok/../../up.txt", "a.__key__"])
def test_a_member_named_as_a_path_out_of_the_archive_is_refused_in_one_line(tmp_path, name):
    tar = tmp_path / "hostile.tar"
    with tarfile.open(tar, "w", format=tarfile.GNU_FORMAT) as archive:
        for member in ("fine.txt", name):
            info = tarfile.TarInfo(member)
            info.size = 2
            archive.addfile(info, __import__("io").BytesIO(b"hi"))
    status, _, err = run_cli("index", tar, "--out", tmp_path / "out", "--quiet")
    lines = err.strip().splitlines()
    assert status == 1 and len(lines) == 1 and str(tar) in lines[0] and repr(name) in lines[0], err
    assert not (tmp_path / "out").exists()


def test_an_adopted_dataset_whose_rows_live_in_the_shard_table_only_reads_the_same(tmp_path, monkeypatch):
    """Past 1,000 shards a manifest keeps its rows in the shard tables only (version 2): the rows of an
    adopted dataset come from the table's columns and extras, their index file resolved on load."""
    from wdsprep.shards.manifest import Manifest

    tars = shardwriter_shards(tmp_path / "shards", count=17, maxcount=3)
    write = Manifest.write
    monkeypatch.setattr(Manifest, "write", lambda self, store, inline_shards=0: write(self, store, 0))
    _index(tmp_path / "shards", "--out", tmp_path / "out", "--index-fields", "cls")
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["manifest_version"] == 2 and manifest["splits"]["train"]["shards"] == len(tars)
    expected = plain_samples(tars)
    assert wdsprep_samples(_stream(tmp_path / "out")) == expected
    mapped = wdsprep.MapDataset(str(tmp_path / "out"), "train", decode=False)
    assert [mapped[i]["__key__"] for i in range(len(mapped))] == [key for key, _ in expected]
    assert sorted(s["__key__"] for s in wdsprep.dataset(str(tmp_path / "out"), "train", select="cls == 1")) == \
        sorted(key for key, fields in expected if fields["cls"] == b"1")
    status, _, err = run_cli("verify", tmp_path / "out", "--quiet")
    assert status == 0, err


@pytest.mark.parametrize("field, value", [("index_bytes", 10**12), ("index_offset", 10**12), ("data_end", 10**9),
                                          ("index_file", "../x.index"), ("name", "../../etc/passwd")])
def test_an_adopted_row_that_points_outside_its_files_is_refused_on_load(tmp_path, field, value):
    shardwriter_shards(tmp_path / "shards", count=6, maxcount=3)
    _index(tmp_path / "shards", "--out", tmp_path / "out")
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    manifest["splits"]["train"]["shards"][1][field] = value
    (tmp_path / "out" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(wdsprep.ManifestError) as raised:
        wdsprep.dataset(str(tmp_path / "out"), "train")
    assert "manifest.json" in str(raised.value) and field in str(raised.value) and "\n" not in str(raised.value)


def test_an_adopted_dataset_is_not_uploaded_but_indexed_where_it_goes(tmp_path):
    shardwriter_shards(tmp_path / "shards", count=4, maxcount=2)
    _index(tmp_path / "shards", "--out", tmp_path / "out")
    status, _, err = run_cli("upload", tmp_path / "out", tmp_path / "elsewhere", "--quiet")
    lines = err.strip().splitlines()
    assert status == 1 and len(lines) == 1 and "wdsprep index" in lines[0] and not (tmp_path / "elsewhere").exists(), err
