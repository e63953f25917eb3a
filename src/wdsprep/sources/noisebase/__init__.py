"""Noisebase sampleset_v1: per-frame shards and a lockstep loader that matches noisebase batch for batch.

`wdsprep.noisebase.TrainingSampleLoader(manifest_url, ...)` is a `torch.utils.data.DataLoader`
with the arguments, batches, epoch counting, DDP split and checkpoint API of noisebase's
`TrainingSampleLoader_v1`, reading frames from shards (local, http, s3) instead of zarr zips.
`TrainingSampleDataModule` and `MidepochCheckpoint` (Lightning) load on first use; so does the
loader, so converting needs neither torch nor Lightning.
"""
from __future__ import annotations

import importlib

from .convert import SOURCE, NoisebaseSource, frame_key

__all__ = ["SOURCE", "NoisebaseSource", "TrainingSampleLoader", "LockstepSampler", "backproject_pixel_centers",
           "TrainingSampleDataModule", "MidepochCheckpoint", "frame_key", "frames"]

_LAZY = {
    "TrainingSampleLoader": ".loader",
    "LockstepSampler": ".loader",
    "backproject_pixel_centers": ".projective",
    "TrainingSampleDataModule": ".lightning",
    "MidepochCheckpoint": ".lightning",
    "frames": ".read",
}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'wdsprep.sources.noisebase' has no attribute {name!r}")
