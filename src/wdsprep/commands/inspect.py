"""`wdsprep inspect DIR_OR_URL`: a converted dataset's splits, counts, sizes, tables and a few samples'
fields. The samples shown are read as training reads them: checked against their shard's row first,
so a corrupt one ends the command with the one line naming the shard, never shown as fine."""
from __future__ import annotations

import argparse
import json

from ..command import Command
from ..storage import describe


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("location", help=f"shard directory or manifest.json, as {describe()}")
    parser.add_argument("--samples", type=int, default=2, help="how many sample keys to show")


def run(args: argparse.Namespace) -> int:
    from ..progress import human_bytes
    from ..shards.codec import decode_sample
    from ..stream import load_manifest
    from ..stream.read import checked_samples

    manifest = load_manifest(args.location)
    print(f"source {manifest.source}   manifest {manifest.url}")
    print(f"config {json.dumps(manifest.config, sort_keys=True)}")
    for split in sorted(manifest.splits):
        rows = manifest.shards(split)
        print(f"{split:>8}: {len(rows):5d} shards {manifest.samples(split):9d} samples {human_bytes(manifest.bytes(split)):>10}")
    total = manifest.bytes()
    if manifest.input_bytes:
        print(f"input {human_bytes(manifest.input_bytes)}, shards {human_bytes(total)}: compression {manifest.input_bytes / max(total, 1):.2f}x")
    if manifest.tables:
        print("tables: " + ", ".join(f"{name} ({len(value) if hasattr(value, '__len__') else value})" for name, value in sorted(manifest.tables.items())))
    if manifest.problems:
        print(f"problems: {len(manifest.problems)} input items were not converted (listed in the manifest)")
    for split in sorted(manifest.splits):
        urls = manifest.shard_urls(split)
        if not urls:
            continue
        for raw in checked_samples(urls[0], manifest.shards(split)[0], 0, max(args.samples, 0)):
            sample = decode_sample(raw, strip=False)
            fields = ", ".join(f"{name}: {_describe(value)}" for name, value in sample.items() if not name.startswith("__"))
            print(f"  {split}/{sample['__key__']}: {fields}")
    return 0


def _describe(value) -> str:
    import numpy as np

    if isinstance(value, np.ndarray):
        return f"{value.dtype}{list(value.shape)}"
    if isinstance(value, dict):
        return "{" + ", ".join(sorted(map(str, value)))[:60] + "}"
    return type(value).__name__


COMMAND = Command("inspect", "splits, counts, sizes, sample fields", add_arguments, run, usage="DIR_OR_URL")
