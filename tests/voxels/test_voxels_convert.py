"""Converting the native layout: split rules, leakage counts, lossless storage, clear errors."""
from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

import wdsprep
from wdsprep.conversion import convert
from wdsprep.errors import InputError, WdsprepError
from wdsprep.sources.base import PlanContext
from wdsprep.sources.voxels import SOURCE, decode_voxel_sample, native_arrays
from wdsprep.sources.voxels.convert import build_fields
from wdsprep.stream import iter_shard, load_manifest

from .voxels_testdata import convert_tiny, expected_splits, native_samples


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    return convert_tiny(tmp_path_factory.mktemp("voxels_convert"))


def _shard_samples(shards, split):
    manifest = load_manifest(str(shards / "manifest.json"))
    for url in manifest.shard_urls(split):
        for raw in iter_shard(url):
            yield decode_voxel_sample(raw)


def test_splits_follow_splits_json_with_shared_subvolumes_in_every_split(converted):
    native, shards, manifest = converted
    expected = expected_splits(native)
    assert set(manifest.splits) == {"train", "val", "test"}
    for split, members in expected.items():
        found = [(s["meta"]["level"], s["meta"]["hash"]) for s in _shard_samples(shards, split)]
        assert len(found) == len(set(found))
        assert set(found) == members
        keys = [(level, name) for level, name in found]
        assert keys == sorted(keys)  # deterministic (level, key) order, whatever the file system says
        assert len(manifest.shards(split)) >= 1
    assert sum(len(manifest.shards(s)) for s in manifest.splits) > 3  # several shards at 150KB


def test_leakage_counts_in_manifest_tables(converted):
    native, shards, manifest = converted
    expected = expected_splits(native)
    membership: dict = {}
    for split, members in expected.items():
        for member in members:
            membership.setdefault(member, set()).add(split)
    shared = {m: s for m, s in membership.items() if len(s) > 1}
    assert shared, "the tiny dataset should share some subvolumes between splits"
    leakage = load_manifest(str(shards)).tables["leakage"]
    assert leakage["samples_in_several_splits"] == len(shared)
    by_splits: dict = {}
    for splits in shared.values():
        name = "all_splits" if len(splits) == 3 else "_".join(s for s in ("train", "val", "test") if s in splits)
        by_splits[name] = by_splits.get(name, 0) + 1
    assert leakage["by_splits"] == by_splits
    for split, members in expected.items():
        assert leakage["per_split"][split] == {
            "samples": len(members),
            "shared_with_other_splits": sum(1 for m in members if m in shared),
        }
    assert manifest.tables["upstream_split_statistics"] == json.loads((native / "dataset" / "splits.json").read_text())["statistics"]


def test_samples_table_counts_rays(converted):
    native, shards, manifest = converted
    natives = native_samples(native)
    for split in manifest.splits:
        rows = manifest.tables["samples"][split]
        assert len(rows) == manifest.samples(split)
        for key, level, num_rays in rows:
            name = key.split("_", 1)[1]
            assert num_rays == len(natives[(level, name)]["rays"]["origins"])
        assert manifest.tables["rays"][split] == sum(row[2] for row in rows)


def test_shards_are_lossless_and_voxels_bit_packed(converted):
    native, shards, manifest = converted
    natives = native_samples(native)
    seen = 0
    for split in manifest.splits:
        for sample in _shard_samples(shards, split):
            meta = sample["meta"]
            want = natives[(meta["level"], meta["hash"])]
            r = want["voxels"].shape[0]
            assert sample["voxels_packed"].dtype == np.uint8 and sample["voxels_packed"].shape == (math.ceil(r**3 / 8),)
            voxels, rays = native_arrays(sample)
            assert np.array_equal(voxels, want["voxels"])
            assert set(rays) == set(want["rays"])
            for name, array in want["rays"].items():
                assert rays[name].dtype == array.dtype and rays[name].shape == array.shape, name
                assert np.array_equal(rays[name], array), name
            seen += 1
    assert seen == sum(manifest.samples(s) for s in manifest.splits)


def test_levels_option_converts_a_subset(converted, tmp_path):
    native, _, _ = converted
    manifest = convert("voxels", str(native), str(tmp_path / "l2"), shard_bytes="1MB", levels="0,2")
    assert {level for rows in manifest.tables["samples"].values() for _, level, _ in rows} == {0, 2}


