"""The per-split sample table a conversion writes beside its manifest (`<split>.samples`), from outside.

Conversions run through `wdsprep pipeline` (the spec names `index_fields`) and `wdsprep convert`;
the table is read back with `msgpack` and `struct` alone (`conformance.read_sample_table`), and
judged against the keys `tarfile` finds in the shards (manifest order) and the values the test
itself wrote into the input. The table's bytes must not depend on the worker count, nor on whether a
conversion ran in one go or was resumed; `verify` checks it, `reindex` gives an older conversion one,
`upload` takes it along before the manifest; a bad field or a manifest naming a file elsewhere is
one line.
"""
from __future__ import annotations

import hashlib
import json
import math
import shutil

import msgpack
import numpy as np
import pytest
import zstandard

import wdsprep
from wdsprep.errors import ManifestError, UploadError
from wdsprep.conformance import read_manifest, read_sample_table, run_cli, shard_bytes

from .selectdata import FIELDS, convert_with_fields, field_of, shard_keys
from .shardsets import journal_records, make_older, write_older_journal


@pytest.fixture(scope="module")
def labelled(labelled_conversion):
    """(input folder, its values, the output of one conversion with FIELDS and --workers 1)."""
    return labelled_conversion


def tables_of(output) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(output.glob("*.samples"))}


def expected_column(values: dict, keys: list[str], name: str) -> list:
    field = name.removeprefix("meta.")
    return [field_of(values[key], field) for key in keys]


def test_the_table_lists_every_key_in_manifest_order_with_the_inputs_values(labelled):
    native, values, output = labelled
    manifest = read_manifest(output)
    assert sorted(manifest["tables"]["sample_tables"]) == ["train", "valid"]
    for split in ("train", "valid"):
        keys, fields = read_sample_table(output, split)
        assert keys == [key for shard in shard_keys(output, split) for key in shard]
        assert len(keys) == len(values[split]) and len(shard_keys(output, split)) > 2
        assert sorted(fields) == sorted(FIELDS)
        for name in FIELDS:
            assert fields[name] == expected_column(values[split], keys, name), (split, name)
        assert {type(v) for v in fields["meta.flag"]} == {bool} and {type(v) for v in fields["meta.score"]} == {float}


def test_the_table_bytes_do_not_depend_on_the_worker_count(labelled, tmp_path):
    native, _, output = labelled
    for workers in (2, 3):
        status, _, err = convert_with_fields(native, tmp_path / f"w{workers}", workers=workers)
        assert status == 0, err
        assert len(tables_of(output)) == 2 and tables_of(tmp_path / f"w{workers}") == tables_of(output), workers
        assert read_manifest(tmp_path / f"w{workers}")["tables"] == read_manifest(output)["tables"]


def test_a_resumed_conversion_writes_the_same_table_as_one_in_a_single_go(labelled, tmp_path):
    """One unit fails (a broken input file), the rest are journaled; the file repaired, the re-run
    reuses them (their keys and values from `_units.json`) and writes the table of a fresh run, with
    values that a careless journal would change (1/3, a subnormal, -0.0, a 60-bit integer, text)."""
    native, values, _ = labelled
    copy = tmp_path / "in"
    shutil.copytree(native, copy)
    awkward = {"k004": 1 / 3, "k010": 5e-324, "k020": -0.0, "k030": 1.7976931348623157e308}
    for key, score in awkward.items():
        meta = dict(values["train"][key], score=score, tag="naïve ∑ \"quoted\"", rare=2**60 + 1)
        (copy / "train" / f"{key}.meta.json").write_text(json.dumps(meta))
    fresh = tmp_path / "fresh"
    assert convert_with_fields(copy, fresh)[0] == 0
    broken = copy / "train" / "k040.meta.json"
    good = broken.read_bytes()
    broken.write_text("{not json")
    resumed = tmp_path / "resumed"
    status, _, err = convert_with_fields(copy, resumed, workers=2)
    assert status == 1 and "k040.meta.json" in err and not (resumed / "manifest.json").exists()
    assert not list(resumed.glob("*.samples")), "a table written before the manifest of a failed run"
    broken.write_bytes(good)
    status, _, err = convert_with_fields(copy, resumed, workers=2)
    assert status == 0, err
    manifest = read_manifest(resumed)
    assert manifest["timing"]["units_reused"] > 0 and manifest["timing"]["units_built"] > 0
    assert tables_of(resumed) == tables_of(fresh)
    assert manifest["tables"] == read_manifest(fresh)["tables"]
    keys, fields = read_sample_table(resumed, "train")
    at = {key: i for i, key in enumerate(keys)}
    for key, score in awkward.items():
        got = fields["meta.score"][at[key]]
        assert got == score and math.copysign(1, got) == math.copysign(1, score), key
        assert (fields["meta.rare"][at[key]], fields["meta.tag"][at[key]]) == (2**60 + 1, "naïve ∑ \"quoted\""), key


