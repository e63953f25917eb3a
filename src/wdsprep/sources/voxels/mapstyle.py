"""Map-style drop-in for upstream `HierarchicalVoxelRayDataset`, over wdsprep shards at any location.

Built on `wdsprep.MapDataset` (stream/mapdataset.py): opening the dataset reads each shard's sample
index and each sample's small `meta.mp` member (read together, shard by shard); `__getitem__` then
reads just the members of the one sample it needs (one positioned read locally, one Range request
remotely). Every member read is checked against the shard's index (a local shard without one is
hashed whole first), so a corrupted shard is a `ShardError` naming it, never a sample. Voxel grids
sit in a real LRU cache (a hit refreshes the entry; upstream's is FIFO); the decoded rays of the
most recently used samples are kept too, so consecutive chunks of a subvolume decompress its rays once.
"""
from __future__ import annotations

import collections
import os
from typing import Callable, Sequence

import numpy as np
from torch.utils.data import BatchSampler, Dataset, RandomSampler, SequentialSampler

from ...errors import ConfigError, ShardError
from ...shards.codec import decode_value
from ...stream.mapdataset import MapDataset
from .read import (
    READ_FIELDS,
    ray_arrays,
    VoxelGrid,
    check_reader_options,
    chunk_bounds,
    keep_sample,
    training_sample,
    unpack_voxels,
)


