"""wdsprep's RawNIND pairs against the legacy rules (`upstream_reference`, written from
github.com/trougnouf/rawnind_jddc), on synthetic scenes with known odd and even shifts:

1. registration: the clean target sits at the noisy crop plus the exact shift (odd ones too), the
   noisy crop keeps its Bayer phase; the measured residual shift is as small on odd as on even;
2. `best_alignment_loss` is upstream's (L1 on the 3-channel RGB images), so the default 0.035
   filter admits the pairs upstream admits;
3. the pair list per split is upstream's (every clean capture a reference; clean-clean pairs);
4. validation and test crops are where upstream takes them, for either `--tile-size`.
"""
import shutil

import numpy as np
import pytest
import webdataset as wds
import yaml

import wdsprep
from wdsprep.conversion import convert
from wdsprep.sources.rawnind.read import crops_at
from wdsprep.sources.rawnind.synth import synth

from . import upstream_reference as reference
from .rawnind_testdata import truth


@pytest.fixture(scope="module")
def small(synth_small, tmp_path_factory):
    work = tmp_path_factory.mktemp("rawnind_upstream")
    shutil.copytree(synth_small, work / "native")
    manifest = convert("rawnind", str(work / "native"), str(work / "shards"), shard_bytes="16MB", tile_size=256)
    return work / "native", manifest


@pytest.fixture(scope="module")
def precrop(tmp_path_factory):
    """800x2336 captures: upstream cuts the test scene into two pre-crops. Converted with tiles of
    512 and of 1024 (the second run reuses the metadata cache)."""
    work = tmp_path_factory.mktemp("rawnind_precrop")
    synth(str(work / "native"), seed=0, size="precrop")
    manifests = {tile: convert("rawnind", str(work / "native"), str(work / f"shards{tile}"), shard_bytes="64MB",
                               tile_size=tile) for tile in (512, 1024)}
    return work / "native", manifests


def tiles(manifest, split):
    return {s["__key__"]: s for s in wds.WebDataset(wdsprep.urls(manifest.url, split), shardshuffle=False)
            .compose(wdsprep.rawnind.tiles())}


def raw_samples(manifest, split):
    return list(wds.WebDataset(wdsprep.urls(manifest.url, split), shardshuffle=False))


class Scenes:
    """The reference's view of a synthetic directory: monos, EA-demosaiced camRGB, Rec.2020 (cached)."""

    def __init__(self, native):
        self.native = native
        self.index = yaml.safe_load((native / "dataset_index.yaml").read_text())
        self._cache = {}

    def mono(self, name):
        if ("mono", name) not in self._cache:
            self._cache[("mono", name)] = reference.mono(self.native / "files" / name)
        return self._cache[("mono", name)]

    def rgb(self, name):
        if ("rgb", name) not in self._cache:
            self._cache[("rgb", name)] = reference.demosaic(self.mono(name)[0])
        return self._cache[("rgb", name)]

    def rec2020(self, name):
        return reference.to_rec2020(self.rgb(name), self.mono(name)[1])

    def pairs(self, cfa="Bayer"):
        """(scene, split, gt, f) of every upstream pair (prep_image_dataset.py)."""
        out = []
        for scene, entry in self.index.get(cfa, {}).items():
            clean = [e["filename"] for e in entry["clean_images"] if not e["filename"].endswith(".xmp")]
            noisy = [e["filename"] for e in entry["noisy_images"]]
            split = "test" if entry["test_reserve"] else "train"
            out += [(scene, split, gt, f) for gt, f in reference.scene_pairs(clean, noisy)]
        return out


def true_shift(native, scene_key, gt, f):
    scene = truth(native)["scenes"][scene_key]
    if f in scene["noisy"]:
        return scene["noisy"][f]["shift"]
    return [0, 0]  # a clean capture against a clean capture of the same view


