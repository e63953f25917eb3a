"""`wdsprep.MapDataset(location, split)`: any sample of a split by its position or its key, from any
location (a directory, `file://`, `http(s)://`, `s3://`), checked before it is returned: a map-style
dataset for a plain torch `DataLoader` with any sampler (`DistributedSampler` included).

Positions. Position i is the i-th sample of the split in manifest order (shard after shard, samples
in shard order): the order of the unshuffled stream, `wdsprep.dataset(..., shuffle_shards=False)`.
A selection (`keys=`, `select=`, `fraction=`, `limit=`, with `seed=` for the fraction: the catalog's,
stream/planning/catalog.py, the same as `wdsprep.dataset`'s) narrows it: position i is then the i-th sample
the selection keeps, in manifest order. `len` and the shard of a position come from the catalog's
per-shard counts (a binary search over their running sums), the sample number from its members: no
shard is read for them. Negative positions count from the end, like a list's; any other position
out of range is an `IndexError` naming the length.

Reading. `ds[i]` reads one sample and `ds[a:b:c]` the list of a slice's samples, read together;
`ds.__getitems__(indices)`, which torch's DataLoader calls with
each batch of its sampler's indices, reads a batch in one call of `ShardAccess.read`
(stream/reading/access.py): per shard, the samples whose bytes lie next to each other (or at most
`gap_bytes` apart remotely) come in ONE read, a bounded Range request remotely, the requests of
different shards in parallel over the pooled connections the read-ahead uses, with the dataset's
`ReadOptions` (`read_options=` and the read keywords, as `wdsprep.dataset` takes them: retries,
timeouts, `max_connections`, `gap_bytes`, the cache); each shard's index is loaded at its first use
and kept; every member is checked against its digest in the index before the
sample is returned (a `ShardError` naming the shard and the member otherwise); with `cache_dir`,
remote shards are read from the local shard cache, downloaded whole at first use. `ds.stats` counts
this process's requests. `ds.read(indices, members)` gives raw samples with only some members, and
`ds.by_shard(members)` scans the dataset one shard at a time: what the source-specific map-style
classes (voxels, rawnind, minecraft) read with.

Keys. `ds.get(key)` is the sample with that key, `ds.position(key)` its position, `ds.keys()` every
key in position order (a `KeyError` names a key the split lacks, or the selection left out). They
come from the split's sample table when the conversion wrote one, else from every shard's index
(loaded together on the first call).

Items. `decode=True` decodes like `wdsprep.decode()` (fields keep their extensions, `__key__` the
only bookkeeping); `decode=wdsprep.decode(strip=True, torch=True, bookkeeping=...)` takes that
stage's options; `decode=False` gives the raw bytes (with `__url__`). Then `stage`, a reader stage as `.compose()` takes it (a function of an iterable of
samples: a source's, e.g. `wdsprep.noisebase.frames(...)`), runs on the one sample and must make
exactly one output (a stage that expands a sample into several, like ray chunks or crops, belongs to
its source's map-style class or to the stream); then `transform`, a function of one sample.

Processes. The dataset pickles without anything open (DataLoader workers, forked or spawned): each
process opens its own descriptors and connections at its first read.
"""
from __future__ import annotations

import bisect
import operator
import os
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from ..checks import function, refuse
from ..errors import ConfigError
from ..readoptions import ReadOptions
from ..shards.manifest import Manifest
from ..shards.samples import SampleTable as StoredTable
from ..shards.samples import table_entry
from .reading.access import ShardAccess
from .planning.catalog import catalog_of
from .decode import Decode, ReaderStage
from .manifests import load_manifest, shard_row
from .reading.unpack import sample_member_names

try:  # a torch Dataset when torch is there (it always is with wdsprep's readers)
    from torch.utils.data import Dataset as _Base
except ImportError:  # pragma: no cover
    _Base = object


