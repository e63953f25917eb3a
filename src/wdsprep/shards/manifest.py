"""`manifest.json`: what a shard directory holds, and the key to counts, verification and resume.

A loaded manifest is checked against one schema before anything trusts it (`validate`): field
types, non-negative integer counts, a sha256 per shard, shard names that follow the shard-name rule
`<split>-<unit:05d>-<part:02d>.tar` (so never a path, `..` or a URL), each name once, and split and
overall totals that add up. A violation is one `ManifestError` line naming the manifest and the
field. A row's sample index fields (`index_offset`, `index_bytes`, `index_digest`) must describe the
shard's last bytes (`index.index_fields_problem`), so no offset read from a manifest points outside
its shard. A split's sample table record names that split's table file and nothing else
(`samples.entry_problem`). The JSON is read by the format's one rule (`codec.parse_json_text`: no field
given twice, no NaN or Infinity, nested at most `codec.MAX_DEPTH` deep), and written so that it holds.
Shard rows may carry further optional fields; those are kept as they are.

Adopted datasets (`wdsprep index`, wdsprep/adopt.py: WebDataset tars other tools wrote, indexed
where they are). Their manifest names the source `webdataset` (`ADOPTED_SOURCE`), and every row is an
adopted shard's (`index.adopted`: its index is in the split's index file `<split>.index`, recorded in
`tables["index_files"]`). Their names follow another rule (`adopted_name_problem`): a path relative
to the manifest without `..` (shards beside or below it), or an absolute path or URL (shards
elsewhere, e.g. a read-only source); so an adopted manifest chooses what is read, as a list of URLs
does. A row's `index_url` (where its index file is) is made on load, never written (`DERIVED`).

Where the shard rows live. `Manifest.write` writes each split's shard table (`<split>.shards`,
shards/shardtable.py: the rows as binary columns, 62 bytes a shard) and records it in
`tables["shard_tables"]`, then manifest.json. While the manifest lists at most `INLINE_SHARDS`
shards, manifest.json keeps the rows inline too (`manifest_version` 1: older wdsprep read it, and
readers use the inline rows); above, each split holds only its shard count (`manifest_version` 2,
which older wdsprep refuse naming the version), and a loaded manifest's split is its `ShardTable`
(a sequence of row dicts made on demand, whose columns stream/planning/catalog.py plans on),
read when the split is first asked for (`TabledSplits`) and checked before use (size and sha256
against the record, then names, index fields and totals on its columns).

The format is `wdsprep/2`: members any plain reader turns into arrays (no structured record dtypes,
the same members and dtypes in every sample of a split). `wdsprep/1` manifests (and their shards)
still read. A source may describe its members in the table `tables["fields"]` ({split: {member:
entry}}, built with `describe_fields` / `merge_fields`): per array its dtype and shape (`null` where
a dimension varies), per `.npz` member the same per column, and where a reader must undo something
to get the arrays back, the `encoding` (e.g. bit-packed voxels) and the `absent` convention.
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InputError, ManifestError
from .codec import parse_json_text
from .index import INDEX_SUFFIX, ROW_FIELDS, adopted, index_fields_problem
from .samples import TABLE as SAMPLE_TABLES
from .samples import entry_problem
from . import shardtable
from .shardtable import TABLE as SHARD_TABLES
from .shardtable import ShardTable

FORMAT = "wdsprep/2"
READ_FORMATS = ("wdsprep/1", FORMAT)  # wdsprep/1: the layout before every member was plain arrays
MANIFEST_VERSION = 2  # written when the shard rows live only in the shard tables (`<split>.shards`)
INLINE_VERSION = 1  # written when they are also inline (older wdsprep read it)
READ_VERSIONS = (INLINE_VERSION, MANIFEST_VERSION)
INLINE_SHARDS = 1000  # a manifest of at most this many shards keeps its rows inline too
MANIFEST_NAME = "manifest.json"
ADOPTED_SOURCE = "webdataset"  # the source of an adopted dataset's manifest (`wdsprep index`)
INDEX_FILES = "index_files"  # manifest.tables key: {split: {file, bytes, sha256}} of an adopted dataset
DERIVED = ("index_url",)  # row fields made on load (an adopted row's index file, resolved), never written
SPLIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
SHA256 = re.compile(r"[0-9a-f]{64}")


def check_split_name(split: Any, where: str, error: type = InputError) -> None:
    """The split-name rule of wdsprep/1 (a split names shards and manifest keys), applied before
    anything is written; `where` names what holds the name (a folder, an option)."""
    if not isinstance(split, str) or not SPLIT_NAME.fullmatch(split):
        raise error(f"{where}: {split!r} is not a split name (letters, digits, '_' and '-', "
                    "starting with a letter or a digit)")


SHARD_NAME_TAIL = re.compile(r"\d{5,}-\d{2,}\.tar")


def shard_name_pattern(split: str) -> re.Pattern:
    """The shard-name rule: `<split>-<unit:05d>-<part:02d>.tar` (more digits past 99999 units)."""
    return re.compile(re.escape(split) + "-" + SHARD_NAME_TAIL.pattern)


def is_shard_name(split: str, name: str) -> bool:
    """`shard_name_pattern(split).fullmatch(name)`, with no pattern made per split (a manifest may
    hold a million splits: one compiled pattern each was 0.25 ms a split)."""
    return name.startswith(split) and name[len(split) : len(split) + 1] == "-" and \
        SHARD_NAME_TAIL.fullmatch(name, len(split) + 1) is not None


@dataclass
class Manifest:
    source: str
    config: dict
    fingerprint: str
    splits: dict[str, list[dict] | ShardTable]  # split -> shard rows {name, samples, bytes, sha256, unit, unit_digest}
    tables: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)
    input_bytes: int = 0
    timing: dict = field(default_factory=dict)  # informational; excluded from comparisons
    url: str | None = None  # where it was loaded from (not serialized)
    format: str = FORMAT  # the format of the shards it lists (a loaded wdsprep/1 manifest says so)

    # -- derived
    def shards(self, split: str) -> list[dict]:
        if split not in self.splits:
            known = ", ".join(sorted(self.splits)) or "none"
            where = f" in {self.url}" if self.url else ""
            raise ManifestError(f"no split {split!r}{where} (splits: {known})")
        return self.splits[split]

    def samples(self, split: str | None = None) -> int:
        splits = [split] if split else list(self.splits)
        return sum(_column_sum(self.shards(s), "samples") for s in splits)

    def bytes(self, split: str | None = None) -> int:
        splits = [split] if split else list(self.splits)
        return sum(_column_sum(self.shards(s), "bytes") for s in splits)

    def shard_urls(self, split: str) -> list[str]:
        base = self.base_url()
        rows = self.shards(split)
        if isinstance(rows, ShardTable):
            return [join_url(base, rows.name(shard)) for shard in range(len(rows))]
        return [join_url(base, row["name"]) for row in rows]

    def url_of(self, name: str) -> str:
        """The URL of a file beside the manifest (a shard, a sample table)."""
        return join_url(self.base_url(), name)

    @property
    def adopted(self) -> bool:
        """Whether this is an adopted dataset's manifest (`wdsprep index`; the module docstring)."""
        return self.source == ADOPTED_SOURCE

    def base_url(self) -> str:
        if not self.url:
            raise ManifestError("manifest was not loaded from a location; shard URLs are unknown")
        return self.url.rsplit("/", 1)[0] if "/" in self.url else "."

    # -- serialization
    def to_dict(self, inline: bool = True) -> dict:
        """The manifest's JSON; `inline=False`: without the shard rows (version 2: they are in the
        shard tables the `tables["shard_tables"]` records, which `write` writes)."""
        split_totals = {
            split: {"shards": [_written(row) for row in rows] if inline else len(rows), "samples": _column_sum(rows, "samples"),
                    "bytes": _column_sum(rows, "bytes")}
            for split, rows in sorted(self.splits.items())
        }
        return {
            "format": self.format,
            "manifest_version": INLINE_VERSION if inline else MANIFEST_VERSION,
            "source": self.source,
            "config": self.config,
            "fingerprint": self.fingerprint,
            "input_bytes": self.input_bytes,
            "splits": split_totals,
            "totals": {
                "shards": sum(len(rows) for rows in self.splits.values()),
                "samples": self.samples(),
                "bytes": self.bytes(),
            },
            "tables": self.tables,
            "problems": self.problems,
            "timing": self.timing,
        }

    def dumps(self, inline: bool = True) -> bytes:
        return (json.dumps(self.to_dict(inline), indent=1, sort_keys=True, allow_nan=False) + "\n").encode()

    def write(self, store, inline_shards: int = INLINE_SHARDS) -> None:
        """Write each split's shard table, then `manifest.json` (last: a reader finds the tables it
        names), to `store` (storage.Store). The rows stay inline in manifest.json (version 1, which
        older wdsprep reads) while the manifest lists at most `inline_shards` shards; above, only the
        tables hold them (version 2: older wdsprep refuse it, naming the version)."""
        records = {}
        for split, rows in sorted(self.splits.items()):
            data = bytes(rows.buffer()) if isinstance(rows, ShardTable) else shardtable.encode_rows(split, list(rows))
            store.write_bytes(shardtable.file_name(split), data)
            records[split] = shardtable.entry_for(split, data, len(rows))
        self.tables = {**self.tables, SHARD_TABLES: records}
        total = sum(len(rows) for rows in self.splits.values())
        store.write_bytes(MANIFEST_NAME, self.dumps(inline=total <= inline_shards))

    @classmethod
    def from_dict(cls, data: dict, url: str | None = None, tables=None) -> "Manifest":
        """`tables(split, record) -> ShardTable`: how a version-2 manifest's shard tables are read
        (default: mapped from the folder of a local `url`; stream/manifests.py reads remote ones)."""
        where = url or "manifest"
        if not isinstance(data, dict) or data.get("format") not in READ_FORMATS:
            raise ManifestError(f"{where}: not a {FORMAT} manifest (format={data.get('format') if isinstance(data, dict) else None!r})")
        version = data.get("manifest_version")
        if version not in READ_VERSIONS or isinstance(version, bool):
            raise ManifestError(
                f"{where}: manifest version {version!r} is not supported by this wdsprep "
                f"(it reads versions {', '.join(map(str, READ_VERSIONS))}); upgrade wdsprep or re-convert"
            )
        validate(data, where, inline=version == INLINE_VERSION)
        adopted_set = data["source"] == ADOPTED_SOURCE
        base = (url.rsplit("/", 1)[0] if "/" in url else ".") if url else None
        index_files = data.get("tables", {}).get(INDEX_FILES, {})
        if version == INLINE_VERSION:
            splits = {name: list(split["shards"]) for name, split in data["splits"].items()}
            if adopted_set:
                for name, rows in splits.items():
                    check_index_places(where, name, rows, index_files[name])
                    if base is not None:
                        splits[name] = [dict(row, index_url=join_url(base, row["index_file"])) for row in rows]
        else:
            reader = tables or _local_tables(url, where)
            records = data["tables"][SHARD_TABLES]
            splits = TabledSplits({name: (reader, records[name], split, index_files.get(name) if adopted_set else None, base)
                                   for name, split in data["splits"].items()})
        return cls(
            source=data["source"],
            config=data["config"],
            fingerprint=data["fingerprint"],
            splits=splits,
            tables=data.get("tables", {}),
            problems=data.get("problems", []),
            input_bytes=data.get("input_bytes", 0),
            timing=data.get("timing", {}),
            url=url,
            format=data["format"],
        )

    @classmethod
    def loads(cls, text: bytes | str, url: str | None = None, tables=None) -> "Manifest":
        try:
            data = parse_json_text(text)
        except ValueError as error:  # JSONDecodeError, UnicodeDecodeError, a duplicate key, NaN, nesting
            raise ManifestError(f"{url or 'manifest'}: not valid JSON ({error})") from None
        return cls.from_dict(data, url, tables)


