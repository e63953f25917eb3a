"""Source-agnostic reading: manifests, URLs, shard iteration, the dataset pipeline and its loader."""
from __future__ import annotations

from typing import Iterator

import importlib

from ..shards.tarformat import iter_samples
from .manifests import load_manifest, manifest_location, urls
from ..storage import open_url, read_url, register_opener

# the pipeline classes import webdataset and torch: loaded on first use, so that `import wdsprep`
# (and every conversion worker) stays light
# (`wdsprep.stream.dataset` is the submodule; the function is `wdsprep.dataset`: a package name that
# is both would be rebound to the module by the first `import wdsprep.stream.dataset`.)
_LAZY = {
    "ShardDataset": "dataset",
    "distributed_info": "world",
    "worker_info": "world",
    "Loader": "loader",
}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"wdsprep.stream.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'wdsprep.stream' has no attribute {name!r}")


def iter_shard(url: str, skip: int = 0) -> Iterator[dict]:
    """Raw samples of one shard (`__key__`, `__url__`, field -> bytes), streamed from any URL as they
    are, unchecked (it has no manifest row to check them against; wdsprep's own readers read through
    `stream.reading.read`, which checks every sample first)."""
    with open_url(url) as stream:
        yield from iter_samples(stream, url, skip=skip)


__all__ = [
    "ShardDataset",
    "Loader",
    "urls",
    "load_manifest",
    "manifest_location",
    "open_url",
    "read_url",
    "register_opener",
    "iter_shard",
    "distributed_info",
    "worker_info",
]
