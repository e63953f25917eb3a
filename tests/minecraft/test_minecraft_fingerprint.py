"""A frame edited in place at equal size with its mtime put back, in the folder layout, rebuilds
exactly the unit holding its episode, and the new action is what streams. (The same edit inside
data.zip, with and without the mtime put back, is in the conformance suite.)"""
from __future__ import annotations

import os

import numpy as np

import wdsprep
from wdsprep.conversion import convert
from wdsprep.sources.minecraft.synth import synth
from wdsprep.stream import iter_shard, load_manifest
from wdsprep.testing.edits import overwrite_keeping_size, rewritten_shards, shard_identities

from .minecraft_testdata import edited_frame

SHARD_BYTES = 4_000  # about one episode a unit


def _samples_by_shard(shards):
    manifest = load_manifest(str(shards))
    return {os.path.basename(url): [wdsprep.decode(strip=True)([raw]).__next__() for raw in iter_shard(url)]
            for url in manifest.shard_urls("train")}


def test_an_equal_size_edit_of_a_frame_in_a_folder_rebuilds_exactly_its_unit(tmp_path):
    folders = synth(str(tmp_path / "native"), seed=3, layout="flat", episodes=6, side=9)
    episode = os.path.basename(folders[2])
    native = str(tmp_path / "native")
    shards = tmp_path / "shards"
    convert("minecraft", native, str(shards), shard_bytes=SHARD_BYTES)
    holding = [name for name, samples in _samples_by_shard(shards).items()
               if any(s["meta"]["episode"] == episode for s in samples)]
    assert len([n for n in os.listdir(shards) if n.endswith(".tar")]) > 2  # several units
    path = os.path.join(native, f"data/{episode}/000004.npy")
    data, action = edited_frame(open(path, "rb").read())
    overwrite_keeping_size(path, data, restore_mtime=True)
    before = shard_identities(str(shards))
    manifest = convert("minecraft", native, str(shards), shard_bytes=SHARD_BYTES)
    assert rewritten_shards(before, str(shards)) == holding  # one window each here
    assert manifest.timing["units_built"] == len(holding) == 1
    sample = next(s for s in _samples_by_shard(shards)[holding[0]] if s["meta"]["episode"] == episode)
    np.testing.assert_array_equal(sample["actions"][4 - sample["meta"]["first_frame"]], action)
