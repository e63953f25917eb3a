"""The mosaic layout (`layout="mosaic"`, the default): what the cameras recorded, targets made at
read time. Checked against rawpy (the stored mosaics), the legacy float layout (today's values),
LibRaw's own whole-image demosaic (X-Trans) and small references written here."""
import shutil
import tarfile

import numpy as np
import pytest
import rawpy
import webdataset as wds

import wdsprep
from wdsprep.conversion import convert
from wdsprep.sources.rawnind.convert import tile_spans
from wdsprep.sources.rawnind.raw import XYZ_TO_LIN_REC2020, normalise
from wdsprep.sources.rawnind.read import crops_at, tile_mask

from . import upstream_reference as reference
from .rawnind_testdata import truth


@pytest.fixture(scope="module")
def both_layouts(synth_small, tmp_path_factory):
    work = tmp_path_factory.mktemp("rawnind_mosaic")
    native = work / "native"
    shutil.copytree(synth_small, native)
    mosaic = convert("rawnind", str(native), str(work / "mosaic"), shard_bytes="4MB", tile_size=512)
    legacy = convert("rawnind", str(native), str(work / "legacy"), shard_bytes="4MB", tile_size=512, layout="legacy")
    return native, mosaic, legacy


def tiles_of(manifest, split=None):
    splits = [split] if split else list(manifest.splits)
    urls = [url for name in splits for url in wdsprep.urls(manifest.url, name)]
    return {s["__key__"]: s for s in wds.WebDataset(urls, shardshuffle=False).compose(wdsprep.rawnind.tiles())}


