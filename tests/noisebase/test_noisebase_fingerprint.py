"""A sequence zip edited in place at equal size (and with its mtime put back) rebuilds exactly the
unit holding that sequence, and the new pixels are what streams (read back with zarr itself)."""
from __future__ import annotations

import os
import shutil
import tarfile

import numpy as np
import pytest
import zarr
from .noisebase_testdata import native

from wdsprep.conversion import convert
from wdsprep.shards.codec import decode_sample
from wdsprep.stream import iter_shard
from wdsprep.testing.edits import (overwrite_keeping_size, rewritten_shards, shard_identities,
                                   zip_with_member_replaced)


def _unit_parts_holding(out, prefix):
    for name in sorted(os.listdir(out)):
        if name.endswith(".tar"):
            with tarfile.open(os.path.join(out, name)) as archive:
                if any(member.name.startswith(prefix) for member in archive.getmembers()):
                    stem = name.rsplit("-", 1)[0]
                    return sorted(n for n in os.listdir(out) if n.startswith(stem + "-") and n.endswith(".tar"))
    raise AssertionError(f"no shard holds {prefix}")


def _color(path):
    with zarr.storage.ZipStore(path, mode="r") as store:
        return zarr.open_group(store, mode="r")["color"][()]


@pytest.mark.parametrize("restore_mtime", [False, True])
def test_an_equal_size_edit_of_a_sequence_rebuilds_exactly_its_unit(tmp_path_factory, tmp_path, restore_mtime):
    root = tmp_path / "native"
    shutil.copytree(native(tmp_path_factory), root)
    out = tmp_path / "out"
    convert("noisebase", str(root), str(out), shard_bytes="200KB")
    expected = _unit_parts_holding(out, "scene0001_")
    assert len([n for n in os.listdir(out) if n.endswith(".tar")]) > len(expected)
    path = str(root / "sampleset_v1" / "train" / "scene0001.zip")
    with zarr.storage.ZipStore(path, mode="r") as store:
        color = zarr.open_group(store, mode="r")["color"]
        chunk = np.zeros(color.chunks, color.dtype)  # frame 0, samples 0-3: blosc makes it small
        encoded = color.compressor.encode(chunk)
    original = _color(path)
    overwrite_keeping_size(path, zip_with_member_replaced(path, "color/0.0.0.0.0", encoded), restore_mtime=restore_mtime)
    edited = _color(path)
    assert not np.array_equal(original, edited)
    before = shard_identities(str(out))
    manifest = convert("noisebase", str(root), str(out), shard_bytes="200KB")
    assert rewritten_shards(before, str(out)) == expected
    assert manifest.timing["units_built"] == 1
    streamed = [decode_sample(raw, strip=True) for name in expected for raw in iter_shard(str(out / name))]
    frame0 = [s for s in streamed if s["__key__"] == "scene0001_f0000"]
    assert len(frame0) == 1
    np.testing.assert_array_equal(frame0[0]["color"], edited[0].transpose(3, 0, 1, 2))  # sample-major
