"""`voxels`: voxel-dataset-generator hierarchies and ray files -> ray-chunk training samples.

Public API (`wdsprep.voxels.<name>`):

- `samples(mode="dense"|"coo"|"graph", connectivity=6, rays_per_chunk=None, levels=None,
  include_empty=False, transform=None)`: reader stage for `wds.WebDataset(urls).compose(...)`;
- `chunk_counts(rays_per_chunk, levels, include_empty)`: its training samples per shard sample, for
  `wdsprep.dataset(..., outputs_per_sample=...)` (ranks balanced on ray chunks);
- `collate_ray_batch`: the spec's batch collation (also `.batched(n, collation_fn=...)`);
- `HierarchicalVoxelRayDataset`, `RayBatchSampler`: map-style drop-ins over local shards;
- `SOURCE`: the converter used by `wdsprep convert voxels` and `wdsprep synth voxels`.

Readers and map-style classes (torch) load on first use; the converter does not need them.
"""
from __future__ import annotations

from .. import lazy_exports
from .convert import SOURCE, VoxelSource
from .synth import synth  # bound here: a later import of the submodule `synth` must not shadow it

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
    "synth",
]

__getattr__ = lazy_exports(__name__, {
    **dict.fromkeys(["samples", "chunk_counts", "collate_ray_batch", "decode_voxel_sample", "native_arrays",
                     "graph_edges", "neighbour_offsets"], ".read"),
    **dict.fromkeys(["HierarchicalVoxelRayDataset", "RayBatchSampler"], ".mapstyle"),
})