class TabledSplits(dict):
    """The splits of a manifest of version 2: each split's shard table is read (and checked) when
    that split is first asked for, so a dataset of one split reads one table."""

    def __init__(self, pending: dict):
        super().__init__({name: None for name in pending})
        self._pending = pending

    def _load(self, name: str) -> ShardTable:
        reader, record, totals, index_file, base = self._pending.pop(name)
        table = reader(name, record)
        table.check(name, record, totals, names=adopted_name_problem if index_file is not None else None)
        if index_file is not None:  # an adopted split: its rows' index places checked, their index file resolved
            check_index_places(table.where, name, table, index_file)
            if base is not None:
                table.row_defaults = {"index_url": join_url(base, index_file_name(name))}
        dict.__setitem__(self, name, table)
        return table

    def __getitem__(self, name):
        return self._load(name) if name in self._pending else dict.__getitem__(self, name)

    def get(self, name, default=None):
        return self[name] if name in self else default

    def values(self):
        return [self[name] for name in self]

    def items(self):
        return [(name, self[name]) for name in self]

    def __reduce__(self):  # a worker gets the tables read so far, and reads the others itself if asked
        loaded = {name: dict.__getitem__(self, name) for name in self if name not in self._pending}
        return (_tabled_splits, (list(self), loaded, self._pending))


