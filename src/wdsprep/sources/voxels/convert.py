"""Native voxel-dataset-generator layout -> shard samples (one per (level, key) with a ray file).

Each shard sample (`voxels/2`) holds one subvolume (or, at level 0, one object) with all of its rays:

- `voxels_packed.npy*`: the occupancy grid bit-packed in C order (`np.packbits`, big bit order),
  lossless; undone by `np.unpackbits(packed, count=prod(grid_shape)).reshape(grid_shape)`, as the
  manifest's field table says;
- `rays.npz*`: the per-ray arrays as one standard `.npz`, one plain array per name (`origins`,
  `directions`, `distances`, `hits`, `face_ids`, `view_ids` and any other (N, ...) numeric array
  of the ray file) with their own dtypes and shapes (distances stay raw). Every sample has the same
  names: a ray file without `face_ids` or `view_ids` gets a zero-length int32 array there (and
  `meta.ray_fields` lists the arrays the file really had);
- `meta.mp`: level, hash, grid shape, ray count, trivial flag, the splits that use the subvolume,
  and every other (small) array of the ray file with its dtype, so a ray file is rebuilt exactly.

`voxels/1` samples (all per-ray arrays in one structured record array `rays.npy*`, which Arrow
readers cannot hold) still read.

Samples are split by `splits.json` the upstream way: an object goes to its split, a subvolume to
every split one of its objects belongs to (and to all splits if trivial); the leakage this causes
is counted in the manifest table `leakage`.

Every file of the ray directory is converted or reported (`ctx.ignore`, the manifest's `problems`):
an entry that is not a `level_<n>/` folder (upstream's `processing_summary.json` aside), a file of a
level folder that is not a `*_rays.npz` ray file, and a ray file that no object of `splits.json`
uses; a split of `splits.json` that gets no sample is reported by the driver (`Plan.splits`).
"""
from __future__ import annotations

import argparse
import pathlib
import re
from typing import Iterator

import numpy as np

from ...errors import ConfigError, InputError
from ...shards.codec import Columns
from ...shards.manifest import FieldRecorder
from ..base import (MAX_JSON_BYTES, Plan, PlanContext, Source, Unit, UnitContext, check_split_name, group_by_size,
                    input_size, parse_json, read_input_bytes, read_npz_file)
from .native import (
    DATASET_DIR,
    MAX_NPZ_MEMBER_BYTES,
    RAY_DIR,
    RAY_SUFFIX,
    SPLITS,
    content_hash,
    object_voxel_path,
    sample_hash,
    shard_key,
    subvolume_path,
)

FORMAT = "voxels/2"
READ_FORMATS = ("voxels/1", FORMAT)  # voxels/1: the per-ray arrays as one structured record array
# per-ray arrays, stored together as the columns of the `rays` .npz member (any other (N, ...)
# numeric array of the ray file joins them); the (V, 3) view_positions is small and goes into meta.mp
RAY_FIELDS = ("origins", "directions", "distances", "hits", "face_ids", "view_ids")
REQUIRED_RAY_FIELDS = ("origins", "directions", "distances", "hits")
ABSENT_RAY_DTYPE = np.dtype("<i4")  # an optional column (face_ids, view_ids) a ray file lacks: zero-length, upstream's dtype
SMALL_EXTRA = 64  # ray-file arrays up to this many elements go into meta.mp, larger ones as members
_LEVEL_DIR = re.compile(r"^level_(\d+)$")
LAYOUT_FILES = ("processing_summary.json",)  # upstream's files of the ray directory that hold no sample


# ---------------------------------------------------------------------------------- native I/O
def read_json(path: pathlib.Path, what: str):
    """A JSON file of the layout (splits, metadata): at most MAX_JSON_BYTES, no key given twice."""
    if not path.exists() and not path.is_symlink():
        raise InputError(f"{path}: {what} not found")
    return parse_json(read_input_bytes(str(path), MAX_JSON_BYTES, f"a {what}"), str(path), what)


