"""Tiny shard sets with exact per-shard sample counts, for the stream tests (written with the public ShardWriter)."""
import hashlib
import os

import numpy as np

from wdsprep.errors import ShardError
from wdsprep.shards.codec import Encoder
from wdsprep.shards.manifest import Manifest
from wdsprep.shards.writer import ShardWriter


def write_counted_shards(directory, counts, *, split="train", codec="zstd", tag=""):
    """Shards holding exactly `counts[i]` samples each, plus their manifest; keys `s<shard>x<i>`
    (prefixed by `tag`). A count of 0 is an empty tar (end blocks only) listed with 0 samples."""
    os.makedirs(directory, exist_ok=True)
    rows = []
    rng = np.random.default_rng(0)
    for shard, count in enumerate(counts):
        if count == 0:
            name, empty = f"{split}-{shard:05d}-00.tar", b"\0" * 1024
            (directory / name).write_bytes(empty)
            rows.append({"name": name, "samples": 0, "bytes": len(empty), "sha256": hashlib.sha256(empty).hexdigest(), "unit": shard})
            continue
        writer = ShardWriter(str(directory), f"{split}-{shard:05d}", shard_bytes=1 << 40, encoder=Encoder(codec))
        with writer:
            for i in range(count):
                writer.write(f"{tag}s{shard:02d}x{i:02d}", {"value": rng.standard_normal(8).astype(np.float32), "meta": {"shard": shard, "i": i}})
        rows.extend(dict(row.as_dict(), unit=shard) for row in writer.rows)
    manifest = Manifest("test", {}, "fp", {split: rows})
    (directory / "manifest.json").write_bytes(manifest.dumps())
    return str(directory / "manifest.json")


def keys_until_error(samples) -> tuple[list, BaseException | None]:
    """The `__key__` of each sample until a ShardError, and that error (None if none came)."""
    keys: list = []
    try:
        for sample in samples:
            keys.append(sample["__key__"])
    except ShardError as error:
        return keys, error
    return keys, None