def _tabled_splits(names: list, loaded: dict, pending: dict) -> TabledSplits:
    splits = TabledSplits(pending)
    for name in names:
        if name in loaded:
            dict.__setitem__(splits, name, loaded[name])
    return splits


def _written(row: dict) -> dict:
    """A row as the manifest writes it: without the fields made on load (`DERIVED`)."""
    return {name: value for name, value in row.items() if name not in DERIVED}


def index_file_name(split: str) -> str:
    """An adopted split's index file, beside the manifest (shards/index.py)."""
    return f"{split}{INDEX_SUFFIX}"


def check_index_places(where: str, split: str, rows, index_file: dict) -> None:
    """Every adopted row's index lies within its split's index file (as its record sizes it): so no
    row makes a reader allocate or ask for more than that file holds."""
    for number, row in enumerate(rows):
        if row["index_offset"] + row["index_bytes"] > index_file["bytes"]:
            raise ManifestError(f"{where}: splits.{split}.shards[{number}]: the index of {row['name']!s:.80} "
                                f"(index_offset {row['index_offset']} + index_bytes {row['index_bytes']}) lies outside "
                                f"{index_file['file']} ({index_file['bytes']} bytes)")


def index_file_problem(split: str, entry: Any) -> str | None:
    """What is wrong with the manifest's record of an adopted split's index file (None: nothing)."""
    if not isinstance(entry, dict) or entry.get("file") != index_file_name(split):
        return f"expected {{file: {index_file_name(split)!r}, bytes, sha256}}"
    if not _count(entry.get("bytes")):
        return f"bytes: expected a non-negative integer (got {entry.get('bytes')!r:.60})"
    if not isinstance(entry.get("sha256"), str) or not SHA256.fullmatch(entry["sha256"]):
        return f"sha256: expected 64 lowercase hex digits (got {entry.get('sha256')!r:.60})"
    return None