def load_npz(path: pathlib.Path) -> dict[str, np.ndarray]:
    """All arrays of an .npz file, each at most MAX_NPZ_MEMBER_BYTES and exactly what its header
    declares (`read_npz_file`); any problem raises InputError naming the file."""
    if not path.exists() and not path.is_symlink():
        raise InputError(f"{path}: file not found")
    return read_npz_file(str(path), MAX_NPZ_MEMBER_BYTES, "an array of a voxel or ray file")


def check_voxels(arrays: dict, path: pathlib.Path, level: int, key: str, base_resolution: int | None) -> np.ndarray:
    """The bool occupancy cube of a voxel file, after the upstream invariants are checked."""
    if "voxels" not in arrays:
        raise InputError(f"{path}: missing array 'voxels' (has: {', '.join(sorted(arrays)) or 'none'})")
    voxels = arrays["voxels"]
    if voxels.ndim != 3 or len(set(voxels.shape)) != 1:
        raise InputError(f"{path}: voxel grid has shape {tuple(voxels.shape)}, expected a cube")
    if voxels.dtype != bool:
        if voxels.dtype.kind not in "iuf" or not np.isin(voxels, (0, 1)).all():
            raise InputError(f"{path}: voxel grid of dtype {voxels.dtype} holds values other than 0 and 1")
        voxels = voxels.astype(bool)
    if base_resolution:
        expected = base_resolution >> level
        if voxels.shape[0] != expected:
            raise InputError(
                f"{path}: level {level} grid has size {voxels.shape[0]}, expected {expected} "
                f"(base_resolution {base_resolution} / 2**{level})"
            )
    if level > 0:
        actual = content_hash(voxels)
        if actual != key:
            raise InputError(f"{path}: content hash {actual} does not match the file name (expected {key})")
    return np.ascontiguousarray(voxels)


def check_rays(arrays: dict, path: pathlib.Path, level: int, key: str, grid_shape: tuple) -> int:
    """Validates a ray file against the upstream layout; returns its ray count."""
    for name in REQUIRED_RAY_FIELDS:
        if name not in arrays:
            raise InputError(f"{path}: missing array {name!r} (has: {', '.join(sorted(arrays)) or 'none'})")
    origins = arrays["origins"]
    if origins.ndim != 2 or origins.shape[1] != 3 or origins.dtype.kind != "f":
        raise InputError(f"{path}: 'origins' has shape {origins.shape} dtype {origins.dtype}, expected (N, 3) float")
    n = origins.shape[0]
    expected = {"directions": (n, 3), "distances": (n,), "hits": (n,), "face_ids": (n,), "view_ids": (n,)}
    for name, shape in expected.items():
        if name in arrays and arrays[name].shape != shape:
            raise InputError(f"{path}: {name!r} has shape {arrays[name].shape}, expected {shape} (N = {n} rays)")
    for name in ("directions", "distances"):
        if arrays[name].dtype.kind != "f":
            raise InputError(f"{path}: {name!r} has dtype {arrays[name].dtype}, expected float")
    for name in ("face_ids", "view_ids"):
        if name in arrays and arrays[name].dtype.kind not in "iu":
            raise InputError(f"{path}: {name!r} has dtype {arrays[name].dtype}, expected integers")
    if "face_ids" in arrays and n and (arrays["face_ids"].min() < 0 or arrays["face_ids"].max() > 5):
        raise InputError(f"{path}: 'face_ids' outside 0..5")
    if "view_positions" in arrays:
        positions = arrays["view_positions"]
        if positions.ndim != 2 or positions.shape[1] != 3:
            raise InputError(f"{path}: 'view_positions' has shape {positions.shape}, expected (V, 3)")
        if "view_ids" in arrays and n and (arrays["view_ids"].min() < 0 or arrays["view_ids"].max() >= len(positions)):
            raise InputError(f"{path}: 'view_ids' outside 0..{len(positions) - 1} (view_positions has {len(positions)} rows)")
    if "grid_shape" in arrays and tuple(int(v) for v in np.ravel(arrays["grid_shape"])) != tuple(grid_shape):
        raise InputError(
            f"{path}: grid_shape {tuple(np.ravel(arrays['grid_shape']).tolist())} does not match "
            f"the voxel grid {tuple(grid_shape)}"
        )
    if "level" in arrays and arrays["level"].size == 1 and int(arrays["level"]) != level:
        raise InputError(f"{path}: level {int(arrays['level'])} does not match its directory level_{level}")
    if "hash" in arrays and arrays["hash"].size == 1 and str(arrays["hash"]) != key:
        raise InputError(f"{path}: hash {str(arrays['hash'])!r} does not match the file name ({key!r})")
    return n


