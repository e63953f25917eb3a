"""Synthetic data in the real voxel-dataset-generator layout (`wdsprep synth voxels DIR`).

Objects (solid spheres, boxes, hollow shells, random blobs) are voxelized on a cube of
`base_resolution`, subdivided recursively into octants with SHA-256 content hashes and global
de-duplication (empty subvolumes are written too and listed as trivial), split the upstream way, and
ray-traced the upstream way: `sphere_divisions**2` views on a sphere of radius r around each grid,
the far faces of the bounding box per view, uniform origins on each face, rays ordered
view -> face -> sample, and distance = chord length through occupied voxels (transmission, not
first hit) computed exactly on the CPU instead of the OptiX DDA.
"""
from __future__ import annotations

import json
import pathlib
import random
from dataclasses import dataclass

import numpy as np

from .native import (
    DATASET_DIR,
    FACE_NORMALS,
    RAY_DIR,
    content_hash,
    object_voxel_path,
    ray_path,
    subvolume_path,
)

SHAPES = ("sphere", "box", "shell", "blob")


@dataclass(frozen=True)
class SynthConfig:
    base_resolution: int = 128
    min_resolution: int = 4
    num_objects: int = 7
    samples_per_view: int = 60  # upstream default 3000; rays per used face = samples_per_view // 3
    sphere_divisions: int = 4
    train_ratio: float = 0.8
    val_ratio: float = 0.2
    test_ratio: float = 0.0


PRESETS = {
    # `make shards` and the CLI default: the upstream base resolution, levels 0..3 (128^3 .. 16^3)
    "small": SynthConfig(base_resolution=128, min_resolution=16, num_objects=7, samples_per_view=60),
    # more objects, rays and levels (down to 8^3)
    "medium": SynthConfig(base_resolution=128, min_resolution=8, num_objects=12, samples_per_view=150),
}


# ------------------------------------------------------------------------------------ objects
def make_object(kind: str, resolution: int, rng: np.random.Generator) -> np.ndarray:
    """A bool (r, r, r) occupancy grid of one synthetic shape (axes d, h, w)."""
    r = resolution
    grid = (np.arange(r) + 0.5)[:, None, None], (np.arange(r) + 0.5)[None, :, None], (np.arange(r) + 0.5)[None, None, :]

    def ball(center, radius):
        return sum((g - c) ** 2 for g, c in zip(grid, center)) <= radius**2

    center = r / 2 + rng.uniform(-0.1, 0.1, size=3) * r
    if kind == "sphere":
        out = ball(center, rng.uniform(0.2, 0.42) * r)
    elif kind == "box":
        half = rng.uniform(0.12, 0.4, size=3) * r
        out = np.ones((r, r, r), dtype=bool)
        for axis, (g, c, h) in enumerate(zip(grid, center, half)):
            out = out & (np.abs(g - c) <= h)
    elif kind == "shell":
        radius = rng.uniform(0.25, 0.45) * r
        thickness = max(1.0, r / 16)
        distance = np.sqrt(sum((g - c) ** 2 for g, c in zip(grid, center)))
        out = (distance <= radius) & (distance > radius - thickness)
    elif kind == "blob":
        out = np.zeros((r, r, r), dtype=bool)
        for _ in range(int(rng.integers(3, 7))):
            c = r / 2 + rng.uniform(-0.25, 0.25, size=3) * r
            out |= ball(c, rng.uniform(0.08, 0.2) * r)
    else:
        raise ValueError(f"unknown shape {kind!r} (expected one of {SHAPES})")
    return np.ascontiguousarray(out, dtype=bool)


def octant_blocks(voxels: np.ndarray, level: int) -> np.ndarray:
    """All subvolumes of `level` as an (n, n, n, s, s, s) view, n = 2**level, s = r / n."""
    n = 2**level
    s = voxels.shape[0] // n
    return voxels.reshape(n, s, n, s, n, s).transpose(0, 2, 4, 1, 3, 5)


