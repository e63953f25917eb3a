"""Which samples each rank and worker reads in an epoch: global permutation, balanced split, equal counts.

1. The global shard list is permuted by (seed, epoch) before any split, so every epoch deals shards
   afresh (webdataset splits first and only shuffles within a fixed slice).
2. Shards are dealt to ranks greedily by sample count (next shard to the emptiest slot, ties to the
   lowest index), using the manifest's counts; a rank's stream is then cut into equal contiguous
   runs, one per DataLoader worker (see `worker_pieces`).
3. `equalize` makes every rank yield the same number of samples: "drop" truncates every rank to the
   smallest rank's count; "pad" extends every rank to the largest count by repeating the rank's own
   samples from the start of its stream (a rank that got no shard repeats the global order's first
   samples). The padding is the only case where a sample appears twice in an epoch.
A worker's stream is a list of pieces (shard index, first sample, end sample); the same arguments
give the same pieces on any machine.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError


@dataclass(frozen=True)
class Piece:
    shard: int  # index into the manifest's shard list of the split
    start: int  # first sample within the shard
    stop: int  # one past the last sample

    @property
    def samples(self) -> int:
        return self.stop - self.start


def epoch_order(n_shards: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    if not shuffle:
        return list(range(n_shards))
    rng = np.random.Generator(np.random.PCG64([seed & 0xFFFFFFFF, epoch & 0xFFFFFFFF, 0x5EED]))
    return [int(i) for i in rng.permutation(n_shards)]


def deal(order: list[int], counts: list[int], slots: int) -> list[list[int]]:
    """Greedy balanced dealing of shards (in `order`) to `slots` by sample count."""
    totals = [0] * slots
    dealt: list[list[int]] = [[] for _ in range(slots)]
    for shard in order:
        slot = min(range(slots), key=lambda s: (totals[s], s))
        dealt[slot].append(shard)
        totals[slot] += counts[shard]
    return dealt


def _pieces(shards: list[int], counts: list[int]) -> list[Piece]:
    return [Piece(s, 0, counts[s]) for s in shards if counts[s] > 0]


def _take(pieces: list[Piece], n: int) -> list[Piece]:
    """The first n samples of a piece list."""
    out = []
    for piece in pieces:
        if n <= 0:
            break
        take = min(n, piece.samples)
        out.append(Piece(piece.shard, piece.start, piece.start + take))
        n -= take
    return out


def _cycle(pieces: list[Piece], n: int) -> list[Piece]:
    """n samples by cycling through `pieces` (used for padding)."""
    out: list[Piece] = []
    total = sum(p.samples for p in pieces)
    if n <= 0 or total == 0:
        return out
    while n > 0:
        chunk = _take(pieces, n)
        out.extend(chunk)
        n -= sum(p.samples for p in chunk)
    return out


def rank_pieces(
    counts: list[int], *, rank: int, world_size: int, seed: int, epoch: int, shuffle: bool, equalize: str | None
) -> list[Piece]:
    if equalize not in (None, "pad", "drop"):
        raise ConfigError(f"equalize must be 'pad', 'drop' or None (got {equalize!r})")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is outside world size {world_size}")
    order = epoch_order(len(counts), seed, epoch, shuffle)
    dealt = deal(order, counts, world_size)
    totals = [sum(counts[s] for s in shards) for shards in dealt]
    mine = _pieces(dealt[rank], counts)
    if equalize is None or world_size == 1:
        return mine
    if equalize == "drop":
        return _take(mine, min(totals))
    target = max(totals)
    own = totals[rank]
    source = mine if own else _pieces(order, counts)
    return mine + _cycle(source, target - own)


def worker_pieces(pieces: list[Piece], *, worker: int, num_workers: int) -> list[Piece]:
    """A rank's stream cut into `num_workers` contiguous runs of equal sample counts (the first
    `total % num_workers` workers get one more). Equal per-worker counts on every rank are what make
    batch counts equal across ranks when each DataLoader worker batches its own stream (whole-shard
    dealing gives e.g. workers of 27/24 samples on one rank and 26/25 on another: 13 vs 14 batches
    of 4, and a DDP hang). A shard is split between at most two neighbouring workers."""
    if num_workers == 1:
        return pieces
    total = sum(p.samples for p in pieces)
    base, extra = divmod(total, num_workers)
    start = worker * base + min(worker, extra)
    stop = start + base + (1 if worker < extra else 0)
    out: list[Piece] = []
    position = 0
    for piece in pieces:
        lo, hi = max(start, position), min(stop, position + piece.samples)
        if lo < hi:
            out.append(Piece(piece.shard, piece.start + lo - position, piece.start + hi - position))
        position += piece.samples
    return out