def adopted_name_problem(name: str) -> str | None:
    """What is wrong with an adopted row's shard name (None: nothing): a path relative to the
    manifest without `..`, or an absolute path or URL (the module docstring)."""
    if not name or "\0" in name or "\\" in name:
        return "expected a relative path without '..', or an absolute path or URL"
    if "://" in name or name.startswith("/"):
        return None
    if ".." in name.split("/") or "" in name.split("/") or name.startswith("pipe:"):
        return "expected a relative path without '..' (or empty parts), or an absolute path or URL"
    return None


def _column_sum(rows, name: str) -> int:
    if isinstance(rows, ShardTable):
        return int(rows.columns[name].sum(dtype=np.uint64))
    return sum(row[name] for row in rows)


def _local_tables(url: str | None, where: str):
    """Shard tables mapped from the folder of a local manifest."""
    return functools.partial(_local_table, url, where)


def _local_table(url: str | None, where: str, split: str, record: dict) -> ShardTable:
    if url is None or "://" in url:
        raise ManifestError(f"{where}: its shard tables must be read through wdsprep.stream's load_manifest")
    base = url.rsplit("/", 1)[0] if "/" in url else "."
    return shardtable.map_file(join_url(base, record["file"]), record)


# -- the schema
def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


_TOP = {  # field: (required, check, what it must be)
    "source": (True, lambda v: isinstance(v, str) and bool(v), "a non-empty string"),
    "config": (True, lambda v: isinstance(v, dict), "an object"),
    "fingerprint": (True, lambda v: isinstance(v, str), "a string"),
    "splits": (True, lambda v: isinstance(v, dict), "an object of splits"),
    "input_bytes": (False, _count, "a non-negative integer"),
    "tables": (False, lambda v: isinstance(v, dict), "an object"),
    "problems": (False, lambda v: isinstance(v, list), "a list"),
    "timing": (False, lambda v: isinstance(v, dict), "an object"),
    "totals": (False, lambda v: isinstance(v, dict), "an object"),
}
_ROW = {
    "name": (True, lambda v: isinstance(v, str), "a string"),
    "samples": (True, _count, "a non-negative integer"),
    "bytes": (True, _count, "a non-negative integer"),
    "sha256": (True, lambda v: isinstance(v, str) and SHA256.fullmatch(v) is not None, "64 lowercase hex digits"),
    "unit": (False, _count, "a non-negative integer"),
    "unit_digest": (False, lambda v: isinstance(v, str), "a string"),
}
_TOTALS = {"samples": (True, _count, "a non-negative integer"), "bytes": (True, _count, "a non-negative integer")}


