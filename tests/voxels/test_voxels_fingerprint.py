"""A ray file edited in place at equal size (and with its mtime put back) rebuilds exactly the unit
holding its sample, and the new rays are what streams."""
from __future__ import annotations

import io
import os

import numpy as np
import pytest
from .voxels_testdata import convert_tiny

from wdsprep.conversion import convert
from wdsprep.sources.voxels import decode_voxel_sample, native_arrays
from wdsprep.stream import iter_shard, load_manifest
from wdsprep.testing.edits import (overwrite_keeping_size, rewritten_shards, shard_identities,
                                   zip_with_member_replaced)


def _samples_by_shard(shards):
    manifest = load_manifest(str(shards))
    found = {}
    for split in manifest.splits:
        for url in manifest.shard_urls(split):
            found[os.path.basename(url)] = [decode_voxel_sample(raw) for raw in iter_shard(url)]
    return found


def _npy_bytes(array):
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, allow_pickle=False)
    return buffer.getvalue()


@pytest.mark.parametrize("restore_mtime", [False, True])
def test_an_equal_size_edit_of_a_ray_file_rebuilds_exactly_its_unit(tmp_path, restore_mtime):
    native, shards, _ = convert_tiny(tmp_path)
    ray_file = native / "ray_dataset_hierarchical" / "level_0" / "00" / "0003_rays.npz"
    holding = [name for name, samples in _samples_by_shard(shards).items()
               if any(s["meta"]["level"] == 0 and s["meta"]["hash"] == "object_0003" for s in samples)]
    assert len(holding) == 1  # an object belongs to one split
    unit_parts = sorted(n for n in os.listdir(shards) if n.startswith(holding[0].rsplit("-", 1)[0] + "-"))
    with np.load(ray_file) as arrays:
        distances = arrays["distances"]
    edited = np.zeros_like(distances)  # compresses better: the archive is padded back to its size
    overwrite_keeping_size(str(ray_file), zip_with_member_replaced(str(ray_file), "distances.npy", _npy_bytes(edited)),
                           restore_mtime=restore_mtime)
    before = shard_identities(str(shards))
    manifest = convert("voxels", str(native), str(shards), shard_bytes="150KB")
    assert rewritten_shards(before, str(shards)) == unit_parts
    assert manifest.timing["units_built"] == 1
    streamed = [s for s in _samples_by_shard(shards)[holding[0]] if s["meta"]["hash"] == "object_0003"]
    assert len(streamed) == 1
    with np.load(ray_file) as arrays:
        np.testing.assert_array_equal(native_arrays(streamed[0])[1]["distances"], arrays["distances"])
    assert not np.array_equal(distances, edited)
