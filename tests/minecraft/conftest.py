"""Fixtures for the minecraft source: the real data.zip, converted once, and an upstream-style loader.

`upstream_pairs` restates upstream `MinecraftDataset.load_data` (rglob the creative:* folders, sort
the paths, cut to max_creative_scenes, np.load every frame, pair idx with idx+1 for idx in
range(H-1, T-1)) so the tests compare against what the original loader gives.
"""
from __future__ import annotations

import os
import pathlib
import zipfile

import numpy as np
import pytest

from wdsprep.sources.minecraft._synth import write_frame


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


@pytest.fixture(scope="session")
def real_zip(shared_data) -> pathlib.Path:
    path = shared_data / "minecraft" / "data.zip"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    return path


@pytest.fixture(scope="session")
def real_flat_dir(real_zip, tmp_path_factory) -> pathlib.Path:
    """data.zip extracted: the flat layout `root/data/creative:N/`."""
    root = tmp_path_factory.mktemp("minecraft_flat")
    with zipfile.ZipFile(real_zip) as archive:
        archive.extractall(root)
    return root


@pytest.fixture(scope="session")
def real_bucketed_dir(real_flat_dir, tmp_path_factory) -> pathlib.Path:
    """The same frames in the seed document's bucketed layout `data/seq{n}-{m}/creative:N/` (links)."""
    root = tmp_path_factory.mktemp("minecraft_buckets")
    for episode in sorted((real_flat_dir / "data").iterdir()):
        number = int(episode.name.split(":")[1])
        low = number // 5 * 5  # two buckets for the ten episodes
        target = root / "data" / f"seq{low}-{low + 4}" / episode.name
        target.mkdir(parents=True)
        for frame in episode.iterdir():
            os.symlink(frame, target / frame.name)
    return root


@pytest.fixture(scope="session")
def real_converted(real_zip, tmp_path_factory):
    """data.zip converted with the default options: (manifest, output folder)."""
    from wdsprep.conversion import convert

    output = tmp_path_factory.mktemp("minecraft_shards")
    manifest = convert("minecraft", str(real_zip), str(output))
    return manifest, output
