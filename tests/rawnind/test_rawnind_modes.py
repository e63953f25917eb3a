"""The legacy loader modes beyond random Bayer crops: data pairings (clean-clean, noisy-noisy), the
validation loader (middle pre-crop, centre crop or whole) and the test loader (grid of crops or
whole pre-crops), each against a small reference of the legacy rule written here (research notes
A.6 and `rawds.py`'s rules)."""
import shutil

import numpy as np
import pytest
import rawpy
import webdataset as wds

import wdsprep
from wdsprep.conversion import convert
from wdsprep.errors import ConfigError
from wdsprep.sources.rawnind.read import crops_at

from . import upstream_reference as reference
from .rawnind_testdata import truth


@pytest.fixture(scope="module")
def mosaic(synth_small, tmp_path_factory):
    work = tmp_path_factory.mktemp("rawnind_modes")
    shutil.copytree(synth_small, work / "native")
    manifest = convert("rawnind", str(work / "native"), str(work / "shards"), shard_bytes="4MB", tile_size=256)
    return work / "native", manifest


def raw_samples(manifest, split):
    return list(wds.WebDataset(wdsprep.urls(manifest.url, split), shardshuffle=False))


def decoded(manifest, split):
    return {s["__key__"]: s for s in wds.WebDataset(wdsprep.urls(manifest.url, split), shardshuffle=False)
            .compose(wdsprep.rawnind.tiles())}


def test_validation_takes_the_centre_of_the_aligned_middle_precrop(mosaic):
    """The test scene (512x768) is too small for upstream's pre-crops: its one tile is the whole
    image; the crop is the centre of the region `shift_images` leaves of it (upstream_reference)."""
    native, manifest = mosaic
    tiles = decoded(manifest, "test")
    outputs = list(wdsprep.rawnind.validation(crop_size=64, max_alignment_loss=None, min_mask_mean=None, to_torch=False)(
        raw_samples(manifest, "test")))
    [(key, middle)] = list(tiles.items())
    meta = middle["meta"]
    assert meta["tile"] == [0, 0] and meta["tile_size"] == meta["image_size"] and reference.precrops(*meta["image_size"]) == []
    assert len(outputs) == len(meta["pair_gt"])
    for n, out in enumerate(outputs):
        gt_top, gt_left, top, left, height, width = reference.aligned_precrop((0, 0, *meta["tile_size"]), meta["best_alignment"][n])
        cy, cx = reference.center_crop(height, width, 64)
        assert out["position"] == [top + cy, left + cx] and out["gt_position"] == [gt_top + cy, gt_left + cx]
        want = crops_at(middle, n, [(top + cy, left + cx)], crop_size=64, to_torch=False)
        assert out["x_crops"].shape == (3, 64, 64) and out["y_crops"].shape == (4, 32, 32) and out["mask_crops"].shape == (3, 64, 64)
        assert np.array_equal(out["x_crops"], want["x_crops"][0]) and np.array_equal(out["y_crops"], want["y_crops"][0])
        assert out["y_file"] == meta["y_files"][n] and out["gt_file"] == meta["gt_files"][n] and out["gain"] == meta["raw_gain"][n]
    # crop_size=0: the whole aligned pre-crop, trimmed to multiples of 256
    whole = list(wdsprep.rawnind.validation(crop_size=0, input="rgb", max_alignment_loss=None, min_mask_mean=None,
                                            to_torch=False)(raw_samples(manifest, "test")))
    sizes = [reference.aligned_precrop((0, 0, *meta["tile_size"]), shift)[4:] for shift in meta["best_alignment"]]
    assert [out["x_crops"].shape for out in whole] == [(3, h - h % 256, w - w % 256) for h, w in sizes]
    assert whole[0]["x_crops"].shape == (3, 512, 768) and whole[-1]["x_crops"].shape == (3, 256, 512)  # self pair, shifted pair
    assert whole[0]["gain"] == meta["rgb_gain"][0]
    # the train split's grid tiles are not pre-crops
    with pytest.raises(ConfigError, match="pre-crop tiles"):
        list(wdsprep.rawnind.validation()(raw_samples(manifest, "train")))


