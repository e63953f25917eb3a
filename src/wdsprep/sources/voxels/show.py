"""`wdsprep show` for voxels: one subvolume as its training sample, the way the spec describes it.

The shard sample goes through the reader stage itself (`samples(mode="dense", include_empty=True)`,
all rays in one chunk, and `mode="graph"` for the sparse fields), and is drawn as:

- three orthogonal mid-slices of the dense grid (`voxels[0]`, axes d, h, w), occupied cells light,
  with the rays' first hits that lie in the slice as red dots;
- the same three mid-slices rebuilt from the COO `voxel_pos` ([x, y, z] = [w, h, d]), which must
  look the same as the dense ones;
- the grid seen along axis 0 (occupied anywhere along d), with every drawn ray's first hit;
- text: level, hash, occupied voxels, the graph's edge count (6-connectivity), rays and hits.

A ray's first hit is found by marching it from its origin in quarter-cell steps to the first
occupied cell (origins are world (x, y, z) with the grid centred at 0, so (z, y, x) + r/2 is the
position in cells (d, h, w), cell [d, h, w] spanning d..d+1 and so on); at most `MAX_RAYS` hit rays are marched (drawn by the report's
seed). The first hit is always an occupied cell, so dots never fall on empty cells.
"""
from __future__ import annotations

import math

import numpy as np

from ...show.model import Panel, ShowContext, Shown
from ...show.picture import AXIS_VIEWS, as_numpy, mid_slice, occupancy, picture, text_panel

MAX_RAYS = 2000
STEP = 0.25  # cells per marching step


def first_hits(grid: np.ndarray, origins: np.ndarray, directions: np.ndarray) -> np.ndarray:
    """(K, 3) int64 (d, h, w) of the first occupied cell along each ray that meets one."""
    r = grid.shape[0]
    start = origins[:, ::-1].astype(np.float64) + r / 2.0  # (z, y, x) = (d, h, w) in cell units
    along = directions[:, ::-1].astype(np.float64)
    t = np.arange(0.0, math.sqrt(3.0) * r + 1.0, STEP)
    found = []
    for lo in range(0, len(start), 256):
        points = np.floor(start[lo : lo + 256, None, :] + t[None, :, None] * along[lo : lo + 256, None, :]).astype(np.int64)
        inside = np.all((points >= 0) & (points < np.array(grid.shape)), axis=2)
        clipped = np.where(inside[..., None], points, 0)
        occupied = inside & grid[clipped[..., 0], clipped[..., 1], clipped[..., 2]]
        hit = occupied.any(axis=1)
        first = occupied.argmax(axis=1)
        found.append(points[np.nonzero(hit)[0], first[hit]])
    return np.concatenate(found) if found else np.zeros((0, 3), np.int64)


def _grid_from_coo(positions: np.ndarray, shape) -> np.ndarray:
    grid = np.zeros(tuple(int(s) for s in shape), bool)
    cells = np.asarray(positions, np.int64)
    if len(cells):
        grid[cells[:, 2], cells[:, 1], cells[:, 0]] = True  # voxel_pos is [x, y, z] = [w, h, d]
    return grid


def show(sample: dict, context: ShowContext) -> Shown:
    from .read import samples

    dense = next(iter(samples(mode="dense", include_empty=True)([sample])))
    graph = next(iter(samples(mode="graph", include_empty=True)([sample])))
    grid = as_numpy(dense["voxels"])[0] > 0
    coo = _grid_from_coo(as_numpy(graph["voxel_pos"]), as_numpy(graph["voxel_shape"]))
    hits = as_numpy(dense["hits"]) > 0
    chosen = np.nonzero(hits)[0]
    if len(chosen) > MAX_RAYS:
        chosen = np.sort(context.rng().choice(chosen, MAX_RAYS, replace=False))
    found = first_hits(grid, as_numpy(dense["origins"])[chosen], as_numpy(dense["directions"])[chosen])
    shape = "x".join(str(s) for s in grid.shape)
    panels: list[Panel] = []
    for axis, how in AXIS_VIEWS:
        middle = grid.shape[axis] // 2
        here = found[found[:, axis] == middle]
        others = [a for a in range(3) if a != axis]
        panels.append(picture(f"dense/axis{axis}", f"voxels mid-slice, axis {axis} = {middle}",
                              occupancy(mid_slice(grid, axis)), f"{shape}; {how}; red: first hits in this slice ({len(here)})",
                              dots=here[:, others]))
    for axis, how in AXIS_VIEWS:
        panels.append(picture(f"coo/axis{axis}", f"COO voxel_pos mid-slice, axis {axis}",
                              occupancy(mid_slice(coo, axis)), f"{len(as_numpy(graph['voxel_pos']))} voxels; {how}"))
    panels.append(picture("hits/axis0", "first hits, seen along axis 0", occupancy(grid.any(axis=0)),
                          f"occupied anywhere along axis 0; red: first hits of {len(found)} of {int(hits.sum())} hit rays",
                          dots=found[:, 1:]))
    edges = as_numpy(graph["voxel_edge_index"]).shape[1]
    panels.append(text_panel("summary", "subvolume", "\n".join([
        f"level      {dense['level']}",
        f"hash       {dense['hash']}",
        f"grid       {shape}",
        f"occupied   {int(grid.sum())} voxels (COO: {len(as_numpy(graph['voxel_pos']))})",
        f"graph      {edges} edges (6-connectivity, both directions)",
        f"rays       {len(hits)}, hits {int(hits.sum())} ({hits.mean() if len(hits) else 0:.1%})",
        f"distances  {float(as_numpy(dense['distances']).max()) if len(hits) else 0:.3f} max (/ cube diagonal)",
    ])))
    fields = dict(dense)
    fields.update({name: value for name, value in graph.items() if name not in fields})
    return Shown(panels, fields, "the reader's training sample: mode='dense', all rays in one chunk "
                                 "(voxel_pos, voxel_edge_index, voxel_shape from mode='graph')")
