"""Shared synthetic data for the noisebase tests: native zips, their shards, reference helpers."""
from __future__ import annotations

import os
import warnings

import numpy as np
import torch

SEQUENCES, FRAMES, CROP, SAMPLES = 6, 4, 16, 8
ALL_BUFFERS = ["normal", "motion", "depth", "w_normal", "w_motion", "w_position", "diffuse", "color", "reference"]
_cache: dict = {}


def src_config(sequences=SEQUENCES, frames=FRAMES, crop=CROP, samples=SAMPLES):
    """noisebase's `src` config block for the synthetic set (its dataset YAML's fields)."""
    return dict(sequences=sequences, files="sampleset_v1/train/scene{index:04d}.zip", frames_per_sequence=frames,
                crop=crop, samples=samples, rendering_height=1080, rendering_width=1920)


def native(tmp_path_factory) -> str:
    if "native" not in _cache:
        from wdsprep.sources.noisebase.synth import synth

        root = tmp_path_factory.mktemp("noisebase-native")
        synth(str(root), seed=3, size="small")
        _cache["native"] = str(root)
    return _cache["native"]


def shards(tmp_path_factory, codec="zstd", shard_bytes="200KB") -> str:
    name = f"shards-{codec}-{shard_bytes}"
    if name not in _cache:
        from wdsprep.conversion import convert

        out = tmp_path_factory.mktemp(f"noisebase-{codec}")
        convert("noisebase", native(tmp_path_factory), str(out), shard_bytes=shard_bytes, codec=codec)
        _cache[name] = str(out)
    return _cache[name]


def require_noisebase(module: str = "noisebase.loaders.torch"):
    """The reference package's module, or skip (it needs zarr<3, hydra-core, imageio; it breaks on zarr 3)."""
    import importlib

    import pytest

    try:
        return importlib.import_module(module)
    except Exception as error:  # missing, or broken by zarr 3 (AttributeError), or a missing dependency
        pytest.skip(f"noisebase 1.1.1 (the reference) is not importable: {type(error).__name__}: {error}")


def reference_loader(data_path: str, **kwargs):
    warnings.filterwarnings("ignore", message=".*pin_memory.*")
    TrainingSampleLoader_v1 = require_noisebase().TrainingSampleLoader_v1

    return TrainingSampleLoader_v1(src=src_config(), data_path=data_path, **kwargs)


def assert_same_batch(ours, theirs, path="batch"):
    """Keys (in order), shapes, dtypes and values identical; file paths compared by name."""
    if isinstance(theirs, dict):
        assert list(ours) == list(theirs), f"{path}: keys {list(ours)} != {list(theirs)}"
        for key in theirs:
            assert_same_batch(ours[key], theirs[key], f"{path}.{key}")
    elif isinstance(theirs, torch.Tensor):
        assert isinstance(ours, torch.Tensor), f"{path}: {type(ours)} is not a tensor"
        assert ours.dtype == theirs.dtype, f"{path}: dtype {ours.dtype} != {theirs.dtype}"
        assert ours.shape == theirs.shape, f"{path}: shape {tuple(ours.shape)} != {tuple(theirs.shape)}"
        assert np.array_equal(ours.numpy(), theirs.numpy(), equal_nan=True), \
            f"{path}: values differ (max {float((ours.double() - theirs.double()).abs().nan_to_num().max())})"
    elif isinstance(theirs, list):
        assert [os.path.basename(x) for x in ours] == [os.path.basename(x) for x in theirs], f"{path}: {ours} != {theirs}"
    else:
        assert ours == theirs, f"{path}: {ours!r} != {theirs!r}"


def assert_same_batches(ours, theirs) -> int:
    """Both batch lists equally long and non-empty (a zip over nothing proves nothing), then batch for batch."""
    ours, theirs = list(ours), list(theirs)
    assert len(ours) == len(theirs) > 0, (len(ours), len(theirs))
    for index, (mine, reference) in enumerate(zip(ours, theirs)):
        assert_same_batch(mine, reference, f"batch {index}")
    return len(ours)
