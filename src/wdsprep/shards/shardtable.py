"""The shard table of a split: every shard row of the manifest as binary columns, in one file beside it.

Why a file of its own. `manifest.json` once held one JSON object per shard (~384 bytes each): at 10^6
shards every process parsed 384 MB into ~2.4 KB of Python objects per shard, and `len()` walked them
again. The table holds the same rows as fixed-width little-endian columns (62 bytes per shard when
every row has its sample index), so a reader maps it (`mmap`: the processes of a node share one copy
through the page cache) and plans an epoch on numpy views of it, making no per-shard object.

File `<split>.shards` (`wdsprep-shards/1`): the 8 bytes `WDSSHRD1`, a uint32 (little-endian) header
length H, H bytes of JSON header, then the columns, each at an offset (a multiple of 8) the header
gives:

    {"format": "wdsprep-shards/1", "split", "count", "digest", "names": "rule" | "blob",
     "columns": {name: {"dtype", "width", "offset"}}, "extras": {"offset", "bytes"} | null}

- `name_unit` (uint32) and `name_part` (uint16) when every name follows the shard-name rule in its
  canonical spelling (`<split>-<unit:05d>-<part:02d>.tar`: the name is rebuilt from them), else
  `names` (the UTF-8 names back to back) and `name_ends` (uint64, where each ends): "names": "blob";
- `samples` (uint32, or uint64 when a count does not fit), `bytes` (uint64), `sha256` (32 bytes);
- the sample index of the rows that have one (`index_offset`, `index_bytes`, `index_digest` all
  given and consistent): `index_bytes` (uint32), `index_digest` (uint64, the xxh3_64 value);
  `index_offset` is not stored, it is `bytes - index_bytes - 1024` (the rule every manifest row
  obeys: docs/format.md). `indexed` (uint8 0/1) only when some rows have an index and some not;
- `unit`: not stored when every row's `unit` is its name's (`"unit": "name"` in the header: what
  every conversion writes);
- `extras`: every other field of the rows (`unit` where it is not the name's, fields a later
  wdsprep adds, index fields of a row that does not obey the rule) as one zstd frame around msgpack
  {field: [[value, run length], ...]}, runs in row order; a row without the field is a run of None.
  Read only when a whole row is asked for (`table[i]`: verify, upload, inspect), never to plan.
- left out: `unit_digest` (what a unit's shards depend on, 32 bytes of entropy a unit). The unit
  journal `_units.json` keeps it, and it is what a resumed conversion reads; no reader reads it
  from the manifest. A manifest with inline rows keeps it there.

`digest` is the split's state digest (`rows_digest`: names, counts and sha256 of its shards, what a
saved state must have been read from), written once so a reader does not rebuild 10^6 JSON rows for it.

The manifest records each split's table in `tables["shard_tables"][split]` = {`file`, `bytes`,
`sha256`, `shards`}; a table whose size or sha256 differ is refused with one `ManifestError` line
naming the file (a truncated or altered table). A table read is checked once more (`check`): its
header (offsets and lengths inside the file, the split and count of the record), unique names, index
fields inside their shard, and the split's totals from its columns.
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
from typing import Any, Iterable, Iterator

import msgpack
import numpy as np
import zstandard

from ..errors import ManifestError
from ..storage.files import open_to_read
from .codec import inflate

FORMAT = "wdsprep-shards/1"
MAGIC = b"WDSSHRD1"
TABLE = "shard_tables"  # manifest.tables key
SUFFIX = ".shards"
INDEX_FIELDS = ("index_offset", "index_bytes", "index_digest")
CORE = ("name", "samples", "bytes", "sha256")
LEFT_OUT = ("unit_digest",)  # the conversion's journal keeps it (resume reads it there); no reader does
INDEX_TAIL = 1024  # the two end blocks after the index member
_DIGEST = re.compile(r"xxh3_64:([0-9a-f]{16})")
_MAX_EXTRAS = 1 << 30  # an extras frame inflating past this is refused unread


def file_name(split: str) -> str:
    return f"{split}{SUFFIX}"


def rows_digest(rows: Iterable[dict]) -> str:
    """Names, counts and sha256 of a split's shards: the `dataset` a saved state records."""
    return hashlib.sha256(json.dumps([[row["name"], row["samples"], row.get("sha256")] for row in rows]).encode()).hexdigest()[:16]


def _canonical_name(split: str, unit: int, part: int) -> str:
    return f"{split}-{unit:05d}-{part:02d}.tar"


