"""A raw capture edited in place at equal size (and with its mtime put back) rebuilds exactly the
unit holding its scene, and the new pixels are what streams (read back with rawpy)."""
import os
import shutil

import numpy as np
import pytest
import rawpy
import webdataset as wds

import wdsprep
from wdsprep.conversion import convert
from wdsprep.testing.edits import overwrite_keeping_size, rewritten_shards, shard_identities

from .rawnind_testdata import truth

TILE = 128


def _mono(path):
    with rawpy.imread(str(path)) as raw:
        black = np.array(raw.black_level_per_channel, dtype=np.float32)
        return (raw.raw_image.astype(np.float32) - black[0]) / (raw.white_level - black[0])


def _brighter(path):
    """Every pixel value + 1 (the pixels end the synthetic DNG: uint16, little-endian)."""
    data = open(path, "rb").read()
    with rawpy.imread(str(path)) as raw:
        pixels = raw.raw_image.copy()
        white = raw.white_level
    start = len(data) - pixels.nbytes
    assert np.array_equal(np.frombuffer(data[start:], "<u2").reshape(pixels.shape), pixels)
    return data[:start] + np.minimum(pixels.astype(np.uint32) + 1, white).astype("<u2").tobytes()


@pytest.mark.parametrize("restore_mtime,layout", [(True, "legacy")])  # the default mosaic layout: the conformance suite
def test_an_equal_size_edit_of_a_capture_rebuilds_exactly_its_unit(synth_tiny, tmp_path, restore_mtime, layout):
    native = tmp_path / "native"
    shutil.copytree(synth_tiny, native)
    out = tmp_path / "out"
    convert("rawnind", str(native), str(out), shard_bytes="256MB", tile_size=TILE, layout=layout)
    scene = truth(synth_tiny)["scenes"]["Bayer/plants"]  # the train split's one scene
    name = sorted(scene["noisy"])[0]
    path = native / "files" / name
    overwrite_keeping_size(str(path), _brighter(path), restore_mtime=restore_mtime)
    expected = sorted(n for n in os.listdir(out) if n.startswith("train-"))
    before = shard_identities(str(out))
    manifest = convert("rawnind", str(native), str(out), shard_bytes="256MB", tile_size=TILE, layout=layout)
    assert rewritten_shards(before, str(out)) == expected
    assert any(n.startswith("test-") for n in os.listdir(out))  # the other unit, untouched
    assert manifest.timing["units_built"] == 1 and manifest.timing["units_reused"] == 1
    noisy = _mono(path)
    checked = 0
    for sample in wds.WebDataset(wdsprep.urls(str(out), "train"), shardshuffle=False).compose(wdsprep.rawnind.tiles()):
        meta = sample["meta"]
        n = meta["noisy_files"].index(name)
        if layout == "mosaic":  # the stored mosaic is the edited file's, at the window minus the shift
            with rawpy.imread(str(path)) as raw:
                pixels = np.pad(raw.raw_image, 40)
            wy, wx, wh, ww = meta["window"]
            dy, dx = meta["noisy_shift"][n]
            np.testing.assert_array_equal(sample["noisy"][n], pixels[40 + wy - dy : 40 + wy - dy + wh, 40 + wx - dx : 40 + wx - dx + ww])
            checked += 1
            continue
        dy, dx = meta["bayer_alignment"][n]
        y0, x0 = meta["tile"][0] - dy, meta["tile"][1] - dx
        expected_r = noisy[0::2, 0::2][y0 // 2: y0 // 2 + TILE // 2, x0 // 2: x0 // 2 + TILE // 2]
        if y0 >= 0 and x0 >= 0 and expected_r.shape == (TILE // 2, TILE // 2):
            np.testing.assert_array_equal(sample["noisy_bayer"][n][0], expected_r)
            checked += 1
    assert checked > 0
