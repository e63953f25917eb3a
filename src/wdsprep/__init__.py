"""wdsprep: research datasets to deterministic WebDataset shards, streamed into PyTorch.

Public API: `urls`, `dataset`, `decode`, `Loader`, and one namespace per source
(`wdsprep.voxels`, `wdsprep.minecraft`, `wdsprep.deepreg`, `wdsprep.rawnind`, `wdsprep.noisebase`),
imported on first use.
"""
from __future__ import annotations

import importlib

from .errors import ConfigError, FormatError, InputError, ManifestError, ShardError, WdsprepError
from .shards.codec import decode, decode_sample

__version__ = "0.1.0"

SOURCE_IDS = ("voxels", "minecraft", "deepreg", "rawnind", "noisebase")

__all__ = [
    "urls",
    "dataset",
    "decode",
    "decode_sample",
    "Loader",
    "WdsprepError",
    "InputError",
    "FormatError",
    "ShardError",
    "ManifestError",
    "ConfigError",
    *SOURCE_IDS,
]

_LAZY = {
    "urls": ("wdsprep.stream", "urls"),
    "dataset": ("wdsprep.stream", "dataset"),
    "Loader": ("wdsprep.stream", "Loader"),
}


_SUBMODULES = ("stream", "shards", "sources", "conversion", "executors", "cli", "upload", "progress")


def __getattr__(name: str):
    if name in SOURCE_IDS:
        module = importlib.import_module(f"wdsprep.sources.{name}")
        globals()[name] = module
        return module
    if name in _LAZY:
        module_name, attribute = _LAZY[name]
        value = getattr(importlib.import_module(module_name), attribute)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"wdsprep.{name}")
    raise AttributeError(f"module 'wdsprep' has no attribute {name!r}")
