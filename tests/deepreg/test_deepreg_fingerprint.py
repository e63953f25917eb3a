"""A volume edited in place at equal size (and with its mtime put back) rebuilds exactly the unit
holding its case; an H5 file rebuilds every unit it feeds and no other; the new voxels stream."""
import os

import h5py
import nibabel as nib
import numpy as np
import pytest
from .deepreg_testdata import samples, write_nifti

from wdsprep.conversion import convert
from wdsprep.testing.edits import overwrite_keeping_size, rewritten_shards, shard_identities


def _unit_of(output, split, case):
    found = [s["__url__"] for s in samples(output, split) if s["meta"]["name"] == case]
    assert len(found) == 1
    return [os.path.basename(found[0])]


@pytest.mark.parametrize("restore_mtime", [False, True])
def test_an_equal_size_edit_of_a_nifti_volume_rebuilds_exactly_its_unit(tmp_path, restore_mtime):
    rng = np.random.default_rng(0)
    for i in range(6):
        for role in ("moving_images", "fixed_images"):
            write_nifti(tmp_path / "d/train" / role / f"case{i}.nii", rng.random((8, 8, 8)).astype(np.float32))
    out = tmp_path / "out"
    convert("deepreg", str(tmp_path / "d"), str(out), shard_bytes="5KB")
    expected = _unit_of(out, "train", "case3")
    path = tmp_path / "d/train/moving_images/case3.nii"
    edited = (np.asarray(nib.load(path).dataobj) + 1).astype(np.float32)
    data = open(path, "rb").read()
    offset = len(data) - edited.nbytes  # the voxels end the file
    overwrite_keeping_size(str(path), data[:offset] + edited.tobytes(order="F"), restore_mtime=restore_mtime)
    before = shard_identities(str(out))
    manifest = convert("deepreg", str(tmp_path / "d"), str(out), shard_bytes="5KB")
    assert rewritten_shards(before, str(out)) == expected
    assert manifest.timing["units_built"] == 1
    streamed = [s for s in samples(out, "train") if s["meta"]["name"] == "case3"]
    np.testing.assert_array_equal(streamed[0]["moving_image"], np.asarray(nib.load(path).dataobj))
    np.testing.assert_array_equal(np.asarray(nib.load(path).dataobj), edited)


def test_an_edited_h5_file_rebuilds_the_units_it_feeds_and_no_other(tmp_path):
    rng = np.random.default_rng(1)
    for split in ("train", "test"):
        (tmp_path / "d" / split).mkdir(parents=True)
        with h5py.File(tmp_path / "d" / split / "images.h5", "w") as handle:
            for case in range(4):
                handle[f"case{case}"] = rng.random((8, 8, 8)).astype(np.float32)
    out = tmp_path / "out"
    convert("deepreg", str(tmp_path / "d"), str(out), shard_bytes="5KB")
    train = sorted(n for n in os.listdir(out) if n.startswith("train-"))
    assert len(train) > 1
    with h5py.File(tmp_path / "d/train/images.h5", "r+") as handle:
        handle["case2"][0, 0, 0] = -7.0  # in place: h5py keeps the file size
    before = shard_identities(str(out))
    convert("deepreg", str(tmp_path / "d"), str(out), shard_bytes="5KB")
    assert rewritten_shards(before, str(out)) == train
    streamed = [s for s in samples(out, "train") if s["meta"]["name"] == "case2"]
    with h5py.File(tmp_path / "d/train/images.h5") as handle:
        np.testing.assert_array_equal(streamed[0]["image"], handle["case2"][()])
    assert streamed[0]["image"][0, 0, 0] == -7.0