def test_evaluation_walks_a_grid_of_every_aligned_precrop(mosaic):
    native, manifest = mosaic
    tiles = decoded(manifest, "test")
    outputs = list(wdsprep.rawnind.evaluation(crop_size=96, input="rgb", max_alignment_loss=None, min_mask_mean=None,
                                              to_torch=False)(raw_samples(manifest, "test")))
    expected = []
    for key, sample in tiles.items():  # stream order: tile, then its pairs, then the grid
        meta = sample["meta"]
        for n, shift in enumerate(meta["best_alignment"]):
            _, _, top, left, height, width = reference.aligned_precrop((*meta["tile"], *meta["tile_size"]), shift)
            expected += [(key, n, (top + y - meta["tile"][0], left + x - meta["tile"][1])) for y, x in reference.grid(height, width, 96)]
    assert len(outputs) == len(expected) > 0
    for out, (key, n, origin) in zip(outputs, expected):
        assert out["__key__"] == f"{key}-{n}-{origin[0]:05d}-{origin[1]:05d}"
        assert out["x_crops"].shape == (1, 3, 96, 96) and out["y_crops"].shape == (1, 3, 96, 96)
        assert out["rgb_xyz_matrix"].shape == (1, 4, 3)
    # crop_size=0 gives each whole aligned pre-crop once per pair
    whole = list(wdsprep.rawnind.evaluation(crop_size=0, max_alignment_loss=None, min_mask_mean=None)(raw_samples(manifest, "test")))
    assert len(whole) == sum(len(s["meta"]["pair_gt"]) for s in tiles.values()) and tuple(whole[0]["y_crops"].shape) == (1, 4, 256, 384)
    assert tuple(whole[-1]["y_crops"].shape) == (1, 4, 128, 256)  # a shifted pair: 512x768 less the shift, trimmed to 256
    assert str(whole[0]["gain"].dtype) == "torch.float32" or str(whole[0]["gain"].dtype) == "torch.float64"


def test_clean_clean_and_noisy_noisy_pairings(mosaic):
    native, manifest = mosaic
    scenes = truth(native)["scenes"]
    sample = next(s for s in decoded(manifest, "train").values() if s["meta"]["is_bayer"])
    meta = sample["meta"]
    origin, crop = (20, 40), 32
    n = meta["pair_y_clean"].index(False)  # the first clean/noisy pair
    same = crops_at(sample, n, [origin], crop_size=crop, pairing="x_x", to_torch=False)
    # x_x: y is the clean capture's own RGGB crop; the mask is all valid
    with rawpy.imread(str(native / "files" / scenes[f"Bayer/{meta['scene']}"]["clean"][0])) as raw:
        black = np.asarray(raw.black_level_per_channel, dtype=np.float32)
        mono = (raw.raw_image.astype(np.float32) - black[0]) / np.float32(raw.white_level - black[0])
    top, left = meta["tile"]
    window = mono[top + origin[0] : top + origin[0] + crop, left + origin[1] : left + origin[1] + crop]
    reference = np.stack([window[0::2, 0::2], window[0::2, 1::2], window[1::2, 0::2], window[1::2, 1::2]])
    assert np.array_equal(same["y_crops"][0], reference)
    assert same["mask_crops"].all()
    plain = crops_at(sample, n, [origin], crop_size=crop, to_torch=False)
    dy, dx = meta["best_alignment"][n]
    moved = crops_at(sample, n, [(origin[0] - dy, origin[1] - dx)], crop_size=crop, to_torch=False)
    assert np.array_equal(same["x_crops"], moved["x_crops"]) and same["gain"] == plain["gain"]  # x_x: no shift
    # y_y: x is the noisy capture profiled to Rec.2020 (what input="rgb" gives as y)
    noisy = crops_at(sample, n, [origin], crop_size=crop, pairing="y_y", to_torch=False)
    rgb = crops_at(sample, n, [origin], crop_size=crop, input="rgb", to_torch=False)
    assert np.array_equal(noisy["x_crops"], rgb["y_crops"]) and np.array_equal(noisy["y_crops"], plain["y_crops"])
    assert noisy["mask_crops"].all()
    # through the stage: the all-valid mask lets every pair through, even with min_valid=1
    stage = wdsprep.rawnind.pairs(crop_size=64, pairing="x_x", min_valid=1.0, max_alignment_loss=None,
                                  min_mask_mean=None, to_torch=False)
    outputs = list(stage(raw_samples(manifest, "train")))
    assert outputs and all(out["mask_crops"].all() for out in outputs)
    with pytest.raises(ConfigError, match="pairing"):
        wdsprep.rawnind.pairs(pairing="y_x")


