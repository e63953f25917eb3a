"""An H5 file edited in place rebuilds every unit it feeds and no other; the new voxels stream. (An
equal-size edit of a NIfTI volume, with and without its mtime put back, is in the conformance suite.)"""
import os

import h5py
import numpy as np

from wdsprep.conversion import convert
from wdsprep.testing.edits import rewritten_shards, shard_identities

from .deepreg_testdata import samples


def _unit_of(output, split, case):
    found = [s["__url__"] for s in samples(output, split) if s["meta"]["name"] == case]
    assert len(found) == 1
    return [os.path.basename(found[0])]


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
