"""Fixtures for the minecraft source: the real data.zip, converted once (helpers such as the
upstream-style loader are in minecraft_testdata.py).

`minecraft_testdata.upstream_pairs` restates upstream `MinecraftDataset.load_data` (rglob the creative:* folders, sort
the paths, cut to max_creative_scenes, np.load every frame, pair idx with idx+1 for idx in
range(H-1, T-1)) so the tests compare against what the original loader gives.
"""
from __future__ import annotations

import os
import pathlib
import zipfile

import pytest



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