def ray_columns(rays: dict, names: list[str]) -> Columns:
    """The per-ray arrays as the columns of one `.npz` member, in the order of `names`; an optional
    column the ray file lacks is a zero-length array (`ABSENT_RAY_DTYPE`), so every sample of a
    split has the same columns."""
    return Columns(
        (name, np.ascontiguousarray(rays[name]) if name in rays else np.zeros(0, ABSENT_RAY_DTYPE)) for name in names
    )


def _describe_array(array: np.ndarray) -> dict:
    return {"dtype": array.dtype.str, "shape": list(array.shape), "value": array.tolist()}


def restore_array(entry: dict) -> np.ndarray:
    return np.array(entry["value"], dtype=np.dtype(entry["dtype"])).reshape(entry["shape"])


# --------------------------------------------------------------------------------------- source
def resolve_dirs(input: str, options: dict) -> tuple[pathlib.Path, pathlib.Path]:
    """(dataset dir, ray dir): `INPUT/dataset` and `INPUT/ray_dataset_hierarchical` unless given."""
    root = pathlib.Path(input)
    dataset_option, ray_option = options.get("dataset_dir"), options.get("ray_dir")
    if dataset_option:
        dataset_dir = root / dataset_option  # an absolute option stays absolute
    elif (root / "splits.json").exists() and not (root / DATASET_DIR).exists():
        dataset_dir = root  # INPUT is the voxel dataset itself
    else:
        dataset_dir = root / DATASET_DIR
    if ray_option:
        ray_dir = root / ray_option
    elif dataset_dir == root:
        ray_dir = root.parent / RAY_DIR
    else:
        ray_dir = root / RAY_DIR
    if not dataset_dir.is_dir():
        raise InputError(f"{dataset_dir}: voxel dataset directory not found (give INPUT holding {DATASET_DIR}/ or --dataset-dir)")
    if not ray_dir.is_dir():
        raise InputError(f"{ray_dir}: ray dataset directory not found (give INPUT holding {RAY_DIR}/ or --ray-dir)")
    return dataset_dir, ray_dir


def read_splits(dataset_dir: pathlib.Path) -> dict:
    path = dataset_dir / "splits.json"
    doc = read_json(path, "splits file")
    if not isinstance(doc, dict) or not isinstance(doc.get("object_splits"), dict):
        raise InputError(f"{path}: expected an object with 'object_splits' (object id -> split)")
    for object_id, split in doc["object_splits"].items():
        check_split_name(split, f"{path}: object {object_id!r}")
    usage = doc.get("hash_object_usage", {})
    if not isinstance(usage, dict) or not all(isinstance(v, dict) for v in usage.values()):
        raise InputError(f"{path}: 'hash_object_usage' must map hash -> {{object id: split}}")
    trivial = doc.get("trivial_hashes", [])
    if not isinstance(trivial, list):
        raise InputError(f"{path}: 'trivial_hashes' must be a list")
    return doc


