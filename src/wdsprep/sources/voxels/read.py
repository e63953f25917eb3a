"""Shard samples -> the training samples of the voxel ray dataset spec, and their collate function.

One shard sample (a subvolume with all its rays) becomes `ceil(N / rays_per_chunk)` training
samples (one when `rays_per_chunk` is None), each with exactly the spec's keys, shapes and dtypes:

- rays sliced to `[k * rays_per_chunk, min((k + 1) * rays_per_chunk, N))`, origins/directions float32,
  `distances` = raw chord length / cube diagonal of the sample's grid (`sqrt(3 * r**2)`),
  `hits` float32 0/1, `view_ids`/`face_ids` int64, `view_positions` (N, 3) float32 = the position
  of each ray's view;
- voxels: dense `(1, D, H, W)` float32, or COO (`voxel_pos` (M, 3) float32 in [x, y, z] = [w, h, d]
  order, rows in C order of (d, h, w), `voxel_features` ones (M, 1), `voxel_shape` int64 [D, H, W],
  `num_voxels`), or graph (the same without `num_voxels`, plus `voxel_edge_index` (2, E) int64: both
  directions, no self-loops, no duplicates, for 6/18/26 connectivity);
- `level` int, `hash` str, `chunk_idx` int.
"""
from __future__ import annotations

import math
from typing import Callable, Iterator, Sequence

import numpy as np
import torch

from ...errors import ConfigError, FormatError
from ...shards.codec import decode_sample, decode_value
from .convert import FORMAT, READ_FORMATS, restore_array

MODES = ("dense", "coo", "graph")
READ_FIELDS = ("origins", "directions", "distances", "hits", "face_ids", "view_ids", "view_positions")
CONNECTIVITIES = (6, 18, 26)


