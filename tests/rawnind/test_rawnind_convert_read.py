"""The legacy float layout (`layout="legacy"`): convert scenes to shards and read the legacy
loader's crop pairs back. The mosaic layout's tests are in test_rawnind_mosaic.py."""
import contextlib
import shutil
import tarfile

import msgpack
import numpy as np
import pytest
import rawpy
import webdataset as wds
import yaml

import wdsprep
from wdsprep.conversion import convert
from wdsprep.errors import ConfigError, InputError, ShardError
from wdsprep.shards.codec import Encoder
from wdsprep.sources.rawnind.convert import tile_origins
from wdsprep.sources.rawnind.raw import XYZ_TO_LIN_REC2020

from .rawnind_testdata import truth


@pytest.fixture(scope="module")
def shards(synth_small, tmp_path_factory):
    # convert reads (and caches metadata in) its input, so work on a copy of the session fixture
    work = tmp_path_factory.mktemp("rawnind_convert")
    native = work / "native"
    shutil.copytree(synth_small, native)
    out = work / "shards"
    manifest = convert("rawnind", str(native), str(out), shard_bytes="4MB", tile_size=512, layout="legacy")
    return native, out, manifest


def native_mono(path):
    """The legacy normalisation, straight from rawpy (the synthetic DNGs are RGGB, no margins)."""
    with rawpy.imread(str(path)) as raw:
        black = np.array(raw.black_level_per_channel, dtype=np.float32)
        return (raw.raw_image.astype(np.float32) - black[0]) / (raw.white_level - black[0]), np.array(raw.rgb_xyz_matrix)


