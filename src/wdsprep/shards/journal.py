"""`_units.json`, the conversion's journal beside the manifest: the units a conversion completed.

The first line holds the conversion config; each further line is one completed unit (`UnitResult`
as JSON: its split and index, its digest, the rows of its shards, its problems, tables and input
bytes, and its samples' keys and index field values in written order). The conversion driver (`wdsprep.conversion`) appends a unit when its shards check out in the
store and reads the journal again when a run resumes; `wdsprep reindex` gives the rows of the shards
it rewrote their new fields here, so a later re-run of the conversion still reuses those units.

Invariants: a journal of another config is worth nothing (`load_units` returns no unit, and the
first record of a new run replaces it); a torn line (a crash mid-append) only costs a rebuild of its
unit, never the journal; nothing is written before a run's first unit is done, so a run that fails
at once leaves the output as it was. The journal is used only through `Store` methods (a local
directory appends, a store that cannot append gets the whole file rewritten).
"""
from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

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


def load_units(store: Store, config: dict) -> dict[str, UnitResult]:
    """Completed units of an earlier run with the same config (JSON lines); each unit's digest holds
    its inputs' fingerprints, so a changed input only loses the units it feeds."""
    raw = store.read_bytes(UNITS_NAME)
    if raw is None:
        return {}
    lines = raw.splitlines()
    try:
        head = json.loads(lines[0])
        if head.get("config") != json.loads(json.dumps(config)):
            return {}
    except (ValueError, IndexError, AttributeError):
        return {}
    units = {}
    for line in lines[1:]:
        try:
            record = UnitResult(**json.loads(line))
        except (ValueError, TypeError):
            continue  # a torn last line after a crash only costs a rebuild of that unit
        units[record.digest] = record
    return units


def replace_unit_rows(store: Store, rows: dict[str, dict], keys: Mapping[str, list[str]] | None = None) -> None:
    """Give the shards named in `rows` (name -> new row fields) their new rows in `_units.json`, so a
    re-run of the conversion still finds its units' shards as recorded (`wdsprep reindex`); a record
    of an older wdsprep without its samples gets their keys (no index field) where `keys` (shard
    name -> its keys) has every shard of the unit."""
    raw = store.read_bytes(UNITS_NAME)
    if raw is None:
        return
    lines = raw.decode().splitlines()
    for number, line in enumerate(lines[1:], 1):
        try:
            record = json.loads(line)
            record["rows"] = [dict(row, **rows.get(row["name"], {})) for row in record["rows"]]
            if record.get("samples") is None and keys and all(row["name"] in keys for row in record["rows"]):
                record["samples"] = {"keys": [key for row in record["rows"] for key in keys[row["name"]]], "fields": {}}
        except (ValueError, TypeError, KeyError):
            continue  # a torn line: that unit is rebuilt by the next conversion, as after a crash
        lines[number] = json.dumps(record, sort_keys=True, default=str)
    store.write_bytes(UNITS_NAME, ("\n".join(lines) + "\n").encode())


class UnitJournal:
    """Appends each finished unit to `_units.json` at once (stores that cannot append get the whole
    file rewritten at most once a second, at every `durable` record, and at the end). Nothing is
    written before the first unit of this run is done, so a run that fails at once leaves the
    output as it was."""

    def __init__(self, store: Store, config: dict, done: dict[str, UnitResult]):
        self.store = store
        self.lines = [json.dumps({"config": config}, sort_keys=True, default=str)]
        self.lines += [json.dumps(asdict(r), sort_keys=True, default=str) for r in done.values()]
        self.can_append = store.supports_append
        self.written = False
        self.last_flush = time.monotonic()

    def record(self, result: UnitResult, durable: bool = False) -> None:
        line = json.dumps(asdict(result), sort_keys=True, default=str)
        self.lines.append(line)
        if not self.written or (not self.can_append and (durable or time.monotonic() - self.last_flush > 1.0)):
            self._rewrite()  # the first record replaces a journal of an earlier config
        elif self.can_append:
            self.store.append_bytes(UNITS_NAME, (line + "\n").encode())

    def close(self) -> None:
        if self.written and not self.can_append:
            self._rewrite()

    def _rewrite(self) -> None:
        self.store.write_bytes(UNITS_NAME, ("\n".join(self.lines) + "\n").encode())
        self.written = True
        self.last_flush = time.monotonic()