# --- 1. registration -------------------------------------------------------------------------------
def residual_shift(x, y):
    """Sub-pixel (dy, dx) that best moves y onto x: L1 of 4x4 block means (the noise averaged away)
    at integer moves -2..2, then a parabola through the minimum and its neighbours, per axis."""
    def error(dy, dx):
        moved = np.roll(y, (dy, dx), axis=(-2, -1))[..., 8:-8, 8:-8]
        a, b = x[..., 8:-8, 8:-8], moved
        k, h, w = a.shape[-3], a.shape[-2] // 4 * 4, a.shape[-1] // 4 * 4
        blocks = lambda v: v[..., :h, :w].reshape(-1, k, h // 4, 4, w // 4, 4).mean(axis=(3, 5))  # noqa: E731
        return float(np.abs(blocks(a) - blocks(b)).mean())

    errors = {(dy, dx): error(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)}
    by, bx = min(errors, key=errors.get)
    out = []
    for axis in range(2):
        if abs((by, bx)[axis]) == 2:
            out.append(float((by, bx)[axis]))
            continue
        step = (1, 0) if axis == 0 else (0, 1)
        minus, centre = errors[(by - step[0], bx - step[1])], errors[(by, bx)]
        plus = errors[(by + step[0], bx + step[1])]
        curvature = minus - 2 * centre + plus
        out.append((by, bx)[axis] + (0.5 * (minus - plus) / curvature if curvature > 0 else 0.0))
    return out


@pytest.mark.parametrize("cfa", ["Bayer", "X-Trans"])
def test_registration_is_as_good_on_odd_shifts_as_on_even(small, cfa):
    native, manifest = small
    scenes = Scenes(native)
    residuals = {"odd": [], "even": []}
    by_pair = {}
    rng = np.random.default_rng(3)
    for key, sample in tiles(manifest, "train").items():
        meta = sample["meta"]
        if meta["cfa"] != cfa:
            continue
        top, left = meta["tile"]
        for n, (y_clean, gt, y) in enumerate(zip(meta["pair_y_clean"], meta["pair_gt"], meta["pair_y"])):
            if gt or (y_clean and y == gt):
                continue  # the first reference's pairs, not a capture with itself
            name = meta["y_files"][n]
            shift = true_shift(native, f"{cfa}/{meta['scene']}", meta["gt_files"][n], name)
            assert meta["best_alignment"][n] == shift
            origins = [(2 * int(rng.integers(0, 48)), 2 * int(rng.integers(0, 48))) for _ in range(4)]
            out = crops_at(sample, n, origins, crop_size=128, input="rgb", legacy_values=True, to_torch=False)
            if cfa == "Bayer":  # exactly upstream's aligned pair: x at the y position plus the exact shift
                clean, noisy = scenes.rec2020(meta["gt_files"][n]), scenes.rec2020(name)
                rggb = crops_at(sample, n, origins, crop_size=128, legacy_values=True, to_torch=False)["y_crops"]
                mono = scenes.mono(name)[0][0]
                for k, (oy, ox) in enumerate(origins):
                    y, x = top + oy, left + ox
                    region = (slice(None), slice(y + shift[0], y + shift[0] + 128), slice(x + shift[1], x + shift[1] + 128))
                    if region[1].start >= 0 and region[2].start >= 0 and region[1].stop <= clean.shape[1] and region[2].stop <= clean.shape[2]:
                        assert np.allclose(out["x_crops"][k], clean[region], rtol=0, atol=1e-6)
                    assert np.allclose(out["y_crops"][k], noisy[:, y : y + 128, x : x + 128], rtol=0, atol=1e-6)
                    window = mono[y : y + 128, x : x + 128]  # the Bayer phase: R at the crop origin
                    assert np.array_equal(rggb[k], np.stack([window[0::2, 0::2], window[0::2, 1::2], window[1::2, 0::2], window[1::2, 1::2]]))
            valid = out["mask_crops"].mean(axis=(1, 2, 3)) > 0.9
            crops = by_pair.setdefault((meta["gt_files"][n], name), (shift, meta["rgb_gain"][n], [], []))
            crops[2].extend(out["x_crops"][valid])
            crops[3].extend(out["y_crops"][valid] * np.float32(meta["rgb_gain"][n]))
    for shift, _, x, y in by_pair.values():  # every tile's crops of a pair together: the noise averages out
        measured = residual_shift(np.stack(x), np.stack(y))
        residuals["odd" if any(v % 2 for v in shift) else "even"].append(max(abs(v) for v in measured))
    assert residuals["odd"] and (residuals["even"] or cfa == "X-Trans"), residuals  # small X-Trans: odd shifts only
    # registered to a fraction of a pixel (a one-pixel error measures about 1), no worse on odd shifts
    assert max(residuals["odd"] + residuals["even"]) < 0.3, residuals
    assert np.mean(residuals["odd"]) <= np.mean(residuals["even"] or residuals["odd"]) + 0.1, residuals


# --- 2. the alignment loss and its filter ------------------------------------------------------------
def test_alignment_loss_and_filter_are_upstreams(small):
    native, manifest = small
    scenes = Scenes(native)
    rows = {(row["gt_file"], row["noisy_file"]): row for row in manifest.tables["pairs"] if row["scene"].startswith("Bayer/")}
    admitted = {"reference": set(), "wdsprep": set()}
    for scene, split, gt, f in scenes.pairs():
        row = rows[(gt, f)]
        shift = true_shift(native, f"Bayer/{scene}", gt, f)
        assert row["best_alignment"] == shift
        loss = reference.alignment_loss(scenes.rgb(gt), scenes.rgb(f), shift)
        assert row["best_alignment_loss"] == pytest.approx(loss, rel=1e-5, abs=1e-9)
        # upstream's greedy search stops there: every neighbour is worse
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                if (dy or dx) and loss > 0:
                    assert reference.alignment_loss(scenes.rgb(gt), scenes.rgb(f), (shift[0] + dy, shift[1] + dx)) > loss
        assert row["rgb_gain"] == pytest.approx(float(scenes.rgb(gt).mean() / scenes.rgb(f).mean()), rel=1e-6)
        if loss <= 0.035:
            admitted["reference"].add((gt, f))
        if row["best_alignment_loss"] <= 0.035:
            admitted["wdsprep"].add((gt, f))
    assert admitted["reference"] == admitted["wdsprep"]
    assert 0 < len(admitted["reference"]) < len(scenes.pairs())  # the filter matters on this set
    # the reader's default filter admits exactly those (mask means are all above 0.8 here)
    kept = set()
    for split in ("train", "test"):
        for out in wdsprep.rawnind.pairs(crop_size=64, to_torch=False, min_mask_mean=None)(raw_samples(manifest, split)):
            key, n = out["__key__"].rsplit("-", 1)
            meta = tiles(manifest, split)[key]["meta"]
            kept.add((meta["gt_files"][int(n)], meta["y_files"][int(n)]))
    assert kept == admitted["reference"]


# --- 3. the pairs per split --------------------------------------------------------------------------
def test_pair_lists_per_split_are_upstreams(small):
    native, manifest = small
    scenes = Scenes(native)
    from wdsprep.rawnind import CleanProfiledRGBNoisyBayerImageCropsDataset as Dataset

    everything = scenes.pairs()
    assert any(gt == f for _, _, gt, f in everything) and len({gt for _, _, gt, _ in everything}) > len(scenes.index["Bayer"])
    clean_files = {e["filename"] for entry in scenes.index["Bayer"].values() for e in entry["clean_images"]}
    first_clean = {entry["clean_images"][0]["filename"] for entry in scenes.index["Bayer"].values()}
    for split in ("train", "test"):
        expected = sorted((scene, gt, f) for scene, s, gt, f in everything if s == split)
        dataset = Dataset(manifest.url, split, alignment_max_loss=None, mask_mean_min=None, to_torch=False)
        assert dataset.pairs == expected
        # the options to leave them out: clean y, second references, and upstream's MS-SSIM bound
        no_clean = Dataset(manifest.url, split, alignment_max_loss=None, mask_mean_min=None, clean_clean=False)
        assert no_clean.pairs == [p for p in expected if p[2] not in clean_files]
        first = Dataset(manifest.url, split, alignment_max_loss=None, mask_mean_min=None, second_references=False)
        assert first.pairs == [p for p in expected if p[1] in first_clean]
        below_one = Dataset(manifest.url, split, alignment_max_loss=None, mask_mean_min=None, max_msssim_score=0.9999)
        assert below_one.pairs == [p for p in expected if p[1] != p[2]]  # a capture with itself scores 1.0
    # the stage yields the same pairs, once per tile
    stage_pairs = set()
    for out in wdsprep.rawnind.pairs(crop_size=64, to_torch=False, max_alignment_loss=None, min_mask_mean=None)(
            raw_samples(manifest, "train")):
        key, n = out["__key__"].rsplit("-", 1)
        meta = tiles(manifest, "train")[key]["meta"]
        stage_pairs.add((meta["scene"], meta["gt_files"][int(n)], meta["y_files"][int(n)]))
    assert stage_pairs == {(scene, gt, f) for scene, s, gt, f in everything if s == "train"}


# --- 4. validation and test crops --------------------------------------------------------------------
def test_validation_and_test_crops_are_where_upstream_takes_them(precrop):
    native, manifests = precrop
    scenes = Scenes(native)
    test_scene = [(scene, gt, f) for scene, split, gt, f in scenes.pairs() if split == "test"]
    height, width = scenes.mono(test_scene[0][1])[0].shape[1:]
    regions = [region for _, region in reference.precrops(height, width)]
    assert len(regions) == 2
    shifts = {(gt, f): true_shift(native, f"Bayer/{scene}", gt, f) for scene, gt, f in test_scene}
    crop = 256
    val_expected, test_expected = [], []
    for gt, f in shifts:
        gt_top, gt_left, top, left, h, w = reference.aligned_precrop(regions[len(regions) // 2], shifts[(gt, f)])
        cy, cx = reference.center_crop(h, w, crop)
        val_expected.append((gt, f, (top + cy, left + cx), (gt_top + cy, gt_left + cx)))
        for region in regions:
            gt_top, gt_left, top, left, h, w = reference.aligned_precrop(region, shifts[(gt, f)])
            test_expected += [(gt, f, (top + y, left + x), (gt_top + y, gt_left + x)) for y, x in reference.grid(h, w, crop)]
    outputs = {}
    for tile, manifest in manifests.items():
        assert [s["meta"]["tile_size"] for s in tiles(manifest, "test").values()] == [list(r[2:]) for r in regions]
        options = dict(crop_size=crop, max_alignment_loss=None, min_mask_mean=None, to_torch=False)
        val = list(wdsprep.rawnind.validation(**options)(raw_samples(manifest, "test")))
        test = list(wdsprep.rawnind.evaluation(**options)(raw_samples(manifest, "test")))
        for got, expected in ((val, val_expected), (test, test_expected)):
            assert sorted((o["gt_file"], o["y_file"], tuple(o["position"]), tuple(o["gt_position"])) for o in got) == sorted(expected)
        outputs[tile] = (val, test)
        # the values: upstream's demosaic of the whole clean capture, and the noisy RGGB, there
        for out in val:
            clean = scenes.rec2020(out["gt_file"])
            (gy, gx), (y, x) = out["gt_position"], out["position"]
            assert np.allclose(out["x_crops"], clean[:, gy : gy + crop, gx : gx + crop], rtol=0, atol=1e-6)
            window = scenes.mono(out["y_file"])[0][0][y : y + crop, x : x + crop]
            assert np.array_equal(out["y_crops"], np.stack([window[0::2, 0::2], window[0::2, 1::2], window[1::2, 0::2], window[1::2, 1::2]]))
    # independent of --tile-size: the same crops, the same values
    for a, b in zip(*(outputs[tile][0] + outputs[tile][1] for tile in (512, 1024))):
        assert a["__key__"] == b["__key__"] and np.array_equal(a["x_crops"], b["x_crops"]) and np.array_equal(a["y_crops"], b["y_crops"])
    assert [r["sha256"] for r in manifests[512].splits["test"]] == [r["sha256"] for r in manifests[1024].splits["test"]]
    assert len(manifests[512].splits["train"]) and manifests[512].splits["train"] != manifests[1024].splits["train"]
