"""Helpers shared by the minecraft tests: synthetic episode folders and an upstream-style loader.

`upstream_pairs` restates upstream `MinecraftDataset.load_data` (rglob the creative:* folders, sort
the paths, cut to max_creative_scenes, np.load every frame, pair idx with idx+1 for idx in
range(H-1, T-1)) so the tests compare against what the original loader gives.
"""
from __future__ import annotations

import os
import pathlib

import numpy as np

from wdsprep.sources.minecraft.synth import write_frame


def upstream_pairs(data_dir, history_length: int = 1, max_creative_scenes: int | None = None) -> list[dict]:
    data_dir = pathlib.Path(data_dir)
    creative_dirs = sorted(p for p in data_dir.rglob("*") if p.is_dir() and p.name.startswith("creative:"))
    if max_creative_scenes is not None:
        creative_dirs = creative_dirs[:max_creative_scenes]
    items = []
    for creative_dir in creative_dirs:
        files = sorted(creative_dir.glob("*.npy"))
        if len(files) < 2:
            continue
        frames = [np.load(path, allow_pickle=True).item() for path in files]
        if len(frames) <= history_length:
            continue
        for idx in range(history_length - 1, len(frames) - 1):
            items.append({
                "x_raw": frames[idx]["voxel"],
                "y_raw": frames[idx]["action"],
                "z_raw": frames[idx + 1]["voxel"],
                "episode": creative_dir.name,
                "history_start_index": idx - history_length + 1,
                "history_raw": [frames[k]["voxel"] for k in range(idx - history_length + 1, idx)],
                "history_actions_raw": [frames[k]["action"] for k in range(idx - history_length + 1, idx)],
            })
    return items


def make_episode_dir(root, name: str, frames: int, side: int = 5, start: int = 0, seed: int = 0,
                     names=("air", "stone", "dirt", "grass block", "water")) -> list[str]:
    """Write `frames` valid random frames into root/name/ (numbered from `start`)."""
    rng = np.random.default_rng(seed)
    paths = []
    for t in range(start, start + frames):
        voxel = np.array(names)[rng.integers(len(names), size=(side, side, side))]
        action = np.array([rng.integers(3), rng.integers(3), rng.integers(2)], dtype=np.int64)
        path = os.path.join(root, name, f"{t:06d}.npy")
        write_frame(path, action, voxel)
        paths.append(path)
    return paths


def zip_folder(folder, archive) -> pathlib.Path:
    """`folder`'s files as a deflated zip like the real data.zip, byte-identical on every run
    (sorted names, a fixed timestamp)."""
    import zipfile

    folder, archive = pathlib.Path(folder), pathlib.Path(archive)
    with zipfile.ZipFile(archive, "w") as handle:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            info = zipfile.ZipInfo(path.relative_to(folder).as_posix(), date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            handle.writestr(info, path.read_bytes())
    return archive


def edited_frame(data: bytes) -> tuple[bytes, np.ndarray]:
    """The same pickled frame with another `straight` action (same dtype, so the same size)."""
    import io

    frame = np.load(io.BytesIO(data), allow_pickle=True).item()
    action = frame["action"].copy()
    action[0] = (action[0] + 1) % 3
    buffer = io.BytesIO()
    np.save(buffer, {"action": action, "voxel": frame["voxel"]}, allow_pickle=True)
    return buffer.getvalue(), action
