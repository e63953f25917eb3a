"""Checking shards against their manifest: sha256, sample counts, and that every member decodes.

Shards with a sample index (`shards/index.py`) are read through the index-checked read path
(`stream/reading/read.py`: index digest, end blocks, every member's digest) in the same single pass that
computes the sha256. A split's sample table (`<split>.samples`, shards/samples.py) is checked too:
its size and sha256 against the manifest's record, its columns against its count, and, against what
that same pass read from the split's shards in order (when every shard of the split checked out),
its keys and each row's indexed field values: each sample's value derived from its decoded members
as the conversion derives it (`shards.samples.sample_values`: the source's `index_values`, handed in
as `index_values`, else the sample's field or dotted path), then held as a table column holds it
(`shards.samples.column_of`). So a table edited consistently (values shifted, its size and sha256
recorded anew) is caught. Without `index_values` (the source could not be loaded) the values are not
compared. A manifest with inline rows that records shard tables (`<split>.shards`,
shards/shardtable.py) has each table checked against its record and its rows against the inline
ones (a manifest without inline rows had its tables checked when it was loaded). An adopted dataset
(`wdsprep index`) has its shards read the same way (their indexes are in the split's index file),
and each split's index file is checked against its record (size and sha256). One problem line per
bad shard or table."""
from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import WdsprepError
from ..shards.codec import decode_member
from ..shards.manifest import DERIVED, INDEX_FILES, Manifest, adopted_name_problem
from ..shards.samples import SampleTable, column_of, sample_values, table_entry
from ..shards.index import has_index
from ..shards.tarformat import iter_samples
from ..shards.shardtable import TABLE as SHARD_TABLES
from ..shards.shardtable import LEFT_OUT, ShardTable
from .manifests import load_manifest, shard_table
from ..storage import open_url
from .reading.read import Sha256Reader, read_samples


@dataclass
class VerifyReport:
    checked: int = 0
    samples: int = 0
    bad: list[tuple[str, str]] = field(default_factory=list)  # (shard url, problem)


@dataclass
class SplitSamples:
    """What a split's shards hold for its sample table, in manifest order, as verify read them: the
    keys and, for each indexed field of `names`, every sample's value (None: absent) derived from its
    decoded members (`index_values`: the source's `Source.index_values`; the first sample whose
    values cannot be derived is `problem`)."""

    names: tuple[str, ...] = ()
    index_values: Callable | None = None
    keys: list[str] = field(default_factory=list)
    values: list[list] = field(default_factory=list)
    problem: str | None = None

    def add(self, url: str, key: str, fields: dict) -> None:
        self.keys.append(key)
        if not self.names:
            return
        try:
            computed = self.index_values(key, fields) if self.index_values is not None else {}
            self.values.append(sample_values(key, fields, self.names, computed))
        except Exception as error:  # a source's hook on a stranger's sample: one line, not a traceback
            self.problem = self.problem or f"{url}: sample {key!r}: its index fields cannot be derived ({error})"
            self.values.append([None] * len(self.names))


def verify_shard(url: str, row: dict, seen: SplitSamples | None = None) -> str | None:
    """None if the shard matches its manifest row, else a one-line problem; its samples (keys, and
    their decoded members) go to `seen`."""
    try:
        with open_url(url) as stream:
            hashing = Sha256Reader(stream)
            reader = io.BufferedReader(hashing, 1 << 20)
            count = 0
            samples = read_samples(url, row, 0, row["samples"], reader) if has_index(row) else iter_samples(reader, url)
            for sample in samples:
                decoded = {}
                for name, value in sample.items():
                    if not name.startswith("__"):
                        field, data = decode_member(url, sample["__key__"], name, value)  # a ShardError names shard and member
                        decoded[field] = data
                count += 1
                if seen is not None:
                    seen.add(url, sample["__key__"], decoded)
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


def verify(location: str | Manifest, progress=None, index_values: Callable | None = None) -> VerifyReport:
    """Every shard and table of the manifest at `location` checked (module docstring); the sample
    tables' field values only with `index_values` (the manifest's source's `Source.index_values`)."""
    manifest = location if isinstance(location, Manifest) else load_manifest(location)
    report = VerifyReport()
    for split in sorted(manifest.splits):
        entry = table_entry(manifest, split)
        names = tuple(entry.get("fields") or ()) if entry is not None and index_values is not None else ()
        seen = SplitSamples(names, index_values)
        shards_ok = True
        for row, url in zip(manifest.shards(split), manifest.shard_urls(split)):
            problem = verify_shard(url, row, seen)
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
        if entry is not None:
            problem = verify_table(manifest, split, entry, seen if shards_ok else None)
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


def verify_table(manifest: Manifest, split: str, entry: dict, seen: SplitSamples | None) -> str | None:
    """None if the split's sample table matches its record and holds what `seen` read from the
    shards (their keys in manifest order, and the values of `seen.names`; None: not compared), else
    a one-line problem."""
    url = manifest.url_of(entry["file"])
    try:
        table = SampleTable.load(manifest, split, entry)
    except WdsprepError as error:
        return str(error)
    if seen is None:
        return None
    keys = seen.keys
    if table.keys != keys:
        at = next((i for i, (a, b) in enumerate(zip(table.keys, keys)) if a != b), min(len(table.keys), len(keys)))
        said = table.keys[at] if at < len(table.keys) else "nothing"
        found = keys[at] if at < len(keys) else "nothing"
        return f"{url}: sample {at} of split {split!r} is {said!r} in the sample table, {found!r} in the shards"
    if not seen.names:
        return None
    if seen.problem:
        return seen.problem
    unrecorded = sorted(set(table.fields) - set(seen.names))
    if unrecorded:
        return f"{url}: field {unrecorded[0]!r} of split {split!r} is in the sample table but not in its manifest record"
    for i, name in enumerate(seen.names):
        derived = [values[i] for values in seen.values]
        problem = _field_problem(table.fields.get(name), derived, name, split, keys)
        if problem:
            return f"{url}: {problem}"
    return None


_KINDS = {"b": "bools", "i": "integers", "f": "numbers", "U": "strings"}


def _field_problem(said: np.ndarray | None, derived: list, name: str, split: str, keys: list[str]) -> str | None:
    """How a table's column `said` of field `name` differs from the values `derived` from the
    shards, naming the first sample that differs; None if it holds them."""
    if said is None:
        return f"field {name!r} of split {split!r} is in the manifest's record but not in the sample table"
    if all(value is None for value in derived):
        return f"field {name!r} of split {split!r} is in the sample table, but no sample of the shards holds it"
    try:
        found = column_of(name, derived)
    except WdsprepError as error:
        return f"field {name!r} of split {split!r}: {error}"
    if said.dtype.kind != found.dtype.kind:
        return (f"field {name!r} of split {split!r} holds {_KINDS.get(said.dtype.kind, said.dtype)} in the sample "
                f"table, {_KINDS.get(found.dtype.kind, found.dtype)} in the shards")
    same = said == found
    if said.dtype.kind == "f":
        same |= np.isnan(said) & np.isnan(found)
    differ = np.flatnonzero(~same)
    if not len(differ):
        return None
    at = int(differ[0])
    return (f"sample {at} ({keys[at]!r}) of split {split!r}: field {name!r} is {said[at].item()!r} in the sample "
            f"table, {found[at].item()!r} in the shards")