def _parse_name(split: str, name: str) -> tuple[int, int] | None:
    prefix = f"{split}-"
    if not name.startswith(prefix) or not name.endswith(".tar"):
        return None
    middle = name[len(prefix) : -4].split("-")
    if len(middle) != 2 or not all(part.isdigit() for part in middle):
        return None
    unit, part = int(middle[0]), int(middle[1])
    if unit >= 1 << 32 or part >= 1 << 16 or _canonical_name(split, unit, part) != name:
        return None
    return unit, part


def _indexed(row: dict) -> bool:
    """Whether the row's index fields are stored as columns (all three given, obeying the rule)."""
    offset, size, digest = (row.get(name) for name in INDEX_FIELDS)
    return (isinstance(size, int) and isinstance(offset, int) and isinstance(digest, str)
            and 0 <= size < 1 << 32 and offset + size + INDEX_TAIL == row["bytes"] and _DIGEST.fullmatch(digest) is not None)


def _runs(values: list) -> list[list]:
    runs: list[list] = []
    for value in values:
        if runs and runs[-1][0] == value and type(runs[-1][0]) is type(value):
            runs[-1][1] += 1
        else:
            runs.append([value, 1])
    return runs


def encode_rows(split: str, rows: list[dict]) -> bytes:
    """The table file of a split's shard rows (as the manifest lists them)."""
    count = len(rows)
    parsed = [_parse_name(split, row["name"]) for row in rows]
    columns: dict[str, np.ndarray] = {}
    names_blob = None
    if all(p is not None for p in parsed):
        columns["name_unit"] = np.array([p[0] for p in parsed], dtype="<u4")
        columns["name_part"] = np.array([p[1] for p in parsed], dtype="<u2")
    else:
        names_blob = [row["name"] for row in rows]
    columns["samples"] = np.array([row["samples"] for row in rows], dtype="<u8")
    columns["bytes"] = np.array([row["bytes"] for row in rows], dtype="<u8")
    columns["sha256"] = np.frombuffer(b"".join(bytes.fromhex(row["sha256"]) for row in rows), dtype=np.uint8).reshape(count, 32)
    indexed = np.array([_indexed(row) for row in rows], dtype=bool)
    if indexed.any():
        columns["index_bytes"] = np.array([row["index_bytes"] if ok else 0 for row, ok in zip(rows, indexed)], dtype="<u4")
        columns["index_digest"] = np.array([int(row["index_digest"][8:], 16) if ok else 0 for row, ok in zip(rows, indexed)], dtype="<u8")
        if not indexed.all():
            columns["indexed"] = indexed.astype("<u1")
    unit_from_name = names_blob is None and count > 0 and all(row.get("unit") == p[0] and type(row.get("unit")) is int
                                                             for row, p in zip(rows, parsed))
    left_out = set(CORE) | set(INDEX_FIELDS) | set(LEFT_OUT) | ({"unit"} if unit_from_name else set())
    extra_names = sorted({name for row in rows for name in row} - left_out
                         | {name for row, ok in zip(rows, indexed) if not ok for name in INDEX_FIELDS if name in row})
    extras = {name: _runs([row.get(name) for row in rows]) for name in extra_names}
    # a field given as None and a field absent are both None in the runs: keep which rows hold it
    present = {name: _runs([name in row for row in rows]) for name in extra_names
               if any(name in row and row[name] is None for row in rows)}
    if present:
        extras["__present__"] = present
    return encode_columns(split, columns, names=names_blob, extras=extras or None, digest=rows_digest(rows),
                          unit_from_name=unit_from_name)


def encode_columns(split: str, columns: dict[str, np.ndarray], *, names: list[str] | None = None,
                   extras: dict | None = None, digest: str, unit_from_name: bool = False) -> bytes:
    """The table file from its columns (see the module docstring): `columns` holds `name_unit` and
    `name_part` unless `names` gives the names; `samples` is narrowed to uint32 when it fits."""
    columns = dict(columns)
    count = len(columns["samples"])
    if names is not None:
        encoded = [name.encode() for name in names]
        columns["names"] = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        columns["name_ends"] = np.cumsum([len(name) for name in encoded], dtype=np.int64).astype("<u8")
    samples = np.asarray(columns["samples"])
    columns["samples"] = samples.astype("<u4" if count == 0 or int(samples.max()) < 1 << 32 else "<u8")
    layout: dict[str, dict] = {}
    chunks: list[bytes] = []
    position = 0
    for name in sorted(columns):
        array = np.ascontiguousarray(columns[name])
        width = 1 if array.ndim == 1 else int(array.shape[1])
        layout[name] = {"dtype": array.dtype.str, "width": width, "offset": position}
        data = array.tobytes()
        chunks.append(data + b"\0" * (-len(data) % 8))
        position += len(data) + (-len(data) % 8)
    extras_entry = None
    if extras is not None:
        frame = zstandard.ZstdCompressor(level=3, write_checksum=True).compress(msgpack.packb(extras, use_bin_type=True))
        extras_entry = {"offset": position, "bytes": len(frame)}
        chunks.append(frame)
    header = {"format": FORMAT, "split": split, "count": count, "digest": digest,
              "names": "blob" if names is not None else "rule", "columns": layout, "extras": extras_entry}
    if unit_from_name:
        header["unit"] = "name"
    text = json.dumps(header, sort_keys=True).encode()
    text += b" " * (-(len(MAGIC) + 4 + len(text)) % 8)  # the columns start 8-aligned, offsets from there
    return MAGIC + len(text).to_bytes(4, "little") + text + b"".join(chunks)


