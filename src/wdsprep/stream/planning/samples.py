"""A split's sample table as a selection reads it: every sample's key and indexed fields, in
manifest order (shard after shard, samples in shard order).

Where it comes from: the split's sample table file beside the manifest (shards/samples.py: keys and
the fields indexed at conversion, checked against the sha256 the manifest records), or, for shards
converted before tables existed, the keys of every shard's index (one read per shard; no fields).
"""
from __future__ import annotations

from ...errors import ShardError
from ...shards.index import has_index
from ...shards.manifest import Manifest
from ...shards.samples import SampleTable, table_entry
from ..reading.read import load_index


def sample_table(manifest: Manifest, split: str) -> SampleTable:
    """The split's keys and indexed fields in manifest order (keys only, from the shard indexes, when
    the manifest lists no table)."""
    entry = table_entry(manifest, split)
    if entry is not None:
        return SampleTable.load(manifest, split, entry)
    keys: list[str] = []
    for url, row in zip(manifest.shard_urls(split), manifest.shards(split)):
        keys.extend(shard_keys(url, row))
    return SampleTable(keys)


def shard_keys(url: str, row: dict) -> list[str]:
    """The keys of one shard's samples, from its index (one read)."""
    if not row["samples"]:
        return []
    if not has_index(row):
        raise ShardError(url, "has no sample index to select on (run `wdsprep reindex` on its directory)")
    return list(load_index(url, row).sample_keys())