# ---------------------------------------------------------------------------------- decoding
def unpack_voxels(packed: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    count = int(np.prod(shape))
    return np.unpackbits(packed, count=count).reshape(tuple(shape)).astype(bool)


def decode_voxel_sample(sample: dict) -> dict:
    """A raw (bytes) or decoded shard sample -> decoded fields with extensions stripped."""
    decoded = decode_sample(sample)
    meta = decoded.get("meta")
    if not isinstance(meta, dict) or meta.get("format") not in READ_FORMATS:
        raise FormatError(f"sample {decoded.get('__key__')!r}: not a {FORMAT} voxel sample (meta.mp missing or foreign)")
    return decoded


def native_arrays(decoded: dict) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(voxel grid, ray-file arrays) exactly as the native npz files held them (lossless check)."""
    meta = decoded["meta"]
    voxels = unpack_voxels(decoded["voxels_packed"], meta["grid_shape"])
    return voxels, ray_arrays(decoded, copy=True)


def ray_arrays(decoded: dict, copy: bool = False) -> dict[str, np.ndarray]:
    """Every array of the native ray file, by name: the columns of the `rays` member (an `.npz`'s
    dict in voxels/2; the fields of a structured array in voxels/1, views unless `copy`), the small
    ones kept in meta.mp, and any large `extra_<name>` member. `meta.ray_fields` says which arrays
    the file had (a zero-length column stands for one it had not)."""
    meta = decoded["meta"]
    table = decoded["rays"]
    if isinstance(table, dict):
        columns = table
    else:  # voxels/1: a structured record array
        columns = {name: np.ascontiguousarray(table[name]) if copy else table[name] for name in table.dtype.names or ()}
    rays = {}
    for name in meta["ray_fields"]:
        if name in columns:
            rays[name] = columns[name]
        elif name in meta["ray_extras"]:
            rays[name] = restore_array(meta["ray_extras"][name])
        elif f"extra_{name}" in decoded:  # a reader may leave unused large arrays unread
            rays[name] = decoded[f"extra_{name}"]
    return rays


# ------------------------------------------------------------------------------ sparse voxels
def neighbour_offsets(connectivity: int) -> np.ndarray:
    """(d, h, w) offsets: 6 faces, 18 = faces + edges, 26 = the full 3x3x3 shell (upstream order)."""
    faces = [(-1, 0, 0), (1, 0, 0), (0, -1, 0), (0, 1, 0), (0, 0, -1), (0, 0, 1)]
    if connectivity == 6:
        return np.array(faces, dtype=np.int64)
    if connectivity == 18:
        edges = []
        for first, second in ((0, 1), (0, 2), (1, 2)):
            for a in (-1, 1):
                for b in (-1, 1):
                    offset = [0, 0, 0]
                    offset[first], offset[second] = a, b
                    edges.append(tuple(offset))
        return np.array(faces + edges, dtype=np.int64)
    if connectivity == 26:
        shell = [(a, b, c) for a in (-1, 0, 1) for b in (-1, 0, 1) for c in (-1, 0, 1) if (a, b, c) != (0, 0, 0)]
        return np.array(shell, dtype=np.int64)
    raise ConfigError(f"connectivity must be 6, 18 or 26 (got {connectivity!r})")


def occupied_coords(voxels: np.ndarray) -> np.ndarray:
    """(M, 3) int64 (d, h, w) of occupied voxels, in C order."""
    return np.argwhere(voxels)


def graph_edges(voxels: np.ndarray, coords: np.ndarray, connectivity: int) -> np.ndarray:
    """(2, E) int64 edges [source, target] between occupied neighbours, by offset then source."""
    offsets = neighbour_offsets(connectivity)
    if len(coords) == 0:
        return np.zeros((2, 0), dtype=np.int64)
    # node index + 1 in a grid padded by one on every side; 0 = empty or outside
    index = np.zeros(tuple(s + 2 for s in voxels.shape), dtype=np.int64)
    index[coords[:, 0] + 1, coords[:, 1] + 1, coords[:, 2] + 1] = np.arange(1, len(coords) + 1)
    sources, targets = [], []
    for offset in offsets:
        neighbour = coords + 1 + offset
        found = index[neighbour[:, 0], neighbour[:, 1], neighbour[:, 2]]
        hit = np.nonzero(found)[0]
        sources.append(hit)
        targets.append(found[hit] - 1)
    return np.stack([np.concatenate(sources), np.concatenate(targets)]).astype(np.int64)


class VoxelGrid:
    """One subvolume's voxels in the representation a reader mode needs (built once per sample)."""

    __slots__ = ("grid", "coords", "pos", "edges", "connectivity")

    def __init__(self, grid: np.ndarray, mode: str, connectivity: int = 6):
        self.grid = grid
        self.coords = self.pos = self.edges = None
        self.connectivity = connectivity
        if mode in ("coo", "graph"):
            self.coords = occupied_coords(grid)
            self.pos = np.ascontiguousarray(self.coords[:, ::-1], dtype=np.float32)  # [x, y, z] = [w, h, d]
        if mode == "graph":
            self.edges = graph_edges(grid, self.coords, connectivity)

    def fields(self, mode: str) -> dict:
        """Fresh tensors for one training sample (chunks never share storage)."""
        if mode == "dense":
            return {"voxels": torch.from_numpy(self.grid.astype(np.float32)[None])}
        shape = torch.tensor(self.grid.shape, dtype=torch.int64)
        out = {
            "voxel_pos": torch.from_numpy(self.pos.copy()),
            "voxel_features": torch.ones((len(self.pos), 1), dtype=torch.float32),
        }
        if mode == "graph":
            out["voxel_edge_index"] = torch.from_numpy(self.edges.copy())
            out["voxel_shape"] = shape
        else:
            out["voxel_shape"] = shape
            out["num_voxels"] = int(len(self.pos))
        return out


# ------------------------------------------------------------------------------------ chunking
def chunk_bounds(num_rays: int, rays_per_chunk: int | None) -> list[tuple[int, int]]:
    """Sequential chunks [k*rpc, min((k+1)*rpc, N)); one chunk of all rays when rpc is None."""
    if rays_per_chunk is None:
        return [(0, num_rays)]
    return [(start, min(start + rays_per_chunk, num_rays)) for start in range(0, num_rays, rays_per_chunk)]


def cube_diagonal(grid_shape: Sequence[int]) -> float:
    """sqrt(3 * r**2) for the sample's r**3 grid (= the spec's 2**(7-level) cube at base 128)."""
    return math.sqrt(3.0 * float(grid_shape[0]) ** 2)


def ray_fields(rays: dict, start: int, end: int, grid_shape: Sequence[int]) -> dict:
    """The ray part of one training sample (fresh arrays)."""
    diag = np.float32(cube_diagonal(grid_shape))
    out = {
        "origins": torch.from_numpy(rays["origins"][start:end].astype(np.float32)),
        "directions": torch.from_numpy(rays["directions"][start:end].astype(np.float32)),
        "distances": torch.from_numpy(rays["distances"][start:end].astype(np.float32) / diag),
        "hits": torch.from_numpy((rays["hits"][start:end] != 0).astype(np.float32)),  # binary flags
    }
    if "view_ids" in rays:
        out["view_ids"] = torch.from_numpy(rays["view_ids"][start:end].astype(np.int64))
    if "face_ids" in rays:
        out["face_ids"] = torch.from_numpy(rays["face_ids"][start:end].astype(np.int64))
    positions = rays.get("view_positions")
    if positions is not None:
        if "view_ids" in rays:
            out["view_positions"] = torch.from_numpy(positions[rays["view_ids"][start:end]].astype(np.float32))
        elif len(positions) == len(rays["origins"]):  # already per ray
            out["view_positions"] = torch.from_numpy(positions[start:end].astype(np.float32))
    return out


def training_sample(rays: dict, voxels: VoxelGrid, meta: dict, chunk_idx: int, start: int, end: int, mode: str) -> dict:
    sample = ray_fields(rays, start, end, meta["grid_shape"])
    sample.update(voxels.fields(mode))
    sample["level"] = int(meta["level"])
    sample["hash"] = str(meta["hash"])
    sample["chunk_idx"] = int(chunk_idx)
    return sample


def check_reader_options(mode: str, connectivity: int, rays_per_chunk: int | None) -> None:
    if mode not in MODES:
        raise ConfigError(f"mode must be one of {', '.join(MODES)} (got {mode!r})")
    if connectivity not in CONNECTIVITIES:
        raise ConfigError(f"connectivity must be 6, 18 or 26 (got {connectivity!r})")
    if rays_per_chunk is not None and (not isinstance(rays_per_chunk, int) or rays_per_chunk < 1):
        raise ConfigError(f"rays_per_chunk must be a positive int or None (got {rays_per_chunk!r})")


def keep_sample(meta: dict, levels, include_empty: bool) -> bool:
    if levels is not None and int(meta["level"]) not in levels:
        return False
    return include_empty or not meta.get("trivial", False)


# ---------------------------------------------------------------------------------- the stage
def samples(
    mode: str = "dense",
    connectivity: int = 6,
    rays_per_chunk: int | None = None,
    levels: Sequence[int] | None = None,
    include_empty: bool = False,
    transform: Callable[[dict], dict] | None = None,
) -> Callable[[Iterator[dict]], Iterator[dict]]:
    """Reader stage: `wds.WebDataset(urls).compose(wdsprep.voxels.samples(mode="graph", ...))`.

    Flat-maps each shard sample to its ray chunks in order (no randomness, no state across samples,
    so a replay from a shard's start reproduces the stream exactly).
    """
    check_reader_options(mode, connectivity, rays_per_chunk)
    wanted = None if levels is None else {int(level) for level in levels}

    def stage(source: Iterator[dict]) -> Iterator[dict]:
        for raw in source:
            meta = _peek_meta(raw)
            if meta is not None and not keep_sample(meta, wanted, include_empty):
                continue  # filtered on meta.mp alone: the rays are never decompressed
            decoded = decode_voxel_sample(raw)
            meta = decoded["meta"]
            if not keep_sample(meta, wanted, include_empty):
                continue
            voxels = VoxelGrid(unpack_voxels(decoded["voxels_packed"], meta["grid_shape"]), mode, connectivity)
            rays = ray_arrays(decoded)
            for chunk_idx, (start, end) in enumerate(chunk_bounds(int(meta["num_rays"]), rays_per_chunk)):
                sample = training_sample(rays, voxels, meta, chunk_idx, start, end, mode)
                yield transform(sample) if transform is not None else sample

    return stage


def chunk_counts(rays_per_chunk: int | None = None, levels: Sequence[int] | None = None,
                 include_empty: bool = False) -> Callable:
    """For `wdsprep.dataset(..., outputs_per_sample=chunk_counts(...))`: the training samples that
    `samples(...)` with the same options makes of each shard sample, from the manifest's tables
    (`samples`: level and ray count per subvolume, `trivial`), so ranks balance on ray chunks."""
    check_reader_options("dense", 6, rays_per_chunk)
    wanted = None if levels is None else {int(level) for level in levels}

    def counts(manifest, split: str) -> list[int]:
        tables = manifest.tables
        if "trivial" not in tables:
            raise ConfigError("this voxels manifest has no 'trivial' table (converted before it was recorded): "
                              "convert again to balance on ray chunks")
        trivial = set(tables["trivial"].get(split, []))
        return [
            len(chunk_bounds(int(num_rays), rays_per_chunk))
            if keep_sample({"level": level, "trivial": key in trivial}, wanted, include_empty) else 0
            for key, level, num_rays in tables["samples"].get(split, [])
        ]

    return counts


def _peek_meta(sample: dict) -> dict | None:
    for name in ("meta.mp", "meta"):
        if name in sample:
            value = decode_value(name, sample[name])
            return value if isinstance(value, dict) else None
    return None


# ----------------------------------------------------------------------------------- collate
def _pad_to(voxels: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Zero-pad a (1, D, H, W) grid at the high end of each axis to `shape`."""
    pads = []
    for have, want in zip(reversed(voxels.shape[1:]), reversed(shape)):
        pads.extend([0, want - have])
    return torch.nn.functional.pad(voxels, pads) if any(pads) else voxels


def collate_ray_batch(batch: Sequence[dict]) -> dict:
    """Spec batch: rays concatenated, `ray_to_voxel`, voxels stacked (zero-padded to the batch max),
    `levels` int64, `hashes`; sparse modes concatenate nodes with `voxel_batch` and offset edges."""
    if not batch:
        raise ValueError("collate_ray_batch needs at least one sample")
    counts = [len(sample["origins"]) for sample in batch]
    out = {
        name: torch.cat([sample[name] for sample in batch], dim=0)
        for name in ("origins", "directions", "distances", "hits")
    }
    out["ray_to_voxel"] = torch.repeat_interleave(torch.arange(len(batch), dtype=torch.int64), torch.tensor(counts))
    out["levels"] = torch.tensor([int(sample["level"]) for sample in batch], dtype=torch.int64)
    out["hashes"] = [str(sample["hash"]) for sample in batch]
    if "voxel_pos" in batch[0]:
        nodes = [len(sample["voxel_pos"]) for sample in batch]
        out["voxel_pos"] = torch.cat([sample["voxel_pos"] for sample in batch], dim=0)
        out["voxel_features"] = torch.cat([sample["voxel_features"] for sample in batch], dim=0)
        out["voxel_batch"] = torch.repeat_interleave(torch.arange(len(batch), dtype=torch.int64), torch.tensor(nodes))
        out["voxel_shapes"] = torch.stack([sample["voxel_shape"] for sample in batch])
        if "voxel_edge_index" in batch[0]:
            offsets = np.concatenate([[0], np.cumsum(nodes)[:-1]])
            out["voxel_edge_index"] = torch.cat(
                [sample["voxel_edge_index"] + int(offset) for sample, offset in zip(batch, offsets)], dim=1
            )
    else:
        shape = [max(sample["voxels"].shape[axis] for sample in batch) for axis in (1, 2, 3)]
        out["voxels"] = torch.stack([_pad_to(sample["voxels"], shape) for sample in batch])
    for name in ("view_ids", "face_ids", "view_positions"):
        if all(name in sample for sample in batch):
            out[name] = torch.cat([sample[name] for sample in batch], dim=0)
    return out