def subdivision_records(object_id: str, hashes: dict, levels: list[int], base: int) -> list[dict]:
    """The upstream flat octant list (depth-first, octant order i, j, k over numpy axes 0, 1, 2)."""
    records: list[dict] = []

    def visit(level: int, block: tuple[int, int, int]) -> None:
        size = base >> level
        for i in (0, 1):
            for j in (0, 1):
                for k in (0, 1):
                    child = (2 * block[0] + i, 2 * block[1] + j, 2 * block[2] + k)
                    child_level = level + 1
                    hash_, empty = hashes[child_level][child]
                    half = size // 2
                    records.append(
                        {
                            "object_id": object_id,
                            "level": child_level,
                            "octant_index": 4 * i + 2 * j + k,
                            "position_x": i * half,
                            "position_y": j * half,
                            "position_z": k * half,
                            "global_position_x": child[0] * half,
                            "global_position_y": child[1] * half,
                            "global_position_z": child[2] * half,
                            "hash": hash_,
                            "is_empty": empty,
                        }
                    )
                    if child_level < levels[-1]:
                        visit(child_level, child)

    if levels:
        visit(0, (0, 0, 0))
    return records


# ----------------------------------------------------------------------------------------- rays
def camera_positions(resolution: int, sphere_divisions: int) -> np.ndarray:
    """(V, 3) camera positions: elevations outer, azimuths inner, radius = 2 * (r / 2)."""
    elevations = np.linspace(0.1 * np.pi, 0.9 * np.pi, sphere_divisions)
    azimuths = np.linspace(0.0, 2.0 * np.pi, sphere_divisions, endpoint=False)
    radius = 2.0 * (resolution / 2.0)
    cams = [
        radius * np.array([np.sin(t) * np.cos(p), np.sin(t) * np.sin(p), np.cos(t)])
        for t in elevations
        for p in azimuths
    ]
    return np.array(cams, dtype=np.float64)


def ray_schedule(resolution: int, sphere_divisions: int, samples_per_view: int):
    """(view_ids, face_ids) of every ray in upstream order: view -> far face (ascending) -> sample."""
    cams = camera_positions(resolution, sphere_divisions)
    per_face = samples_per_view // 3
    views, faces = [], []
    for view, cam in enumerate(cams):
        toward_center = -cam / np.linalg.norm(cam)
        for face, normal in enumerate(FACE_NORMALS):
            if float(np.dot(normal, toward_center)) > 0:  # a far face, seen from this camera
                views.extend([view] * per_face)
                faces.extend([face] * per_face)
    return cams, np.array(views, dtype=np.int32), np.array(faces, dtype=np.int32)


