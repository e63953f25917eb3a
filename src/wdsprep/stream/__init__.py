"""Source-agnostic reading: manifests, URLs, shard iteration, the dataset pipeline and its loader."""
from __future__ import annotations

from typing import Iterator

from ..shards.tarformat import iter_samples
from .dataset import ShardDataset, dataset, distributed_info, worker_info
from .loader import Loader
from .manifests import load_manifest, manifest_location, urls
from .opener import open_url, read_url, register_opener


def iter_shard(url: str, skip: int = 0) -> Iterator[dict]:
    """Raw samples of one shard (`__key__`, `__url__`, field -> bytes), streamed from any URL."""
    with open_url(url) as stream:
        yield from iter_samples(stream, url, skip=skip)


__all__ = [
    "ShardDataset",
    "Loader",
    "dataset",
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
