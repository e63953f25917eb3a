"""Synthetic MineDojo-style episodes in the native layout (what `wdsprep synth minecraft DIR` writes).

Each episode is an agent walking over a generated terrain (stone with ores and gravel, dirt,
grass block or sand at the top, water below sea level, trees, grass and flowers), seen as the
(S, S, S) window of block names around it, S = 21 like the real data. Frame t+1 is frame t shifted
by the move `action[t]` encodes (straight = x, pan = z, jump = the agent stepping up), so the
actions agree with the block shifts like upstream's relabelled ones. As in the real data, the last
frame's action is int32 and never relabelled, and no two consecutive actions are both no-ops.
"""
from __future__ import annotations

import os

import numpy as np

SIZES = {
    # episodes, frames per episode (low, high), voxel side
    "small": (6, (8, 24), 21),
    "medium": (12, (30, 90), 21),
}
BUCKET = 50  # episode ids n..n+49 share a seq{n}-{m} folder
SEA_LEVEL = 30


def write_frame(path: str, action, voxel) -> None:
    """One native frame exactly as upstream stores it: `np.save(path, dict(action=..., voxel=...))`."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.save(path, {"action": action, "voxel": voxel}, allow_pickle=True)


def episode_folder(root: str, episode_id: int, layout: str) -> str:
    if layout == "flat":
        return os.path.join(root, "data", f"creative:{episode_id}")
    if layout == "buckets":
        low = episode_id // BUCKET * BUCKET
        return os.path.join(root, "data", f"seq{low}-{low + BUCKET - 1}", f"creative:{episode_id}")
    raise ValueError(f"unknown layout {layout!r} (expected 'flat' or 'buckets')")


def _heightmap(rng: np.random.Generator, width: int) -> np.ndarray:
    """Smooth rolling ground heights around sea level: a few random low-frequency waves."""
    x = np.arange(width)[:, None]
    z = np.arange(width)[None, :]
    height = np.full((width, width), SEA_LEVEL + 1.5)
    for _ in range(4):
        fx, fz = rng.uniform(0.02, 0.15, size=2)
        phase = rng.uniform(0, 2 * np.pi, size=2)
        height += rng.uniform(0.8, 2.5) * np.sin(fx * x + phase[0]) * np.cos(fz * z + phase[1])
    return np.round(height).astype(np.int64)


def make_world(rng: np.random.Generator, width: int, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """A (width, depth, width) world of block names and its ground heights (x, z) -> y of the top block."""
    height = _heightmap(rng, width)
    y = np.arange(depth)[None, :, None]
    top = height[:, None, :]
    world = np.full((width, depth, width), "air", dtype="<U11")
    world[y < top - 3] = "stone"
    underground = rng.random(world.shape)
    stone = world == "stone"
    world[stone & (underground < 0.025)] = "coal ore"
    world[stone & (underground > 0.995)] = "iron ore"
    world[stone & (underground > 0.97) & (underground < 0.985)] = "gravel"
    world[(y >= top - 3) & (y < top)] = "dirt"
    beach = height <= SEA_LEVEL + 1
    surface = np.where(beach, "sand", "grass block")
    world[y == top] = np.broadcast_to(surface[:, None, :], world.shape)[y == top]
    world[(y > top) & (y <= SEA_LEVEL)] = "water"
    world[(y == top - 1) & beach[:, None, :] & (world == "dirt")] = "sandstone"
    # surface decorations and trees on dry land
    xs, zs = np.nonzero(~beach)
    for x, z in zip(xs.tolist(), zs.tolist()):
        roll = rng.random()
        h = int(height[x, z])
        if h + 8 >= depth:
            continue
        if roll < 0.06:
            world[x, h + 1, z] = "grass"
        elif roll < 0.07:
            world[x, h + 1, z] = "flower"
        elif roll < 0.075:
            world[x, h + 1, z] = "plant"
        elif roll < 0.078:
            world[x, h + 1, z] = "mushroom"
        elif roll < 0.083 and 2 <= x < width - 2 and 2 <= z < width - 2:
            crown = world[x - 2 : x + 3, h + 4 : h + 7, z - 2 : z + 3]
            crown[crown == "air"] = "leaves"
            world[x, h + 1 : h + 6, z] = "wood"
            if rng.random() < 0.3:
                world[x + 1, h + 2, z] = "vines"
    return world, height


def make_episode(rng: np.random.Generator, frames: int, side: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(actions, voxels) of one walk; action[t] is the move from frame t to t+1."""
    centre = (side - 1) // 2
    width = side + 2 * frames + 4
    depth = SEA_LEVEL + 12 + side
    world, height = make_world(rng, width, depth)
    x = z = width // 2
    y = max(int(height[x, z]), SEA_LEVEL) + 1
    positions, actions = [(x, y, z)], []
    previous = (0, 0, 0)
    for _ in range(frames - 1):
        while True:
            straight = int(rng.choice(3, p=[0.45, 0.4, 0.15]))
            pan = int(rng.choice(3, p=[0.5, 0.3, 0.2]))
            if (straight, pan) != (0, 0) or previous[:2] != (0, 0):
                break  # upstream's filter leaves no two no-op moves in a row
        x += {0: 0, 1: 1, 2: -1}[straight]
        z += {0: 0, 1: 1, 2: -1}[pan]
        new_y = max(int(height[x, z]), SEA_LEVEL) + 1
        jump = int(new_y > y)
        y = new_y
        previous = (straight, pan, jump)
        actions.append(np.array([straight, pan, jump], dtype=np.int64))
        positions.append((x, y, z))
    # the last frame keeps an unrelabelled action, int32 like the real dump
    actions.append(np.array([rng.integers(3), rng.integers(3), rng.integers(2)], dtype=np.int32))
    voxels = []
    for x, y, z in positions:
        window = world[x - centre : x + centre + 1, y - centre : y + centre + 1, z - centre : z + centre + 1]
        voxels.append(np.asfortranarray(window))  # the real frames are Fortran-ordered
    return actions, voxels


def synth(directory: str, seed: int = 0, size: str = "small", layout: str = "buckets", *,
          episodes: int | None = None, frames: tuple[int, int] | None = None, side: int | None = None) -> list[str]:
    """Write synthetic episodes under `directory/data/`; returns the episode folders written.

    `layout="buckets"` is the seed document's `data/seq{n}-{m}/creative:{id}/`, `"flat"` the real
    data's `data/creative:{id}/`. The same seed gives the same frames in either layout.
    """
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r} (expected one of {', '.join(SIZES)})")
    count, (low, high), default_side = SIZES[size]
    count = episodes or count
    low, high = frames or (low, high)
    side = side or default_side
    rng = np.random.default_rng(seed)
    # ids spread over several buckets, and past 9 so that name order (creative:10 < creative:2) matters
    ids = sorted(rng.choice(max(150, 3 * count), size=count, replace=False).tolist())
    written = []
    for episode_id in ids:
        length = int(rng.integers(low, high + 1))
        actions, voxels = make_episode(np.random.default_rng([seed, episode_id]), length, side)
        folder = episode_folder(directory, episode_id, layout)
        for t, (action, voxel) in enumerate(zip(actions, voxels)):
            write_frame(os.path.join(folder, f"{t:06d}.npy"), action, voxel)
        written.append(folder)
    return written
