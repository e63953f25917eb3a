import os

import numpy as np
import pytest

from wdsprep.shards.codec import Encoder
from wdsprep.shards.manifest import Manifest
from wdsprep.shards.writer import ShardWriter


def write_counted_shards(directory, counts, *, split="train", codec="zstd"):
    """Shards holding exactly `counts[i]` samples each, plus their manifest; keys `s<shard>x<i>`."""
    os.makedirs(directory, exist_ok=True)
    rows = []
    rng = np.random.default_rng(0)
    for shard, count in enumerate(counts):
        writer = ShardWriter(str(directory), f"{split}-{shard:05d}", shard_bytes=1 << 40, encoder=Encoder(codec))
        with writer:
            for i in range(count):
                writer.write(f"s{shard:02d}x{i:02d}", {"value": rng.standard_normal(8).astype(np.float32), "meta": {"shard": shard, "i": i}})
        rows.extend(dict(row.as_dict(), unit=shard) for row in writer.rows)
    manifest = Manifest("test", {}, "fp", {split: rows})
    (directory / "manifest.json").write_bytes(manifest.dumps())
    return str(directory / "manifest.json")


@pytest.fixture
def uneven_manifest(tmp_path):
    """The issue's case: 8 shards of 7,7,7,7,7,7,7,1 samples."""
    return write_counted_shards(tmp_path / "uneven", [7, 7, 7, 7, 7, 7, 7, 1])


@pytest.fixture(scope="session")
def generic_input(tmp_path_factory):
    from wdsprep.sources.generic import SOURCE

    root = tmp_path_factory.mktemp("generic") / "in"
    SOURCE.synth(str(root), 0, "small")
    return str(root)