# ------------------------------------------------------------------------------- bad input
@pytest.fixture()
def copy(converted, tmp_path):
    native, _, _ = converted
    target = tmp_path / "native"
    shutil.copytree(native, target)
    return target


def _plan(root, ctx=None, **options):
    return SOURCE.plan(str(root), ctx or PlanContext({"shard_bytes": 1 << 20, "on_error": "raise", **options}))


def _some_subvolume(root, level=2):
    return sorted((root / "ray_dataset_hierarchical" / f"level_{level}").glob("*/*_rays.npz"))[0]


def test_missing_voxel_file_is_named(copy):
    ray_file = _some_subvolume(copy)
    key = ray_file.name[: -len("_rays.npz")]
    voxel_file = copy / "dataset" / "subvolumes" / "level_2" / key[:2] / f"{key}.npz"
    voxel_file.unlink()
    with pytest.raises(InputError, match=f"{voxel_file}: voxel file not found"):
        _plan(copy)
    ctx = PlanContext({"shard_bytes": 1 << 20, "on_error": "skip"})
    plan = _plan(copy, ctx)
    assert [p["item"] for p in ctx.problems] == [ray_file.relative_to(copy / "ray_dataset_hierarchical").as_posix()]
    assert all(item[1] != key for unit in plan.units for item in unit.items)


def _rewrite(path, drop=(), **replace):
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files if k not in drop}
    arrays.update(replace)
    np.savez_compressed(path, **arrays)


def test_ray_file_without_origins_fails_the_conversion(copy, tmp_path):
    ray_file = _some_subvolume(copy)
    _rewrite(ray_file, drop=("origins",))
    with pytest.raises(WdsprepError, match=rf"{ray_file}: missing array 'origins'"):
        convert("voxels", str(copy), str(tmp_path / "out"), shard_bytes="1MB")
    manifest = convert("voxels", str(copy), str(tmp_path / "skip"), shard_bytes="1MB", on_error="skip")
    assert [p["item"] for p in manifest.problems] == [str(ray_file)]
    assert "missing array 'origins'" in manifest.problems[0]["message"]


def test_grid_that_is_not_a_cube(copy):
    voxel_file = copy / "dataset" / "objects" / "object_0000" / "level_0.npz"
    np.savez_compressed(voxel_file, voxels=np.zeros((16, 16, 15), dtype=bool))
    ray_file = copy / "ray_dataset_hierarchical" / "level_0" / "00" / "0000_rays.npz"
    with pytest.raises(InputError, match=r"level_0.npz: voxel grid has shape \(16, 16, 15\), expected a cube"):
        build_fields(0, "0000", ray_file, voxel_file, False, ["train"], 16)


def test_other_malformed_files(copy):
    ray_file = _some_subvolume(copy)
    key = ray_file.name[: -len("_rays.npz")]
    voxel_file = copy / "dataset" / "subvolumes" / "level_2" / key[:2] / f"{key}.npz"
    with pytest.raises(InputError, match="level 2 grid has size 4, expected 8"):
        build_fields(2, key, ray_file, voxel_file, False, ["train"], 32)
    other = _some_subvolume(copy, level=1)
    with pytest.raises(InputError, match="does not match the voxel grid"):
        build_fields(2, key, other, voxel_file, False, ["train"], 16)
    _rewrite(ray_file, distances=np.zeros(3, np.float32))
    with pytest.raises(InputError, match=r"'distances' has shape \(3,\), expected \(176,\)"):
        build_fields(2, key, ray_file, voxel_file, False, ["train"], 16)
    ray_file.write_bytes(b"not a zip file at all")
    with pytest.raises(InputError, match=f"{ray_file}: not a readable .npz file"):
        build_fields(2, key, ray_file, voxel_file, False, ["train"], 16)
    np.savez_compressed(voxel_file, voxels=np.ones((4, 4, 4), dtype=bool))
    with pytest.raises(InputError, match="content hash .* does not match the file name"):
        build_fields(2, key, ray_file, voxel_file, False, ["train"], 16)
    np.savez_compressed(voxel_file, occupancy=np.ones((4, 4, 4), dtype=bool))
    with pytest.raises(InputError, match="missing array 'voxels'"):
        build_fields(2, key, ray_file, voxel_file, False, ["train"], 16)