def test_other_index_fields_rebuild_the_units_into_the_same_shards(labelled, tmp_path):
    native, values, output = labelled
    work = tmp_path / "out"
    shutil.copytree(output, work)
    status, _, err = convert_with_fields(native, work, fields=["meta.label"])
    assert status == 0, err
    manifest = read_manifest(work)
    assert manifest["timing"]["units_reused"] == 0 and shard_bytes(work) == shard_bytes(output)
    keys, fields = read_sample_table(work, "train")
    assert list(fields) == ["meta.label"] and fields["meta.label"] == expected_column(values["train"], keys, "meta.label")
    assert convert_with_fields(native, work, fields=["meta.label"])[0] == 0
    assert read_manifest(work)["timing"]["units_built"] == 0  # the same fields again: every unit reused


def test_a_journal_of_a_wdsprep_without_tables_rebuilds_its_units(labelled, tmp_path):
    native, _, output = labelled
    work = tmp_path / "out"
    shutil.copytree(output, work)
    head, records = journal_records(work)
    for record in records:
        del record["samples"]
    write_older_journal(work, head, records)
    assert convert_with_fields(native, work)[0] == 0
    assert read_manifest(work)["timing"]["units_reused"] == 0
    assert tables_of(work) == tables_of(output) and shard_bytes(work) == shard_bytes(output)


def test_without_index_fields_the_sources_defaults_or_keys_only(labelled, tmp_path):
    """generic declares no default field: `wdsprep convert` writes tables of keys; an empty list too."""
    native, _, output = labelled
    status, _, err = run_cli("convert", "generic", native, tmp_path / "plain", "--shard-bytes", "16KB", "--quiet")
    assert status == 0, err
    assert convert_with_fields(native, tmp_path / "empty", fields=[])[0] == 0
    for out in (tmp_path / "plain", tmp_path / "empty"):
        keys, fields = read_sample_table(out, "train")
        assert fields == {} and keys == read_sample_table(output, "train")[0]
        assert shard_bytes(out) == shard_bytes(output)


@pytest.mark.parametrize("fields, named", [
    (["meta.1st"], "--index-fields: 'meta.1st' is not a field name"),
    (["meta.label", "meta.label"], "--index-fields: 'meta.label' is named twice"),
    (["array"], "sample 'k000': index field 'array' is ndarray, not a number, bool or string"),
])
def test_a_bad_index_field_is_one_line_and_nothing_is_written(labelled, tmp_path, fields, named):
    native, _, _ = labelled
    output = tmp_path / "out"
    status, _, err = convert_with_fields(native, output, fields=fields)
    assert status == 1 and named in err, err
    assert [line for line in err.splitlines() if line.startswith("wdsprep: error:")] == [err.splitlines()[0]]
    assert not (output / "manifest.json").exists() and not list(output.glob("*.samples"))


def test_a_field_of_strings_and_numbers_is_one_line_naming_it(labelled, tmp_path):
    native, values, _ = labelled
    copy = tmp_path / "in"
    shutil.copytree(native, copy)
    (copy / "valid" / "k003.meta.json").write_text(json.dumps(dict(values["valid"]["k003"], label="three")))
    status, _, err = convert_with_fields(copy, tmp_path / "out")
    assert status == 1 and "index field 'meta.label' mixes strings and numbers" in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "manifest.json").exists() and not list((tmp_path / "out").glob("*.samples"))


def test_a_field_no_sample_holds_is_said_and_left_out(labelled, tmp_path):
    native, _, _ = labelled
    status, _, err = convert_with_fields(native, tmp_path / "out", fields=["meta.label", "meta.nothing"])
    assert status == 0
    assert "wdsprep: warning: index field 'meta.nothing' is in no sample of any split: it is not indexed" in err
    assert list(read_sample_table(tmp_path / "out", "train")[1]) == ["meta.label"]
    with pytest.raises(wdsprep.ConfigError, match=r"field 'meta.nothing' is not indexed in this split \(indexed fields: meta.label\)"):
        wdsprep.dataset(str(tmp_path / "out"), "train", select="meta.nothing == 1")