def _check_fields(where: str, path: str, data: dict, schema: dict) -> None:
    for name, (required, check, expected) in schema.items():
        if name not in data:
            if required:
                raise ManifestError(f"{where}: {path}{name}: missing")
        elif not check(data[name]):
            raise ManifestError(f"{where}: {path}{name}: expected {expected} (got {data[name]!r:.60})")


def _check_sum(where: str, path: str, stated: Any, actual: int) -> None:
    if stated != actual:
        raise ManifestError(f"{where}: {path}: says {stated!r}, but its shard rows add up to {actual}")


def validate(data: dict, where: str, inline: bool = True) -> None:
    """Raise one-line `ManifestError`s for anything in `data` that a reader must not trust (`inline`:
    the rows are in it; else each split names its shard count and its shard table, whose rows the
    table's own `check` checks when it is read)."""
    _check_fields(where, "", data, _TOP)
    if not inline:
        _validate_tabled(data, where)
        return
    names: set[str] = set()
    totals = {"shards": 0, "samples": 0, "bytes": 0}
    for split, entry in data["splits"].items():
        if not SPLIT_NAME.fullmatch(split):
            raise ManifestError(f"{where}: splits.{split!r:.60}: not a split name ([A-Za-z0-9][A-Za-z0-9_-]*)")
        if not isinstance(entry, dict) or not isinstance(entry.get("shards"), list):
            raise ManifestError(f"{where}: splits.{split}.shards: expected a list of shard rows")
        _check_fields(where, f"splits.{split}.", entry, _TOTALS)
        adopted_set = data["source"] == ADOPTED_SOURCE
        for index, row in enumerate(entry["shards"]):
            path = f"splits.{split}.shards[{index}]."
            if not isinstance(row, dict):
                raise ManifestError(f"{where}: {path[:-1]}: expected a shard row object (got {row!r:.60})")
            _check_fields(where, path, row, _ROW)
            if adopted(row) != adopted_set:
                raise ManifestError(f"{where}: {path}index_file: " + (
                    "missing (every row of an adopted dataset has its index in the index file)" if adopted_set
                    else f"only an adopted dataset's rows (source {ADOPTED_SOURCE!r}) have their index outside the shard"))
            if adopted_set:
                problem = adopted_name_problem(row["name"])
                if problem is not None:
                    raise ManifestError(f"{where}: {path}name: {row['name']!r:.80}: {problem}")
                if row["index_file"] != index_file_name(split):
                    raise ManifestError(f"{where}: {path}index_file: expected {index_file_name(split)!r} "
                                        f"(got {row['index_file']!r:.60})")
            elif not is_shard_name(split, row["name"]):
                raise ManifestError(f"{where}: {path}name: {row['name']!r:.80} breaks the shard-name rule "
                                    f"{split}-<unit:05d>-<part:02d>.tar")
            if row["name"] in names:
                raise ManifestError(f"{where}: {path}name: shard {row['name']} is listed twice")
            names.add(row["name"])
            # the sample index's fields (absent in rows of older conversions): all three, within the shard
            if any(row.get(name) is not None for name in ROW_FIELDS) and (problem := index_fields_problem(row)):
                raise ManifestError(f"{where}: {path}{problem[0]}: {problem[1]}")
        for field_name in ("samples", "bytes"):
            actual = sum(row[field_name] for row in entry["shards"])
            _check_sum(where, f"splits.{split}.{field_name}", entry[field_name], actual)
            totals[field_name] += actual
        totals["shards"] += len(entry["shards"])
    _validate_tables(data, where, totals)


