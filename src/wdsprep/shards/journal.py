"""`_units.json`, the conversion's journal beside the manifest: the units a conversion completed.

The first line holds the conversion config and the journal's format (`FORMAT`); each further line is
one completed unit (`UnitResult`: its split and index, its digest, the rows of its shards, its
problems, tables and input bytes, and its samples' keys and index field values in written order).
The conversion driver (`wdsprep.conversion`) records a unit when its shards check out in the store
and reads the journal again when a run resumes; `wdsprep reindex` gives the rows of the shards it
rewrote their new fields here, so a later re-run of the conversion still reuses those units.

Compact (issue 40: 10^5 shards wrote 42 MB of journal). A unit's line is `{"d": digest, "u": [split,
index, input bytes], "r": rows, "s": [keys, fields], "p": problems, "t": tables}` (`p`, `t` only
when not empty, `s` only when the samples are known). A row is a list of `ROW_COLUMNS` values whose
name is null when it is the one the writer gives part `k` of the unit (`<split>-<index:05d>-<k:02d>.tar`)
and whose `unit` (the record's index) is implied; a row that does not fit this (an older row without
index fields, a name of its own, another key) is kept as its JSON object. Decoding gives back the
very rows and samples that were recorded. A journal without a format (wdsprep before issue 40: one
`UnitResult` object per line) is still read; one of another format reuses no unit (never an error).

Invariants: a journal of another config is worth nothing (`load_units` returns no unit, and the
first record of a new run replaces it); a torn line (a crash mid-append) only costs a rebuild of its
unit, never the journal; nothing is written before a run's first unit is done, so a run that fails
at once leaves the output as it was. Records reach the store in batches (`UnitJournal`): at once when
`durable`, else at most `FLUSH_SECONDS` after they were made and at `close`; a process killed between
two flushes loses only those units' records (they are built again, into the same bytes), where one
append and fsync per unit made 10^5 tiny units wait on the disk in the driver. The journal is used only
through `Store` methods (a local directory appends, a store that cannot append gets the whole file
rewritten, no more often than `FLUSH_SECONDS` nor than 20 times the last rewrite took).
"""
from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..storage.base import Store
from .manifest import MANIFEST_NAME
from .samples import SUFFIX as TABLE_SUFFIX

UNITS_NAME = "_units.json"


def written_by_conversion(name: str) -> bool:
    """Names a conversion (and `reindex`) may write, replace or remove in its output: the manifest,
    the units record, shards, sample tables and temporaries. One that exists and is not a regular file is refused
    before any work (`Store.check_replaceable`)."""
    return name in (MANIFEST_NAME, UNITS_NAME) or name.endswith((".tar", ".tmp", TABLE_SUFFIX))


@dataclass
class UnitResult:
    split: str
    index: int
    digest: str
    rows: list[dict]
    problems: list[dict] = field(default_factory=list)
    tables: dict = field(default_factory=dict)
    input_bytes: int = 0
    # the unit's samples in written order: {"keys": [...], "fields": {name: [value or None per key]}}
    samples: dict | None = None


FORMAT = "wdsprep-units/2"
ROW_COLUMNS = ("name", "samples", "bytes", "sha256", "index_offset", "index_bytes", "index_digest")
FLUSH_SECONDS = 1.0


def part_name(split: str, index: int, part: int) -> str:
    """The name the shard writer gives part `part` of unit `index` of `split`."""
    return f"{split}-{index:05d}-{part:02d}.tar"


def encode_record(result: UnitResult) -> str:
    """One journal line for `result` (the compact form: see the module docstring)."""
    record: dict = {"d": result.digest, "u": [result.split, result.index, result.input_bytes],
                    "r": [_encode_row(row, result, part) for part, row in enumerate(result.rows)]}
    if result.samples is not None:
        record["s"] = [result.samples["keys"], result.samples["fields"]]
    if result.problems:
        record["p"] = result.problems
    if result.tables:
        record["t"] = result.tables
    return json.dumps(record, separators=(",", ":"), default=str)


def decode_record(record: dict) -> UnitResult:
    """The `UnitResult` of one compact journal line's object (ValueError/TypeError/KeyError if malformed)."""
    split, index, input_bytes = record["u"]
    if not isinstance(split, str) or type(index) is not int or not isinstance(record["d"], str):
        raise ValueError("malformed unit record")
    rows = [_decode_row(row, split, index, part) for part, row in enumerate(record["r"])]
    samples = None
    if "s" in record:
        keys, fields = record["s"]
        samples = {"keys": keys, "fields": fields}
    return UnitResult(split, index, record["d"], rows, record.get("p", []), record.get("t", {}), input_bytes, samples)


def _encode_row(row: dict, result: UnitResult, part: int):
    if row.keys() != {*ROW_COLUMNS, "unit"} or row["unit"] != result.index:
        return row  # not the shape this form abbreviates: kept whole
    values = [row[column] for column in ROW_COLUMNS]
    if values[0] == part_name(result.split, result.index, part):
        values[0] = None
    return values