def _split_order(names) -> list[str]:
    return [s for s in SPLITS if s in names] + sorted(set(names) - set(SPLITS))


def _pair_name(splits: list[str]) -> str:
    return "all_splits" if set(splits) >= set(SPLITS) and len(splits) == 3 else "_".join(_split_order(splits))


class VoxelSource(Source):
    """`wdsprep convert voxels INPUT OUTPUT`: INPUT holds `dataset/` and `ray_dataset_hierarchical/`."""

    id = "voxels"
    show_with = "wdsprep.sources.voxels.show:show"  # `wdsprep show` draws the reader's sample (show.py)
    fingerprint = "stat"  # ray files are large: content hashing would read the input twice
    index_fields = ("meta.level", "meta.trivial", "meta.num_rays")  # the sample table's fields (selections)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--dataset-dir", dest="dataset_dir", default=None,
                            help="voxel dataset directory (default INPUT/dataset)")
        parser.add_argument("--ray-dir", dest="ray_dir", default=None,
                            help="ray dataset directory (default INPUT/ray_dataset_hierarchical)")
        parser.add_argument("--levels", dest="levels", default=None,
                            help="comma-separated hierarchy levels to convert (default all)")

    def check_options(self, options: dict) -> None:
        _parse_levels(options.get("levels"))

    # ------------------------------------------------------------------------------------ plan
    def plan(self, input: str, ctx: PlanContext) -> Plan:
        options = ctx.options
        dataset_dir, ray_dir = resolve_dirs(input, options)
        splits_doc = read_splits(dataset_dir)
        metadata = read_json(dataset_dir / "metadata.json", "dataset metadata")
        base_resolution = metadata.get("base_resolution") if isinstance(metadata, dict) else None
        if base_resolution is not None and not isinstance(base_resolution, int):
            raise InputError(f"{dataset_dir / 'metadata.json'}: base_resolution {base_resolution!r} is not an integer")
        levels = _parse_levels(options.get("levels"))
        object_splits: dict = splits_doc["object_splits"]
        usage: dict = splits_doc.get("hash_object_usage", {})
        trivial = set(splits_doc.get("trivial_hashes", []))
        all_splits = _split_order(set(object_splits.values()))

        per_split: dict[str, list] = {split: [] for split in all_splits}
        sizes: dict[str, list] = {split: [] for split in all_splits}
        unassigned = []
        leakage = {"samples_in_several_splits": 0, "by_splits": {}}
        level_counts = {split: {} for split in all_splits}
        for level, ray_file in _ray_files(ray_dir, levels, ctx):
            key = ray_file.name[: -len(RAY_SUFFIX)]
            relative_ray = ray_file.relative_to(ray_dir).as_posix()
            if level == 0:
                voxel_file = object_voxel_path(dataset_dir, key)
                splits = [object_splits[key]] if key in object_splits else []
                is_trivial = False
            else:
                voxel_file = subvolume_path(dataset_dir, level, key)
                is_trivial = key in trivial
                users = usage.get(key, {})
                splits = all_splits if is_trivial else _split_order(
                    {object_splits[o] for o in users if o in object_splits}
                )
            if not splits:
                unassigned.append(relative_ray)
                ctx.ignore(str(ray_file), "no object of splits.json uses it")
                continue
            try:
                voxel_bytes = voxel_file.stat().st_size
            except FileNotFoundError:
                ctx.skip_or_raise(relative_ray, f"{voxel_file}: voxel file not found (needed by ray file {ray_file})")
                continue
            ray_bytes = input_size(str(ray_file))
            item = [level, key, str(ray_file), str(voxel_file), is_trivial, splits, base_resolution]
            for split in splits:
                per_split[split].append(item)
                sizes[split].append(ray_bytes + voxel_bytes)
                level_counts[split][str(level)] = level_counts[split].get(str(level), 0) + 1
            if len(splits) > 1:
                leakage["samples_in_several_splits"] += 1
                name = _pair_name(splits)
                leakage["by_splits"][name] = leakage["by_splits"].get(name, 0) + 1

        units, total_bytes = [], 0
        for split in all_splits:  # items arrive in sorted (level, key) order from _ray_files
            groups = group_by_size(range(len(per_split[split])), sizes[split], ctx.core.shard_bytes)
            for index, group in enumerate(groups):
                group_bytes = sum(sizes[split][i] for i in group)
                units.append(Unit(split, index, [per_split[split][i] for i in group], group_bytes))
                total_bytes += group_bytes

        leakage["per_split"] = {
            split: {
                "samples": len(per_split[split]),
                "shared_with_other_splits": sum(1 for item in per_split[split] if len(item[5]) > 1),
            }
            for split in all_splits
        }
        tables = {
            "leakage": leakage,
            "levels": level_counts,
            "unassigned_ray_files": {"count": len(unassigned), "examples": unassigned[:20]},
            "upstream_split_statistics": splits_doc.get("statistics", {}),
            "layout": {"base_resolution": base_resolution, "format": FORMAT},
        }
        config = {
            "format": FORMAT,
            "dataset_dir": dataset_dir.name,
            "ray_dir": ray_dir.name,
            "levels": sorted(levels) if levels is not None else None,
        }
        splits_file = str(dataset_dir / "splits.json")
        return Plan(units, config, total_bytes, tables, splits=dict.fromkeys(all_splits, splits_file))

    def inputs(self, item) -> list[str]:
        """A sample reads its ray file and its voxel file (the split files only shape the items)."""
        return [item[2], item[3]]

    # ----------------------------------------------------------------------------------- build
    def build(self, unit: Unit, ctx: UnitContext) -> Iterator[tuple[str, dict]]:
        recorder = FieldRecorder(ctx.options)
        for level, key, ray_file, voxel_file, is_trivial, splits, base_resolution in unit.items:
            try:
                fields = build_fields(
                    level, key, pathlib.Path(ray_file), pathlib.Path(voxel_file), is_trivial, splits, base_resolution
                )
            except InputError as error:
                ctx.skip_or_raise(ray_file, error)
                continue
            meta = fields["meta"]
            ctx.add_table_entry("samples", [unit.split, shard_key(level, key), level, meta["num_rays"]])
            if meta.get("trivial"):  # the reader skips these by default: its chunk counts need to know
                ctx.add_table_entry("trivial", [unit.split, shard_key(level, key)])
            recorder.add(unit.split, fields)
            yield shard_key(level, key), fields
        recorder.report(ctx)

    def finalize(self, plan: Plan, unit_tables) -> dict:
        samples: dict[str, list] = {}
        rays: dict[str, int] = {}
        for tables in unit_tables:
            for split, key, level, num_rays in tables.get("samples", []):
                samples.setdefault(split, []).append([key, level, num_rays])
                rays[split] = rays.get(split, 0) + num_rays
        trivial: dict[str, list] = {split: [] for split in samples}
        for tables in unit_tables:
            for split, key in tables.get("trivial", []):
                trivial[split].append(key)
        return {"samples": samples, "rays": rays, "trivial": trivial,
                "fields": {split: declare_fields(table) for split, table in FieldRecorder.split_tables(unit_tables).items()}}

    def synth(self, directory: str, seed: int = 0, size: str = "small") -> None:
        from .synth import synth

        synth(directory, seed, size)