def sample_origins(resolution: int, face_ids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Uniform points on the given faces of the box [-r/2, r/2]^3 (world x, y, z)."""
    half = resolution / 2.0
    origins = rng.uniform(-half, half, size=(len(face_ids), 3))
    axis = face_ids // 2
    sign = np.where(face_ids % 2 == 1, 1.0, -1.0)
    origins[np.arange(len(face_ids)), axis] = sign * half
    return origins


def chord_lengths(
    occupancy: np.ndarray, grid_index: np.ndarray, origins: np.ndarray, directions: np.ndarray
) -> np.ndarray:
    """Length of each ray's path inside occupied voxels, exactly (all plane crossings, sorted).

    `occupancy` is (K, r, r, r) bool (axes d, h, w); ray m starts at `origins[m]` (world x, y, z
    on the box surface, grid centred at 0) and runs along `directions[m]` through grid
    `grid_index[m]` until it leaves the box.
    """
    r = occupancy.shape[1]
    # world (x, y, z) -> array axes (d, h, w) = (z, y, x), shifted so the box is [0, r]^3
    p = origins[:, ::-1].astype(np.float64) + r / 2.0
    u = directions[:, ::-1].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        far_plane = np.where(u > 0, r, 0.0)
        t_axis_exit = np.where(u != 0, (far_plane - p) / u, np.inf)
        t_exit = np.clip(t_axis_exit.min(axis=1), 0.0, None)
        planes = np.arange(1, r, dtype=np.float64)
        crossings = (planes[None, None, :] - p[:, :, None]) / u[:, :, None]  # (M, 3, r-1)
    crossings = crossings.reshape(len(p), -1)
    crossings = np.where(np.isfinite(crossings) & (crossings > 0), crossings, 0.0)
    crossings = np.minimum(crossings, t_exit[:, None])
    ts = np.sort(np.concatenate([np.zeros((len(p), 1)), crossings, t_exit[:, None]], axis=1), axis=1)
    segments = np.diff(ts, axis=1)
    middles = 0.5 * (ts[:, 1:] + ts[:, :-1])
    cells = np.floor(p[:, None, :] + u[:, None, :] * middles[:, :, None]).astype(np.int64)
    np.clip(cells, 0, r - 1, out=cells)
    inside = occupancy[grid_index[:, None], cells[..., 0], cells[..., 1], cells[..., 2]]
    return (segments * inside).sum(axis=1)


def trace_grids(
    grids: list[np.ndarray], rngs: list[np.random.Generator], config: SynthConfig
) -> list[dict]:
    """Ray files (as dicts of arrays, without metadata) for same-sized grids, traced together."""
    if not grids:
        return []
    r = grids[0].shape[0]
    cams, view_ids, face_ids = ray_schedule(r, config.sphere_divisions, config.samples_per_view)
    n = len(view_ids)
    rays = []
    for rng in rngs:
        origins = sample_origins(r, face_ids, rng).astype(np.float32)
        toward = cams[view_ids] - origins.astype(np.float64)
        directions = (toward / np.linalg.norm(toward, axis=1, keepdims=True)).astype(np.float32)
        rays.append({"origins": origins, "directions": directions})
    occupancy = np.stack(grids)
    distances = []
    per_batch = max(1, 400_000 // max(1, n * r))  # bound the (rays x crossings) work arrays
    for start in range(0, len(grids), per_batch):
        stop = min(len(grids), start + per_batch)
        index = np.repeat(np.arange(start, stop), n)
        origins = np.concatenate([rays[i]["origins"] for i in range(start, stop)])
        directions = np.concatenate([rays[i]["directions"] for i in range(start, stop)])
        distances.extend(np.split(chord_lengths(occupancy, index, origins, directions), stop - start))
    for ray, distance in zip(rays, distances):
        distance = distance.astype(np.float32)
        ray.update(
            distances=distance,
            hits=(distance > 0).astype(np.uint8),
            face_ids=face_ids.copy(),
            view_ids=view_ids.copy(),
            view_positions=cams.astype(np.float32),
        )
    return rays


def _rng(seed: int, level: int, key: str) -> np.random.Generator:
    entropy = [seed, level, *(int(key[i : i + 8], 16) for i in range(0, min(len(key), 16), 8))]
    return np.random.default_rng(np.random.SeedSequence(entropy))


# ------------------------------------------------------------------------------------ splitting
def assign_splits(object_ids: list[str], config: SynthConfig, seed: int) -> dict[str, str]:
    """Upstream HierarchicalSplitter: seeded shuffle of the sorted ids; the remainder goes to test."""
    ids = sorted(object_ids)
    random.Random(seed).shuffle(ids)
    n = len(ids)
    train_end = int(n * config.train_ratio)
    val_end = train_end + int(n * config.val_ratio)
    splits = {}
    for position, object_id in enumerate(ids):
        splits[object_id] = "train" if position < train_end else "val" if position < val_end else "test"
    return dict(sorted(splits.items()))


def _split_statistics(object_splits, usage, trivial):
    counts = {name: sum(1 for s in object_splits.values() if s == name) for name in ("train", "val", "test")}
    distribution = dict.fromkeys(
        ("only_train", "only_val", "only_test", "train_val", "train_test", "val_test", "all_splits", "trivial"), 0
    )
    trivial_set = set(trivial)
    for hash_, users in usage.items():
        if hash_ in trivial_set:
            distribution["trivial"] += 1
            continue
        used = set(users.values())
        if len(used) == 3:
            distribution["all_splits"] += 1
        elif len(used) == 2:
            distribution["_".join(s for s in ("train", "val", "test") if s in used)] += 1
        else:
            distribution[f"only_{used.pop()}"] += 1
    return {
        "objects": {**counts, "total": len(object_splits)},
        "unique_nontrivial_hashes": {"total": len(usage) - distribution["trivial"], "distribution": distribution},
        "trivial_hashes": {"count": len(trivial)},
    }


# ---------------------------------------------------------------------------------------- writer
def _save_npz(path: pathlib.Path, **arrays) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **arrays)


def _write_json(path: pathlib.Path, value, indent=None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=indent))


def write_synthetic(directory, seed: int = 0, config: SynthConfig | None = None) -> pathlib.Path:
    """Write `<directory>/dataset` and `<directory>/ray_dataset_hierarchical`; returns directory."""
    config = config or PRESETS["small"]
    base, min_res = config.base_resolution, config.min_resolution
    if base & (base - 1) or min_res & (min_res - 1) or min_res > base:
        raise ValueError(f"base_resolution {base} and min_resolution {min_res} must be powers of two, min <= base")
    root = pathlib.Path(directory)
    dataset_dir, ray_dir = root / DATASET_DIR, root / RAY_DIR
    levels, size = [], base
    while size >= 2 * min_res:  # upstream stops when size < 2 * min_resolution
        size //= 2
        levels.append(len(levels) + 1)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x70C5]))
    object_ids = [f"{i:04d}" for i in range(config.num_objects)]
    object_splits = assign_splits(object_ids, config, seed)

    registry: dict[str, dict] = {}
    usage: dict[str, dict[str, str]] = {}
    level_stats = {level: {"level": level, "unique": 0, "total": 0, "empty": 0} for level in levels}
    objects: dict[str, np.ndarray] = {}
    for number, object_id in enumerate(object_ids):
        kind = SHAPES[number % len(SHAPES)]
        voxels = make_object(kind, base, rng)
        objects[object_id] = voxels
        _save_npz(object_voxel_path(dataset_dir, object_id), voxels=voxels)
        hashes: dict[int, dict] = {}
        for level in levels:
            blocks = octant_blocks(voxels, level)
            n = blocks.shape[0]
            hashes[level] = {}
            for index in np.ndindex(n, n, n):
                block = np.ascontiguousarray(blocks[index])
                hash_ = content_hash(block)
                empty = not block.any()
                hashes[level][index] = (hash_, empty)
                level_stats[level]["total"] += 1
                level_stats[level]["empty"] += int(empty)
                usage.setdefault(hash_, {})[object_id] = object_splits[object_id]
                entry = registry.get(hash_)
                if entry is None:
                    path = subvolume_path(dataset_dir, level, hash_)
                    _save_npz(path, voxels=block)
                    registry[hash_] = {
                        "level": level,
                        "count": 1,
                        "path": str(path.relative_to(root)),
                        "is_empty": empty,
                        "resolution": block.shape[0],
                    }
                    level_stats[level]["unique"] += 1
                else:
                    entry["count"] += 1
        occupied = int(voxels.sum())
        _write_json(
            dataset_dir / "objects" / f"object_{object_id}" / "metadata.json",
            {
                "object_id": object_id,
                "source_file": f"synthetic:{kind}",
                "voxel_pitch": 1.0,
                "original_bbox_min": [0.0, 0.0, 0.0],
                "original_bbox_max": [float(base)] * 3,
                "original_bbox_extents": [float(base)] * 3,
                "num_occupied_voxels": occupied,
                "occupancy_ratio": occupied / base**3,
                "source_hash": content_hash(voxels),
            },
            indent=2,
        )
        _write_json(
            dataset_dir / "objects" / f"object_{object_id}" / "subdivision_map.json",
            subdivision_records(object_id, hashes, levels, base),
        )

    trivial = sorted(h for h, entry in registry.items() if entry["is_empty"])
    for stats in level_stats.values():
        stats["deduplication_ratio"] = stats["unique"] / stats["total"] if stats["total"] else 0.0
    total = sum(s["total"] for s in level_stats.values())
    unique = len(registry)
    overall = {"total_subvolumes": total, "unique_subvolumes": unique, "deduplication_ratio": unique / total if total else 0.0}
    resolutions = [base >> level for level in [0, *levels]]
    _write_json(
        dataset_dir / "metadata.json",
        {
            "dataset_name": "Synthetic_Hierarchical_Voxels",
            "version": "1.0",
            "created_at": "1970-01-01T00:00:00",
            "base_resolution": base,
            "min_resolution": min_res,
            "num_levels": len(resolutions),
            "level_resolutions": resolutions,
            "num_objects": len(object_ids),
            "compression_enabled": True,
            "deduplication_stats": {str(level): stats for level, stats in level_stats.items()},
            "overall_stats": overall,
            "synthetic": {"seed": seed, "config": config.__dict__},
        },
        indent=2,
    )
    _write_json(dataset_dir / "registry.json", {"stats": overall, "registry": registry})
    _write_json(
        dataset_dir / "splits.json",
        {
            "config": {
                "train_ratio": config.train_ratio,
                "val_ratio": config.val_ratio,
                "test_ratio": config.test_ratio,
                "seed": seed,
            },
            "object_splits": object_splits,
            "hash_object_usage": {h: dict(sorted(u.items())) for h, u in sorted(usage.items())},
            "trivial_hashes": trivial,
            "statistics": _split_statistics(object_splits, usage, trivial),
        },
        indent=2,
    )

    # rays: every object at level 0, every non-empty unique subvolume above (empties are skipped)
    samples_per_level: dict[str, int] = {}
    processed = 0
    jobs = {0: [(object_id, objects[object_id]) for object_id in object_ids]}
    for hash_, entry in sorted(registry.items()):
        if not entry["is_empty"]:
            voxels = np.load(root / entry["path"])["voxels"]
            jobs.setdefault(entry["level"], []).append((hash_, voxels))
    for level in sorted(jobs):
        keys = [key for key, _ in jobs[level]]
        grids = [grid for _, grid in jobs[level]]
        traced = trace_grids(grids, [_rng(seed, level, key) for key in keys], config)
        for key, grid, rays in zip(keys, grids, traced):
            _save_npz(
                ray_path(ray_dir, level, key),
                **rays,
                grid_shape=np.array(grid.shape, dtype=np.int64),
                voxel_size=np.float64(1.0),
                hash=np.array(key),
                level=np.int64(level),
                sampling_mode=np.array("sphere"),
            )
            processed += 1
        if traced:
            samples_per_level[str(level)] = len(traced[0]["origins"])
    _write_json(
        ray_dir / "processing_summary.json",
        {
            "dataset_dir": DATASET_DIR,
            "output_dir": RAY_DIR,
            "sphere_divisions": config.sphere_divisions,
            "samples_per_view": config.samples_per_view,
            "adaptive_sampling": False,
            "min_samples": config.samples_per_view,
            "samples_per_level": samples_per_level,
            "total_subvolumes": len(registry) + len(object_ids),
            "processed": processed,
            "skipped_already_exists": 0,
            "skipped_empty": len(trivial),
            "errors": 0,
            "min_level": 0,
            "max_level": levels[-1] if levels else 0,
        },
        indent=2,
    )
    return root


def synth(directory: str, seed: int = 0, size: str = "small", **overrides) -> pathlib.Path:
    """`wdsprep synth voxels DIR --size small|medium`; keyword overrides change the preset."""
    if size not in PRESETS:
        raise ValueError(f"unknown size {size!r} (expected one of {', '.join(PRESETS)})")
    config = SynthConfig(**{**PRESETS[size].__dict__, **overrides})
    return write_synthetic(directory, seed, config)