class MapDataset(_Base):
    """The samples of one split by position and by key (see the module docstring).

    `location`: a manifest location (its file or directory, any scheme) or a loaded `Manifest`; or a
    list of shard paths or URLs (each one's row from the manifest beside it; no selection then).
    The read side's settings as `wdsprep.dataset` takes them (`ReadOptions.given`): `read_options=`
    (a `wdsprep.ReadOptions`; None: the `WDSPREP_*` environment's) and its fields as keywords, each
    overriding it: among them `cache_dir` / `cache_bytes` (the local shard cache, stream/reading/cache.py;
    default 10 GB when only `cache_dir` is given), `max_connections` (remote requests at once;
    default: the read-ahead's share per DataLoader worker), `gap_bytes` (samples of one remote shard
    at most this many bytes apart are read by one request, the bytes between dropped; locally,
    touching samples are), `retries`, `timeout`. Every value is checked before anything is read.
    """

    def __init__(self, location, split: str = "train", *, keys=None, select: str | None = None,
                 fraction: float | None = None, limit: int | None = None, seed: int = 0,
                 decode: bool | ReaderStage = True, stage: Callable | None = None,
                 transform: Callable | None = None, read_options: ReadOptions | None = None, **read: Any):
        self.read_options = ReadOptions.given(read_options, **read)
        self.split = split
        self.decoder = _decoder(decode)
        self.stage = function(stage, "stage", "a reader stage run on each sample", optional=True)
        self.transform = function(transform, "transform", "applied to each item last", optional=True)
        selection = dict(keys=keys, select=select, fraction=fraction, limit=limit)
        if _is_shard_list(location):
            if any(value is not None for value in selection.values()):
                raise ConfigError("keys=, select=, fraction= and limit= select on a split's manifest: give its "
                                  "location, not a list of shards")
            self.manifest, self.catalog = None, None
            urls = [str(url) for url in ([location] if isinstance(location, (str, os.PathLike)) else location)]
            if not urls:
                raise ConfigError("no shards given")
            manifests: dict = {}
            rows = [shard_row(url, manifests) for url in urls]
            self.where = "the shards given"
            counts = np.array([row["samples"] for row in rows], dtype=np.int64)
        else:
            self.manifest = location if isinstance(location, Manifest) else load_manifest(os.fspath(location), self.read_options)
            self.catalog = catalog_of(self.manifest, split, seed=seed, **selection)
            urls, rows, counts = self.catalog.urls, self.catalog.rows, self.catalog.counts
            self.where = self.manifest.url or "the manifest"
        cache = None
        if self.read_options.cache_dir is not None:
            from .reading.cache import ShardCache

            cache = ShardCache(self.read_options.cache_dir, self.read_options.cache_bytes, self.read_options)
        self.access = ShardAccess(urls, rows, cache=cache, options=self.read_options)
        self.counts = counts
        self._ends = np.cumsum(counts).tolist()  # positions before the end of each shard
        self._keys: list[str] | None = None  # position -> key (built by the first key lookup)
        self._positions: dict[str, int] | None = None

    # -- sizes and positions
    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    @property
    def urls(self) -> list[str]:
        return self.access.urls

    @property
    def stats(self) -> dict:
        """What this process did so far (stream/reading/access.py): requests, index_requests, downloads, bytes, reads."""
        return dict(self.access.stats)

    def locate(self, index: int) -> tuple[int, int]:
        """(shard, sample number in it) of position `index` (negative: from the end)."""
        position = operator.index(index)
        length = len(self)
        if position < 0:
            position += length
        if not 0 <= position < length:
            raise IndexError(f"index {index} out of range: split {self.split!r} of {self.where} has {length} "
                             f"samples{' selected' if self.catalog is not None and self.catalog.selection else ''}")
        shard = bisect.bisect_right(self._ends, position)
        kept = position - (self._ends[shard] - int(self.counts[shard]))
        members = self.catalog.members(shard) if self.catalog is not None else None
        return shard, kept if members is None else int(members[kept])

    def member_names(self, index: int) -> tuple[str, ...]:
        """The member names of the sample at `index` (from its shard's index)."""
        shard, number = self.locate(index)
        return sample_member_names(self.access, shard, number)

    # -- reading
    def __getitem__(self, index: int | slice):
        """The item at a position (negative: from the end), or at each position of a slice, as a
        list read together (`__getitems__`: one batch). A key is `get(key)`."""
        if isinstance(index, slice):
            return self.__getitems__(range(*index.indices(len(self))))
        try:
            operator.index(index)
        except TypeError:
            what = f"the string {index!r} (a sample by key is ds.get(key))" if isinstance(index, str) else type(index).__name__
            raise TypeError(f"MapDataset indices are positions (integers) or slices, not {what}") from None
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list:
        """The items at `indices`, in that order, read together (torch's DataLoader calls this with a batch)."""
        return [self._item(raw) for raw in self.read(indices)]

    def read(self, indices: Iterable[int], members: Sequence[str] | None = None) -> list[dict]:
        """The raw samples at `indices` (`__key__`, `__url__`, member -> bytes), with only the
        `members` named (None: all of them), read together and checked."""
        return self.access.read([(*self.locate(index), members) for index in indices])

    def by_shard(self, members: Sequence[str] | None = None) -> Iterator[tuple[range, list[dict]]]:
        """(positions, raw samples) of each shard in turn, with only `members` (None: all): a scan of
        the whole dataset that holds one shard's samples at a time."""
        start = 0
        for count in self.counts.tolist():
            positions = range(start, start + count)
            start += count
            if count:
                yield positions, self.read(positions, members)

    def _item(self, raw: dict):
        sample = self.decoder.sample(raw) if self.decoder is not None else raw
        if self.stage is not None:
            outputs = list(self.stage(iter([sample])))
            if len(outputs) != 1:
                raise ConfigError(f"the stage made {len(outputs)} samples of sample {raw['__key__']!r} "
                                  f"({raw['__url__']}); a MapDataset item is one sample: read a stage that splits or "
                                  "drops samples with its source's map-style class, or stream it")
            sample = outputs[0]
        return self.transform(sample) if self.transform is not None else sample

    def close(self) -> None:
        """Close this process's open shards and threads (they come back on the next read)."""
        self.access.close()

    # -- keys
    def keys(self) -> list[str]:
        """Every key, in position order."""
        if self._keys is None:
            split_keys = self._split_keys()
            starts = np.concatenate([[0], np.cumsum([row["samples"] for row in self.access.rows])[:-1]]).astype(np.int64)
            numbers = []
            for shard, count in enumerate(self.counts.tolist()):
                members = self.catalog.members(shard) if self.catalog is not None else None
                numbers.append(starts[shard] + (np.arange(count) if members is None else members))
            self._keys = [split_keys[n] for n in np.concatenate(numbers).tolist()] if numbers else []
        return list(self._keys)

    def position(self, key: str) -> int:
        """The position of the sample with `key`."""
        if self._positions is None:
            self.keys()
            self._positions = {key: position for position, key in enumerate(self._keys)}
        position = self._positions.get(key)
        if position is None:
            if self.catalog is not None and self.catalog.selection is not None and key in set(self._split_keys()):
                raise KeyError(f"{key!r} is in split {self.split!r} of {self.where} but not in the selection "
                               f"({self.catalog.selection.describe()})")
            raise KeyError(f"{key!r} is not in split {self.split!r} of {self.where}")
        return position

    def get(self, key: str):
        """The item with `key` (a `KeyError` naming it and the split when there is none)."""
        return self[self.position(key)]

    def _split_keys(self) -> list[str]:
        """Every key of the split (kept or not) in manifest order: its sample table's, else its shard indexes'."""
        if self.manifest is not None and (entry := table_entry(self.manifest, self.split)) is not None:
            return StoredTable.load(self.manifest, self.split, entry).keys
        indexes = self.access.indexes(range(len(self.access.rows)))
        return [key for shard in range(len(self.access.rows)) for key in indexes[shard].sample_keys()]

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_positions"] = None  # rebuilt where needed
        return state


def _decoder(decode) -> Decode | None:
    """The decode stage `decode=` asks for: True (`wdsprep.decode()`), False (None: raw), or a decode stage."""
    if decode is True:
        return Decode()
    if decode is False or decode is None:
        return None
    if isinstance(decode, ReaderStage):
        if getattr(decode, "handler", None) is not None:
            raise ConfigError("decode=wdsprep.decode(handler=...): a MapDataset item cannot be skipped; a sample "
                              "that does not decode raises ShardError (give the stage without a handler)")
        return decode
    raise refuse(decode, "decode", "must be True, False or a wdsprep.decode(...) stage")


def _is_shard_list(location) -> bool:
    if isinstance(location, Manifest):
        return False
    if isinstance(location, (str, os.PathLike)):
        return os.fspath(location).endswith(".tar")
    return isinstance(location, (list, tuple))
