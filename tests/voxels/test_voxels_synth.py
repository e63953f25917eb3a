"""`wdsprep synth voxels` writes the real voxel-dataset-generator layout, made the upstream way."""
from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest

from wdsprep.sources.voxels.synth import SynthConfig, assign_splits, chord_lengths

from .voxels_testdata import make_tiny, native_samples


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("voxels_synth"), seed=3)


def test_dataset_files_and_metadata(tiny):
    dataset = tiny / "dataset"
    meta = json.loads((dataset / "metadata.json").read_text())
    assert meta["base_resolution"] == 16 and meta["min_resolution"] == 4
    assert meta["level_resolutions"] == [16, 8, 4] and meta["num_levels"] == 3
    for i in range(7):
        object_dir = dataset / "objects" / f"object_{i:04d}"
        with np.load(object_dir / "level_0.npz") as z:
            assert z["voxels"].dtype == bool and z["voxels"].shape == (16, 16, 16)
        assert json.loads((object_dir / "metadata.json").read_text())["object_id"] == f"{i:04d}"
    registry = json.loads((dataset / "registry.json").read_text())["registry"]
    assert {v["level"] for v in registry.values()} == {1, 2}
    assert (tiny / "ray_dataset_hierarchical" / "processing_summary.json").exists()


def test_subvolumes_are_content_hashed_deduplicated_octants(tiny):
    dataset = tiny / "dataset"
    files = sorted((dataset / "subvolumes").glob("level_*/*/*.npz"))
    names = [f.stem for f in files]
    assert len(names) == len(set(names))  # written once, globally
    for path in files:
        with np.load(path) as z:
            voxels = z["voxels"]
        level = int(path.parent.parent.name.split("_")[1])
        assert voxels.dtype == bool and voxels.shape == (16 >> level,) * 3
        assert path.stem == hashlib.sha256(voxels.tobytes()).hexdigest()
        assert path.parent.name == path.stem[:2]
    # the subdivision map reassembles every object from its octants
    for object_dir in sorted((dataset / "objects").iterdir()):
        with np.load(object_dir / "level_0.npz") as z:
            whole = z["voxels"]
        records = json.loads((object_dir / "subdivision_map.json").read_text())
        assert len(records) == 8 + 64
        for level in (1, 2):
            rebuilt = np.zeros_like(whole)
            size = 16 >> level
            for rec in (r for r in records if r["level"] == level):
                with np.load(dataset / "subvolumes" / f"level_{level}" / rec["hash"][:2] / f"{rec['hash']}.npz") as z:
                    part = z["voxels"]
                x, y, zz = rec["global_position_x"], rec["global_position_y"], rec["global_position_z"]
                rebuilt[x : x + size, y : y + size, zz : zz + size] = part
                assert rec["is_empty"] == (not part.any())
                assert rec["octant_index"] == 4 * (rec["position_x"] > 0) + 2 * (rec["position_y"] > 0) + (rec["position_z"] > 0)
            assert np.array_equal(rebuilt, whole)


def test_splits_json_upstream_semantics(tiny):
    doc = json.loads((tiny / "dataset" / "splits.json").read_text())
    assert set(doc) >= {"config", "object_splits", "hash_object_usage", "trivial_hashes", "statistics"}
    assert sorted(doc["object_splits"]) == [f"{i:04d}" for i in range(7)]
    # every level>=1 hash -> the objects using it; trivial = the all-empty ones
    files = {p.stem: p for p in (tiny / "dataset" / "subvolumes").glob("level_*/*/*.npz")}
    assert set(doc["hash_object_usage"]) == set(files)
    empties = set()
    for name, path in files.items():
        with np.load(path) as z:
            if not z["voxels"].any():
                empties.add(name)
    assert empties and set(doc["trivial_hashes"]) == empties
    for name, users in doc["hash_object_usage"].items():
        assert all(doc["object_splits"][o] == s for o, s in users.items())


def test_split_assignment_rounding_goes_to_test():
    ids = [f"{i:04d}" for i in range(7)]
    splits = assign_splits(ids, SynthConfig(), seed=42)
    counts = {s: list(splits.values()).count(s) for s in ("train", "val", "test")}
    assert counts == {"train": 5, "val": 1, "test": 1}  # int(5.6)=5, int(1.4)=1, remainder -> test
    assert assign_splits(ids, SynthConfig(), seed=42) == splits
    assert sorted(assign_splits([f"{i:04d}" for i in range(5)], SynthConfig(), 0).values()).count("test") == 0