class HierarchicalVoxelRayDataset(Dataset):
    """Ray chunks of a voxels/1 shard set; `len()` is the number of chunks (not subvolumes).

    `shards` is a local manifest (its file or directory; `split` picks the shard list) or a list of
    local tar paths. The other arguments are upstream's; `seed` is accepted and, as upstream, unused
    (chunking is sequential).
    """

    def __init__(
        self,
        shards,
        split: str = "train",
        levels: Sequence[int] | None = None,
        rays_per_chunk: int | None = None,
        cache_size: int = 100,
        include_empty: bool = False,
        transform: Callable[[dict], dict] | None = None,
        seed: int = 42,
        sparse_voxels: bool = False,
        sparse_mode: str = "coo",
        sparse_connectivity: int = 6,
    ):
        if sparse_voxels and sparse_mode not in ("coo", "graph"):
            raise ConfigError(f"sparse_mode must be 'coo' or 'graph' (got {sparse_mode!r})")
        self.mode = sparse_mode if sparse_voxels else "dense"
        check_reader_options(self.mode, sparse_connectivity, rays_per_chunk)
        self.split = split
        self.levels = None if levels is None else sorted({int(level) for level in levels})
        self.rays_per_chunk = rays_per_chunk
        self.cache_size = int(cache_size)
        self.include_empty = include_empty
        self.transform = transform
        self.seed = seed
        self.sparse_voxels = sparse_voxels
        self.sparse_mode = sparse_mode
        self.sparse_connectivity = sparse_connectivity
        # the shards at any location, or a list of shard paths/URLs; raw bytes, decoded here per member
        self.data = MapDataset(shards, split, decode=False)
        self.shard_paths = self.data.urls

        wanted = None if self.levels is None else set(self.levels)
        self.samples: list[dict] = []  # {position, shard, number (in the shard), key, members, meta}
        chunk_sample, chunk_start, chunk_end, chunk_number = [], [], [], []
        seen = set()
        for positions, raws in self.data.by_shard(("meta.mp",)):  # one shard's metas at a time
            for position, raw in zip(positions, raws):
                key, (shard, number) = raw["__key__"], self.data.locate(position)
                if "meta.mp" not in raw:
                    raise ShardError(raw["__url__"], f"sample {key!r} has no meta.mp member (not a voxels shard?)")
                meta = decode_value("meta.mp", raw["meta.mp"])
                if not keep_sample(meta, wanted, include_empty) or key in seen:
                    continue
                seen.add(key)
                sample_number = len(self.samples)
                self.samples.append({"position": position, "shard": shard, "number": number, "key": key,
                                     "members": self.data.member_names(position), "meta": meta})
                for chunk, (first, end) in enumerate(chunk_bounds(int(meta["num_rays"]), rays_per_chunk)):
                    chunk_sample.append(sample_number)
                    chunk_start.append(first)
                    chunk_end.append(end)
                    chunk_number.append(chunk)
        if not self.samples:
            raise ConfigError(f"no samples found for split {split!r} with levels={self.levels} in {len(self.shard_paths)} shards")
        self._chunk_sample = np.array(chunk_sample, dtype=np.int64)
        self._chunk_start = np.array(chunk_start, dtype=np.int64)
        self._chunk_end = np.array(chunk_end, dtype=np.int64)
        self._chunk_number = np.array(chunk_number, dtype=np.int64)
        self._reset_process_state()

    # ------------------------------------------------------------------ per-process state
    def _reset_process_state(self) -> None:
        self._pid = os.getpid()
        self._voxel_cache: collections.OrderedDict = collections.OrderedDict()
        self._ray_cache: collections.OrderedDict = collections.OrderedDict()
        self.cache_hits = self.cache_misses = 0

    def __getstate__(self):
        state = self.__dict__.copy()
        for name in ("_voxel_cache", "_ray_cache"):
            state[name] = collections.OrderedDict()
        state["_pid"] = -1  # DataLoader workers start with empty caches (shards reopen where unpickled)
        return state

    def _read(self, sample: dict, names: list[str]) -> dict:
        """Decoded members `names` of one sample, read (and checked) in one positioned read."""
        if self._pid != os.getpid():
            self._reset_process_state()
        raw = self.data.read([sample["position"]], names)[0]
        return {name: decode_value(name, raw[name]) for name in names}

    def _member_name(self, sample: dict, field: str) -> str | None:
        for name in sample["members"]:
            if name.split(".", 1)[0] == field:
                return name
        return None

    def _voxels(self, number: int) -> VoxelGrid:
        cache = self._voxel_cache
        grid = cache.get(number)
        if grid is not None:
            cache.move_to_end(number)  # LRU: a hit refreshes the entry
            self.cache_hits += 1
            return grid
        self.cache_misses += 1
        sample = self.samples[number]
        name = self._member_name(sample, "voxels_packed")
        packed = self._read(sample, [name])[name]
        grid = VoxelGrid(unpack_voxels(packed, sample["meta"]["grid_shape"]), self.mode, self.sparse_connectivity)
        if self.cache_size > 0:
            cache[number] = grid
            while len(cache) > self.cache_size:
                cache.popitem(last=False)
        return grid

    def _rays(self, number: int) -> dict:
        cache = self._ray_cache
        rays = cache.get(number)
        if rays is not None:
            cache.move_to_end(number)
            return rays
        sample = self.samples[number]
        meta = sample["meta"]
        names = {"rays": self._member_name(sample, "rays")}
        for field in meta["ray_fields"]:
            name = self._member_name(sample, f"extra_{field}")
            if field in READ_FIELDS and name is not None:  # unused arrays are never read
                names[f"extra_{field}"] = name
        members = self._read(sample, list(names.values()))
        rays = ray_arrays({"meta": meta, **{field: members[name] for field, name in names.items()}})
        cache[number] = rays
        while len(cache) > 2:
            cache.popitem(last=False)
        return rays

    # ------------------------------------------------------------------------- Dataset API
    def __len__(self) -> int:
        return len(self._chunk_sample)

    def __getitem__(self, index: int) -> dict:
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"chunk index {index} out of range for {len(self)} chunks")
        number = int(self._chunk_sample[index])
        meta = self.samples[number]["meta"]
        sample = training_sample(
            self._rays(number),
            self._voxels(number),
            meta,
            int(self._chunk_number[index]),
            int(self._chunk_start[index]),
            int(self._chunk_end[index]),
            self.mode,
        )
        return self.transform(sample) if self.transform is not None else sample

    def get_level_distribution(self) -> dict[int, int]:
        """Subvolumes (not chunks) per level, as upstream counts them."""
        distribution: dict[int, int] = {}
        for sample in self.samples:
            level = int(sample["meta"]["level"])
            distribution[level] = distribution.get(level, 0) + 1
        return distribution

    def num_chunks(self, sample_number: int) -> int:
        return int(np.count_nonzero(self._chunk_sample == sample_number))

    def close(self) -> None:
        """Close this process's shard file descriptors (they reopen on the next access)."""
        data = getattr(self, "data", None)
        if data is not None:
            data.close()


class RayBatchSampler(BatchSampler):
    """Batches of chunk indices (upstream HEAD signature); `generator` makes shuffling reproducible."""

    def __init__(self, dataset, batch_size: int = 8, shuffle: bool = True, drop_last: bool = False, generator=None):
        sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
        super().__init__(sampler, batch_size=batch_size, drop_last=drop_last)
        self.dataset = dataset
        self.shuffle = shuffle