def _validate_tabled(data: dict, where: str) -> None:
    records = data.get("tables", {}).get(SHARD_TABLES)
    if not isinstance(records, dict):
        raise ManifestError(f"{where}: tables.{SHARD_TABLES}: missing (a version 2 manifest's shard rows are there)")
    totals = {"shards": 0, "samples": 0, "bytes": 0}
    for split, entry in data["splits"].items():
        if not SPLIT_NAME.fullmatch(split):
            raise ManifestError(f"{where}: splits.{split!r:.60}: not a split name ([A-Za-z0-9][A-Za-z0-9_-]*)")
        if not isinstance(entry, dict):
            raise ManifestError(f"{where}: splits.{split}: expected an object")
        _check_fields(where, f"splits.{split}.", entry, {**_TOTALS, "shards": _TOTALS["samples"]})
        if split not in records:
            raise ManifestError(f"{where}: tables.{SHARD_TABLES}.{split}: missing")
        for name in totals:
            totals[name] += entry[name]
    _validate_tables(data, where, totals)


def _validate_tables(data: dict, where: str, totals: dict) -> None:
    """The overall totals against the splits' (`totals`), and the tables' records."""
    if "totals" in data:
        for field_name, actual in totals.items():
            _check_sum(where, f"totals.{field_name}", data["totals"].get(field_name), actual)
    shard_tables = data.get("tables", {}).get(SHARD_TABLES)
    if shard_tables is not None:  # the per-split shard tables (shards/shardtable.py): one file each
        if not isinstance(shard_tables, dict):
            raise ManifestError(f"{where}: tables.{SHARD_TABLES}: expected {{split: {{file, bytes, sha256, shards}}}}")
        for split, entry in shard_tables.items():
            problem = "no such split" if split not in data["splits"] else shardtable.entry_problem(split, entry)
            if problem:
                raise ManifestError(f"{where}: tables.{SHARD_TABLES}.{split!s:.60}: {problem}")
    index_files = data.get("tables", {}).get(INDEX_FILES)
    if data["source"] == ADOPTED_SOURCE or index_files is not None:  # an adopted dataset's index files: one per split
        if data["source"] != ADOPTED_SOURCE or not isinstance(index_files, dict) or set(index_files) != set(data["splits"]):
            raise ManifestError(f"{where}: tables.{INDEX_FILES}: expected {{split: {{file, bytes, sha256}}}} for every split "
                                f"of an adopted dataset (source {ADOPTED_SOURCE!r}) and only there")
        for split, entry in index_files.items():
            problem = index_file_problem(split, entry)
            if problem:
                raise ManifestError(f"{where}: tables.{INDEX_FILES}.{split!s:.60}: {problem}")
    sample_tables = data.get("tables", {}).get(SAMPLE_TABLES)
    if sample_tables is not None:  # the per-split sample tables (shards/samples.py): one file each
        if not isinstance(sample_tables, dict):
            raise ManifestError(f"{where}: tables.{SAMPLE_TABLES}: expected {{split: {{file, bytes, sha256, fields}}}}")
        for split, entry in sample_tables.items():
            problem = "no such split" if split not in data["splits"] else entry_problem(split, entry)
            if problem:
                raise ManifestError(f"{where}: tables.{SAMPLE_TABLES}.{split!s:.60}: {problem}")
    fields = data.get("tables", {}).get("fields")
    if fields is not None:
        if not isinstance(fields, dict) or not all(
                isinstance(table, dict) and all(isinstance(entry, dict) and entry.get("kind") in KINDS
                                                for entry in table.values()) for table in fields.values()):
            raise ManifestError(f"{where}: tables.fields: expected {{split: {{member: {{kind: {'|'.join(KINDS)}, ...}}}}}}")


def join_url(base: str, name: str) -> str:
    """The URL of `name` beside `base`; an absolute path or URL (an adopted shard's) is itself."""
    if base in ("", ".") or "://" in name or name.startswith("/"):
        return name
    return f"{base.rstrip('/')}/{name}"


def comparable(manifest: dict | Manifest) -> dict[str, Any]:
    """The manifest without its timing fields: equal for equal inputs on any machine or executor."""
    data = manifest.to_dict() if isinstance(manifest, Manifest) else dict(manifest)
    data.pop("timing", None)
    return data


# -- the per-field table (`tables["fields"]`)
KINDS = ("array", "columns", "value")


