"""The sample table of a split: every sample's key and indexed fields, in one file beside the manifest.

Why a file of its own. A selection (`keys=`, `select="label == 3"`) and random access by key are
decided before any shard is read, on every rank: with the keys and fields inside each shard's index
a remote rank would fetch one index per shard first (10^4 requests for 10^4 shards). The table is
one request, read only when a selection or a key lookup asks for it; plain streaming never does.

File `<split>.samples`: one zstd frame (level 3, with its content size and checksum) around msgpack,
`wdsprep-samples/1`: a map with `format`, `split`, `count`
(samples), `keys` (the UTF-8 keys back to back, a bin) and `key_ends` (uint64 little-endian: where
each key ends in `keys`), and `fields`: {name: column}, a column being either
{`dtype`: a numpy dtype string of a bool, integer or float kind, `data`: the little-endian values}
or, for strings, {`values`: [the distinct strings, sorted], `codes`: uint32 per sample}. Samples
are in manifest order: shard after shard as the split lists them, each shard's samples in order.
The manifest records each split's table in `tables["sample_tables"][split]` = {`file`, `bytes`,
`sha256`, `fields`: [names]}; a table whose bytes do not match is refused (`ManifestError`). Compressed
because most of it is regular (key ends, small integers, keys with a common stem: 24 MB of a 10^6-sample
table become 0.9 MB), and it is one request on every rank of a remote dataset with a selection. Read
back, it is inflated at most to a bound from its sample count and fields (`inflate_bound`, by the
format's one bounded inflate, `codec.inflate`), so a frame that expands further is refused unread; its keys are decoded into strings only when asked for (a
`select=` alone reads its columns, not its keys).

An indexed field is a small scalar of each sample (a label, an ISO value, a sensor name): the
conversion takes it from what the source computes for the sample (`Source.index_values`), else from
the sample's top-level field of that name, or by a dotted path through a metadata dict
(`meta.iso`): `sample_values`. A sample without it gets the column's missing value: -1 for integers,
NaN for floats, "" for strings, False for bools (so a selection on it does not keep that sample,
except through `!=` or `not`). A field no sample of the split holds is left out of that split's
table (`split_table`), so a selection on it names the fields that are there. A column's kind comes
from its values: bools, integers (and bools), numbers, or strings; strings mixed with numbers are a
`ConfigError` naming the field.

A table entry in a manifest is checked with the manifest (`entry_problem`): its file is exactly
`<split>.samples` (never a path), its size and sha256 well-formed, its fields names.
"""
from __future__ import annotations

import hashlib
from typing import Any, Iterable, Mapping

import msgpack
import numpy as np
import zstandard

from ..errors import ConfigError, FormatError, ManifestError
from .codec import inflate

FORMAT = "wdsprep-samples/1"
TABLE = "sample_tables"  # manifest.tables key (not "samples": a source may name its own table so)
SUFFIX = ".samples"


def file_name(split: str) -> str:
    return f"{split}{SUFFIX}"


def field_value(fields: Mapping[str, Any], path: str) -> Any:
    """A sample's value of an indexed field: its top-level field `path`, or a dotted path through
    dicts; `None` when the sample has no such value. Arrays of one element count as scalars."""
    value: Any = fields
    for part in [path] if path in fields else path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.reshape(()).item()
    elif isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ConfigError(f"index field {path!r} is {type(value).__name__}, not a number, bool or string")


def sample_values(key: str, sample: Mapping[str, Any], names, computed: Mapping[str, Any]) -> list:
    """One sample's index field values in `names` order (None: absent): `computed` (the source's
    `index_values`) first, then the sample's field or dotted path; a value that is not a scalar is
    a ConfigError naming the sample and the field."""
    values = []
    for name in names:
        try:
            values.append(field_value(computed if name in computed else sample, name))
        except ConfigError as error:
            raise ConfigError(f"sample {key!r}: {error}") from None
    return values


def split_table(split: str, keys: list[str], columns: Mapping[str, list]) -> tuple[bytes, dict]:
    """(the table file's bytes, its manifest entry) of one split; the fields that no sample of the
    split holds are left out."""
    present = {name: values for name, values in columns.items() if any(value is not None for value in values)}
    data = encode_table(split, keys, present)
    return data, entry_for(split, data, present)


