"""`voxels`: voxel-dataset-generator hierarchies and ray files -> ray-chunk training samples.

Public API (`wdsprep.voxels.<name>`):

- `samples(mode="dense"|"coo"|"graph", connectivity=6, rays_per_chunk=None, levels=None,
  include_empty=False, transform=None)`: reader stage for `wds.WebDataset(urls).compose(...)`;
- `chunk_counts(rays_per_chunk, levels, include_empty)`: its training samples per shard sample, for
  `wdsprep.dataset(..., outputs_per_sample=...)` (ranks balanced on ray chunks);
- `collate_ray_batch`: the spec's batch collation (also `.batched(n, collation_fn=...)`);
- `HierarchicalVoxelRayDataset`, `RayBatchSampler`: map-style drop-ins over local shards;
- `SOURCE`: the converter used by `wdsprep convert voxels` and `wdsprep synth voxels`.
"""
from __future__ import annotations

from .convert import SOURCE, VoxelSource
from .mapstyle import HierarchicalVoxelRayDataset, RayBatchSampler, index_tar
from .read import (
    chunk_counts,
    collate_ray_batch,
    decode_voxel_sample,
    graph_edges,
    native_arrays,
    neighbour_offsets,
    samples,
)
from .synth import synth

__all__ = [
    "SOURCE",
    "VoxelSource",
    "samples",
    "chunk_counts",
    "collate_ray_batch",
    "HierarchicalVoxelRayDataset",
    "RayBatchSampler",
    "decode_voxel_sample",
    "native_arrays",
    "graph_edges",
    "neighbour_offsets",
    "index_tar",
    "synth",
]
