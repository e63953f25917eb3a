"""The unit journal (`_units.json`) at many tiny units (issue 40): its bytes per shard are bounded, a
conversion killed at any moment resumes into the very shards an uninterrupted one writes, a torn
line costs only its unit, a journal an older wdsprep wrote is still reused, and one of another format
reuses nothing without an error.

Conversions run through the command line; shards are compared byte for byte with a conversion that
was never interrupted and read back with `tarfile`; the journal is measured in bytes on disk."""
import json
import os
import signal
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from tests.timeouts import SUBPROCESS, wait_for
from wdsprep.conformance import read_manifest, shard_bytes

from .shardsets import journal_records, write_older_journal

SHARD = "12KB"  # about 8 tiny samples a shard: one shard per unit


def _tiny_input(root, count):
    rng = np.random.default_rng(7)
    os.makedirs(root / "train")
    for i, array in enumerate(rng.standard_normal((count, 16)).astype(np.float32)):
        np.save(root / "train" / f"s{i:05d}.x.npy", array)
    return root


def _command(native, output, *options):
    return [sys.executable, "-m", "wdsprep", "convert", "generic", str(native), str(output), "--shard-bytes", SHARD,
            "--codec", "none", "--quiet", *options]


def _convert(native, output, *options):
    done = subprocess.run(_command(native, output, *options), capture_output=True, text=True, timeout=SUBPROCESS)
    assert done.returncode == 0, done.stderr
    return read_manifest(output)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(input of 2,000 tiny samples, its conversion never interrupted)."""
    root = tmp_path_factory.mktemp("journal")
    native = _tiny_input(root / "in", 2000)
    _convert(native, root / "reference")
    return native, root / "reference"


def _same_output(output, reference):
    assert shard_bytes(output) == shard_bytes(reference)
    assert (output / "train.samples").read_bytes() == (reference / "train.samples").read_bytes()
    assert read_manifest(output)["splits"] == read_manifest(reference)["splits"]


def _interrupted_copy(reference, output):
    """The reference conversion as a run interrupted after its last unit leaves it: no manifest."""
    os.makedirs(output)
    for name in os.listdir(reference):
        (output / name).write_bytes((reference / name).read_bytes())
    (output / "manifest.json").unlink()
    return output


def _keys(output):
    keys = []
    for row in read_manifest(output)["splits"]["train"]["shards"]:
        with tarfile.open(output / row["name"]) as archive:
            keys += [name.split(".")[0] for name in archive.getnames() if not name.startswith("__")]
    return keys


def test_the_journal_costs_a_bounded_number_of_bytes_per_shard(tiny):
    """Beyond the head line and the sample keys it must keep (a resumed run has them without reading a
    shard), at most 128 bytes per unit (its digest, split, index) and 160 per shard (its sha256, index
    digest and numbers): issue 40 measured ~420 bytes per shard, 42 MB at 10^5 shards, each row's
    field names, its shard name and its unit repeated on every line."""
    _, reference = tiny
    rows = read_manifest(reference)["splits"]["train"]["shards"]
    units = len({row["unit"] for row in rows})
    assert len(rows) >= 200
    raw = (reference / "_units.json").read_bytes()
    head = len(raw.splitlines()[0]) + 1
    keys = sum(len(key) + 3 for key in _keys(reference))  # each key as a JSON string and its separator
    assert len(raw) - head - keys <= 128 * units + 160 * len(rows), (len(raw) - head - keys, units, len(rows))


def test_a_conversion_killed_at_any_moment_resumes_into_the_same_shards(tiny, tmp_path):
    native, reference = tiny
    output = tmp_path / "out"
    child = subprocess.Popen(_command(native, output), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: (output / "_units.json").exists() and (output / "_units.json").read_bytes().count(b"\n") >= 2,
                 "the first unit journaled")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=SUBPROCESS)
    assert not (output / "manifest.json").exists()  # killed mid-run
    manifest = _convert(native, output)
    assert manifest["timing"]["units_reused"] >= 1 and manifest["timing"]["units_built"] >= 1
    _same_output(output, reference)
    assert _keys(output) == [f"s{i:05d}" for i in range(2000)]


def test_a_torn_line_costs_only_its_unit(tiny, tmp_path):
    native, reference = tiny
    output = _interrupted_copy(reference, tmp_path / "out")
    raw = (output / "_units.json").read_bytes()
    lines = raw.splitlines(keepends=True)
    torn = b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2]  # the last record cut mid-line
    (output / "_units.json").write_bytes(torn)
    manifest = _convert(native, output)
    units = len(lines) - 1
    assert (manifest["timing"]["units_reused"], manifest["timing"]["units_built"]) == (units - 1, 1)
    _same_output(output, reference)


def test_a_journal_an_older_wdsprep_wrote_is_still_reused(tiny, tmp_path):
    native, reference = tiny
    output = _interrupted_copy(reference, tmp_path / "out")
    head, records = journal_records(output)
    write_older_journal(output, head, records)  # one object per line, no format in the head
    manifest = _convert(native, output)
    assert (manifest["timing"]["units_reused"], manifest["timing"]["units_built"]) == (len(records), 0)
    _same_output(output, reference)


def test_a_journal_of_another_format_reuses_no_unit_and_is_no_error(tiny, tmp_path):
    native, reference = tiny
    output = _interrupted_copy(reference, tmp_path / "out")
    lines = (output / "_units.json").read_text().splitlines()
    head = json.loads(lines[0])
    head["format"] = "wdsprep-units/99"
    (output / "_units.json").write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    manifest = _convert(native, output)
    assert manifest["timing"]["units_reused"] == 0 and manifest["timing"]["units_built"] == len(lines) - 1
    _same_output(output, reference)
    assert json.loads((output / "_units.json").read_text().splitlines()[0])["format"] != "wdsprep-units/99"


def test_a_rerun_of_a_finished_conversion_reuses_every_unit(tiny, tmp_path):
    native, reference = tiny
    output = tmp_path / "out"
    built = _convert(native, output)["timing"]["units_built"]
    manifest = _convert(native, output)
    assert (manifest["timing"]["units_reused"], manifest["timing"]["units_built"]) == (built, 0)
    _same_output(output, reference)


def test_units_that_rolled_over_are_reused_with_every_part(tmp_path):
    """Units of several shards each (a JSON of short floats that msgpack writes in more bytes than
    planned): the re-run finds every part of every unit as journaled."""
    native = tmp_path / "in"
    os.makedirs(native / "train")
    for i in range(120):
        (native / "train" / f"s{i:04d}.w.json").write_text("[" + ",".join(["0.5"] * 400) + "]")
    first = _convert(native, tmp_path / "out")
    parts = [row["name"] for row in first["splits"]["train"]["shards"] if not row["name"].endswith("-00.tar")]
    assert parts  # units rolled over
    again = _convert(native, tmp_path / "out")
    assert (again["timing"]["units_reused"], again["timing"]["units_built"]) == (first["timing"]["units_built"], 0)


def test_shards_reach_the_disk_at_once_before_the_manifest_not_one_fsync_each(tiny, tmp_path, monkeypatch):
    """Counted, not timed: a conversion of 2,000 tiny samples (250 shards) in this process calls fsync a
    bounded number of times (the journal's batched flushes, the atomic writes of the table and the
    manifest), not once per shard and once per journaled unit, and flushes the file system before the
    manifest is written."""
    from wdsprep.conversion import convert

    native, reference = tiny
    events = []
    real_fsync, real_sync, real_replace = os.fsync, os.sync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "sync", lambda: (events.append("sync"), real_sync())[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(os.path.basename(b)), real_replace(a, b))[1])
    convert("generic", str(native), str(tmp_path / "out"), shard_bytes=SHARD, codec="none")
    shards = len(read_manifest(reference)["splits"]["train"]["shards"])
    assert events.count("fsync") <= 20 < shards, events.count("fsync")
    assert "sync" in events and events.index("sync") < events.index("manifest.json")
    assert events.index("sync") > max(i for i, event in enumerate(events) if event.endswith(".tar"))
    _same_output(tmp_path / "out", reference)