def build_fields(
    level: int,
    key: str,
    ray_file: pathlib.Path,
    voxel_file: pathlib.Path,
    is_trivial: bool,
    splits: list,
    base_resolution: int | None = None,
) -> dict:
    """The shard fields of one (level, key); raises InputError naming the bad file."""
    voxels = check_voxels(load_npz(voxel_file), voxel_file, level, key, base_resolution)
    rays = load_npz(ray_file)
    num_rays = check_rays(rays, ray_file, level, key, voxels.shape)
    fields: dict = {"voxels_packed": np.packbits(voxels.reshape(-1))}
    per_ray = list(RAY_FIELDS) + sorted(
        name for name, array in rays.items()
        if name not in RAY_FIELDS and name != "view_positions" and array.ndim >= 1
        and array.shape[0] == num_rays and array.dtype.kind in "biuf"
    )
    fields["rays"] = ray_columns(rays, per_ray)
    extras = {}
    for name, array in rays.items():
        if name in per_ray:
            continue
        if array.size <= SMALL_EXTRA or array.dtype.kind in "US":
            extras[name] = _describe_array(array)
        elif array.dtype.hasobject:
            raise InputError(f"{ray_file}: array {name!r} holds Python objects")
        else:
            fields[f"extra_{name}"] = np.ascontiguousarray(array)
    fields["meta"] = {
        "format": FORMAT,
        "level": level,
        "key": key,
        "hash": sample_hash(level, key),
        "grid_shape": list(voxels.shape),
        "num_rays": num_rays,
        "occupied": int(np.count_nonzero(voxels)),
        "trivial": bool(is_trivial),
        "splits": list(splits),
        "ray_fields": sorted(rays),
        "ray_extras": extras,
    }
    return fields