def entry_problem(split: Any, entry: Any) -> str | None:
    """What is wrong with a manifest's record of a split's table (None: nothing)."""
    if not isinstance(entry, dict):
        return "expected an object {file, bytes, sha256, fields}"
    if entry.get("file") != file_name(str(split)):
        return f"file must be {file_name(str(split))!r} (got {entry.get('file')!r:.60})"
    size = entry.get("bytes")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return f"bytes: expected a non-negative integer (got {size!r:.60})"
    digest = entry.get("sha256")
    if not isinstance(digest, str) or len(digest) != 64 or digest.strip("0123456789abcdef"):
        return f"sha256: expected 64 lowercase hex digits (got {digest!r:.60})"
    fields = entry.get("fields")
    if not isinstance(fields, list) or not all(isinstance(name, str) for name in fields):
        return f"fields: expected a list of field names (got {fields!r:.60})"
    return None


def _column(name: str, values: list) -> dict:
    present = [v for v in values if v is not None]
    kinds = {type(v) for v in present}
    if kinds <= {bool}:
        data = np.array([bool(v) if v is not None else False for v in values], dtype="|b1")
        return {"dtype": "|b1", "data": data.tobytes()}
    if kinds <= {bool, int}:
        try:
            data = np.array([int(v) if v is not None else -1 for v in values], dtype="<i8")
        except OverflowError:
            raise ConfigError(f"index field {name!r} holds an integer outside 64 bits") from None
        return {"dtype": "<i8", "data": data.tobytes()}
    if kinds <= {bool, int, float}:
        data = np.array([float(v) if v is not None else np.nan for v in values], dtype="<f8")
        return {"dtype": "<f8", "data": data.tobytes()}
    if kinds <= {str}:
        distinct = sorted(set(present) | ({""} if len(present) < len(values) else set()))
        code = {value: i for i, value in enumerate(distinct)}
        codes = np.array([code[v if v is not None else ""] for v in values], dtype="<u4")
        return {"values": distinct, "codes": codes.tobytes()}
    raise ConfigError(f"index field {name!r} mixes strings and numbers ({', '.join(sorted(k.__name__ for k in kinds))})")


def _read_column(name: str, column: dict, count: int) -> np.ndarray:
    """A column of the table file as the reader holds it (one value per sample); a ValueError says
    what does not add up."""
    if "codes" in column:
        codes = np.frombuffer(column["codes"], "<u4")
        values = np.array(column["values"], dtype=object)
        if len(codes) != count or (len(codes) and codes.max() >= len(values)):
            raise ValueError(f"field {name!r}: codes do not match")
        return values[codes].astype(str) if len(values) else np.zeros(count, dtype=str)
    if column["dtype"] not in ("|b1", "<i8", "<f8"):
        raise ValueError(f"field {name!r}: dtype {column['dtype']!r} is not allowed")
    values = np.frombuffer(column["data"], column["dtype"])
    if len(values) != count:
        raise ValueError(f"field {name!r}: {len(values)} values for {count} samples")
    return values


def column_of(name: str, values: list) -> np.ndarray:
    """The column a table holds for a field of these values (one per sample, None: absent), as a
    reader holds it: what a conversion that derived them writes and `SampleTable` reads back
    (`wdsprep verify` compares a table with it)."""
    return _read_column(name, _column(name, list(values)), len(values))


def encode_table(split: str, keys: list[str], fields: Mapping[str, list]) -> bytes:
    """The table file's bytes: `keys` in manifest order, `fields` {name: one value (or None) per key}."""
    encoded = [key.encode("utf-8") for key in keys]
    ends = np.cumsum([len(k) for k in encoded], dtype=np.uint64) if encoded else np.zeros(0, np.uint64)
    columns = {}
    for name, values in sorted(fields.items()):
        if len(values) != len(keys):
            raise ValueError(f"field {name!r} has {len(values)} values for {len(keys)} keys")
        columns[name] = _column(name, list(values))
    packed = msgpack.packb({"format": FORMAT, "split": split, "count": len(keys), "keys": b"".join(encoded),
                            "key_ends": ends.astype("<u8").tobytes(), "fields": columns}, use_bin_type=True)
    return zstandard.ZstdCompressor(level=3, write_checksum=True).compress(packed)