def test_missing_or_malformed_splits_json(copy):
    splits = copy / "dataset" / "splits.json"
    splits.write_text("{not json")
    with pytest.raises(InputError, match=f"{splits}: splits file is not valid JSON"):
        _plan(copy)
    splits.write_text(json.dumps({"hash_object_usage": {}}))
    with pytest.raises(InputError, match="expected an object with 'object_splits'"):
        _plan(copy)
    splits.unlink()
    with pytest.raises(InputError, match=f"{splits}: splits file not found"):
        _plan(copy)
    with pytest.raises(InputError, match="ray dataset directory not found"):
        _plan(copy, ray_dir="nowhere")


def test_input_may_name_both_directories(copy, tmp_path):
    moved = tmp_path / "elsewhere" / "rays"
    shutil.move(str(copy / "ray_dataset_hierarchical"), moved)
    plan = _plan(copy / "dataset", ray_dir=str(moved))
    assert plan.units and plan.config["ray_dir"] == "rays"
    assert wdsprep.voxels.SOURCE is SOURCE


def test_unknown_ray_file_arrays_survive_the_round_trip(copy):
    from wdsprep.shards.codec import Encoder, decode_sample

    ray_file = _some_subvolume(copy)
    key = ray_file.name[: -len("_rays.npz")]
    voxel_file = copy / "dataset" / "subvolumes" / "level_2" / key[:2] / f"{key}.npz"
    rng = np.random.default_rng(0)
    extra = {
        "normals": rng.normal(size=(176, 3)).astype(np.float16),  # per ray: joins the rays table
        "lut": np.arange(300, dtype=np.uint16).reshape(100, 3),  # large, not per ray: own member
        "note": np.array("made by a newer generator"),  # small: meta.mp
    }
    _rewrite(ray_file, **extra)
    fields = build_fields(2, key, ray_file, voxel_file, False, ["train"], 16)
    assert "extra_lut" in fields and "normals" in fields["rays"]
    raw = {"__key__": "k", **dict(Encoder().encode_fields("k", fields))}
    assert sorted(raw) == ["__key__", "extra_lut.npy.zst", "meta.mp", "rays.npz.zst", "voxels_packed.npy.zst"]
    voxels, rays = native_arrays(decode_sample(raw))
    with np.load(ray_file) as z:
        assert set(rays) == set(z.files)
        for name in z.files:
            assert rays[name].dtype == z[name].dtype and np.array_equal(rays[name], z[name]), name


def test_pipeline_spec_converts_a_given_input(converted, tmp_path, repo_root):
    from wdsprep.cli import main

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    spec = tomllib.loads((repo_root / "pipelines" / "voxels.toml").read_text())
    assert spec["source"] == "voxels" and spec["synth"]["size"] == "small" and "shard_bytes" in spec["convert"]
    native, _, _ = converted
    out = tmp_path / "out"
    assert main(["pipeline", str(repo_root / "pipelines" / "voxels.toml"), "--input", str(native),
                 "--output", str(out), "--quiet"]) == 0
    manifest = load_manifest(str(out))
    assert manifest.source == "voxels" and set(manifest.splits) == {"train", "val", "test"}


def test_trivial_ray_files_go_to_every_split_and_strays_are_counted(copy):
    doc = json.loads((copy / "dataset" / "splits.json").read_text())
    empty = next(h for h in doc["trivial_hashes"])
    level = int(next((copy / "dataset" / "subvolumes").glob(f"level_*/*/{empty}.npz")).parent.parent.name.split("_")[1])
    donor = _some_subvolume(copy, level)
    with np.load(donor) as z:
        arrays = {k: z[k] for k in z.files if k != "hash"}
    target = copy / "ray_dataset_hierarchical" / f"level_{level}" / empty[:2] / f"{empty}_rays.npz"
    target.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(target, **arrays)
    stray = copy / "ray_dataset_hierarchical" / "level_1" / "ff" / f"{'f' * 64}_rays.npz"
    stray.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(stray, **arrays)
    before = _plan(copy / "..", dataset_dir="native/dataset", ray_dir="native/ray_dataset_hierarchical")
    with_empty = [u.split for u in before.units for item in u.items if item[1] == empty]
    assert sorted(with_empty) == ["test", "train", "val"]
    assert before.tables["unassigned_ray_files"] == {"count": 1, "examples": [stray.relative_to(copy / "ray_dataset_hierarchical").as_posix()]}
    assert before.tables["leakage"]["by_splits"]["all_splits"] >= 1