PACKED_VOXELS = {  # how `voxels_packed` is undone, for readers without wdsprep (the manifest's field table)
    "name": "packbits",
    "dtype": "|b1",
    "bitorder": "big",
    "order": "C",
    "shape": {"member": "meta.mp", "key": "grid_shape"},
    "undo": "np.unpackbits(packed, count=prod(shape), bitorder='big').reshape(shape).astype(bool)",
}
ABSENT_COLUMN = ("a zero-length int32 array: the ray file has no such array "
                 "(meta.mp `ray_fields` lists the arrays it has)")


def declare_fields(table: dict) -> dict:
    """A split's observed field table plus what a reader must know to undo: the packed voxel
    encoding and the zero-length convention of the optional ray columns."""
    declared = {}
    for member, entry in table.items():
        entry = dict(entry)
        if member.startswith("voxels_packed."):
            entry["encoding"] = PACKED_VOXELS
        if member.startswith("rays.") and entry.get("kind") == "columns":
            entry["columns"] = {name: dict(column, absent=ABSENT_COLUMN) if name in ("face_ids", "view_ids") else column
                                for name, column in entry["columns"].items()}
        declared[member] = entry
    return declared


def _parse_levels(value) -> set[int] | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        value = [part for part in value.split(",") if part.strip()]
    try:
        return {int(v) for v in value}
    except (TypeError, ValueError):
        raise ConfigError(f"--levels must be integers like 0,1,2 (got {value!r})") from None


def _ray_files(ray_dir: pathlib.Path, levels: set[int] | None, ctx: PlanContext) -> Iterator[tuple[int, pathlib.Path]]:
    """(level, ray file) in sorted (level, name) order, whatever the file system returns; any other
    entry goes to `ctx.ignore` (levels left out by `--levels` are the user's choice: not reported)."""
    found = []
    for entry in sorted(ray_dir.iterdir()):
        match = _LEVEL_DIR.match(entry.name)
        if not match or not entry.is_dir():
            if entry.name not in LAYOUT_FILES:
                ctx.ignore(str(entry) + "/" * entry.is_dir(), "not a level_<n> folder")
            continue
        level = int(match.group(1))
        if levels is not None and level not in levels:
            continue
        for path in sorted(entry.rglob("*")):
            if path.name.endswith(RAY_SUFFIX) and not path.is_dir():
                found.append((level, path.name, path))
            elif not path.is_dir():
                ctx.ignore(str(path), f"not a *{RAY_SUFFIX} ray file")
    found.sort()
    for level, _, ray_file in found:
        yield level, ray_file


SOURCE = VoxelSource()