def legacy_msssim_keeps(score, min_msssim_score, max_msssim_score):
    """The legacy constructor's MS-SSIM rule, as written in `rawds`."""
    if min_msssim_score and min_msssim_score > score:
        return False
    if max_msssim_score and max_msssim_score != 1.0 and max_msssim_score < score:
        return False
    return True


def reference_ms_ssim(x, y):
    """MS-SSIM written out directly: a 2-D 11x11 Gaussian (sigma 1.5) 'valid' convolution per channel,
    standard constants and weights, 2x2 mean pooling of the edge-padded image between scales."""
    from scipy.signal import convolve2d

    g = np.exp(-((np.arange(11) - 5) ** 2) / 4.5)
    window = np.outer(g, g) / np.outer(g, g).sum()
    weights = [0.0448, 0.2856, 0.3001, 0.2363, 0.1333]
    per_channel = []
    for a, b in zip(x.astype(np.float64), y.astype(np.float64)):
        value = 1.0
        for scale, weight in enumerate(weights):
            f = lambda img: convolve2d(img, window, mode="valid")  # noqa: E731
            ma, mb = f(a), f(b)
            va, vb, cov = f(a * a) - ma**2, f(b * b) - mb**2, f(a * b) - ma * mb
            cs = ((2 * cov + 0.03**2) / (va + vb + 0.03**2)).mean()
            if scale == 4:
                value *= max(((2 * ma * mb + 0.01**2) / (ma**2 + mb**2 + 0.01**2) * (2 * cov + 0.03**2) / (va + vb + 0.03**2)).mean(), 0) ** weight
                break
            value *= max(cs, 0) ** weight
            a = np.pad(a, ((0, a.shape[0] % 2), (0, a.shape[1] % 2)), mode="edge")
            b = np.pad(b, ((0, b.shape[0] % 2), (0, b.shape[1] % 2)), mode="edge")
            a = a.reshape(a.shape[0] // 2, 2, a.shape[1] // 2, 2).mean(axis=(1, 3))
            b = b.reshape(b.shape[0] // 2, 2, b.shape[1] // 2, 2).mean(axis=(1, 3))
        per_channel.append(value)
    return float(np.mean(per_channel))


def test_ms_ssim_matches_a_direct_reference():
    from wdsprep.sources.rawnind.metadata import ms_ssim

    rng = np.random.default_rng(5)
    clean = rng.random((3, 171, 203))
    for noise in (0.0, 0.02, 0.1, 0.4):
        noisy = clean + noise * rng.normal(size=clean.shape)
        assert ms_ssim(noisy, clean) == pytest.approx(reference_ms_ssim(noisy, clean), abs=1e-9)
    assert ms_ssim(clean, clean) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="160"):
        ms_ssim(clean[:, :160], clean[:, :160])


def test_msssim_filter_follows_the_legacy_rule(mosaic):
    native, manifest = mosaic
    rows = [row for row in manifest.tables["pairs"] if row["split"] == "train"]
    scores = sorted(row["rgb_msssim_score"] for row in rows)
    assert 0 < scores[0] < scores[-1] == 1.0  # a clean capture with itself scores 1
    by_pair = {(row["gt_file"], row["noisy_file"]): row["rgb_msssim_score"] for row in rows}
    tiles = decoded(manifest, "train")
    for low, high in ((0.0, 1.0), (scores[len(scores) // 2], 1.0), (0.0, scores[len(scores) // 2]), (scores[2], scores[-3])):
        stage = wdsprep.rawnind.pairs(crop_size=64, input="rgb", min_msssim_score=low, max_msssim_score=high,
                                      max_alignment_loss=None, min_mask_mean=None, to_torch=False)
        kept = {out["__key__"] for out in stage(raw_samples(manifest, "train"))}
        expected = {f"{key}-{n}" for key, sample in tiles.items()
                    for n, pair in enumerate(zip(sample["meta"]["gt_files"], sample["meta"]["y_files"]))
                    if legacy_msssim_keeps(by_pair[pair], low, high)}
        assert kept == expected
    assert 0 < len(expected) < sum(len(s["meta"]["pair_gt"]) for s in tiles.values())


def legacy_clean_bayer_mask(rggb, overexposure_lb):
    """`CleanCleanImageDataset.get_mask` for a Bayer image: nearest x2 upsampling, max over channels."""
    upsampled = np.repeat(np.repeat(rggb, 2, axis=1), 2, axis=2)
    return np.repeat((upsampled.max(axis=0) < overexposure_lb)[None], 3, axis=0)


def test_clean_pairs_use_the_overexposure_mask(mosaic):
    native, manifest = mosaic
    scenes = truth(native)["scenes"]
    tiles = decoded(manifest, "train")
    bayer_tiles = {key: s for key, s in tiles.items() if s["meta"]["is_bayer"]}
    monos = {}

    def check(out, crop_size):
        sample = bayer_tiles[out["__key__"]]
        meta = sample["meta"]
        top, left = meta["tile"]
        if meta["scene"] not in monos:
            with rawpy.imread(str(native / "files" / scenes[f"Bayer/{meta['scene']}"]["clean"][0])) as raw:
                black = np.float32(raw.black_level_per_channel[0])
                monos[meta["scene"]] = (raw.raw_image.astype(np.float32) - black) / (np.float32(raw.white_level) - black)
        mono = monos[meta["scene"]]
        assert out["gain"] == 1.0 and out["y_crops"].shape[1:] == (4, crop_size // 2, crop_size // 2)
        overexposed = False
        for crop, (y, x) in enumerate(out["origins"]):
            window = mono[top + y : top + y + crop_size, left + x : left + x + crop_size]
            rggb = np.stack([window[0::2, 0::2], window[0::2, 1::2], window[1::2, 0::2], window[1::2, 1::2]])
            assert np.array_equal(out["y_crops"][crop], rggb)
            expected = legacy_clean_bayer_mask(rggb, meta["overexposure_lb"])
            assert np.array_equal(out["mask_crops"][crop], expected)
            overexposed |= not expected.all()
        return overexposed

    outputs = list(wdsprep.rawnind.clean_pairs(crop_size=64, num_crops=3, min_valid=0.5, seed=2, epoch=0,
                                               to_torch=False)(raw_samples(manifest, "train")))
    assert [out["__key__"] for out in outputs] == list(bayer_tiles)
    for out in outputs:
        check(out, 64)
        assert out["x_crops"].shape == (3, 3, 64, 64) and all(m.mean() >= 0.5 for m in out["mask_crops"])
        sample = bayer_tiles[out["__key__"]]
        plain = crops_at(sample, 0, out["origins"], crop_size=64, to_torch=False)
        assert np.array_equal(out["x_crops"], plain["x_crops"])
    # with many crops some see the synthetic overexposed patch: the mask there follows the rule too
    many = list(wdsprep.rawnind.clean_pairs(crop_size=128, num_crops=40, min_valid=0.0, seed=1, epoch=0,
                                            to_torch=False)(raw_samples(manifest, "train")))
    assert any([check(out, 128) for out in many])
    # RGB: x only, per-channel mask x < overexposure_lb; X-Trans tiles included
    rgb = list(wdsprep.rawnind.clean_pairs(crop_size=64, input="rgb", min_valid=0.0, seed=2, epoch=0,
                                           to_torch=False)(raw_samples(manifest, "train")))
    assert len(rgb) == len(tiles) and "y_crops" not in rgb[0]
    for out in rgb:
        bound = tiles[out["__key__"]]["meta"]["overexposure_lb"]
        assert np.array_equal(out["mask_crops"], out["x_crops"] < bound)
