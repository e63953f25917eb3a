"""Noisebase sampleset_v1: per-frame shards and a lockstep loader that matches noisebase batch for batch.

`wdsprep.noisebase.TrainingSampleLoader(manifest_url, ...)` is a `torch.utils.data.DataLoader`
with the arguments, batches, epoch counting, DDP split and checkpoint API of noisebase's
`TrainingSampleLoader_v1`, reading frames from shards (local, http, s3) instead of zarr zips.
`TrainingSampleDataModule` and `MidepochCheckpoint` (Lightning) load on first use.
"""
from __future__ import annotations

from .convert import SOURCE, NoisebaseSource, frame_key
from .loader import LockstepSampler, TrainingSampleLoader
from .projective import backproject_pixel_centers

__all__ = ["SOURCE", "NoisebaseSource", "TrainingSampleLoader", "LockstepSampler", "backproject_pixel_centers",
           "TrainingSampleDataModule", "MidepochCheckpoint", "frame_key"]


def __getattr__(name: str):
    if name in ("TrainingSampleDataModule", "MidepochCheckpoint"):
        from . import lightning as _lightning

        return getattr(_lightning, name)
    raise AttributeError(f"module 'wdsprep.noisebase' has no attribute {name!r}")
