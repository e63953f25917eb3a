"""Reading a shard whose small samples lie in packed blocks (`wdsprep convert --pack`, shards/packed.py).

Readers see samples, never blocks. A packed shard's index (`ShardIndex.pack`, a `PackMap`) numbers
its samples as every other shard's: the manifest's counts, the planner's dealing, a resume position,
a selection's kept numbers and `MapDataset[i]` are all sample numbers. Each read path turns the
samples it is asked for into the entries (tar member groups: a sample stored whole, or a block) that
hold them, reads those entries as it reads any shard's samples (every byte checked against its
digest first: reading/read.py), and hands out the samples:

- streamed (`read.read_samples`): `read_packed` reads the entries holding [start, stop) and yields
  the samples of that range only, so a run that resumes at a sample inside a block starts at that
  row; a local shard read lazily comes as a `PackedShard`, which numbers samples as a `LocalShard`
  does (`checked()`, `take(i)`, `members(i)`, `decode_members`, `release`);
- random access (reading/access.py: MapDataset, show, inspect, a sample read again): the whole
  block, one read, then the row (`PackedRequests`).

A block is parsed only after its member matched its digest, and checked before any of its samples
is handed out: its bounds (shards/packed.py `Block.parse`) and its keys against the index's; either
failing is one `ShardError` naming the shard and the member.
"""
from __future__ import annotations

from typing import Callable, Iterator, Sequence

from ...shards.index import ShardIndex
from ...shards.packed import PACK_MEMBER, Block, block_of


def read_packed(url: str, index: ShardIndex, start: int, stop: int, entries: Callable[[int, int], Iterator]) -> Iterator:
    """Samples [start, stop) of the packed shard `index` describes: `entries(first, end)` reads its
    entries [first, end) the way reading/read.py reads samples (raw dicts, checked; or one lazily
    read `LocalShard`), and each is unpacked here to the samples of the range it holds."""
    pack = index.pack
    stop = min(stop, len(pack))
    if start >= stop:
        return
    first, end = pack.entries(start, stop)
    for entry, item in enumerate(entries(first, end), first):
        if item.__class__ is not dict:  # a local shard's entries, taken as they are asked for
            yield PackedShard(item, index, start, stop)
            return
        held = pack.samples(entry)
        if not pack.rows[entry]:
            yield item
            continue
        block = _block(url, index, entry, item[PACK_MEMBER])
        for i in range(max(start, held.start), min(stop, held.stop)):
            yield block.sample(i - held.start, url)


def _block(url: str, index: ShardIndex, entry: int, data) -> Block:
    held = index.pack.samples(entry)
    return block_of(url, index.keys[entry], data, index.pack.keys[held.start : held.stop])


def _member_bytes(index: ShardIndex, entry: int, members: tuple):
    """The block member's data in what `LocalShard.members(entry)` gave: (buffer, where the entry
    starts in it) or (its members' own bytearrays, None)."""
    buffer, at = members
    if at is None:
        return buffer[0]
    k = index.first[entry]
    start = at + index.heads[k]
    return buffer[start : start + index.sizes[k]]


