"""A split as the planner sees it: its shards' sample counts, narrowed by a selection.

`Catalog(manifest, split, selection)` is what an epoch is planned on (stream/planning/plan.py): `counts`, the
samples of each shard that the selection keeps (numpy, one entry per shard of the manifest, 0 for a
shard with none kept), and `members(shard)`, their sample numbers. Pieces of the plan are in
*selected positions*: position j of shard s is its j-th kept sample. Without a selection position j
is sample j, and everything is exactly what it was before selections existed (same order, same states).

A manifest whose rows live in a shard table (shards/shardtable.py) gives the catalog its columns:
`sizes` is a view of the table's `samples` column, `rows` the table itself and `urls` a `ShardURLs`
(each URL made when asked for), and `digest` is the one the table carries; so a catalog of 10^6
shards makes no Python object per shard.

A `Selection` is applied on the split's sample table (keys and indexed fields: `stream/planning/samples.py`),
never on sample data, in this order: `keys` (a list of keys, or the path of a file with one key per
line: `KeyFile`, read by `read_key_file` once the split is known), `select` (an expression over
indexed fields: stream/planning/select.py), `fraction` (exactly
round(f * n) of the samples kept so far, chosen by a permutation keyed by the dataset's seed: the
same subset in every epoch), `limit` (the first n kept, in manifest order). A selection that keeps
no sample, names a key the split lacks or a field that was not indexed is one `ConfigError` line.
Its `text` (canonical) goes into every state, so a state saved under another selection is refused.

A key file is data from anywhere (`keys = "/etc/shadow"` in a mix file): it is read as a regular file
only (a FIFO or device is refused unread, never waited on), at most what the split's keys can fill
(`key_file_limit`: a line per sample, each as long as the longest key, plus `KEY_FILE_SLACK`), as
strict UTF-8 (a bad byte is named by its offset), each line a well-formed key no longer than the
split's longest (else the line and its byte offset are named, never its text); a key it names that
the split lacks is shown escaped and cut to `SHOWN_KEY` characters, with its line.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, replace
from typing import Sequence as Sequence_

import numpy as np

from ...checks import number, refuse, whole_number
from ...errors import ConfigError
from ...shards.manifest import Manifest, join_url
from ...shards.shardtable import ShardTable, rows_digest
from ...shards.tarformat import KEY
from ...storage.files import read_regular
from .select import Expression

KEY_FILE_SLACK = 1 << 16  # blank lines and spaces a key file may hold beyond a line per key
SHOWN_KEY = 40  # characters of a key that is not in the split shown in the error
_NOT_IN_A_KEY = re.compile(r"[./\\\0]")  # what `tarformat.KEY` refuses anywhere in a key
_RESERVED = re.compile(r"^[^\S\n]*__", re.M)  # a line whose key starts with "__" (KEY refuses it too)


@dataclass(frozen=True)
class KeyFile:
    """A selection's `keys=` given as a file (one key a line): read by `read_key_file` when the split
    it selects from is known, which bounds it."""

    path: str


@dataclass(frozen=True)
class Selection:
    keys: tuple[str, ...] | KeyFile | None = None
    select: Expression | None = None
    fraction: float | None = None
    limit: int | None = None
    seed: int = 0

    @classmethod
    def of(cls, *, keys=None, select=None, fraction=None, limit=None, seed: int = 0) -> "Selection | None":
        """The selection these arguments ask for, checked; None when they ask for none."""
        if keys is None and select is None and fraction is None and limit is None:
            return None
        return cls(_keys(keys), None if select is None else Expression(select), _fraction(fraction), _limit(limit),
                   int(seed) if fraction is not None else 0)

    @property
    def text(self) -> str:
        """Canonical: what a state records (keys by the digest of their set: the samples kept do not
        depend on the order the keys were given in, nor on a key given twice)."""
        parts = {}
        if self.keys is not None:
            distinct = sorted(set(self.keys))
            parts["keys"] = hashlib.sha256("\n".join(distinct).encode()).hexdigest()[:16] + f"/{len(distinct)}"
        if self.select is not None:
            parts["select"] = self.select.text
        if self.fraction is not None:
            parts["fraction"] = [self.fraction, self.seed]
        if self.limit is not None:
            parts["limit"] = self.limit
        return json.dumps(parts, sort_keys=True)

    def describe(self) -> str:
        words = []
        if isinstance(self.keys, KeyFile):
            words.append(f"the keys of {self.keys.path}")
        elif self.keys is not None:
            words.append(f"{len(self.keys)} keys")
        if self.select is not None:
            words.append(f"select {self.select.source!r}")
        if self.fraction is not None:
            words.append(f"fraction {self.fraction}")
        if self.limit is not None:
            words.append(f"limit {self.limit}")
        return ", ".join(words)


def _keys(keys) -> tuple[str, ...] | KeyFile | None:
    if keys is None:
        return None
    if isinstance(keys, (str, os.PathLike)):
        path = os.fspath(keys)
        _read_key_bytes(path, 0)  # a file that is not there, or not a regular file: refused before any read
        return KeyFile(path)
    given, keys = keys, list(keys)
    if not all(isinstance(key, str) for key in keys):
        raise refuse(given, "keys", "must be a list of key strings, or the path of a file with one key per line")
    if not keys:
        raise ConfigError("keys: the list of keys is empty (a selection keeping no sample)")
    return tuple(keys)


def _read_key_bytes(path: str, limit: int) -> bytes:
    try:
        return read_regular(path, limit)
    except OSError as error:
        raise ConfigError(f"keys: cannot read the key file {path} ({error.strerror or error})") from None


def key_file_limit(samples: int, longest_key: int) -> int:
    """The most bytes a key file of a split of `samples` keys, the longest `longest_key` bytes, may
    hold: each key once on its own line (a CR LF ending), plus `KEY_FILE_SLACK`."""
    return samples * (longest_key + 2) + KEY_FILE_SLACK


def read_key_file(path: str, samples: int, longest_key: int, split: str) -> tuple[tuple[str, ...], list[str]]:
    """(the keys of the file at `path`, the file's lines: `_line_of` finds a key's) for a split of
    `samples` samples whose longest key is `longest_key` UTF-8 bytes; every problem one `ConfigError`
    line that names the file and where, and never shows the file's text (module docstring)."""
    limit = key_file_limit(samples, longest_key)
    data = _read_key_bytes(path, limit)
    if len(data) > limit:
        raise ConfigError(f"keys: the key file {path} holds more than the {samples} keys of split {split!r} fill "
                          f"(more than {limit} bytes: a key a line, the longest {longest_key} bytes)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"keys: the key file {path} is not UTF-8 text (byte {error.start})") from None
    lines = text.split("\n")
    keys = tuple(key for key in map(str.strip, lines) if key)
    size = len if text.isascii() else (lambda key: len(key.encode("utf-8")))
    # the whole file checked at once (10^6 keys: no Python step per key but the strip); a line that
    # fails is then looked for, to be named
    if max(map(size, keys), default=0) > longest_key or _NOT_IN_A_KEY.search(text) or _RESERVED.search(text):
        for number, line in enumerate(lines, 1):
            key = line.strip()
            problem = (f"longer than any key of split {split!r} ({size(key)} bytes, the longest is {longest_key})"
                       if size(key) > longest_key else None if not key or KEY.fullmatch(key)
                       else "not a sample key (a key has no '.', '/', '\\' or NUL and does not start with '__')")
            if problem:
                offset = len("\n".join(lines[: number - 1]).encode("utf-8")) + (number > 1)
                raise ConfigError(f"keys: line {number} of {path} (byte {offset}) is {problem}")
    if not keys:
        raise ConfigError(f"keys: the key file {path} lists no key (a selection keeping no sample)")
    return keys, lines


def _line_of(lines: list[str], key: str) -> int:
    """The number of the first line of a key file that holds `key`."""
    return next(number for number, line in enumerate(lines, 1) if line.strip() == key)


def _shown(key: str) -> str:
    """A key the split lacks, as an error shows it: escaped, and cut to `SHOWN_KEY` characters."""
    return repr(key) if len(key) <= SHOWN_KEY else repr(key[:SHOWN_KEY]) + "..."


def _fraction(fraction) -> float | None:
    return None if fraction is None else number(fraction, "fraction", 0, "the share of the samples kept", above=True,
                                                maximum=1)


def _limit(limit) -> int | None:
    return None if limit is None else whole_number(limit, "limit", 1, "the first samples kept", text=False)


class Catalog:
    """One split of one manifest, narrowed by a selection (see the module docstring)."""

    def __init__(self, manifest: Manifest, split: str, selection: Selection | None = None):
        self.manifest, self.split, self.selection = manifest, split, selection
        self.rows = manifest.shards(split)
        if isinstance(self.rows, ShardTable):  # columns over the mapped table: no object per shard
            self.urls = ShardURLs(manifest.base_url(), self.rows)
            self.sizes = self.rows.samples.astype(np.int64)
        else:  # inline rows (a manifest of version 1)
            self.urls = manifest.shard_urls(split)
            self.sizes = np.fromiter((row["samples"] for row in self.rows), dtype=np.int64, count=len(self.rows))
        self._members: tuple[np.ndarray, np.ndarray] | None = None  # CSR: (offsets per shard, sample numbers)
        self.counts = self.sizes
        if selection is not None:
            self.selection, kept = self._apply(selection)  # a key file read: the selection of its keys
            shard_of = np.repeat(np.arange(len(self.sizes)), self.sizes)[kept]
            self.counts = np.bincount(shard_of, minlength=len(self.sizes)).astype(np.int64)
            starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
            numbers = kept - starts[shard_of]
            self._members = (np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64), numbers.astype(np.int64))
        self._digest: str | None = None

    def _apply(self, selection: Selection) -> tuple[Selection, np.ndarray]:
        """(the selection, its key file read; the positions, in manifest order over the split, of
        the samples it keeps)."""
        from .samples import sample_table

        total = int(self.sizes.sum())
        kept = np.ones(total, dtype=bool)
        if selection.keys is not None or selection.select is not None:
            table = sample_table(self.manifest, self.split)
            if selection.keys is not None:
                lines = None
                if isinstance(selection.keys, KeyFile):
                    file = selection.keys.path
                    keys, lines = read_key_file(file, total, table.longest_key, self.split)
                    selection = replace(selection, keys=keys)
                position = table.positions()
                missing = [at for at, key in enumerate(selection.keys) if key not in position]
                if missing:
                    first = selection.keys[missing[0]]
                    line = f" (line {_line_of(lines, first)} of {file})" if lines is not None else ""
                    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
                    raise ConfigError(f"keys: {_shown(first)}{line}{more} not in split "
                                      f"{self.split!r} of {self._where()}")
                wanted = np.zeros(total, dtype=bool)
                wanted[[position[key] for key in selection.keys]] = True
                kept &= wanted
            if selection.select is not None:
                kept &= selection.select.evaluate(table.fields, total)
        positions = np.flatnonzero(kept)
        if selection.fraction is not None:
            count = int(round(selection.fraction * len(positions)))
            rng = np.random.Generator(np.random.PCG64([selection.seed & 0xFFFFFFFF, 0xF4AC]))
            positions = np.sort(positions[rng.permutation(len(positions))[:count]])
        if selection.limit is not None:
            positions = positions[: selection.limit]
        if not len(positions):
            raise ConfigError(f"the selection ({selection.describe()}) keeps no sample of split {self.split!r} "
                              f"of {self._where()}")
        return selection, positions

    def _where(self) -> str:
        return self.manifest.url or "the manifest"

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def members(self, shard: int) -> np.ndarray | None:
        """The sample numbers kept in `shard` (sorted), or None: all of them."""
        if self._members is None:
            return None
        offsets, numbers = self._members
        return numbers[offsets[shard] : offsets[shard + 1]]

    def positions(self) -> np.ndarray:
        """The kept samples' numbers over the split (manifest order: shard by shard), sorted."""
        if self._members is None:
            return np.arange(int(self.sizes.sum()), dtype=np.int64)
        offsets, numbers = self._members
        starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        return numbers + np.repeat(starts, np.diff(offsets))

    def runs(self, shard: int, first: int, stop: int) -> list[tuple[int, int]]:
        """The samples at selected positions [first, stop) of `shard`, as runs [a, b) of consecutive
        sample numbers."""
        members = self.members(shard)
        if members is None:
            return [(first, stop)] if first < stop else []
        numbers = members[first:stop]
        if not len(numbers):
            return []
        breaks = np.flatnonzero(np.diff(numbers) != 1) + 1
        heads = np.concatenate([[0], breaks])
        tails = np.concatenate([breaks, [len(numbers)]])
        return [(int(numbers[h]), int(numbers[t - 1]) + 1) for h, t in zip(heads, tails)]

    @property
    def digest(self) -> str:
        """Names, counts and sha256 of the split's shards: what a saved state must have been read from."""
        if self._digest is None:
            # a shard table carries it, written with it (shards/shardtable.py), checked with its sha256
            self._digest = self.rows.digest if isinstance(self.rows, ShardTable) else rows_digest(self.rows)
        return self._digest

    def same_samples(self, other: "Catalog") -> bool:
        """Whether `other` keeps exactly the samples this one keeps, of the same shards and split,
        whatever the two selections say (`limit=10**9` and none, two `select=` that agree, ...)."""
        if self.digest != other.digest or self.split != other.split or not np.array_equal(self.counts, other.counts):
            return False
        if self._members is None or other._members is None:
            return True  # equal counts, one keeping every sample of each shard: so does the other
        return np.array_equal(self._members[1], other._members[1])

    @property
    def selection_text(self) -> str | None:
        return None if self.selection is None else self.selection.text


class ShardURLs:
    """The URLs of a shard table's shards, made when asked for (`urls[i]`), not one string per shard."""

    def __init__(self, base: str, table: ShardTable):
        self.base, self.table = base, table

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, shard):
        if isinstance(shard, slice):
            return [self[i] for i in range(*shard.indices(len(self.table)))]
        if shard < 0:
            shard += len(self.table)
        if not 0 <= shard < len(self.table):
            raise IndexError(shard)
        return join_url(self.base, self.table.name(shard))

    def __iter__(self):
        return (self[i] for i in range(len(self.table)))


def catalog_of(manifest: Manifest, split: str, *, seed: int = 0, keys=None, select=None, fraction=None,
               limit=None) -> Catalog:
    return Catalog(manifest, split, Selection.of(keys=keys, select=select, fraction=fraction, limit=limit, seed=seed))


__all__: Sequence_[str] = ("Catalog", "Selection", "catalog_of")
