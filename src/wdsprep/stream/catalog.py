"""A split as the planner sees it: its shards' sample counts, narrowed by a selection.

`Catalog(manifest, split, selection)` is what an epoch is planned on (stream/plan.py): `counts`, the
samples of each shard that the selection keeps (numpy, one entry per shard of the manifest, 0 for a
shard with none kept), and `members(shard)`, their sample numbers. Pieces of the plan are in
*selected positions*: position j of shard s is its j-th kept sample. Without a selection position j
is sample j, and everything is exactly what it was before selections existed (same order, same states).

A manifest whose rows live in a shard table (shards/shardtable.py) gives the catalog its columns:
`sizes` is a view of the table's `samples` column, `rows` the table itself and `urls` a `ShardURLs`
(each URL made when asked for), and `digest` is the one the table carries; so a catalog of 10^6
shards makes no Python object per shard.

A `Selection` is applied on the split's sample table (keys and indexed fields: `stream/samples.py`),
never on sample data, in this order: `keys` (a list of keys, or the path of a file with one key per
line), `select` (an expression over indexed fields: stream/select.py), `fraction` (exactly
round(f * n) of the samples kept so far, chosen by a permutation keyed by the dataset's seed: the
same subset in every epoch), `limit` (the first n kept, in manifest order). A selection that keeps
no sample, names a key the split lacks or a field that was not indexed is one `ConfigError` line.
Its `text` (canonical) goes into every state, so a state saved under another selection is refused.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Sequence as Sequence_

import numpy as np

from ..checks import number, refuse, whole_number
from ..errors import ConfigError
from ..shards.manifest import Manifest, join_url
from ..shards.shardtable import ShardTable, rows_digest
from .select import Expression


@dataclass(frozen=True)
class Selection:
    keys: tuple[str, ...] | None = None
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
        if self.keys is not None:
            words.append(f"{len(self.keys)} keys")
        if self.select is not None:
            words.append(f"select {self.select.source!r}")
        if self.fraction is not None:
            words.append(f"fraction {self.fraction}")
        if self.limit is not None:
            words.append(f"limit {self.limit}")
        return ", ".join(words)


def _keys(keys) -> tuple[str, ...] | None:
    if keys is None:
        return None
    if isinstance(keys, (str, os.PathLike)):
        path = os.fspath(keys)
        try:
            with open(path, encoding="utf-8") as file:
                keys = [line.strip() for line in file if line.strip()]
        except OSError as error:
            raise ConfigError(f"keys: cannot read the key file {path} ({error.strerror or error})") from None
    else:
        given, keys = keys, list(keys)
        if not all(isinstance(key, str) for key in keys):
            raise refuse(given, "keys", "must be a list of key strings, or the path of a file with one key per line")
    if not keys:
        raise ConfigError("keys: the list of keys is empty (a selection keeping no sample)")
    return tuple(keys)


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
            kept = self._apply(selection)
            shard_of = np.repeat(np.arange(len(self.sizes)), self.sizes)[kept]
            self.counts = np.bincount(shard_of, minlength=len(self.sizes)).astype(np.int64)
            starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
            numbers = kept - starts[shard_of]
            self._members = (np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64), numbers.astype(np.int64))
        self._digest: str | None = None

    def _apply(self, selection: Selection) -> np.ndarray:
        """Positions (in manifest order over the split) of the samples the selection keeps."""
        from .samples import sample_table

        total = int(self.sizes.sum())
        kept = np.ones(total, dtype=bool)
        if selection.keys is not None or selection.select is not None:
            table = sample_table(self.manifest, self.split)
            if selection.keys is not None:
                position = table.positions()
                missing = [key for key in selection.keys if key not in position]
                if missing:
                    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
                    raise ConfigError(f"keys: {missing[0]!r}{more} not in split {self.split!r} of {self._where()}")
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
        return positions

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
