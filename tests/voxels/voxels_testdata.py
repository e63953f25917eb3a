"""Shared helpers of the voxels tests: a tiny synthetic dataset and independent spec formulas.

Nothing here imports the reader code: the expected training samples are computed from the native
npz files with plain numpy, the graph edges with a k-d tree (scipy), so a test compares two
independent implementations.
"""
from __future__ import annotations

import json
import math
import pathlib

import numpy as np
from scipy.spatial import cKDTree

TINY = dict(base_resolution=16, min_resolution=4, num_objects=7, samples_per_view=12)


def make_tiny(directory: pathlib.Path, seed: int = 0, **overrides) -> pathlib.Path:
    from wdsprep.sources.voxels.synth import synth

    return synth(str(directory), seed, "small", **{**TINY, **overrides})


def native_samples(root: pathlib.Path) -> dict[tuple[int, str], dict]:
    """{(level, sample hash): {"rays": {...}, "voxels": bool grid, "ray_file", "voxel_file"}}."""
    out = {}
    for ray_file in sorted((root / "ray_dataset_hierarchical").glob("level_*/*/*_rays.npz")):
        level = int(ray_file.parent.parent.name.split("_")[1])
        key = ray_file.name[: -len("_rays.npz")]
        if level == 0:
            voxel_file = root / "dataset" / "objects" / f"object_{key}" / "level_0.npz"
            name = f"object_{key}"
        else:
            voxel_file = root / "dataset" / "subvolumes" / f"level_{level}" / key[:2] / f"{key}.npz"
            name = key
        with np.load(ray_file) as z:
            rays = {k: z[k] for k in z.files}
        with np.load(voxel_file) as z:
            voxels = z["voxels"]
        out[(level, name)] = {"rays": rays, "voxels": voxels, "ray_file": ray_file, "voxel_file": voxel_file, "key": key}
    return out


def expected_splits(root: pathlib.Path) -> dict[str, set[tuple[int, str]]]:
    """Which (level, hash) each split holds, by the upstream rules read straight from splits.json."""
    doc = json.loads((root / "dataset" / "splits.json").read_text())
    object_splits = doc["object_splits"]
    trivial = set(doc["trivial_hashes"])
    names = set(object_splits.values())
    out = {name: set() for name in names}
    for level, name in native_samples(root):
        if level == 0:
            out[object_splits[name[len("object_"):]]].add((level, name))
        else:
            users = doc["hash_object_usage"][name]
            for split in (names if name in trivial else {object_splits[o] for o in users}):
                out[split].add((level, name))
    return out


def spec_chunk(native: dict, level: int, name: str, start: int, end: int, mode: str) -> dict:
    """One training sample by the spec's formulas, from the native arrays."""
    rays, voxels = native["rays"], native["voxels"].astype(bool)
    r = voxels.shape[0]
    diag = math.sqrt(3 * r**2)  # = sqrt(3 * (2**(7-level))**2) at base resolution 128
    out = {
        "origins": rays["origins"][start:end].astype(np.float32),
        "directions": rays["directions"][start:end].astype(np.float32),
        "distances": rays["distances"][start:end].astype(np.float32) / np.float32(diag),
        "hits": (rays["hits"][start:end] != 0).astype(np.float32),
        "view_ids": rays["view_ids"][start:end].astype(np.int64),
        "face_ids": rays["face_ids"][start:end].astype(np.int64),
        "view_positions": np.stack([rays["view_positions"][v] for v in rays["view_ids"][start:end]]).astype(np.float32)
        if end > start else np.zeros((0, 3), np.float32),
        "level": level,
        "hash": name,
    }
    if mode == "dense":
        out["voxels"] = voxels.astype(np.float32).reshape(1, r, r, r)
    else:
        d, h, w = np.nonzero(voxels)
        out["voxel_pos"] = np.stack([w, h, d], axis=1).astype(np.float32)
        out["voxel_features"] = np.ones((len(d), 1), np.float32)
        out["voxel_shape"] = np.array(voxels.shape, dtype=np.int64)
        if mode == "coo":
            out["num_voxels"] = len(d)
    return out


def brute_force_edges(voxel_pos: np.ndarray, connectivity: int) -> set[tuple[int, int]]:
    """Directed edges between occupied voxels within the connectivity's distance (k-d tree)."""
    radius = {6: 1.0, 18: math.sqrt(2.0), 26: math.sqrt(3.0)}[connectivity] + 1e-6
    if len(voxel_pos) == 0:
        return set()
    pairs = cKDTree(voxel_pos.astype(np.float64)).query_pairs(radius, output_type="ndarray")
    return {(int(a), int(b)) for a, b in pairs} | {(int(b), int(a)) for a, b in pairs}


SPEC_KEYS = {
    "dense": {"origins", "directions", "distances", "hits", "voxels", "level", "hash", "chunk_idx",
              "view_ids", "face_ids", "view_positions"},
    "coo": {"origins", "directions", "distances", "hits", "voxel_pos", "voxel_features", "voxel_shape",
            "num_voxels", "level", "hash", "chunk_idx", "view_ids", "face_ids", "view_positions"},
    "graph": {"origins", "directions", "distances", "hits", "voxel_pos", "voxel_features", "voxel_edge_index",
              "voxel_shape", "level", "hash", "chunk_idx", "view_ids", "face_ids", "view_positions"},
}


def convert_tiny(base: pathlib.Path, **options):
    """(native root, shard dir, manifest) of the tiny dataset converted into small shards."""
    from wdsprep.conversion import convert

    native = make_tiny(base / "native", seed=1)
    manifest = convert("voxels", str(native), str(base / "shards"), shard_bytes="150KB", **options)
    return native, base / "shards", manifest


def chunk_count(num_rays: int, rays_per_chunk) -> int:
    return 1 if rays_per_chunk is None else math.ceil(num_rays / rays_per_chunk)
