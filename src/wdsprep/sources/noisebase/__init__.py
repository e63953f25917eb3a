"""Noisebase sampleset_v1: per-frame shards and a lockstep loader that matches noisebase batch for batch.

`wdsprep.noisebase.TrainingSampleLoader(manifest_url, ...)` is a `torch.utils.data.DataLoader`
with the arguments, batches, epoch counting, DDP split and checkpoint API of noisebase's
`TrainingSampleLoader_v1`, reading frames from shards (local, http, s3) instead of zarr zips.
`TrainingSampleDataModule` and `MidepochCheckpoint` (Lightning) load on first use; so does the
loader, so converting needs neither torch nor Lightning.
"""
from __future__ import annotations

from .. import lazy_exports
from .convert import SOURCE, NoisebaseSource, frame_key

__all__ = ["SOURCE", "NoisebaseSource", "TrainingSampleLoader", "LockstepSampler", "backproject_pixel_centers",
           "TrainingSampleDataModule", "MidepochCheckpoint", "frame_key", "frames"]

__getattr__ = lazy_exports(__name__, {
    "TrainingSampleLoader": ".loader",
    "LockstepSampler": ".loader",
    "backproject_pixel_centers": ".projective",
    "TrainingSampleDataModule": ".lightning",
    "MidepochCheckpoint": ".lightning",
    "frames": ".read",
})