def entry_for(split: str, data: bytes, count: int) -> dict:
    return {"file": file_name(split), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "shards": count}


def entry_problem(split: Any, entry: Any) -> str | None:
    """What is wrong with a manifest's record of a split's shard table (None: nothing)."""
    if not isinstance(entry, dict):
        return "expected an object {file, bytes, sha256, shards}"
    if entry.get("file") != file_name(str(split)):
        return f"file must be {file_name(str(split))!r} (got {entry.get('file')!r:.60})"
    for name in ("bytes", "shards"):
        value = entry.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            return f"{name}: expected a non-negative integer (got {value!r:.60})"
    digest = entry.get("sha256")
    if not isinstance(digest, str) or len(digest) != 64 or digest.strip("0123456789abcdef"):
        return f"sha256: expected 64 lowercase hex digits (got {digest!r:.60})"
    return None


class ShardTable:
    """A split's shard rows as columns over the table's bytes (a read-only mmap or bytes). A
    sequence of row dicts too (`table[i]`, iteration, `len`), built on demand, so code that reads
    rows works unchanged; planning uses the columns (`samples`, `bytes`, `name(i)`). A table mapped
    from `path` keeps the manifest's `record` of it, so a process it is pickled to (a spawned
    DataLoader worker) checks the file it maps again before trusting it (the file may have been
    replaced since: a cache entry)."""

    def __init__(self, buffer, where: str, path: str | None = None, record: dict | None = None):
        self.where, self.path, self.record = where, path, record
        self._buffer = buffer
        data = memoryview(buffer)
        if len(data) < len(MAGIC) + 4 or bytes(data[: len(MAGIC)]) != MAGIC:
            raise ManifestError(f"{where}: not a {FORMAT} shard table")
        size = int.from_bytes(data[len(MAGIC) : len(MAGIC) + 4], "little")
        try:
            header = json.loads(bytes(data[len(MAGIC) + 4 : len(MAGIC) + 4 + size]))
        except ValueError:
            raise ManifestError(f"{where}: shard table header is not valid JSON") from None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise ManifestError(f"{where}: not a {FORMAT} shard table")
        self.split, self.count, self.digest = header.get("split"), header.get("count"), header.get("digest")
        if not isinstance(self.count, int) or self.count < 0:
            raise ManifestError(f"{where}: shard table count: expected a non-negative integer")
        start = len(MAGIC) + 4 + size
        start += -start % 8  # offsets count from the first column
        self.columns: dict[str, np.ndarray] = {}
        self.names_kind = header.get("names")
        layout = header.get("columns")
        if not isinstance(layout, dict):
            raise ManifestError(f"{where}: shard table header: no column layout")
        for name, entry in layout.items():
            try:
                dtype, width, offset = np.dtype(entry["dtype"]), int(entry["width"]), start + int(entry["offset"])
            except (KeyError, TypeError, ValueError):
                raise ManifestError(f"{where}: shard table column {name!r:.40}: bad layout") from None
            if dtype.kind not in "ui" or width < 1 or offset < start:
                raise ManifestError(f"{where}: shard table column {name!r:.40}: bad layout")
            if name == "names":  # its length is the last name end
                ends = layout.get("name_ends")
                items = 0 if not self.count else None
                if items is None:
                    if not isinstance(ends, dict) or "offset" not in ends:
                        raise ManifestError(f"{where}: shard table names have no name_ends")
                    end_at = start + int(ends["offset"]) + 8 * (self.count - 1)
                    if end_at + 8 > len(data):
                        raise ManifestError(f"{where}: shard table column 'name_ends' lies outside the file")
                    items = int(np.frombuffer(buffer, dtype="<u8", count=1, offset=end_at)[0])
            else:
                items = self.count * width
            if offset + items * dtype.itemsize > len(data):
                raise ManifestError(f"{where}: shard table column {name!r:.40} lies outside the file")
            array = np.frombuffer(buffer, dtype=dtype, count=items, offset=offset)
            self.columns[name] = array.reshape(self.count, width) if width > 1 else array
        if self.names_kind == "blob":
            ends = self.columns.get("name_ends")
            if ends is None or "names" not in self.columns or (np.diff(ends.astype(np.int64)) < 0).any():
                raise ManifestError(f"{where}: shard table names: bad name_ends")
            self._starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
        elif self.names_kind != "rule" or "name_unit" not in self.columns or "name_part" not in self.columns:
            raise ManifestError(f"{where}: shard table names: expected 'rule' columns or a 'blob'")
        for name in ("samples", "bytes", "sha256"):
            if name not in self.columns:
                raise ManifestError(f"{where}: shard table has no {name!r} column")
        self.samples, self.bytes, self.sha256 = self.columns["samples"], self.columns["bytes"], self.columns["sha256"]
        if self.sha256.ndim != 2 or self.sha256.shape[1] != 32:
            raise ManifestError(f"{where}: shard table column 'sha256': expected 32 bytes per shard")
        self._extras_entry, self._start = header.get("extras"), start
        self.unit_from_name = header.get("unit") == "name" and self.names_kind == "rule"
        self._extras: dict | None = None

    # -- pickling: a worker process maps the same file (no manifest read), or gets the bytes
    def __reduce__(self):
        if self.path is not None:
            return (_mapped, (self.path, self.where, self.record))
        return (ShardTable, (bytes(memoryview(self._buffer)), self.where))

    def buffer(self):
        """The table file's bytes (a read-only view)."""
        return memoryview(self._buffer)

    # -- columns
    def __len__(self) -> int:
        return self.count

    def name(self, shard: int) -> str:
        if self.names_kind == "rule":
            return _canonical_name(self.split, int(self.columns["name_unit"][shard]), int(self.columns["name_part"][shard]))
        start, end = int(self._starts[shard]), int(self.columns["name_ends"][shard])
        return bytes(self.columns["names"][start:end]).decode("utf-8", "replace")

    def names(self) -> list[str]:
        return [self.name(shard) for shard in range(self.count)]

    def indexed(self) -> np.ndarray:
        if "index_bytes" not in self.columns:
            return np.zeros(self.count, dtype=bool)
        if "indexed" in self.columns:
            return self.columns["indexed"].astype(bool)
        return np.ones(self.count, dtype=bool)

    def extras(self) -> dict:
        """The other fields' runs (decoded on first use)."""
        if self._extras is None:
            entry = self._extras_entry
            if entry is None:
                self._extras = {}
            else:
                offset, size = self._start + int(entry["offset"]), int(entry["bytes"])
                frame = bytes(memoryview(self._buffer)[offset : offset + size])
                try:
                    data = inflate(frame, _MAX_EXTRAS, "shard table extras")
                    extras = msgpack.unpackb(data, raw=False, strict_map_key=False)
                except Exception as error:  # zstd or msgpack: a damaged frame
                    raise ManifestError(f"{self.where}: shard table extras cannot be read ({error})") from None
                self._extras = {}
                present = extras.pop("__present__", {})
                for name, runs in extras.items():
                    self._extras[name] = (_expand(runs, self.count), _expand(present[name], self.count) if name in present else None)
        return self._extras

    # -- rows (on demand)
    def __getitem__(self, shard):
        if isinstance(shard, slice):
            return [self[i] for i in range(*shard.indices(self.count))]
        if shard < 0:
            shard += self.count
        if not 0 <= shard < self.count:
            raise IndexError(shard)
        row: dict[str, Any] = {"name": self.name(shard), "samples": int(self.samples[shard]),
                               "bytes": int(self.bytes[shard]), "sha256": self.sha256[shard].tobytes().hex()}
        if "index_bytes" in self.columns and ("indexed" not in self.columns or self.columns["indexed"][shard]):
            size = int(self.columns["index_bytes"][shard])
            row["index_offset"] = row["bytes"] - size - INDEX_TAIL
            row["index_bytes"] = size
            row["index_digest"] = f"xxh3_64:{int(self.columns['index_digest'][shard]):016x}"
        if self.unit_from_name:
            row["unit"] = int(self.columns["name_unit"][shard])
        for name, (values, present) in self.extras().items():
            value = values[shard]
            if value is not None or (present is not None and present[shard]):
                row[name] = value
        return row

    def __iter__(self) -> Iterator[dict]:
        for shard in range(self.count):
            yield self[shard]

    def __eq__(self, other) -> bool:
        if isinstance(other, (list, ShardTable)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def rows(self) -> list[dict]:
        return list(self)

    # -- the checks a manifest makes of its rows, on columns
    def check(self, split: str, entry: dict, totals: dict) -> None:
        where = self.where
        if self.split != split or self.count != entry.get("shards"):
            raise ManifestError(f"{where}: shard table is of split {self.split!r} with {self.count} shards; "
                                f"the manifest says split {split!r} with {entry.get('shards')}")
        if self.names_kind == "rule":
            pairs = self.columns["name_unit"].astype(np.int64) << 16 | self.columns["name_part"].astype(np.int64)
            # a conversion lists its shards in name order: then no name is twice when they increase
            duplicated = not (pairs[1:] > pairs[:-1]).all() and len(np.unique(pairs)) != self.count
        else:
            names = self.names()
            duplicated = len(set(names)) != self.count
            rule = re.compile(re.escape(split) + r"-\d{5,}-\d{2,}\.tar")
            bad = next((name for name in names if not rule.fullmatch(name)), None)
            if bad is not None:
                raise ManifestError(f"{where}: shard name {bad!r:.80} breaks the shard-name rule {split}-<unit:05d>-<part:02d>.tar")
        if duplicated:
            raise ManifestError(f"{where}: a shard is listed twice")
        if "index_bytes" in self.columns:
            size = self.columns["index_bytes"].astype(np.int64)
            bad = self.indexed() & ((size % 512 != 0) | (self.bytes.astype(np.int64) - size - INDEX_TAIL < 0))
            if bad.any():
                shard = int(np.flatnonzero(bad)[0])
                raise ManifestError(f"{where}: shard {self.name(shard)}: its sample index does not lie within the shard")
        for name in ("samples", "bytes"):
            actual = int(self.columns[name].sum(dtype=np.uint64))
            if totals.get(name) != actual:
                raise ManifestError(f"{where}: the manifest's splits.{split}.{name} says {totals.get(name)!r}, "
                                    f"but its shard table adds up to {actual}")


def _expand(runs, count: int) -> list:
    values: list = []
    for value, length in runs:
        values.extend([value] * int(length))
    if len(values) != count:
        raise ManifestError(f"shard table extras hold {len(values)} rows, not {count}")
    return values


def map_descriptor(fd: int):
    """The open file `fd` mapped read-only (b"" when empty): its pages are shared with every process
    that maps the same file."""
    size = os.fstat(fd).st_size
    return mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else b""


def _map(path: str, where: str):
    """The file at `path` mapped, refused in one line unless it is a regular file (a FIFO or device
    named like a table is never read or waited on: `files.open_to_read`)."""
    try:
        fd = open_to_read(path)
    except FileNotFoundError:
        raise ManifestError(f"{where}: shard table listed in the manifest is missing") from None
    except OSError as error:
        raise ManifestError(f"{where}: cannot read shard table ({error.strerror or error})") from None
    try:
        return map_descriptor(fd)
    except OSError as error:
        raise ManifestError(f"{where}: cannot read shard table ({error.strerror or error})") from None
    finally:
        os.close(fd)


def _mapped(path: str, where: str, record: dict | None = None) -> ShardTable:
    buffer = _map(path, where)
    if record is not None:
        checked_bytes(buffer, record, where)
    return ShardTable(buffer, where, path, record)


def table_problem(data, entry: dict) -> str | None:
    """What differs between a table's bytes and its manifest record (size, then sha256), or None."""
    if len(data) != entry["bytes"]:
        return f"shard table is {len(data)} bytes, the manifest says {entry['bytes']}"
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        return "shard table sha256 does not match the manifest"
    return None


def checked_bytes(data, entry: dict, where: str) -> None:
    """Refuse a table whose size or sha256 differ from its manifest record (one line naming it)."""
    problem = table_problem(data, entry)
    if problem is not None:
        raise ManifestError(f"{where}: {problem} (truncated, altered or replaced); re-convert or fetch it again")


def map_file(path: str, entry: dict, where: str | None = None) -> ShardTable:
    """The table at a local `path`, mapped read-only (shared with every process that maps it) and
    checked against its record before any of it is trusted."""
    where = where or path
    buffer = _map(path, where)
    checked_bytes(buffer, entry, where)
    return ShardTable(buffer, where, path, entry)


def from_bytes(data: bytes, entry: dict, where: str) -> ShardTable:
    checked_bytes(data, entry, where)
    return ShardTable(data, where)