def test_ray_files_exist_for_objects_and_nonempty_subvolumes_only(tiny):
    doc = json.loads((tiny / "dataset" / "splits.json").read_text())
    natives = native_samples(tiny)
    expected = {(0, f"object_{i:04d}") for i in range(7)}
    for path in (tiny / "dataset" / "subvolumes").glob("level_*/*/*.npz"):
        if path.stem not in doc["trivial_hashes"]:
            expected.add((int(path.parent.parent.name.split("_")[1]), path.stem))
    assert set(natives) == expected


def test_ray_file_keys_dtypes_and_order(tiny):
    natives = native_samples(tiny)
    per_face = 12 // 3
    for (level, name), native in natives.items():
        rays = native["rays"]
        n = len(rays["origins"])
        r = native["voxels"].shape[0]
        assert n == 44 * per_face  # 16 views, far faces [2, 3, 3, 3] per elevation
        dtypes = {k: v.dtype.str for k, v in rays.items()}
        assert dtypes == {
            "origins": "<f4", "directions": "<f4", "distances": "<f4", "hits": "|u1", "face_ids": "<i4",
            "view_ids": "<i4", "view_positions": "<f4", "grid_shape": "<i8", "voxel_size": "<f8",
            "hash": "<U4" if level == 0 else "<U64", "level": "<i8", "sampling_mode": "<U6",
        }
        assert rays["view_positions"].shape == (16, 3)
        assert tuple(rays["grid_shape"]) == (r, r, r) and int(rays["level"]) == level
        assert str(rays["hash"]) == native["key"] and str(rays["sampling_mode"]) == "sphere"
        order = rays["view_ids"].astype(np.int64) * 6 + rays["face_ids"]
        assert np.all(np.diff(order) >= 0)  # view -> face (ascending) -> sample
        # cameras on a sphere of radius r; only far faces; origins on their face
        cams = rays["view_positions"].astype(np.float64)
        assert np.allclose(np.linalg.norm(cams, axis=1), r)
        normals = np.zeros((n, 3))
        normals[np.arange(n), rays["face_ids"] // 2] = np.where(rays["face_ids"] % 2, 1.0, -1.0)
        assert np.all((normals * -cams[rays["view_ids"]]).sum(1) > 0)
        on_face = (rays["origins"] * normals).sum(1)
        assert np.allclose(on_face, r / 2)
        assert np.all(np.abs(rays["origins"]) <= r / 2 + 1e-5)
        toward = cams[rays["view_ids"]] - rays["origins"]
        toward /= np.linalg.norm(toward, axis=1, keepdims=True)
        assert np.allclose(rays["directions"], toward, atol=1e-6)
        assert np.array_equal(rays["hits"], (rays["distances"] > 0).astype(np.uint8))
        assert rays["distances"].min() >= 0 and rays["distances"].max() <= r * math.sqrt(3) + 1e-4


def _slab_chord(origin, direction, voxels):
    """Sum over occupied voxel boxes of the ray's intersection length (independent of the DDA)."""
    r = voxels.shape[0]
    total = 0.0
    for d, h, w in np.argwhere(voxels):
        lo = np.array([w, h, d], float) - r / 2
        hi = lo + 1
        with np.errstate(divide="ignore", invalid="ignore"):
            t1, t2 = (lo - origin) / direction, (hi - origin) / direction
        near = np.nanmax(np.minimum(t1, t2))
        far = np.nanmin(np.maximum(t1, t2))
        total += max(0.0, far - max(near, 0.0))
    return total


def test_distances_are_chord_lengths_through_occupied_voxels(tiny):
    natives = native_samples(tiny)
    rng = np.random.default_rng(0)
    picked = [key for key in natives if key[0] == 0][:2] + [key for key in natives if key[0] == 2][:6]
    for key in picked:
        rays, voxels = natives[key]["rays"], natives[key]["voxels"]
        for i in rng.choice(len(rays["origins"]), size=12, replace=False):
            expected = _slab_chord(rays["origins"][i].astype(float), rays["directions"][i].astype(float), voxels)
            assert rays["distances"][i] == pytest.approx(expected, abs=2e-5)


def test_chord_length_of_a_full_cube_is_the_box_crossing():
    full = np.ones((1, 4, 4, 4), dtype=bool)
    origin = np.array([[-2.0, 0.3, -0.7]])  # on the -X face
    direction = np.array([[1.0, 0.0, 0.0]])
    assert chord_lengths(full, np.array([0]), origin, direction)[0] == pytest.approx(4.0)
    diagonal = np.array([[1.0, 1.0, 1.0]]) / math.sqrt(3)
    corner = np.array([[-2.0, -2.0, -2.0]])
    assert chord_lengths(full, np.array([0]), corner, diagonal)[0] == pytest.approx(4 * math.sqrt(3))