def describe_value(value: Any) -> dict:
    """`{"kind": "array", "dtype", "shape"}`, `{"kind": "columns", "columns": {name: array entry}}`
    (an `.npz` member) or `{"kind": "value"}` (msgpack/json)."""
    from .codec import Columns

    if isinstance(value, np.ndarray):
        return {"kind": "array", "dtype": value.dtype.str, "shape": list(value.shape)}
    if isinstance(value, Columns):
        return {"kind": "columns", "columns": {name: describe_value(np.asarray(column)) for name, column in value.items()}}
    return {"kind": "value"}


def describe_fields(encoder, fields: dict) -> dict:
    """{member suffix as written (`rays.npz.zst`): entry} of one sample's fields."""
    return {encoder.field_name(name, value): describe_value(value) for name, value in fields.items()}


def _merge_entry(a: dict, b: dict) -> dict:
    if a == b:
        return a
    if a["kind"] != b["kind"]:
        return {"kind": "value", "mixed": True}
    if a["kind"] == "columns":
        return {**a, "columns": merge_fields(a["columns"], b["columns"])}
    if a["kind"] != "array":
        return a
    merged = dict(a)
    if a["dtype"] != b["dtype"]:
        merged["dtype"] = sorted(set(_as_list(a["dtype"])) | set(_as_list(b["dtype"])))
    if a["shape"] is None or b["shape"] is None or len(a["shape"]) != len(b["shape"]):
        merged["shape"] = None  # the rank varies
    else:
        merged["shape"] = [x if x == y else None for x, y in zip(a["shape"], b["shape"])]
    return merged


def _as_list(dtype) -> list:
    return dtype if isinstance(dtype, list) else [dtype]


def merge_fields(a: dict, b: dict) -> dict:
    """Two field tables (of samples, units or splits) as one: dimensions that differ become `None`,
    dtypes that differ a list, and a member not in both is marked `"missing_in_some": true`."""
    merged = {}
    for name in sorted(set(a) | set(b)):
        if name in a and name in b:
            merged[name] = _merge_entry(a[name], b[name])
        else:
            merged[name] = dict(a.get(name) or b[name], missing_in_some=True)
    return merged


def field_table_problems(table: dict, path: str = "") -> list[str]:
    """What keeps a split's samples from sharing one schema (what Arrow readers need): members or
    columns missing in some samples, dtypes or ranks that vary, a member that is sometimes not an array."""
    problems = []
    for name, entry in table.items():
        where = f"{path}{name}"
        if entry.get("missing_in_some"):
            problems.append(f"{where}: missing in some samples")
        if entry.get("mixed"):
            problems.append(f"{where}: an array in some samples, not in others")
        if isinstance(entry.get("dtype"), list):
            problems.append(f"{where}: dtypes {', '.join(entry['dtype'])}")
        if entry.get("kind") == "array" and entry.get("shape") is None:
            problems.append(f"{where}: the number of dimensions varies")
        if entry.get("kind") == "columns":
            problems.extend(field_table_problems(entry["columns"], f"{where}:"))
    return problems


class FieldRecorder:
    """Collects the field table of the samples a unit builds, per split (`Source.build` side):
    `add(split, fields)` per sample, then `report(ctx)` once; `split_tables(unit_tables)` merges
    what every unit reported into `{split: table}` (`Source.finalize` side)."""

    TABLE = "fields"

    def __init__(self, options: dict):
        from .codec import Encoder

        self.encoder = Encoder(options.get("codec", "zstd"))  # names members as the writer does
        self.tables: dict[str, dict] = {}

    def add(self, split: str, fields: dict) -> None:
        described = describe_fields(self.encoder, fields)
        seen = self.tables.get(split)
        self.tables[split] = described if seen is None else merge_fields(seen, described)

    def report(self, ctx) -> None:
        for split, table in sorted(self.tables.items()):
            ctx.add_table_entry(self.TABLE, {"split": split, "fields": table})

    @classmethod
    def split_tables(cls, unit_tables) -> dict[str, dict]:
        merged: dict[str, dict] = {}
        for tables in unit_tables:
            for entry in tables.get(cls.TABLE, []):
                seen = merged.get(entry["split"])
                merged[entry["split"]] = entry["fields"] if seen is None else merge_fields(seen, entry["fields"])
        return dict(sorted(merged.items()))
