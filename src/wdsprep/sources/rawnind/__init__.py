"""RawNIND: acquisition from Dataverse (trio + httpx), alignment metadata, clean/noisy crop pairs.

`wdsprep.rawnind.pairs(...)` is the reader stage; `SOURCE` is what the core converts with.
"""
from __future__ import annotations

from .cli import add_fetch_arguments, add_serve_arguments, fetch_main, serve_main
from .fetch import FetchError, FetchOptions, fetch
from .mapstyle import CleanProfiledRGBNoisyBayerImageCropsDataset
from .read import clean_pairs, crop_pair, crops_at, evaluation, pairs, tiles, validation
from .server import DataverseServer, Faults
from .source import SOURCE, RawNINDSource

__all__ = [
    "SOURCE", "RawNINDSource", "pairs", "tiles", "crop_pair", "crops_at", "validation", "evaluation", "clean_pairs", "CleanProfiledRGBNoisyBayerImageCropsDataset",
    "add_fetch_arguments", "fetch_main", "add_serve_arguments", "serve_main",
    "fetch", "FetchOptions", "FetchError", "DataverseServer", "Faults",
]