@pytest.mark.parametrize("entry, problem", [
    ({"file": "../train.samples"}, "file must be 'train.samples'"),
    ({"file": "valid.samples"}, "file must be 'train.samples'"),
    ({"sha256": "x" * 64}, "sha256: expected 64 lowercase hex digits"),
    ({"bytes": -1}, "bytes: expected a non-negative integer"),
])
def test_a_manifest_whose_table_record_points_elsewhere_is_refused(labelled, tmp_path, entry, problem):
    _, _, output = labelled
    work = tmp_path / "out"
    shutil.copytree(output, work)
    manifest = read_manifest(work)
    manifest["tables"]["sample_tables"]["train"].update(entry)
    (work / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match=rf"tables\.sample_tables\.train: {problem}"):
        wdsprep.dataset(str(work), "train")


def test_verify_checks_the_tables_bytes_and_its_keys_against_the_shards(labelled, tmp_path):
    _, _, output = labelled
    work = tmp_path / "out"
    shutil.copytree(output, work)
    assert run_cli("verify", work, "--quiet")[0] == 0
    table = work / "valid.samples"
    data = bytearray(table.read_bytes())
    data[len(data) // 2] ^= 1
    table.write_bytes(bytes(data))
    status, out, err = run_cli("verify", work, "--quiet")
    assert status == 1 and "1 bad" in out, out + err
    assert err.strip().splitlines() == [f"BAD {work}/valid.samples: sample table does not match the manifest (size or sha256)"]
    # a table of the same keys in another order, recorded with its own sha256: its keys are compared
    shutil.copy(output / "valid.samples", table)
    stored = msgpack.unpackb(zstandard.decompress((output / "valid.samples").read_bytes()), raw=False)
    keys, _ = read_sample_table(output, "valid")
    swapped = [keys[1], keys[0], *keys[2:]]
    stored["keys"] = "".join(swapped).encode()
    stored["key_ends"] = np.cumsum([len(k) for k in swapped]).astype("<u8").tobytes()
    packed = zstandard.compress(msgpack.packb(stored, use_bin_type=True))
    table.write_bytes(packed)
    manifest = read_manifest(work)
    manifest["tables"]["sample_tables"]["valid"].update(bytes=len(packed), sha256=hashlib.sha256(packed).hexdigest())
    (work / "manifest.json").write_text(json.dumps(manifest))
    status, out, err = run_cli("verify", work, "--quiet")
    assert status == 1
    assert err.strip().splitlines() == [
        f"BAD {work}/valid.samples: sample 0 of split 'valid' is {keys[1]!r} in the sample table, {keys[0]!r} in the shards"]


def _rewritten(work, split: str, edit) -> None:
    """`edit(stored)` the split's table as msgpack, written back with its size and sha256 recorded
    in the manifest anew: an edit only the shards themselves can tell."""
    stored = msgpack.unpackb(zstandard.decompress((work / f"{split}.samples").read_bytes()), raw=False)
    edit(stored)
    packed = zstandard.compress(msgpack.packb(stored, use_bin_type=True))
    (work / f"{split}.samples").write_bytes(packed)
    manifest = read_manifest(work)
    manifest["tables"]["sample_tables"][split].update(bytes=len(packed), sha256=hashlib.sha256(packed).hexdigest())
    (work / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("name", ["meta.label", "meta.tag", "meta.score", "meta.flag", "meta.rare"])
def test_verify_checks_each_rows_field_values_against_the_shards(labelled, tmp_path, name):
    """A table edited consistently (a field's values shifted by one sample, its size and sha256
    recorded in the manifest) selected the wrong samples and `verify` said 0 bad: now one BAD line
    names the table, the first sample whose value differs from its shard's (the input's own value
    here) and the field."""
    _, values, output = labelled
    work = tmp_path / "out"
    shutil.copytree(output, work)
    keys, _ = read_sample_table(output, "valid")
    field = name.removeprefix("meta.")
    column = [field_of(values["valid"][key], field) for key in keys]  # the input's values (-1: no rare), in table order

    def shift(stored):
        entry = stored["fields"][name]
        if "codes" in entry:
            codes = np.frombuffer(entry["codes"], "<u4")
            entry["codes"] = np.roll(codes, 1).tobytes()
        else:
            data = np.frombuffer(entry["data"], entry["dtype"])
            entry["data"] = np.roll(data, 1).tobytes()

    _rewritten(work, "valid", shift)
    shifted = [column[-1], *column[:-1]]
    at = next(i for i, (a, b) in enumerate(zip(shifted, column)) if a != b)
    selected = [s["__key__"] for s in wdsprep.dataset(str(work), "valid", select=f"{name} == {shifted[at]!r}",
                                                      shuffle_shards=False)]
    assert keys[at] in selected  # the edit is what a selection sees
    status, out, err = run_cli("verify", work, "--quiet")
    assert status == 1 and "1 bad" in out, out + err
    assert err.strip().splitlines() == [
        f"BAD {work}/valid.samples: sample {at} ({keys[at]!r}) of split 'valid': field {name!r} is "
        f"{shifted[at]!r} in the sample table, {column[at]!r} in the shards"]


def test_verify_names_a_field_the_shards_do_not_hold_and_one_of_another_kind(labelled, tmp_path):
    _, _, output = labelled
    work = tmp_path / "out"
    shutil.copytree(output, work)
    keys, _ = read_sample_table(output, "valid")

    def add_field(stored):
        stored["fields"]["meta.ghost"] = {"dtype": "<i8", "data": np.arange(len(keys), dtype="<i8").tobytes()}

    _rewritten(work, "valid", add_field)
    manifest = read_manifest(work)
    manifest["tables"]["sample_tables"]["valid"]["fields"].append("meta.ghost")
    (work / "manifest.json").write_text(json.dumps(manifest))
    status, out, err = run_cli("verify", work, "--quiet")
    assert status == 1 and err.strip().splitlines() == [
        f"BAD {work}/valid.samples: field 'meta.ghost' of split 'valid' is in the sample table, but no sample of "
        "the shards holds it"], out + err

    shutil.rmtree(work)
    shutil.copytree(output, work)

    def labels_as_floats(stored):
        entry = stored["fields"]["meta.label"]
        entry.update(dtype="<f8", data=np.frombuffer(entry["data"], "<i8").astype("<f8").tobytes())

    _rewritten(work, "valid", labels_as_floats)
    status, out, err = run_cli("verify", work, "--quiet")
    assert status == 1 and err.strip().splitlines() == [
        f"BAD {work}/valid.samples: field 'meta.label' of split 'valid' holds numbers in the sample table, "
        "integers in the shards"], out + err


def test_verify_says_when_the_source_that_derives_the_values_is_not_loaded(labelled, tmp_path):
    """The values are derived with the manifest's source (`Source.index_values`), loaded through the
    plugin gate: a manifest naming a plugin that is not allowed leaves them unchecked, in one warning
    line (keys and bytes are still checked); `--plugin` naming it asks for it, and one that cannot be
    loaded is an error."""
    _, _, output = labelled
    work = tmp_path / "out"
    shutil.copytree(output, work)
    manifest = read_manifest(work)
    manifest["source"] = "nosuch_plugin_module:SOURCE"
    (work / "manifest.json").write_text(json.dumps(manifest))
    status, out, err = run_cli("verify", work, "--quiet")
    assert status == 0 and "0 bad" in out, out + err
    assert err.strip().splitlines() == [
        "wdsprep: warning: the manifest names source 'nosuch_plugin_module:SOURCE', which is not built in, registered "
        "or an installed 'wdsprep.sources' entry point, so it was not loaded (data never chooses the code wdsprep "
        "runs); to use it: --plugin nosuch_plugin_module:SOURCE (or wdsprep.register_source('nosuch_plugin_module:SOURCE'))"
        "; the sample tables' field values are not checked against the shards"]
    status, out, err = run_cli("verify", work, "--quiet", "--plugin", "nosuch_plugin_module:SOURCE")
    assert status == 1 and err.strip().splitlines() == [
        "wdsprep: error: cannot load source plugin 'nosuch_plugin_module:SOURCE': No module named 'nosuch_plugin_module'"]


def test_reindex_gives_an_older_conversion_tables_of_keys(labelled, tmp_path):
    _, _, output = labelled
    work = tmp_path / "older"
    shutil.copytree(output, work)
    make_older(work)
    assert not list(work.glob("*.samples"))
    status, out, err = run_cli("reindex", work, "--quiet")
    assert status == 0, err
    assert "2 sample tables written (keys only)" in out
    for split in ("train", "valid"):
        keys, fields = read_sample_table(work, split)
        assert keys == [key for shard in shard_keys(work, split) for key in shard] and fields == {}
    assert run_cli("verify", work, "--quiet")[0] == 0
    kept = [s["__key__"] for s in wdsprep.dataset(str(work), "train", keys=["k007", "k003"], shuffle_shards=False)]
    assert kept == ["k003", "k007"]
    with pytest.raises(wdsprep.ConfigError, match=r"not indexed in this split \(indexed fields: none\)"):
        wdsprep.dataset(str(work), "train", select="meta.label == 1")
    before = tables_of(work)
    status, out, _ = run_cli("reindex", work, "--quiet")  # again: nothing to write
    assert status == 0 and "sample tables written" not in out and tables_of(work) == before


def test_upload_takes_the_tables_along_checked(labelled, tmp_path):
    _, values, output = labelled
    destination = tmp_path / "copy"
    report = wdsprep.upload.upload(str(output), f"file://{destination}", workers=2)
    assert report.tables == ["train.samples", "train.shards", "valid.samples", "valid.shards"] and report.manifest_written
    assert tables_of(destination) == tables_of(output)
    kept = [s["__key__"] for s in wdsprep.dataset(f"file://{destination}/manifest.json", "train",
                                                  select="meta.label == 2", shuffle_shards=False)]
    assert kept == [key for key, meta in values["train"].items() if meta["label"] == 2]
    # a local table that does not match its manifest record is refused, and no manifest goes up
    broken = tmp_path / "broken"
    shutil.copytree(output, broken)
    data = bytearray((broken / "train.samples").read_bytes())
    data[-1] ^= 1
    (broken / "train.samples").write_bytes(bytes(data))
    with pytest.raises(UploadError, match=r"train.samples: local sample table does not match its manifest row"):
        wdsprep.upload.upload(str(broken), f"file://{tmp_path / 'elsewhere'}", workers=1, retries=0)
    assert not (tmp_path / "elsewhere" / "manifest.json").exists()


def _plant_table(work, split, data):
    """`data` as the split's table, recorded in the manifest with its own size and sha256 (a hostile
    dataset is consistent with itself)."""
    (work / f"{split}.samples").write_bytes(data)
    manifest = read_manifest(work)
    manifest["tables"]["sample_tables"][split].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    (work / "manifest.json").write_text(json.dumps(manifest))


def _table_of(keys, **changes):
    ends = np.cumsum([len(k) for k in keys]).astype("<u8").tobytes()
    table = {"format": "wdsprep-samples/1", "split": "valid", "count": len(keys), "keys": b"".join(keys),
             "key_ends": ends, "fields": {}, **changes}
    return zstandard.compress(msgpack.packb(table, use_bin_type=True))


@pytest.mark.parametrize("case", ["bomb", "garbage", "plain msgpack", "count", "ends backwards", "not utf-8"])
def test_a_hostile_table_is_one_line_in_bounded_memory(labelled, tmp_path, case):
    """A table that inflates far beyond what 11 samples need (a 256 MB zstd bomb) is refused after at
    most its bound is read; a broken one is one `ManifestError` line naming it."""
    import tracemalloc

    _, _, output = labelled
    work = tmp_path / "out"
    shutil.copytree(output, work)
    keys = [key.encode() for key in read_sample_table(output, "valid")[0]]
    data = {
        "bomb": zstandard.compress(bytes(256 << 20)),
        "garbage": b"\x28\xb5\x2f\xfd" + bytes(range(200)),
        "plain msgpack": msgpack.packb({"format": "wdsprep-samples/1"}),
        "count": _table_of(keys[:-1], count=len(keys)),
        "ends backwards": _table_of(keys, key_ends=np.array([4, 2] + [len(b"".join(keys))] * (len(keys) - 2), "<u8").tobytes()),
        "not utf-8": _table_of([b"\xff\xfe" + key[2:] for key in keys]),
    }[case]
    _plant_table(work, "valid", data)
    wdsprep.dataset(str(output), "valid", keys=["k001"])  # the modules a dataset imports, before the count
    tracemalloc.start()
    try:
        with pytest.raises(wdsprep.ManifestError) as caught:
            wdsprep.dataset(str(work), "valid", keys=["k001"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(caught.value).startswith(f"{work}/valid.samples: sample table is unreadable (") and "\n" not in str(caught.value)
    assert peak < 32 << 20, peak