def inflate_bound(count: int, fields: int) -> int:
    """The most bytes a table of `count` samples and `fields` columns may inflate to: a key of up to
    256 bytes and its end, a value of up to 256 bytes (a string column's distinct values) per field
    and sample, and 1 MiB for the rest."""
    return (1 << 20) + count * (264 + 264 * fields)


def table_entry(manifest, split: str) -> dict | None:
    return (manifest.tables.get(TABLE) or {}).get(split)


def entry_for(split: str, data: bytes, fields: Iterable[str]) -> dict:
    """The manifest's record of a table file."""
    return {"file": file_name(split), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "fields": sorted(fields)}


class SampleTable:
    """A split's keys (`keys`, a list decoded at first use) and index fields (`fields`: name -> one
    value per sample, numpy), in manifest order; `positions()`: key -> position."""

    def __init__(self, keys: list[str] | None = None, fields: dict[str, np.ndarray] | None = None, *,
                 blob: bytes = b"", ends: np.ndarray | None = None, where: str = ""):
        self._keys, self.fields = keys, dict(fields or {})
        self._blob, self._ends, self._where = blob, ends, where
        self._positions: dict[str, int] | None = None

    @property
    def keys(self) -> list[str]:
        if self._keys is None:
            ends = self._ends
            starts = np.concatenate([[0], ends[:-1]]) if len(ends) else ends
            try:
                if self._blob.isascii():  # one decode, then slices (a UTF-8 key may not be cut by character)
                    text = self._blob.decode("ascii")
                    self._keys = [text[a:b] for a, b in zip(starts.tolist(), ends.tolist())]
                else:
                    self._keys = [self._blob[a:b].decode("utf-8") for a, b in zip(starts.tolist(), ends.tolist())]
            except UnicodeDecodeError as error:
                raise ManifestError(f"{self._where}: sample table is unreadable ({error})") from None
        return self._keys

    @property
    def longest_key(self) -> int:
        """The length of the split's longest key, in UTF-8 bytes (0 for no sample)."""
        if self._keys is None:
            return int(np.diff(self._ends, prepend=0).max()) if len(self._ends) else 0
        return max((len(key.encode("utf-8")) for key in self._keys), default=0)

    def positions(self) -> dict[str, int]:
        """key -> position in the split (built on first use)."""
        if self._positions is None:
            self._positions = {key: i for i, key in enumerate(self.keys)}
        return self._positions

    @classmethod
    def decode(cls, data: bytes, where: str, count: int, fields: int = 0) -> "SampleTable":
        """The table file's bytes, for a split of `count` samples whose record names `fields` fields."""
        try:
            table = msgpack.unpackb(inflate(data, inflate_bound(count, fields), "this sample table"), raw=False)
            if not isinstance(table, dict) or table.get("format") != FORMAT:
                raise ValueError(f"unknown format {table.get('format') if isinstance(table, dict) else None!r}")
            blob, ends = table["keys"], np.frombuffer(table["key_ends"], "<u8").astype(np.int64)
            if not isinstance(blob, bytes):
                raise ValueError("keys are not bytes")
            if len(ends) != count or table["count"] != count or (len(ends) and ends[-1] != len(blob)):
                raise ValueError(f"{len(ends)} keys for {count} samples")
            if len(ends) and (ends[0] < 0 or (np.diff(ends) < 0).any()):
                raise ValueError("key ends go backwards")
            fields = {name: _read_column(name, column, count) for name, column in table["fields"].items()}
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError, msgpack.ExtraData,
                msgpack.FormatError, msgpack.StackError, zstandard.ZstdError, FormatError) as error:
            raise ManifestError(f"{where}: sample table is unreadable ({error})") from None
        return cls(fields=fields, blob=blob, ends=ends, where=where)

    @classmethod
    def load(cls, manifest, split: str, entry: dict) -> "SampleTable":
        """The split's table, read from beside the manifest and checked against its record."""
        from ..storage import open_url

        url = manifest.url_of(entry["file"])
        try:
            with open_url(url) as stream:
                data = stream.read(int(entry["bytes"]) + 1)
        except OSError as error:
            raise ManifestError(f"{url}: cannot read the sample table ({error})") from None
        if len(data) != entry["bytes"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise ManifestError(f"{url}: sample table does not match the manifest (size or sha256)")
        count = sum(row["samples"] for row in manifest.shards(split))
        return cls.decode(data, url, count, len(entry["fields"]))
