"""RawNIND: acquisition from Dataverse (`acquire/`: trio + httpx), alignment metadata, clean/noisy crop pairs.

`wdsprep.rawnind.pairs(...)` is the reader stage; `SOURCE` is what the core converts with. Readers
and the map-style dataset (torch) and the acquisition (httpx, trio) load on first use; the
converter needs none of them.
"""
from __future__ import annotations

from .. import lazy_exports
from .convert import SOURCE, RawNINDSource

__all__ = [
    "SOURCE", "RawNINDSource", "pairs", "tiles", "crop_pair", "crops_at", "validation", "evaluation", "clean_pairs", "CleanProfiledRGBNoisyBayerImageCropsDataset",
    "fetch", "FetchOptions",
]

__getattr__ = lazy_exports(__name__, {
    "CleanProfiledRGBNoisyBayerImageCropsDataset": ".mapstyle",
    **dict.fromkeys(["clean_pairs", "crop_pair", "crops_at", "evaluation", "pairs", "tiles", "validation"], ".read"),
    **dict.fromkeys(["fetch", "FetchOptions"], ".acquire.fetch"),
})
