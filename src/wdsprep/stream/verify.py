"""Checking shards against their manifest: sha256, sample counts, and that every member decodes.

Shards with a sample index (`shards/index.py`) are read through the index-checked read path
(`stream/read.py`: index digest, end blocks, every member's digest) in the same single pass that
computes the sha256. A split's sample table (`<split>.samples`, shards/samples.py) is checked too:
its size and sha256 against the manifest's record, its columns against its count, and its keys
against the keys of the split's shards, in order, as that same pass read them (when every shard of
the split checked out). A manifest with inline rows that records shard tables (`<split>.shards`,
shards/shardtable.py) has each table checked against its record and its rows against the inline
ones (a manifest without inline rows had its tables checked when it was loaded). An adopted dataset
(`wdsprep index`) has its shards read the same way (their indexes are in the split's index file),
and each split's index file is checked against its record (size and sha256). One problem line per
bad shard or table."""
from __future__ import annotations

import io
from dataclasses import dataclass, field

from ..errors import ShardError, WdsprepError
from ..shards.codec import decode_value
from ..shards.manifest import DERIVED, INDEX_FILES, Manifest, adopted_name_problem
from ..shards.samples import SampleTable, table_entry
from ..shards.index import has_index
from ..shards.tarformat import iter_samples
from ..shards.shardtable import TABLE as SHARD_TABLES
from ..shards.shardtable import LEFT_OUT, ShardTable
from .manifests import load_manifest, shard_table
from ..storage import open_url
from .read import Sha256Reader, read_samples


@dataclass
class VerifyReport:
    checked: int = 0
    samples: int = 0
    bad: list[tuple[str, str]] = field(default_factory=list)  # (shard url, problem)


def verify_shard(url: str, row: dict, keys: list[str] | None = None) -> str | None:
    """None if the shard matches its manifest row, else a one-line problem; the keys of its samples
    are appended to `keys`."""
    try:
        with open_url(url) as stream:
            hashing = Sha256Reader(stream)
            reader = io.BufferedReader(hashing, 1 << 20)
            count = 0
            samples = read_samples(url, row, 0, row["samples"], reader) if has_index(row) else iter_samples(reader, url)
            for sample in samples:
                for name, value in sample.items():
                    if not name.startswith("__"):
                        try:
                            decode_value(name, value)
                        except ShardError:
                            raise
                        except WdsprepError as error:  # name the shard and member, not just the codec's complaint
                            raise ShardError(url, f"member {sample['__key__']}.{name}: {error}") from None
                count += 1
                if keys is not None:
                    keys.append(sample["__key__"])
            while reader.read(1 << 20):
                pass
    except WdsprepError as error:
        return str(error)
    if hashing.count != row["bytes"]:
        return f"{url}: size {hashing.count} bytes, manifest says {row['bytes']}"
    if hashing.digest.hexdigest() != row["sha256"]:
        return f"{url}: sha256 mismatch (content changed or corrupted)"
    if count != row["samples"]:
        return f"{url}: {count} samples, manifest says {row['samples']}"
    return None


def verify(location: str | Manifest, progress=None) -> VerifyReport:
    manifest = location if isinstance(location, Manifest) else load_manifest(location)
    report = VerifyReport()
    for split in sorted(manifest.splits):
        keys: list[str] = []
        shards_ok = True
        for row, url in zip(manifest.shards(split), manifest.shard_urls(split)):
            problem = verify_shard(url, row, keys)
            report.checked += 1
            report.samples += row["samples"]
            if problem:
                report.bad.append((url, problem))
                shards_ok = False
            if progress:
                progress.advance(1, row["bytes"])
        record = (manifest.tables.get(SHARD_TABLES) or {}).get(split)
        if record is not None and not isinstance(manifest.shards(split), ShardTable):
            problem = verify_shard_table(manifest, split, record)
            if problem:
                report.bad.append((manifest.url_of(record["file"]), problem))
        entry = table_entry(manifest, split)
        if entry is not None:
            problem = verify_table(manifest, split, entry, keys if shards_ok else None)
            if problem:
                report.bad.append((manifest.url_of(entry["file"]), problem))
        index_file = (manifest.tables.get(INDEX_FILES) or {}).get(split)
        if index_file is not None:
            problem = verify_file(manifest.url_of(index_file["file"]), index_file, "index file")
            if problem:
                report.bad.append((manifest.url_of(index_file["file"]), problem))
    return report


def verify_file(url: str, record: dict, what: str) -> str | None:
    """None if the file at `url` has its record's size and sha256, else a one-line problem."""
    try:
        with open_url(url) as stream:
            hashing = Sha256Reader(stream)
            while hashing.readinto(bytearray(1 << 20)):
                pass
    except WdsprepError as error:
        return str(error)
    if (hashing.count, hashing.digest.hexdigest()) != (record["bytes"], record["sha256"]):
        return f"{url}: {what} differs from the manifest's record (size or sha256)"
    return None


def verify_shard_table(manifest: Manifest, split: str, record: dict) -> str | None:
    """None if the split's shard table matches its record and holds the manifest's inline rows."""
    try:
        table = shard_table(manifest.url, record)
        table.check(split, record, {"samples": manifest.samples(split), "bytes": manifest.bytes(split)},
                    names=adopted_name_problem if manifest.adopted else None)
    except WdsprepError as error:
        return str(error)
    rows = manifest.shards(split)
    kept = [{name: value for name, value in row.items() if name not in LEFT_OUT + DERIVED} for row in rows]
    at = next((i for i, (a, b) in enumerate(zip(table, kept)) if a != b), None)
    if at is not None:
        return f"{manifest.url_of(record['file'])}: shard {at} of split {split!r} differs from the manifest's row ({rows[at]['name']})"
    return None


def verify_table(manifest: Manifest, split: str, entry: dict, keys: list[str] | None) -> str | None:
    """None if the split's sample table matches its record and holds `keys` (the shards' keys in
    manifest order; None: not compared), else a one-line problem."""
    url = manifest.url_of(entry["file"])
    try:
        table = SampleTable.load(manifest, split, entry)
    except WdsprepError as error:
        return str(error)
    if keys is not None and table.keys != keys:
        at = next((i for i, (a, b) in enumerate(zip(table.keys, keys)) if a != b), min(len(table.keys), len(keys)))
        said = table.keys[at] if at < len(table.keys) else "nothing"
        found = keys[at] if at < len(keys) else "nothing"
        return f"{url}: sample {at} of split {split!r} is {said!r} in the sample table, {found!r} in the shards"
    return None
