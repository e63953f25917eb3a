"""Synthetic sequences are real sampleset_v1 files, and the converter keeps them losslessly."""
from __future__ import annotations

import json
import os
import zipfile

import numpy as np
import pytest
import torch

from .noisebase_testdata import CROP, FRAMES, SAMPLES, SEQUENCES, native, shards

zarr = pytest.importorskip("zarr")

from wdsprep.errors import InputError  # noqa: E402
from wdsprep.sources.base import PlanContext  # noqa: E402
from wdsprep.sources.noisebase import SOURCE, backproject_pixel_centers  # noqa: E402
from wdsprep.sources.noisebase.native import decode_rgbe, encode_rgbe, zip_store  # noqa: E402
from wdsprep.sources.noisebase.projective import Orientation, screen_space_position  # noqa: E402

EXPECTED = {
    "color": ("|u1", [FRAMES, 4, CROP, CROP, SAMPLES]),
    "position": ("<f4", [FRAMES, 3, CROP, CROP, SAMPLES]),
    "motion": ("<f4", [FRAMES, 3, CROP, CROP, SAMPLES]),
    "normal": ("<f2", [FRAMES, 3, CROP, CROP, SAMPLES]),
    "diffuse": ("<f2", [FRAMES, 3, CROP, CROP, SAMPLES]),
    "reference": ("<f4", [FRAMES, 3, CROP, CROP]),
    "exposure": ("<f4", [FRAMES, 2]),
    "camera_position": ("<f4", [FRAMES, 3]),
    "camera_target": ("<f4", [FRAMES, 3]),
    "camera_up": ("<f4", [FRAMES, 3]),
    "proj_mat": ("<f4", [FRAMES, 4, 4]),
    "view_proj_mat": ("<f4", [FRAMES, 4, 4]),
    "crop_offset": ("<i4", [FRAMES, 2]),
}


def _zip(tmp_path_factory, index=0) -> str:
    return os.path.join(native(tmp_path_factory), f"sampleset_v1/train/scene{index:04d}.zip")


def test_synth_writes_zarr_v2_zipstores(tmp_path_factory):
    names = sorted(os.listdir(os.path.join(native(tmp_path_factory), "sampleset_v1/train")))
    assert names == [f"scene{i:04d}.zip" for i in range(SEQUENCES)]
    with zipfile.ZipFile(_zip(tmp_path_factory)) as archive:
        assert json.loads(archive.read(".zgroup")) == {"zarr_format": 2}
        for name, (dtype, shape) in EXPECTED.items():
            meta = json.loads(archive.read(f"{name}/.zarray"))
            assert (meta["zarr_format"], meta["dtype"], meta["shape"]) == (2, dtype, shape), name
            assert meta["compressor"]["id"] == "blosc" and meta["compressor"]["cname"] == "lz4hc"
            assert meta["compressor"]["clevel"] == 9
            if len(shape) == 5:
                assert meta["chunks"] == [1, shape[1], CROP, CROP, 4]  # a frame and 4 samples per chunk


def test_synth_geometry_is_consistent_in_every_orientation(tmp_path_factory):
    """Every sample projects into its own pixel of the full frame, for all 8 flips/rotations."""
    store = zip_store(_zip(tmp_path_factory, 1))
    group = zarr.open_group(store=store, mode="r")
    try:
        for frame in range(FRAMES):
            for code in range(8):
                orient = Orientation(code, 1080, 1920, CROP)
                *_, offset, view_proj = orient.camera(
                    group["camera_target"][frame], group["camera_up"][frame], group["camera_position"][frame],
                    group["proj_mat"][frame], group["crop_offset"][frame])
                position = orient.array(group["position"][frame])
                pixel = np.floor(screen_space_position(position, view_proj, 1080, 1920))
                grid = np.stack(np.meshgrid(np.arange(CROP), np.arange(CROP), indexing="ij"))[..., None]
                inside = (pixel == grid + offset[:, None, None, None]).all(0).mean()
                assert inside > 0.99, (frame, code, inside)
            # the crop follows the scene: offsets move with the camera, stay inside the frame
            offset = group["crop_offset"][frame]
            assert 0 <= offset[0] <= 1080 - CROP and 0 <= offset[1] <= 1920 - CROP
        motion = group["motion"][:]
        assert (motion == 0).mean() > 0.3  # static geometry: world motion is zero there
    finally:
        store.close()


def test_rgbe_round_trip():
    rng = np.random.default_rng(0)
    radiance = rng.exponential(1.0, (3, 8, 8, 4)).astype(np.float32)
    radiance[:, 0, 0, 0] = 0
    rgbe, exposure = encode_rgbe(radiance, rng)
    assert rgbe.dtype == np.uint8 and rgbe.shape == (4, 8, 8, 4)
    decoded = decode_rgbe(rgbe, np.asarray(exposure, np.float32))
    brightest = radiance.max(0, keepdims=True)
    assert np.all(np.abs(decoded - radiance) <= brightest * 2.5 / 255 + 1e-6)
    assert np.all(decoded[:, 0, 0, 0] == 0)
    black, black_exposure = encode_rgbe(np.zeros((3, 2, 2, 1), np.float32), rng)
    assert not black.any() and black_exposure == [0.0, 0.0]


