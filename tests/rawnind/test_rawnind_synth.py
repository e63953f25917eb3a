"""Synthetic captures read like camera files; metadata recovers the known shifts and gains."""
import hashlib
import json
import re

import numpy as np
import pytest
import rawpy
import yaml

from wdsprep.errors import InputError
from wdsprep.sources.rawnind.dng import write_dng
from wdsprep.sources.rawnind.index import load_index, load_listing
from wdsprep.sources.rawnind.metadata import MetadataCache, compute_pair, scene_metadata, shift_images
from wdsprep.sources.rawnind.raw import mono_to_rggb, read_bayer, rggb_to_mono

from .rawnind_testdata import truth

NAME_RE = re.compile(r"^Bayer_(TEST_)?[A-Za-z0-9_-]+_(GT_)?ISO\d+_sha1=([0-9a-f]{40})\.(dng|xmp)$")


def test_dng_round_trip_through_rawpy(tmp_path):
    rng = np.random.default_rng(3)
    mosaic = rng.integers(0, 16383, size=(64, 96), dtype=np.uint16)
    path = tmp_path / "x.dng"
    write_dng(str(path), mosaic, black_level=512, white_level=16383, iso=800)
    with rawpy.imread(str(path)) as raw:
        assert np.array_equal(raw.raw_image, mosaic)
        assert list(raw.black_level_per_channel) == [512] * 4 and raw.white_level == 16383
        assert raw.raw_pattern.tolist() == [[0, 1], [3, 2]] and raw.color_desc == b"RGBG"
        assert np.any(raw.rgb_xyz_matrix) and not np.any(raw.rgb_xyz_matrix[3])
        rgb = raw.postprocess()  # LibRaw can fully develop it, like a camera file
        assert rgb.shape == (64, 96, 3)
    image = read_bayer(str(path))
    expected = (mosaic.astype(np.float32) - 512) / (16383 - 512)
    assert image.mono.shape == (1, 64, 96) and np.allclose(image.mono[0], expected)
    assert np.array_equal(rggb_to_mono(mono_to_rggb(image.mono)), image.mono)


@pytest.mark.parametrize("pattern, rows, cols", [((1, 2, 0, 1), slice(1, -1), slice(None)),  # GBRG
                                                 ((2, 1, 1, 0), slice(1, -1), slice(1, -1)),  # BGGR
                                                 ((1, 0, 2, 1), slice(None), slice(1, -1))])  # GRBG