class PackedShard:
    """Samples [start, stop) of a local (or cached) packed shard, read through `shard` (a
    `read.LocalShard` over the entries holding them): numbered and taken as a `LocalShard`'s are.
    `checked()` yields a sample once its entry's bytes matched their digests (and, in a block, the
    block was parsed and checked: before any of its samples); blocks are kept until `release()`
    (a shuffle block was delivered), the one being read past it. A shard whose samples here all lie
    in blocks keeps no read window past the one being checked (the blocks hold their own bytes;
    one dropped is read again, alone); one with samples stored whole keeps them as `LocalShard` does."""

    __slots__ = ("shard", "url", "index", "pack", "start", "stop", "blocks", "span")

    def __init__(self, shard, index: ShardIndex, start: int, stop: int):
        self.shard, self.url, self.index, self.pack = shard, shard.url, index, index.pack
        self.start, self.stop = start, stop
        if start < stop and all(self.pack.rows[slice(*self.pack.entries(start, stop))]):
            shard.keep = 0  # every entry a block, parsed as it is checked: its window is not read again
        self.blocks: dict[int, Block] = {}  # entry -> its block, parsed and checked
        self.span = (0, 0, 0, False)  # the entry last located: (its first sample, its end, entry, a block)

    def release(self, keep_newest: bool = True) -> None:
        newest = max(self.blocks, default=None) if keep_newest else None
        self.blocks = {newest: self.blocks[newest]} if newest is not None else {}
        self.shard.release(keep_newest)

    def _parsed(self, entry: int) -> Block:
        block = self.blocks.get(entry)
        if block is None:  # its bytes are read (and digested) again when its window was dropped
            data = _member_bytes(self.index, entry, self.shard.members(entry))
            block = self.blocks[entry] = _block(self.url, self.index, entry, data)  # msgpack copies what it keeps
        return block

    def checked(self, tag: int = 0) -> Iterator[int]:
        """`tag | i` for each sample i, once its entry was checked (see the class docstring)."""
        pack, in_order = self.pack, self.shard.in_order
        for entry in self.shard.checked():
            held = pack.samples(entry)
            if pack.rows[entry]:
                if in_order:
                    self.blocks.clear()  # each sample is taken before the next is asked for
                self._parsed(entry)
            for i in range(max(self.start, held.start), min(self.stop, held.stop)):
                yield tag | i

    def _locate(self, i: int) -> tuple[int, int | None]:
        first, end, entry, block = self.span
        if not first <= i < end:  # samples come in runs of one entry: most need no search
            entry, first, end = self.pack.span(i)
            block = bool(self.pack.rows[entry])
            self.span = (first, end, entry, block)
        return entry, (i - first if block else None)

    def take(self, i: int) -> dict:
        entry, row = self._locate(i)
        if row is None:
            return self.shard.take(entry)
        return self._parsed(entry).sample(row, self.url)

    def members(self, i: int) -> tuple:
        """What `decode_members(i, ...)` decodes: the entry's bytes, or (block, row)."""
        entry, row = self._locate(i)
        if row is None:
            return entry, self.shard.members(entry)
        return self._parsed(entry), row

    def decode_members(self, i: int, members: tuple, strip: bool, torch: bool, with_url: bool = True) -> dict:
        held, at = members
        if held.__class__ is Block:
            return held.decoded(at, self.url, strip, torch, with_url)
        return self.shard.decode_members(held, at, strip, torch, with_url)


class PackedRequests:
    """Random access's side (reading/access.py): the samples asked for, (shard, sample number,
    member names), as the entries to read — a block whole — and, once read, each sample taken out."""

    def __init__(self, indexes: dict, wanted: Sequence[tuple]):
        self.indexes = indexes
        self.rows: list = []  # per request: None (read as asked), or (entry, row, names) of a block
        self.entries: list[tuple] = []
        for shard, number, names in wanted:
            index = indexes[shard]
            if index.pack is None:
                self.entries.append((shard, number, names))
                self.rows.append(None)
                continue
            entry, row = index.pack.locate(int(number))
            block = bool(index.pack.rows[entry])
            self.entries.append((shard, entry, None if block else names))
            self.rows.append((entry, row, names) if block else None)

    def samples(self, raw: list[dict], urls: Sequence[str]) -> list[dict]:
        """The samples asked for, from the entries read (`raw`, in the order of `entries`)."""
        if not any(self.rows):
            return raw
        out, blocks = [], {}
        for (shard, _, _), sample, wanted in zip(self.entries, raw, self.rows):
            if wanted is None:
                out.append(sample)
                continue
            entry, row, names = wanted
            block = blocks.get((shard, entry))
            if block is None:
                block = blocks[shard, entry] = _block(urls[shard], self.indexes[shard], entry, sample[PACK_MEMBER])
            taken = block.sample(row, urls[shard])
            if names is not None:
                taken = {name: value for name, value in taken.items() if name.startswith("__") or name in names}
            out.append(taken)
        return out



def sample_member_names(access, shard: int, number: int) -> tuple[str, ...]:
    """The member names of sample `number` of `access`'s shard (a `ShardAccess`): from its index, or,
    for a sample inside a block, from the block (one read of it)."""
    index = access.index(shard)
    if index.pack is None:
        return index.names(number)
    entry, _ = index.pack.locate(number)
    if not index.pack.rows[entry]:
        return index.names(entry)
    return tuple(name for name in access.read([(shard, number, None)])[0] if not name.startswith("__"))