def test_one_sample_per_frame_lossless(tmp_path_factory):
    import webdataset as wds

    from wdsprep.shards.codec import decode_sample
    from wdsprep.shards.manifest import Manifest

    out = shards(tmp_path_factory)
    manifest = Manifest.loads(open(os.path.join(out, "manifest.json"), "rb").read(), os.path.join(out, "manifest.json"))
    table = manifest.tables["sequences"]
    assert [e["index"] for e in table] == list(range(SEQUENCES))
    assert manifest.tables["sampleset"] == {"sequences": SEQUENCES, "frames_per_sequence": FRAMES, "crop": CROP,
                                           "samples": SAMPLES, "rendering_height": 1080, "rendering_width": 1920,
                                           "layout": "sample-major"}
    assert manifest.samples("train") == SEQUENCES * FRAMES
    samples = [decode_sample(s) for s in wds.WebDataset(manifest.shard_urls("train"), shardshuffle=False)]
    keys = [s["__key__"] for s in samples]
    assert keys == [f"scene{i:04d}_f{f:04d}" for i in range(SEQUENCES) for f in range(FRAMES)]
    for entry in table[:2]:
        store = zip_store(os.path.join(native(tmp_path_factory), entry["file"]))
        group = zarr.open_group(store=store, mode="r")
        try:
            for frame in range(FRAMES):
                sample = samples[entry["index"] * FRAMES + frame]
                for name in ("color", "position", "motion", "normal", "diffuse"):
                    stored = sample[name]
                    assert stored.dtype == group[name].dtype
                    assert np.array_equal(np.moveaxis(stored, 0, -1), group[name][frame]), name
                assert np.array_equal(sample["reference"], group["reference"][frame])
                meta = sample["meta"]
                assert (meta["sequence"], meta["frame"], meta["file"]) == (entry["index"], frame, entry["file"])
                for name in ("exposure", "camera_position", "camera_target", "camera_up", "proj_mat",
                             "view_proj_mat", "crop_offset"):
                    source = group[name][frame]
                    assert np.array_equal(np.asarray(meta[name], dtype=source.dtype), source), name
                    if name != "exposure":  # the previous frame's camera rides along
                        if frame == 0:
                            assert meta["prev"] is None
                        else:
                            previous = group[name][frame - 1]
                            assert np.array_equal(np.asarray(meta["prev"][name], dtype=previous.dtype), previous)
                assert meta["rendering"] == [1080, 1920]
        finally:
            store.close()


def _copy_dataset(tmp_path_factory, tmp_path) -> str:
    import shutil

    target = tmp_path / "data"
    shutil.copytree(native(tmp_path_factory), target)
    return str(target)


def test_bad_input_names_the_file(tmp_path_factory, tmp_path):
    with pytest.raises(InputError, match="no sampleset_v1 sequences"):
        SOURCE.plan(str(tmp_path), PlanContext({"shard_bytes": 1 << 20}))
    root = _copy_dataset(tmp_path_factory, tmp_path)
    broken = os.path.join(root, "sampleset_v1/train/scene0002.zip")
    with open(broken, "wb") as handle:
        handle.write(b"not a zip")
    with pytest.raises(InputError, match=r"scene0002\.zip: not a readable zip"):
        SOURCE.plan(root, PlanContext({"shard_bytes": 1 << 20}))
    ctx = PlanContext({"shard_bytes": 1 << 20, "on_error": "skip"})
    plan = SOURCE.plan(root, ctx)
    assert [p["item"] for p in ctx.problems] == ["sampleset_v1/train/scene0002.zip"]
    assert [e["index"] for e in plan.tables["sequences"]] == [0, 1, 3, 4, 5]


def test_wrong_dtype_is_refused(tmp_path_factory, tmp_path):
    import zarr as zarr_module

    root = tmp_path / "data"
    path = root / "sampleset_v1/train/scene0000.zip"
    path.parent.mkdir(parents=True)
    source = zip_store(_zip(tmp_path_factory))
    target = zip_store(str(path), "w")
    group = zarr_module.open_group(store=source, mode="r")
    out = zarr_module.group(store=target)
    for name in group.array_keys():
        data = group[name][:]
        out.create_dataset(name, data=data.astype(np.float32) if name == "normal" else data)
    target.close()
    source.close()
    with pytest.raises(InputError, match=r"scene0000\.zip: normal has dtype float32, expected float16"):
        SOURCE.plan(str(root), PlanContext({"shard_bytes": 1 << 20}))


def test_backproject_pixel_centers_matches_noisebase():
    from .noisebase_testdata import require_noisebase

    reference = require_noisebase("noisebase.torch.projective")
    generator = torch.Generator().manual_seed(0)
    motion = torch.randn(2, 2, 8, 8, generator=generator) * 3
    offset = torch.tensor([[100, 200], [5, 7]], dtype=torch.int32)
    prev = torch.tensor([[98, 203], [5, 6]], dtype=torch.int32)
    for as_grid in (False, True):
        ours = backproject_pixel_centers(motion, offset, prev, as_grid=as_grid)
        theirs = reference.backproject_pixel_centers(motion, offset, prev, as_grid=as_grid)
        assert ours.shape == theirs.shape and torch.equal(ours, theirs)


def test_corrupt_chunk_names_file_and_frame(tmp_path_factory, tmp_path):
    """A damaged chunk inside a zip fails the conversion with the file and the chunk (array and frame)
    named: its blosc header is checked before blosc allocates what it declares."""
    from wdsprep.conversion import ConversionError, convert

    root = _copy_dataset(tmp_path_factory, tmp_path)
    path = os.path.join(root, "sampleset_v1/train/scene0004.zip")
    with zipfile.ZipFile(path) as archive:
        members = {info.filename: archive.read(info.filename) for info in archive.infolist()}
    members["position/2.0.0.0.1"] = b"\x02\x01garbage that is not a blosc frame"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    with pytest.raises((InputError, ConversionError), match=r"scene0004\.zip: member position/2\.0\.0\.0\.1: its blosc header declares"):
        convert("noisebase", root, str(tmp_path / "out"), shard_bytes="1MB")