def blocks(image, size=4):
    """Means of size x size blocks (averages the noise away)."""
    h, w = (image.shape[0] // size) * size, (image.shape[1] // size) * size
    return image[:h, :w].reshape(h // size, size, w // size, size).mean(axis=(1, 3))


def test_manifest_splits_tables_and_problems(shards, synth_small):
    native, out, manifest = shards
    assert manifest.source == "rawnind"
    # 512x768 images, tile 512 -> origins (0,0), (0,256): 2 tiles per scene; 3 train scenes, 1 test
    counts = {split: sum(row["samples"] for row in rows) for split, rows in manifest.splits.items()}
    assert counts == {"train": 6, "test": 2}
    assert len(manifest.tables["pairs"]) == 9
    # the legacy float layout is Bayer only: the X-Trans scene is listed, not converted
    assert manifest.problems == [{"item": "X-Trans/Fuji_flowers", "message": "the legacy layout holds Bayer scenes only; not converted"}]
    assert manifest.config["tile_size"] == 512
    assert (native / "metadata_cache.jsonl").exists()  # computed once, reused by a re-run


def test_tiles_hold_aligned_pairs(shards, synth_small):
    native, out, manifest = shards
    scenes = truth(synth_small)["scenes"]
    urls = wdsprep.urls(str(out / "manifest.json"), "train") + wdsprep.urls(str(out / "manifest.json"), "test")
    seen = 0
    for sample in wds.WebDataset(urls, shardshuffle=False).compose(wdsprep.rawnind.tiles()):
        meta = sample["meta"]
        scene = scenes[f"Bayer/{meta['scene']}"]
        assert meta["gt_file"] == scene["clean"][0]
        assert sample["__key__"] == f"Bayer-{meta['scene']}-{meta['tile'][0]:05d}-{meta['tile'][1]:05d}"
        top, left = meta["tile"]
        gt_mono, matrix = native_mono(native / "files" / meta["gt_file"])
        # clean tile = linear Rec.2020 of the clean capture at the tile position
        assert sample["gt_rgb"].shape == (3, 512, 512) and sample["gt_rgb"].dtype == np.float32
        cam_to_rec2020 = XYZ_TO_LIN_REC2020 @ np.linalg.inv(matrix[:3].astype(np.float64))
        centre = sample["gt_rgb"][:, 101, 101]
        # an interior green-site pixel: bilinear demosaic is the mean of the 4 neighbours for R/B
        y, x = top + 101, left + 101  # odd/odd = B site in RGGB
        blue = gt_mono[y, x]
        red = gt_mono[[y - 1, y - 1, y + 1, y + 1], [x - 1, x + 1, x - 1, x + 1]].mean()
        green = gt_mono[[y - 1, y + 1, y, y], [x, x, x - 1, x + 1]].mean()
        assert np.allclose(centre, cam_to_rec2020 @ np.array([red, green, blue]), atol=1e-4)
        for n, name in enumerate(meta["noisy_files"]):
            known = scene["noisy"][name]
            assert meta["best_alignment"][n] == known["shift"]
            dy, dx = (value - value % 2 for value in known["shift"])
            assert meta["bayer_alignment"][n] == [dy, dx]
            noisy_mono, _ = native_mono(native / "files" / name)
            tile = sample["noisy_bayer"][n]
            assert tile.shape == (4, 256, 256)
            # stored noisy RGGB = the noisy capture at clean position - even shift, zero outside
            y0, x0 = top - dy, left - dx
            inside = (slice(max(0, -y0) // 2 + 8, 240), slice(max(0, -x0) // 2 + 8, 240))
            expected_r = noisy_mono[0::2, 0::2][y0 // 2 : y0 // 2 + 256, x0 // 2 : x0 // 2 + 256] if y0 >= 0 and x0 >= 0 else None
            if expected_r is not None and expected_r.shape == (256, 256):
                assert np.array_equal(tile[0], expected_r)
            # content agrees with the clean capture after gain (noise aside)
            clean_r = gt_mono[0::2, 0::2][top // 2 : top // 2 + 256, left // 2 : left // 2 + 256]
            errors = {roll: np.abs(blocks(np.roll(tile[0], roll, axis=0)[inside]) * known["gain"] - blocks(clean_r[inside])).mean()
                      for roll in range(-3, 4)}
            assert errors[0] <= 1.05 * min(errors.values())  # an odd shift leaves half a pixel: 0 and 1 tie
            assert errors[0] < min(errors[-2], errors[2])
            assert sample["mask"][n].dtype == bool and sample["mask"][n].mean() > 0.8
        seen += 1
    assert seen == 8


def test_pairs_legacy_shapes_and_rules(shards):
    native, out, manifest = shards
    urls = wdsprep.urls(str(out / "manifest.json"), "train")
    stage = wdsprep.rawnind.pairs(crop_size=256, num_crops=4, max_alignment_loss=None, min_mask_mean=None)
    samples = list(wds.WebDataset(urls, shardshuffle=False).compose(stage))
    assert len(samples) == 2 * (2 + 3 + 2)  # tiles x noisy captures of the 3 train scenes
    for sample in samples:
        assert not {"__url__", "__index__", "__piece_start__", "__epoch__"} & sample.keys()  # no bookkeeping for a collate
        assert tuple(sample["x_crops"].shape) == (4, 3, 256, 256) and str(sample["x_crops"].dtype) == "torch.float32"
        assert tuple(sample["y_crops"].shape) == (4, 4, 128, 128) and str(sample["y_crops"].dtype) == "torch.float32"
        assert tuple(sample["mask_crops"].shape) == (4, 3, 256, 256) and str(sample["mask_crops"].dtype) == "torch.bool"
        assert tuple(sample["rgb_xyz_matrix"].shape) == (4, 3)
        assert isinstance(sample["gain"], float) and sample["gain"] > 0.9
        for crop in range(4):
            assert sample["mask_crops"][crop].float().mean() >= 0.5
    # match_gain multiplies y by the gain and reports 1.0
    matched = list(wds.WebDataset(urls, shardshuffle=False).compose(
        wdsprep.rawnind.pairs(match_gain=True, max_alignment_loss=None, min_mask_mean=None)))
    for plain, gained in zip(samples, matched):
        assert gained["gain"] == 1.0
        assert np.allclose(gained["y_crops"].numpy(), plain["y_crops"].numpy() * np.float32(plain["gain"]))


def test_pairs_filters_and_determinism(shards):
    native, out, manifest = shards
    urls = wdsprep.urls(str(out / "manifest.json"), "train")
    losses = [pair["best_alignment_loss"] for pair in manifest.tables["pairs"] if pair["split"] == "train"]
    threshold = sorted(losses)[len(losses) // 2]
    kept = list(wds.WebDataset(urls, shardshuffle=False).compose(
        wdsprep.rawnind.pairs(max_alignment_loss=threshold, min_mask_mean=None, to_torch=False)))
    assert len(kept) == 2 * sum(loss <= threshold for loss in losses) and len(kept) < 14
    assert len(list(wds.WebDataset(urls, shardshuffle=False).compose(
        wdsprep.rawnind.pairs(min_mask_mean=1.01, max_alignment_loss=None)))) == 0

    def crops(**options):
        stage = wdsprep.rawnind.pairs(to_torch=False, max_alignment_loss=None, min_mask_mean=None, **options)
        return [(s["__key__"], s["x_crops"]) for s in wds.WebDataset(urls, shardshuffle=False).compose(stage)]

    first, again, other_epoch = crops(seed=1, epoch=0), crops(seed=1, epoch=0), crops(seed=1, epoch=1)
    assert [k for k, _ in first] == [k for k, _ in again]
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(first, again))
    assert not all(np.array_equal(a, b) for (_, a), (_, b) in zip(first, other_epoch))


def test_pairs_crop_origins_are_even_and_match_the_tile(shards):
    native, out, manifest = shards
    urls = wdsprep.urls(str(out / "manifest.json"), "test")
    raw = next(iter(wds.WebDataset(urls, shardshuffle=False)))
    tile = wdsprep.decode_sample(raw)
    [sample] = list(wdsprep.rawnind.pairs(crop_size=64, num_crops=3, to_torch=False, max_alignment_loss=None,
                                          min_mask_mean=None)([raw]))[:1]
    for crop in range(3):
        x = sample["x_crops"][crop]
        # locate the crop in the tile by its first row (unique for a textured image)
        row = x[0, 0]
        positions = np.argwhere(np.all(np.lib.stride_tricks.sliding_window_view(tile["gt_rgb"][0], 64, axis=1) == row, axis=2))
        assert len(positions) == 1
        y0, x0 = positions[0]
        assert y0 % 2 == 0 and x0 % 2 == 0
        assert np.array_equal(sample["y_crops"][crop], tile["noisy_bayer"][0, :, y0 // 2 : y0 // 2 + 32, x0 // 2 : x0 // 2 + 32])
        assert np.array_equal(sample["mask_crops"][crop][0], tile["mask"][0, y0 : y0 + 64, x0 : x0 + 64])


def test_pairs_accepts_in_memory_samples_and_checks_crop_size():
    rng = np.random.default_rng(0)
    fields = {
        "gt_rgb": rng.random((3, 64, 64), dtype=np.float32),
        "noisy_bayer": rng.random((1, 4, 32, 32), dtype=np.float32),
        "mask": np.ones((1, 64, 64), dtype=bool),
        "meta": {"rgb_xyz_matrix": [[1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 0, 0]], "best_alignment_loss": [0.01],
                 "mask_mean": [0.99], "raw_gain": [2.0], "rgb_gain": [2.1]},
    }
    raw = {"__key__": "k", **dict(Encoder().encode_fields("k", fields))}
    [out] = list(wdsprep.rawnind.pairs(crop_size=32, num_crops=2, to_torch=False)([raw]))
    assert out["x_crops"].shape == (2, 3, 32, 32) and out["gain"] == 2.0
    [out] = list(wdsprep.rawnind.pairs(crop_size=32, num_crops=2, to_torch=False, gain_key="rgb_gain")([raw]))
    assert out["gain"] == 2.1
    with pytest.raises(ConfigError, match="multiple of 4"):
        list(wdsprep.rawnind.pairs(crop_size=30)([raw]))
    with pytest.raises(ConfigError, match="smaller than crop_size"):
        list(wdsprep.rawnind.pairs(crop_size=128)([raw]))
    fields["mask"][:] = False
    raw = {"__key__": "k", **dict(Encoder().encode_fields("k", fields))}
    assert list(wdsprep.rawnind.pairs(crop_size=32, to_torch=False)([raw])) == []


def test_tile_origins():
    assert tile_origins(768, 512) == [0, 256]
    assert tile_origins(512, 512) == [0]
    assert tile_origins(2000, 512) == [0, 512, 1024, 1488]


def test_plan_errors_name_the_problem(tmp_path, synth_tiny):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="dataset_index.yaml: no index"):
        convert("rawnind", str(tmp_path / "empty"), str(tmp_path / "out"))
    native = tmp_path / "native"
    shutil.copytree(synth_tiny, native)
    with pytest.raises(ConfigError, match="--tile-size 30 must be a multiple of 4"):  # before the input is read
        convert("rawnind", str(native), str(tmp_path / "out"), tile_size=30)
    for path in (native / "files").glob("*.dng"):
        path.unlink()
    with pytest.raises(InputError, match=r"^Bayer/\S+: incomplete on disk, missing \S+\.dng"):  # raise mode: the first scene
        convert("rawnind", str(native), str(tmp_path / "out"))
    with pytest.raises(InputError, match="no complete scene to convert .*incomplete on disk, missing"):
        convert("rawnind", str(native), str(tmp_path / "out"), on_error="skip")


def test_an_incomplete_scene_stops_the_conversion_or_is_skipped(tmp_path, synth_tiny):
    native = tmp_path / "native"
    shutil.copytree(synth_tiny, native)
    scenes = yaml.safe_load((native / "dataset_index.yaml").read_text())
    cfa, scene = next((cfa, name) for cfa, entries in sorted(scenes.items()) for name in sorted(entries))
    victim = scenes[cfa][scene]["noisy_images"][0]["filename"]
    (native / "files" / victim).unlink()
    with pytest.raises(InputError, match=f"^{cfa}/{scene}: incomplete on disk, missing {victim}$"):
        convert("rawnind", str(native), str(tmp_path / "out"), tile_size=256)
    assert not (tmp_path / "out" / "manifest.json").exists()
    manifest = convert("rawnind", str(native), str(tmp_path / "out"), tile_size=256, on_error="skip")
    assert manifest.problems == [{"item": f"{cfa}/{scene}", "message": f"incomplete on disk, missing {victim}"}]
    converted = set()
    for split in manifest.splits:  # read back with tarfile and msgpack, not with wdsprep's reader
        for url in manifest.shard_urls(split):
            with tarfile.open(url) as tar:
                converted |= {msgpack.unpackb(tar.extractfile(m).read())["scene"] for m in tar if m.name.endswith(".meta.mp")}
    expected = {name for c, entries in scenes.items() for name in entries if (c, name) != (cfa, scene)}
    assert converted == expected


def test_map_style_drop_in(shards):
    native, out, manifest = shards
    from wdsprep.rawnind import CleanProfiledRGBNoisyBayerImageCropsDataset as Dataset

    dataset = Dataset(str(out / "manifest.json"), num_crops=4, crop_size=256, alignment_max_loss=None, mask_mean_min=None)
    train_pairs = [p for p in manifest.tables["pairs"] if p["split"] == "train"]
    assert len(dataset) == len(train_pairs) == 7  # one item per clean/noisy pair, as the legacy loader
    assert dataset.pairs == sorted((p["scene"].split("/", 1)[1], p["gt_file"], p["noisy_file"]) for p in train_pairs)
    item = dataset[3]
    assert tuple(item["x_crops"].shape) == (4, 3, 256, 256) and tuple(item["y_crops"].shape) == (4, 4, 128, 128)
    assert tuple(item["mask_crops"].shape) == (4, 3, 256, 256) and tuple(item["rgb_xyz_matrix"].shape) == (4, 3)
    pair = train_pairs[[(p["scene"].split("/", 1)[1], p["gt_file"], p["noisy_file"]) for p in train_pairs].index(dataset.pairs[3])]
    assert item["gain"] == pytest.approx(pair["raw_gain"])
    again = dataset[3]
    assert all(np.array_equal(item[k].numpy(), again[k].numpy()) for k in ("x_crops", "y_crops", "mask_crops"))
    dataset.set_epoch(1)
    assert not np.array_equal(dataset[3]["x_crops"].numpy(), item["x_crops"].numpy())
    # the filters apply per pair, like the legacy constructor
    losses = sorted(p["best_alignment_loss"] for p in train_pairs)
    assert len(Dataset(str(out / "manifest.json"), alignment_max_loss=losses[2], mask_mean_min=None)) == 3
    assert len(Dataset(str(out / "manifest.json"), test=True, alignment_max_loss=None, mask_mean_min=None)) == 2
    with pytest.raises(ConfigError, match="no pair in split 'train' passes the filters"):
        Dataset(str(out / "manifest.json"), mask_mean_min=1.5)
    import torch

    loader = torch.utils.data.DataLoader(dataset, batch_size=2, shuffle=True, num_workers=0)
    batch = next(iter(loader))
    assert tuple(batch["x_crops"].shape) == (2, 4, 3, 256, 256) and batch["gain"].shape == (2,)


def test_conversion_is_deterministic_with_or_without_the_metadata_cache(shards, tmp_path):
    native, out, manifest = shards
    again = convert("rawnind", str(native), str(tmp_path / "again"), shard_bytes="4MB", tile_size=512,
                    metadata_cache=False, layout="legacy")  # --workers 2: the conformance suite
    for split, rows in manifest.splits.items():
        assert [(r["name"], r["sha256"]) for r in rows] == [(r["name"], r["sha256"]) for r in again.splits[split]]


def test_pairs_draw_new_crops_each_epoch(shards):
    """No `epoch=`: `__epoch__` (wdsprep.dataset) or the stage's own pass count picks the draws."""
    rng = np.random.default_rng(0)
    fields = {
        "gt_rgb": rng.random((3, 96, 96), dtype=np.float32),
        "noisy_bayer": rng.random((1, 4, 48, 48), dtype=np.float32),
        "mask": np.ones((1, 96, 96), dtype=bool),
        "meta": {"rgb_xyz_matrix": [[1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 0, 0]], "best_alignment_loss": [0.01],
                 "mask_mean": [0.99], "raw_gain": [2.0], "rgb_gain": [2.1]},
    }
    raw = {"__key__": "k", **dict(Encoder().encode_fields("k", fields))}

    def crops(stage, epoch=None):
        sample = raw if epoch is None else {**raw, "__epoch__": epoch}
        [out] = list(stage([sample]))
        return out["x_crops"]

    options = dict(crop_size=32, num_crops=3, to_torch=False, seed=5)
    new = lambda **extra: wdsprep.rawnind.pairs(**options, **extra)  # noqa: E731
    # per-sample __epoch__: two epochs differ, the same epoch replays exactly (any stage instance)
    e0, e1 = crops(new(), 0), crops(new(), 1)
    assert not np.array_equal(e0, e1)
    assert np.array_equal(crops(new(), 0), e0) and np.array_equal(crops(new(), 1), e1)
    stage = new()
    assert np.array_equal(crops(stage, 1), e1) and np.array_equal(crops(stage, 1), e1)  # no counter with __epoch__
    # plain source: each pass of the stage is the next epoch, starting at 0
    stage = new()
    passes = [crops(stage) for _ in range(3)]
    assert np.array_equal(passes[0], e0) and np.array_equal(passes[1], e1)
    assert not np.array_equal(passes[1], passes[2])
    # an explicit epoch wins over both
    fixed = new(epoch=1)
    assert all(np.array_equal(crops(fixed, epoch), e1) for epoch in (None, 0, 7, None))

    # end to end: wdsprep.dataset advances its epoch each pass and stamps it on the samples
    native, out, manifest = shards
    dataset = wdsprep.dataset(str(out / "manifest.json"), "train", seed=1, shuffle_shards=False).compose(
        wdsprep.rawnind.pairs(to_torch=False, max_alignment_loss=None, min_mask_mean=None))
    first = {s["__key__"]: s["x_crops"] for s in dataset}
    second = {s["__key__"]: s["x_crops"] for s in dataset}
    assert first.keys() == second.keys()
    assert not all(np.array_equal(first[k], second[k]) for k in first)
    replay = wdsprep.dataset(str(out / "manifest.json"), "train", seed=1, epoch=0, shuffle_shards=False).compose(
        wdsprep.rawnind.pairs(to_torch=False, max_alignment_loss=None, min_mask_mean=None))
    assert all(np.array_equal(first[s["__key__"]], s["x_crops"]) for s in replay)


def test_map_style_raises_a_shard_error_for_a_flipped_byte_in_any_member(synth_tiny, tmp_path):
    """Converted by the CLI without compression (a changed byte decodes as well as the right one):
    one byte flipped in each member of each tile in turn, the map-style dataset raises a ShardError
    naming that shard, when it opens (meta.mp) or on the first item that reads the tile, and every
    item it gave before is the intact shards' own."""
    from tests.core.shardsets import each_member_flipped, same_until_error
    from wdsprep.rawnind import CleanProfiledRGBNoisyBayerImageCropsDataset as Dataset
    from wdsprep.conformance import run_cli

    shutil.copytree(synth_tiny, tmp_path / "native")
    status, _, err = run_cli("convert", "rawnind", tmp_path / "native", tmp_path / "out", "--codec", "none", "--quiet")
    assert status == 0, err
    options = dict(crop_size=64, num_crops=2, alignment_max_loss=None, mask_mean_min=None)
    expected = {split: [item for item in Dataset(str(tmp_path / "out"), split, **options)] for split in ("train", "test")}
    assert all(expected.values())

    def same(got, want):
        assert set(got) == set(want)
        for name, value in got.items():
            assert np.array_equal(np.asarray(value), np.asarray(want[name])), name

    flipped = set()
    for path, key, member in each_member_flipped(tmp_path / "out"):
        split = path.name.split("-", 1)[0]
        flipped.add(member)
        with pytest.raises(ShardError, match=path.name) if member == "meta.mp" else contextlib.nullcontext():
            dataset = Dataset(str(tmp_path / "out"), split, **options)
        if member == "meta.mp":
            continue
        count, error = same_until_error((dataset[i] for i in range(len(dataset))), expected[split], same)
        assert count == 0 and error is not None and path.name in str(error), (key, member)  # one tile per split
    assert flipped == {"clean.npy", "noisy.npy", "mask.npy", "meta.mp"}


def test_map_style_drop_in_over_http(shards):
    """The same items from the shards served over HTTP (read by Range requests through
    wdsprep.MapDataset) as from the local directory."""
    from wdsprep.rawnind import CleanProfiledRGBNoisyBayerImageCropsDataset as Dataset
    from wdsprep.testing import RangeHTTPServer

    native, out, manifest = shards
    local = Dataset(str(out / "manifest.json"), num_crops=2, crop_size=128, alignment_max_loss=None, mask_mean_min=None)
    with RangeHTTPServer(out) as server:
        remote = Dataset(server.url_of("manifest.json"), num_crops=2, crop_size=128, alignment_max_loss=None,
                         mask_mean_min=None)
        assert remote.pairs == local.pairs
        for i in range(len(local)):
            mine, theirs = remote[i], local[i]
            assert set(mine) == set(theirs)
            assert all(np.array_equal(np.asarray(mine[k]), np.asarray(theirs[k])) for k in mine)
        assert any(r["range"] for r in server.requests)  # read by Range requests, not whole shards