def blocks(images, size=4):
    k, h, w = images.shape
    return images.reshape(k, h // size, size, w // size, size).mean(axis=(2, 4))


def raw_image(path):
    with rawpy.imread(str(path)) as raw:
        return raw.raw_image.copy()


def test_shards_are_no_bigger_than_the_raw_files(both_layouts):
    native, mosaic, legacy = both_layouts
    scenes = truth(native)["scenes"]
    # bytes per CFA, read with tarfile (headers + padded data per member), against the files used
    shard_bytes = {"Bayer": 0, "X-Trans": 0}
    for rows in mosaic.splits.values():
        for row in rows:
            with tarfile.open(native.parent / "mosaic" / row["name"]) as tar:
                for member in tar.getmembers():
                    cfa = "X-Trans" if member.name.startswith("X-Trans-") else "Bayer"
                    shard_bytes[cfa] += 512 + -(-member.size // 512) * 512
    raw_bytes = {"Bayer": 0, "X-Trans": 0}
    for key, scene in scenes.items():
        used = [*scene["clean"], *scene["noisy"]]
        raw_bytes[key.split("/")[0]] += sum((native / "files" / name).stat().st_size for name in used)
    assert raw_bytes["X-Trans"] > 0
    for cfa in raw_bytes:
        assert shard_bytes[cfa] / raw_bytes[cfa] <= 1.0, (cfa, shard_bytes[cfa], raw_bytes[cfa])
    total = sum(row["bytes"] for rows in mosaic.splits.values() for row in rows)
    assert total <= mosaic.input_bytes == sum(raw_bytes.values())
    assert sum(row["bytes"] for rows in legacy.splits.values() for row in rows) > 2 * total


def test_tiles_hold_the_recorded_mosaics(both_layouts):
    native, mosaic, _ = both_layouts
    scenes = truth(native)["scenes"]
    tiles = tiles_of(mosaic)
    covered: dict[str, np.ndarray] = {}
    for key, sample in tiles.items():
        meta = sample["meta"]
        scene = scenes[f"{meta['cfa']}/{meta['scene']}"]
        assert meta["clean_files"] == scene["clean"] and sorted(meta["noisy_files"]) == sorted(scene["noisy"])
        top, left = meta["tile"]
        th, tw = meta["tile_size"]
        halo = meta["halo"]
        shifts = [scene["noisy"][name]["shift"] for name in meta["noisy_files"]]
        # every capture unshifted; the clean ones with a margin for the largest shift
        cy, cx, ch, cw = meta["clean_window"]
        margin = (max(abs(dy) for dy, _ in shifts) + halo + 1, max(abs(dx) for _, dx in shifts) + halo + 1)
        assert (cy, cx) == (max(top - margin[0], 0), max(left - margin[1], 0))
        for c, name in enumerate(meta["clean_files"]):
            clean = raw_image(native / "files" / name)
            assert sample["clean"].dtype == np.uint16 and np.array_equal(sample["clean"][c], clean[cy : cy + ch, cx : cx + cw])
        ny, nx, nh, nw = meta["noisy_window"]
        assert (ny, nx) == (max(top - halo, 0), max(left - halo, 0))
        for n, name in enumerate(meta["noisy_files"]):
            assert np.array_equal(sample["noisy"][n], raw_image(native / "files" / name)[ny : ny + nh, nx : nx + nw])
        # upstream's pairs, each with its known shift
        clean_count = len(meta["clean_files"])
        assert len(meta["pair_gt"]) == clean_count * (clean_count + len(meta["noisy_files"]))
        for n, (y_clean, y) in enumerate(zip(meta["pair_y_clean"], meta["pair_y"])):
            if not y_clean:
                assert meta["best_alignment"][n] == scene["noisy"][meta["noisy_files"][y]]["shift"]
            mask = tile_mask(sample, n)
            assert mask.shape == (th, tw) and 0.8 < mask.mean() <= 1.0
        seen = covered.setdefault(key.rsplit("-", 2)[0], np.zeros(raw_image(native / "files" / scene["clean"][0]).shape, dtype=int))
        seen[top : top + th, left : left + tw] += 1
    # the tiles of a scene cover its image exactly once (no overlap, no gap)
    assert len(covered) == 5 and all((seen == 1).all() for seen in covered.values())


def test_tile_spans_partition():
    for length in range(4, 3000, 4):
        for tile in (8, 64, 256, 512):
            spans = tile_spans(length, tile)
            assert spans[0][0] == 0 and sum(size for _, size in spans) == length
            assert all(a + size == b for (a, size), (b, _) in zip(spans, spans[1:]))
            assert all(size % 4 == 0 and (size > tile // 2 - 4 or len(spans) == 1) for _, size in spans)
            assert len(spans) == -(-length // tile)


def test_legacy_values_equal_the_legacy_layout(both_layouts):
    """`legacy_values=True` on the mosaic layout gives the float layout's noisy RGGB values bit for
    bit at the same noisy positions (the legacy layout stores the noisy capture at the clean tile
    position minus the even-rounded shift), and, for even shifts, the same masks."""
    _, mosaic, legacy = both_layouts
    new, old = tiles_of(mosaic), tiles_of(legacy)
    crop = 64
    rng = np.random.default_rng(0)
    compared = 0
    for sample in new.values():
        meta = sample["meta"]
        if meta["cfa"] != "Bayer":
            continue
        top, left = meta["tile"]
        th, tw = meta["tile_size"]
        for n in (n for n in range(len(meta["pair_gt"])) if meta["pair_gt"][n] == 0 and not meta["pair_y_clean"][n]):
            dy, dx = meta["best_alignment"][n]
            ey, ex = dy - dy % 2, dx - dx % 2
            for _ in range(6):
                y, x = top + 2 * int(rng.integers(0, (th - crop) // 2 + 1)), left + 2 * int(rng.integers(0, (tw - crop) // 2 + 1))
                ly, lx = y + ey, x + ex  # the same noisy pixels in the legacy tiles' (clean) frame
                base = [s for s in old.values() if s["meta"]["scene"] == meta["scene"]
                        and s["meta"]["tile"][0] <= ly and ly + crop <= s["meta"]["tile"][0] + 512
                        and s["meta"]["tile"][1] <= lx and lx + crop <= s["meta"]["tile"][1] + 512][:1]
                if not base:
                    continue
                [base] = base
                m = base["meta"]["noisy_files"].index(meta["y_files"][n])
                got = crops_at(sample, n, [(y - top, x - left)], crop_size=crop, legacy_values=True, to_torch=False)
                want = crops_at(base, m, [(ly - base["meta"]["tile"][0], lx - base["meta"]["tile"][1])], crop_size=crop, to_torch=False)
                assert np.array_equal(got["y_crops"], want["y_crops"]), (y, x, n)
                if (dy, dx) == (ey, ex):
                    assert np.array_equal(got["mask_crops"], want["mask_crops"]), (y, x, n)
                assert got["gain"] == want["gain"]
                compared += 1
    assert compared >= 40


def test_normalise_uses_each_sites_black_level():
    pattern = np.array([[0, 1], [3, 2]], dtype=np.uint8)
    black = [500, 510, 520, 530]
    data = np.arange(600, 600 + 6 * 8, dtype=np.uint16).reshape(6, 8)
    got = normalise(data, pattern, black, 16000, origin=(1, 0))
    for y in range(6):
        for x in range(8):
            level = black[pattern[(y + 1) % 2, x % 2]]
            assert got[y, x] == np.float32((np.float32(data[y, x]) - level) / (np.float32(16000) - level))
    legacy = normalise(data, pattern, black, 16000, origin=(1, 0), legacy=True)
    assert np.array_equal(legacy, (data.astype(np.float32) - 500) / np.float32(16000 - 500))


def test_rgb_input_reference(both_layouts):
    """RGB -> RGB pairs (CleanProfiledRGBNoisyProfiledRGB): y is the noisy capture demosaiced as
    upstream (`raw.demosaic` of the whole image, upstream_reference) and profiled like x, at the
    crop position; x is the clean one at that position plus the exact shift; gain is rgb_gain."""
    native, mosaic, _ = both_layouts
    scenes = truth(native)["scenes"]
    sample = next(s for s in tiles_of(mosaic, "train").values() if s["meta"]["cfa"] == "Bayer")
    meta = sample["meta"]
    top, left = meta["tile"]
    clean_mono, matrix = reference.mono(native / "files" / meta["clean_files"][0])
    clean = reference.to_rec2020(reference.demosaic(clean_mono), matrix)
    for n, name in enumerate(meta["y_files"]):
        if meta["pair_gt"][n]:
            continue
        out = crops_at(sample, n, [(10, 20)], crop_size=32, input="rgb", legacy_values=True, to_torch=False)
        assert out["y_crops"].shape == (1, 3, 32, 32) and out["gain"] == meta["rgb_gain"][n]
        mono, _ = reference.mono(native / "files" / name)
        noisy = reference.to_rec2020(reference.demosaic(mono), matrix)
        dy, dx = meta["best_alignment"][n]
        if not meta["pair_y_clean"][n]:
            assert [dy, dx] == scenes[f"Bayer/{meta['scene']}"]["noisy"][name]["shift"]
        y, x = top + 10, left + 20
        assert np.allclose(out["y_crops"][0], noisy[:, y : y + 32, x : x + 32], rtol=0, atol=1e-6)
        assert np.allclose(out["x_crops"][0], clean[:, y + dy : y + dy + 32, x + dx : x + dx + 32], rtol=0, atol=1e-6)


def test_xtrans_pairs_are_aligned_and_demosaiced_by_libraw(both_layouts):
    native, mosaic, _ = both_layouts
    scenes = truth(native)["scenes"]
    [(key, sample)] = [(k, s) for k, s in tiles_of(mosaic).items() if s["meta"]["cfa"] == "X-Trans"][:1]
    meta = sample["meta"]
    assert meta["is_bayer"] is False and np.asarray(meta["cfa_pattern"]).shape == (6, 6)
    scene = scenes[f"X-Trans/{meta['scene']}"]
    # x: the crop of LibRaw's own VNG demosaic of the whole clean file (interior of the crop)
    with rawpy.imread(str(native / "files" / scene["clean"][0])) as raw:
        white, black = raw.white_level, raw.black_level_per_channel[0]
        whole = raw.postprocess(demosaic_algorithm=rawpy.DemosaicAlgorithm.VNG, output_color=rawpy.ColorSpace.raw,
                                gamma=(1, 1), no_auto_bright=True, output_bps=16, user_wb=[1, 1, 1, 1], user_flip=0,
                                user_black=0, adjust_maximum_thr=0.0)
    cam = (np.moveaxis(whole, -1, 0).astype(np.float64) * white / 65535 - black) / (white - black)
    top, left = meta["tile"]
    to_rec2020 = XYZ_TO_LIN_REC2020 @ np.linalg.inv(np.asarray(meta["rgb_xyz_matrix"], dtype=np.float64)[:3])
    y0, x0, crop = 100, 60, 64
    out = crops_at(sample, 0, [(y0, x0)], crop_size=crop, input="rgb", to_torch=False)
    expected = np.einsum("ij,jhw->ihw", to_rec2020, cam[:, top + y0 : top + y0 + crop, left + x0 : left + x0 + crop])
    inner = (slice(None), slice(8, -8), slice(8, -8))
    assert np.abs(out["x_crops"][0][inner] - expected[inner]).max() < 1e-3
    # the pairs come out aligned with the known shift: y x gain matches x (noise aside), and
    # moving y by a pixel makes it worse
    samples = list(wdsprep.rawnind.pairs(crop_size=128, input="rgb", max_alignment_loss=None, min_mask_mean=None,
                                         to_torch=False)([raw for raw in wds.WebDataset(wdsprep.urls(mosaic.url, "train"), shardshuffle=False)
                                                          if raw["__key__"] == key]))
    assert len(samples) == len(meta["pair_gt"]) == 1 + len(meta["noisy_files"])  # the clean capture with itself too
    for n, pair in enumerate(samples):
        if meta["pair_y_clean"][n]:
            continue
        name = meta["y_files"][n]
        assert meta["best_alignment"][n] == scene["noisy"][name]["shift"]
        gain = scene["noisy"][name]["gain"]
        x, y = pair["x_crops"].mean(axis=1), pair["y_crops"].mean(axis=1) * gain
        assert pair["mask_crops"].all(axis=1).mean() > 0.9

        def error(shift):  # means of 4x4 blocks average the noise away
            moved = np.roll(y, shift, axis=(1, 2))[:, 8:-8, 8:-8]
            return np.abs(blocks(x[:, 8:-8, 8:-8]) - blocks(moved)).mean()

        errors = {(dy, dx): error((dy, dx)) for dy in range(-3, 4) for dx in range(-3, 4)}
        assert min(errors, key=errors.get) == (0, 0), errors
        assert errors[(0, 0)] < 0.9 * min(errors[(3, 0)], errors[(-3, 0)], errors[(0, 3)], errors[(0, -3)])
    # and the Bayer reader leaves X-Trans scenes out
    bayer = list(wds.WebDataset(wdsprep.urls(mosaic.url, "train"), shardshuffle=False)
                 .compose(wdsprep.rawnind.pairs(max_alignment_loss=None, min_mask_mean=None, to_torch=False)))
    assert bayer and not any(s["__key__"].startswith("X-Trans") for s in bayer)


def test_map_style_reads_the_mosaic_layout(both_layouts):
    _, mosaic, _ = both_layouts
    from wdsprep.rawnind import CleanProfiledRGBNoisyBayerImageCropsDataset as Dataset

    bayer = Dataset(mosaic.url, crop_size=128, alignment_max_loss=None, mask_mean_min=None, to_torch=False)
    rgb = Dataset(mosaic.url, crop_size=128, alignment_max_loss=None, mask_mean_min=None, to_torch=False, input="rgb")
    # upstream's pairs: plants 1 x (1 + 2), book_shelf 2 x (2 + 3), MuseeL-toys 1 x (1 + 2); X-Trans 1 x (1 + 2) as RGB only
    assert len(bayer) == 3 + 10 + 3 and len(rgb) == 16 + 3
    assert bayer[0]["y_crops"].shape == (4, 4, 64, 64) and rgb[18]["y_crops"].shape == (4, 3, 128, 128)


def _convolve_demosaic(mono):
    """The per-plane form `raw.demosaic` had (bilinear kernels, ndimage mirror edges): the reference."""
    from scipy.ndimage import convolve

    plane = mono[0].astype(np.float32)
    planes = [np.zeros_like(plane) for _ in range(3)]
    planes[0][0::2, 0::2] = plane[0::2, 0::2]
    planes[1][0::2, 1::2] = plane[0::2, 1::2]
    planes[1][1::2, 0::2] = plane[1::2, 0::2]
    planes[2][1::2, 1::2] = plane[1::2, 1::2]
    k_rb = np.array([[0.25, 0.5, 0.25], [0.5, 1.0, 0.5], [0.25, 0.5, 0.25]], dtype=np.float32)
    k_g = np.array([[0.0, 0.25, 0.0], [0.25, 1.0, 0.25], [0.0, 0.25, 0.0]], dtype=np.float32)
    return np.stack([convolve(planes[0], k_rb, mode="mirror"), convolve(planes[1], k_g, mode="mirror"),
                     convolve(planes[2], k_rb, mode="mirror")])


@pytest.mark.parametrize("shape", [(2, 2), (4, 6), (10, 4), (66, 130)])
def test_demosaic_equals_the_convolution_form(shape):
    from wdsprep.sources.rawnind.raw import demosaic

    rng = np.random.default_rng(sum(shape))
    mono = (rng.integers(0, 16384, size=(1, *shape)).astype(np.float32) - 512) / np.float32(16383 - 512)
    assert np.array_equal(demosaic(mono), _convolve_demosaic(mono))
