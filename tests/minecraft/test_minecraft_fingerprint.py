"""A frame edited in place at equal size (and with its mtime put back), in a directory or inside
data.zip, rebuilds exactly the unit holding its episode, and the new action is what streams."""
from __future__ import annotations

import io
import os
import shutil
import zipfile

import numpy as np
import pytest

import wdsprep
from wdsprep.conversion import convert
from wdsprep.sources.minecraft.synth import synth
from wdsprep.stream import iter_shard, load_manifest
from wdsprep.testing.edits import (overwrite_keeping_size, rewritten_shards, shard_identities,
                                   zip_with_member_replaced)

SHARD_BYTES = 4_000  # about one episode a unit


def _edited_frame(data: bytes) -> tuple[bytes, np.ndarray]:
    """The same pickled frame with another `straight` action (same dtype, so the same size)."""
    frame = np.load(io.BytesIO(data), allow_pickle=True).item()
    action = frame["action"].copy()
    action[0] = (action[0] + 1) % 3
    buffer = io.BytesIO()
    np.save(buffer, {"action": action, "voxel": frame["voxel"]}, allow_pickle=True)
    return buffer.getvalue(), action


def _samples_by_shard(shards):
    manifest = load_manifest(str(shards))
    return {os.path.basename(url): [wdsprep.decode(strip=True)([raw]).__next__() for raw in iter_shard(url)]
            for url in manifest.shard_urls("train")}


@pytest.mark.parametrize("layout", ["dir", "zip"])
@pytest.mark.parametrize("restore_mtime", [False, True])
def test_an_equal_size_edit_of_a_frame_rebuilds_exactly_its_unit(tmp_path, layout, restore_mtime):
    folders = synth(str(tmp_path / "native"), seed=3, layout="flat", episodes=6, side=9)
    episode = os.path.basename(folders[2])
    relpath = f"data/{episode}/000004.npy"
    native = str(tmp_path / "native")
    if layout == "zip":
        native = str(tmp_path / "data.zip")
        shutil.make_archive(native[:-4], "zip", tmp_path / "native")
    shards = tmp_path / "shards"
    convert("minecraft", native, str(shards), shard_bytes=SHARD_BYTES)
    holding = [name for name, samples in _samples_by_shard(shards).items()
               if any(s["meta"]["episode"] == episode for s in samples)]
    assert len([n for n in os.listdir(shards) if n.endswith(".tar")]) > 2  # several units
    if layout == "dir":
        path = os.path.join(native, relpath)
        data, action = _edited_frame(open(path, "rb").read())
        overwrite_keeping_size(path, data, restore_mtime=restore_mtime)
    else:
        with zipfile.ZipFile(native) as archive:
            data, action = _edited_frame(archive.read(relpath))
        overwrite_keeping_size(native, zip_with_member_replaced(native, relpath, data), restore_mtime=restore_mtime)
    before = shard_identities(str(shards))
    manifest = convert("minecraft", native, str(shards), shard_bytes=SHARD_BYTES)
    assert rewritten_shards(before, str(shards)) == holding  # one window each here
    assert manifest.timing["units_built"] == len(holding) == 1
    sample = next(s for s in _samples_by_shard(shards)[holding[0]] if s["meta"]["episode"] == episode)
    np.testing.assert_array_equal(sample["actions"][4 - sample["meta"]["first_frame"]], action)