def _decode_row(row, split: str, index: int, part: int) -> dict:
    if isinstance(row, dict):
        return row
    if not isinstance(row, list) or len(row) != len(ROW_COLUMNS):
        raise ValueError("malformed shard row")
    decoded = dict(zip(ROW_COLUMNS, row))
    if decoded["name"] is None:
        decoded["name"] = part_name(split, index, part)
    decoded["unit"] = index
    return decoded


def _decode_line(line: bytes | str, compact: bool) -> UnitResult:
    record = json.loads(line)
    return decode_record(record) if compact else UnitResult(**record)


def _head(config: dict) -> str:
    return json.dumps({"config": config, "format": FORMAT}, sort_keys=True, default=str)


def load_units(store: Store, config: dict) -> dict[str, UnitResult]:
    """Completed units of an earlier run with the same config (JSON lines); each unit's digest holds
    its inputs' fingerprints, so a changed input only loses the units it feeds."""
    raw = store.read_bytes(UNITS_NAME)
    if raw is None:
        return {}
    lines = raw.splitlines()
    try:
        head = json.loads(lines[0])
        if head.get("config") != json.loads(json.dumps(config)) or head.get("format", FORMAT) != FORMAT:
            return {}
    except (ValueError, IndexError, AttributeError):
        return {}
    compact = "format" in head  # else written before issue 40: one UnitResult object per line
    units = {}
    for line in lines[1:]:
        try:
            record = _decode_line(line, compact)
        except (ValueError, TypeError, KeyError, AttributeError):
            continue  # a torn last line after a crash only costs a rebuild of that unit
        units[record.digest] = record
    return units


def replace_unit_rows(store: Store, rows: dict[str, dict], keys: Mapping[str, list[str]] | None = None) -> None:
    """Give the shards named in `rows` (name -> new row fields) their new rows in `_units.json`, so a
    re-run of the conversion still finds its units' shards as recorded (`wdsprep reindex`); a record
    of an older wdsprep without its samples gets their keys (no index field) where `keys` (shard
    name -> its keys) has every shard of the unit. The journal comes back in the current format."""
    raw = store.read_bytes(UNITS_NAME)
    if raw is None:
        return
    lines = raw.decode().splitlines()
    try:
        head = json.loads(lines[0])
        compact = "format" in head
        if head.get("format", FORMAT) != FORMAT:
            return  # a journal of another format reuses no unit anyway
        lines[0] = _head(head["config"])
    except (ValueError, IndexError, AttributeError, KeyError, TypeError):
        return  # no config to keep: the next conversion starts a journal of its own
    for number, line in enumerate(lines[1:], 1):
        try:
            record = _decode_line(line, compact)
            record.rows = [dict(row, **rows.get(row["name"], {})) for row in record.rows]
            if record.samples is None and keys and all(row["name"] in keys for row in record.rows):
                record.samples = {"keys": [key for row in record.rows for key in keys[row["name"]]], "fields": {}}
        except (ValueError, TypeError, KeyError, AttributeError):
            continue  # a torn line: that unit is rebuilt by the next conversion, as after a crash
        lines[number] = encode_record(record)
    store.write_bytes(UNITS_NAME, ("\n".join(lines) + "\n").encode())


class UnitJournal:
    """Records finished units in `_units.json` in batches (see the module docstring): a store that can
    append gets the new lines appended, one that cannot gets the whole file rewritten. Nothing is
    written before the first unit of this run is done, so a run that fails at once leaves the
    output as it was; that first write replaces the journal (of an earlier config or format)."""

    def __init__(self, store: Store, config: dict, done: dict[str, UnitResult]):
        self.store = store
        self.lines = [_head(config)] + [encode_record(r) for r in done.values()]
        self.pending: list[str] = []
        self.can_append = store.supports_append
        self.written = False
        self.last_flush = time.monotonic()
        self.rewrite_seconds = 0.0

    def record(self, result: UnitResult, durable: bool = False) -> None:
        self.pending.append(encode_record(result))
        interval = max(FLUSH_SECONDS, 20 * self.rewrite_seconds)  # rewrites of a large journal: rarely
        if durable or not self.written or time.monotonic() - self.last_flush > interval:
            self._flush()

    def close(self) -> None:
        if self.pending:
            self._flush()

    def _flush(self) -> None:
        if self.written and self.can_append:
            self.store.append_bytes(UNITS_NAME, "".join(line + "\n" for line in self.pending).encode())
        else:
            started = time.monotonic()
            self.lines += self.pending
            self.store.write_bytes(UNITS_NAME, ("\n".join(self.lines) + "\n").encode())
            self.rewrite_seconds = time.monotonic() - started
            if self.can_append:
                self.lines = []  # appended from now on: the lines are not needed again
        self.pending = []
        self.written = True
        self.last_flush = time.monotonic()
