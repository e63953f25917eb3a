"""One input-fingerprint rule: an input edited in place, at equal size, even with its mtime put back,
rebuilds exactly the unit it feeds, and the new data is what streams (generic source; each source's
folder has the same story for its own inputs)."""
import os
import pathlib
import shutil
import tarfile
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wdsprep
import wdsprep.stream
from wdsprep.conversion import convert
from wdsprep.errors import InputError
from wdsprep.inputs import InputFingerprints, unit_input_fingerprints
from wdsprep.testing.edits import overwrite_keeping_size, rewritten_shards, shard_identities, zip_with_member_replaced

KEY = "sample000077"


@pytest.fixture
def converted(tmp_path, generic_input):
    native = tmp_path / "in"
    shutil.copytree(generic_input, native)
    out = tmp_path / "out"
    convert("generic", str(native), str(out), shard_bytes="300KB")
    return native, out


def _unit_shards_holding(out, key):
    """Every part of the unit whose shard holds `key`, found by listing the tars with tarfile."""
    for name in sorted(os.listdir(out)):
        if name.endswith(".tar"):
            with tarfile.open(out / name) as archive:
                if any(member.name.startswith(f"{key}.") for member in archive.getmembers()):
                    stem = name.rsplit("-", 1)[0]
                    return sorted(n for n in os.listdir(out) if n.endswith(".tar") and n.startswith(stem + "-"))
    raise AssertionError(f"no shard holds {key}")


def _edit_array(path, *, restore_mtime):
    """Same dtype and shape, new values: the .npy keeps its size."""
    original = np.load(path)
    edited = (original * -2 + 1).astype(original.dtype)
    header = len(open(path, "rb").read()) - original.nbytes
    overwrite_keeping_size(path, open(path, "rb").read()[:header] + edited.tobytes(), restore_mtime=restore_mtime)
    return edited


def _streamed(out, key):
    samples = wdsprep.dataset(str(out), "train", shuffle_shards=False).compose(wdsprep.decode(strip=True))
    found = [sample for sample in samples if sample["__key__"] == key]
    assert len(found) == 1
    return found[0]


@pytest.mark.parametrize("mode", [None, "content", "stat"])
@pytest.mark.parametrize("restore_mtime", [False, True])
def test_an_edit_at_equal_size_rebuilds_exactly_its_unit(converted, mode, restore_mtime):
    native, out = converted
    if mode is not None:  # the first run under this mode, then the edit
        convert("generic", str(native), str(out), shard_bytes="300KB", fingerprint=mode)
    expected = _unit_shards_holding(out, KEY)
    before = shard_identities(out)
    path = native / "train" / f"{KEY}.array.npy"
    mtime = os.stat(path).st_mtime_ns
    edited = _edit_array(path, restore_mtime=restore_mtime)
    assert (os.stat(path).st_mtime_ns == mtime) == restore_mtime
    manifest = convert("generic", str(native), str(out), shard_bytes="300KB", fingerprint=mode)
    assert rewritten_shards(before, out) == expected
    assert manifest.timing["units_built"] == 1
    np.testing.assert_array_equal(_streamed(out, KEY)["array"], np.load(path))
    np.testing.assert_array_equal(np.load(path), edited)


def test_nothing_changed_rebuilds_nothing_and_content_mode_ignores_a_touch(converted):
    native, out = converted
    before = shard_identities(out)
    os.utime(native / "train" / f"{KEY}.array.npy")  # a new mtime, the same bytes
    manifest = convert("generic", str(native), str(out), shard_bytes="300KB")
    assert rewritten_shards(before, out) == [] and manifest.timing["units_built"] == 0


def test_stat_mode_takes_a_touch_for_a_change_of_that_unit_only(converted):
    native, out = converted
    convert("generic", str(native), str(out), shard_bytes="300KB", fingerprint="stat")
    before = shard_identities(out)
    os.utime(native / "train" / f"{KEY}.meta.json")
    convert("generic", str(native), str(out), shard_bytes="300KB", fingerprint="stat")
    assert rewritten_shards(before, out) == _unit_shards_holding(out, KEY)


def test_the_manifest_fingerprint_follows_content_not_location(tmp_path, converted):
    native, out = converted
    moved = tmp_path / "moved"
    shutil.copytree(native, moved)
    again = convert("generic", str(moved), str(tmp_path / "out2"), shard_bytes="300KB")
    assert again.fingerprint == wdsprep.stream.load_manifest(str(out)).fingerprint
    _edit_array(moved / "valid" / "sample000003.array.npy", restore_mtime=True)
    edited = convert("generic", str(moved), str(tmp_path / "out2"), shard_bytes="300KB")
    assert edited.fingerprint != again.fingerprint