def test_other_bayer_patterns_are_trimmed_to_rggb(tmp_path, pattern, rows, cols):
    mosaic = np.random.default_rng(4).integers(600, 16000, size=(70, 90), dtype=np.uint16)
    path = tmp_path / "p.dng"
    write_dng(str(path), mosaic, black_level=512, white_level=16383, iso=100, cfa_pattern=pattern)
    image = read_bayer(str(path))
    trimmed = mosaic[rows, cols]
    height, width = (trimmed.shape[0] // 4) * 4, (trimmed.shape[1] // 4) * 4
    assert image.mono.shape == (1, height, width)
    assert np.allclose(image.mono[0], (trimmed[:height, :width].astype(np.float32) - 512) / (16383 - 512))
    with rawpy.imread(str(path)) as raw:  # what is at (0, 0) now is a red photosite
        colours = raw.raw_colors_visible[rows, cols]
        assert raw.color_desc.decode()[colours[0, 0]] == "R" and raw.color_desc.decode()[colours[1, 1]] == "B"


def test_unreadable_raw_names_the_file(tmp_path):
    bad = tmp_path / "broken.dng"
    bad.write_bytes(b"II*\0garbage")
    with pytest.raises(InputError, match="broken.dng: not a readable raw file"):
        read_bayer(str(bad))


def test_synth_writes_the_real_formats(synth_small):
    index = load_index(str(synth_small / "dataset_index.yaml"))
    listing = load_listing(str(synth_small / "dataverse_dataset.json"))
    raw_listing = json.loads((synth_small / "dataverse_dataset.json").read_text())
    assert raw_listing["status"] == "OK"
    assert set(raw_listing["data"]["latestVersion"]["files"][0]["dataFile"]) >= {
        "id", "persistentId", "filename", "contentType", "filesize", "md5", "checksum", "storageIdentifier"}
    assert (synth_small / "files" / "dataset.yaml").read_text() == (synth_small / "dataset_index.yaml").read_text()
    scenes = index["Bayer"]
    assert len(scenes) == 4 and sum(scene["test_reserve"] for scene in scenes.values()) == 1
    assert set(next(iter(scenes.values()))) == {"clean_images", "noisy_images", "test_reserve", "unknown_sensor"}
    unmatched = 0
    for scene in scenes.values():
        for entry in scene["clean_images"] + scene["noisy_images"]:
            match = NAME_RE.match(entry["filename"])
            assert match and match.group(3) == entry["sha1"], entry["filename"]
            assert set(entry) == {"filename", "sha1"}
            if entry["filename"] not in listing:
                unmatched += 1
                assert entry["filename"].endswith(".xmp")
                continue
            data = (synth_small / "files" / entry["filename"]).read_bytes()
            assert hashlib.sha1(data).hexdigest() == entry["sha1"]
            assert hashlib.md5(data).hexdigest() == listing[entry["filename"]].md5
            assert len(data) == listing[entry["filename"]].size
    assert unmatched == 1


def test_alignment_recovers_known_shifts_and_gains(synth_small, tmp_path):
    scenes = {key: scene for key, scene in truth(synth_small)["scenes"].items() if key.startswith("Bayer/")}
    checked = 0
    for scene in scenes.values():
        gt = read_bayer(str(synth_small / "files" / scene["clean"][0]))
        for name, known in scene["noisy"].items():
            record = compute_pair(gt, read_bayer(str(synth_small / "files" / name))).record
            assert record["best_alignment"] == known["shift"], name
            assert record["raw_gain"] == pytest.approx(known["gain"], rel=0.01)
            assert record["rgb_gain"] == pytest.approx(known["gain"], rel=0.01)
            assert 0.95 < record["mask_mean"] <= 1.0
            assert record["best_alignment_loss"] < 0.1  # upstream's RGB L1 (not grey): up to 0.066 here
            checked += 1
    assert checked == 9
    assert sum(any(v % 2 for v in known["shift"]) for scene in scenes.values() for known in scene["noisy"].values()) >= 3


def test_mask_marks_overexposure_and_missing_overlap(synth_small):
    scene = truth(synth_small)["scenes"]["Bayer/plants"]
    gt = read_bayer(str(synth_small / "files" / scene["clean"][0]))
    name, known = next(iter(scene["noisy"].items()))
    pair = compute_pair(gt, read_bayer(str(synth_small / "files" / name)))
    dy, dx = known["shift"]
    height, width = pair.mask.shape
    # the clean capture's overexposed patch (synth.py: at H/3, W/3) is masked out
    assert not pair.mask[height // 3 + 2 : height // 3 + 10, width // 3 + 2 : width // 3 + 10].any()
    assert gt.mono[0, height // 3 + 2 : height // 3 + 10, width // 3 + 2 : width // 3 + 10].min() >= gt.overexposure_lb
    # rows of the clean image the shifted noisy capture does not see are masked
    if dy > 0:
        assert not pair.mask[:dy].any()
    elif dy < 0:
        assert not pair.mask[dy:].any()
    assert pair.mask.mean() > 0.9


def test_metadata_is_cached(synth_small, tmp_path):
    scene = truth(synth_small)["scenes"]["Bayer/book_shelf"]
    index = yaml.safe_load((synth_small / "dataset_index.yaml").read_text())["Bayer"]["book_shelf"]
    sha = {entry["filename"]: entry["sha1"] for entry in index["clean_images"] + index["noisy_images"]}
    gt = scene["clean"][0]
    clean = [(str(synth_small / "files" / name), sha[name]) for name in scene["clean"]]
    noisy = [(str(synth_small / "files" / name), sha[name]) for name in scene["noisy"]]
    cache = MetadataCache(str(tmp_path))
    first, computed = scene_metadata(clean, noisy, cache)
    assert computed == 2 * (2 + 3)  # every clean capture is a reference for every capture
    again, computed = scene_metadata(clean, noisy, MetadataCache(str(tmp_path)))
    assert computed == 0
    assert len(first) == len(again) == 10
    for a, b in zip(first, again):
        assert a.record == b.record and np.array_equal(a.mask, b.mask)
    lines = (tmp_path / "metadata_cache.jsonl").read_text().splitlines()
    assert len(lines) == 10 and json.loads(lines[0])["key"] == f"{sha[gt]}:{sha[gt]}"  # the self pair first
    assert first[0].record["best_alignment"] == [0, 0] and first[0].record["best_alignment_loss"] == 0.0


def test_shift_images_convention():
    anchor = np.arange(100.0).reshape(1, 10, 10)
    target = np.roll(np.roll(anchor, -2, axis=1), 3, axis=2)  # target[y, x] = anchor[y + 2, x - 3]
    a, t = shift_images(anchor, target, (2, -3))
    assert np.array_equal(a, t) and a.shape == (1, 8, 6)  # an odd shift trims one more column (rawproc.shift_images)