def test_the_cli_passes_the_fingerprint_mode(converted):
    native, out = converted
    from wdsprep.cli import main

    command = ["convert", "generic", str(native), str(out), "--shard-bytes", "300KB", "--quiet"]
    assert main(command + ["--fingerprint", "stat"]) == 0
    before = shard_identities(out)
    os.utime(native / "train" / f"{KEY}.meta.json")  # a change for stat, none for content
    assert main(command + ["--fingerprint", "stat"]) == 0
    assert rewritten_shards(before, out) == _unit_shards_holding(out, KEY)
    with pytest.raises(SystemExit):
        main(command + ["--fingerprint", "mtime"])


def test_zip_members_by_content_or_by_their_crc(tmp_path):
    import zipfile

    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as handle:
        handle.writestr("x.bin", b"\x01" * 5000)
        handle.writestr("y.bin", b"\x02" * 5000)
    for mode in ("content", "stat"):
        before = InputFingerprints(mode).of([(str(archive), "x.bin"), (str(archive), "y.bin")])
        archive.write_bytes(zip_with_member_replaced(str(archive), "x.bin", b"\x00" * 5000))
        after = InputFingerprints(mode).of([(str(archive), "x.bin"), (str(archive), "y.bin")])
        assert before[0] != after[0] and before[1] == after[1]
        archive.write_bytes(zip_with_member_replaced(str(archive), "x.bin", b"\x01" * 5000))


def test_an_input_that_vanishes_or_dangles_is_named(tmp_path):
    target = tmp_path / "gone.npy"
    link = tmp_path / "link.npy"
    link.symlink_to(target)
    with pytest.raises(InputError, match=f"^{link}: dangling symbolic link$"):
        InputFingerprints("stat").of([str(link)])
    with pytest.raises(InputError, match=f"^{target}: no such file$"):
        InputFingerprints("content").of([str(target)])


class _FileSource:
    """A stand-in source: an item is a list of file paths, all of which feed it."""

    id = "files"

    @staticmethod
    def inputs(item):
        return item


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), mode=st.sampled_from(["content", "stat"]))
def test_changed_inputs_change_exactly_the_digests_of_the_units_they_feed(tmp_path, data, mode):
    from wdsprep.sources.base import Unit

    root = pathlib.Path(tempfile.mkdtemp(dir=tmp_path))  # a fresh directory per example
    files = [root / f"f{i}" for i in range(data.draw(st.integers(1, 8)))]
    for path in files:
        path.write_bytes(b"\0" * 16)
    units = [Unit("train", index, [[str(f) for f in data.draw(st.lists(st.sampled_from(files), max_size=3))]])
             for index in range(data.draw(st.integers(1, 6)))]
    before = unit_input_fingerprints(_FileSource, units, mode)
    changed = data.draw(st.sets(st.sampled_from(files)))
    for path in changed:
        overwrite_keeping_size(str(path), b"\1" * 16, restore_mtime=data.draw(st.booleans()))
    after = unit_input_fingerprints(_FileSource, units, mode)
    assert len(before) == len(after) == len(units)
    expected = {unit.index for unit in units if {str(f) for f in changed} & set(unit.items[0])}
    assert {unit.index for unit, b, a in zip(units, before, after) if b != a} == expected


def test_many_inputs_are_fingerprinted_in_worker_processes_as_a_reference_rule_says(tmp_path, monkeypatch):
    """Issue 40: above `PARALLEL_INPUTS` inputs the driver fingerprints chunks of units in `--workers`
    processes. The digests follow the rule written out here (sha256 of the mode, then per input the repr
    of [size, sha256 of its bytes] and a newline), in unit order, and the first unreadable input (in
    unit order) is the one named."""
    import hashlib

    import wdsprep.inputs as inputs_module
    from wdsprep.errors import InputError
    from wdsprep.sources.base import Unit

    monkeypatch.setattr(inputs_module, "PARALLEL_INPUTS", 10)
    files = []
    for i in range(60):
        files.append(tmp_path / f"f{i:02d}")
        files[-1].write_bytes(bytes([i]) * (i + 1))
    units = [Unit("train", index, [[str(f) for f in files[index * 3 : index * 3 + 5]]]) for index in range(20)]

    def reference(unit):
        digest = hashlib.sha256(b"content")
        for path in unit.items[0]:
            data = pathlib.Path(path).read_bytes()
            digest.update(repr([len(data), hashlib.sha256(data).hexdigest()]).encode() + b"\n")
        return digest.hexdigest()

    assert unit_input_fingerprints(_FileSource, units, "content", workers=2) == [reference(unit) for unit in units]
    files[40].unlink()
    files[57].unlink()
    with pytest.raises(InputError, match=f"{files[40]}: no such file"):
        unit_input_fingerprints(_FileSource, units, "content", workers=2)
