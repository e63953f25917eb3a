"""Which samples each rank and worker reads in an epoch: sample-exact dealing, equal counts, elastic resume.

For a split whose shards hold c[0..S-1] samples, seed s, epoch e, W ranks and K workers per rank:

1. `order` is the shard permutation of (s, e) (`epoch_order`), taken *before* any split, so every
   epoch deals shards afresh (webdataset splits first and only shuffles within a fixed slice).
2. The epoch's global sequence G is every shard's samples 0..c-1, shards in `order`; N = len(G).
3. Rank r gets the contiguous slice of G starting at r*base + min(r, extra), of base (+1 when
   r < extra) samples, with base, extra = divmod(N, W) (`share`). A shard may be split between
   neighbouring ranks; a rank reads only its own run of it (seeking locally, a Range remotely).
4. `equalize`: "pad" makes a rank with `base` samples (when extra > 0) append one more, its own
   first sample; a rank with none (N < W) appends G[r % N]. "drop" removes the last sample of the
   ranks with base+1. None deals as is. So pad repeats at most one sample per rank and drop drops at
   most one, whatever the shard sizes; padding is the only case where a sample appears twice.
5. A rank's list is cut into K contiguous runs, one per DataLoader worker, by the same rule
   (`worker_pieces`): equal per-worker counts on every rank are what keep batch counts equal when
   each worker batches its own stream.
6. With a shuffle buffer B > 1 (applied by the dataset), a worker's stream is permuted in blocks of
   B consecutive samples, block b by `block_permutation(seed, epoch, rank, worker, b, len)`.
7. Elastic resume (`remainder`): given every old rank's saved position, the delivered samples of an
   interrupted pass are, for each old (rank, worker), the first `skip` samples of its stream (in
   shuffled order when B > 1; a padding repeat delivers nothing new). The other samples, kept in
   the order of the pass's input, form the remainder R, which rules 3-6 deal to the new ranks and
   workers (equalizing over len(R)). A sample whose outputs were partly delivered (`discard`) stays
   in R and carries its discard count. An interrupted resumed pass is resumed the same way from R.
   (`skip` counts the samples whose outputs were all delivered: the dataset holds each output until
   the next one is made, so with one output per sample `skip` equals the outputs delivered.)

Balancing on training samples. When a reader stage turns each shard sample into a number of
training samples known from the manifest (Minecraft pairs of an episode window, voxel ray chunks
of a subvolume), `weights` (one count per position of the sequence, less the outputs a resumed
sample already delivered) replace sample counts in rules 3 and 5: a sample goes to the rank (then
worker) whose share of the outputs, by the same divmod rule, holds the sample's midpoint
(`weighted_cuts`).
Rule 4 then works on outputs: each worker k of every rank yields `output_targets`[k] outputs, the
smallest ("drop": the rest are cut) or the largest ("pad": the worker's first outputs are repeated)
of what worker k has on any rank, so every rank makes the same batches without `Join`.

A stream is a list of pieces (shard index, first sample, end sample); the same arguments give the
same pieces on any machine.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError

EQUALIZE = (None, "pad", "drop")


@dataclass(frozen=True)
class Piece:
    shard: int  # index into the manifest's shard list of the split
    start: int  # first sample within the shard
    stop: int  # one past the last sample

    @property
    def samples(self) -> int:
        return self.stop - self.start


@dataclass
class Sequence:
    """An ordered run of samples (pieces) plus the outputs already delivered of some of them."""

    pieces: list[Piece]
    discards: dict[tuple[int, int], int] = field(default_factory=dict)  # (shard, index) -> outputs delivered

    def __post_init__(self) -> None:
        self.ends = list(np.cumsum([p.samples for p in self.pieces], dtype=np.int64)) if self.pieces else []

    def __len__(self) -> int:
        return int(self.ends[-1]) if self.ends else 0

    def sample(self, position: int) -> tuple[int, int]:
        """(shard, index) at a position of the sequence."""
        i = bisect.bisect_right(self.ends, position)
        before = int(self.ends[i - 1]) if i else 0
        return self.pieces[i].shard, self.pieces[i].start + position - before

    def slice(self, start: int, stop: int) -> list[Piece]:
        """The pieces of positions [start, stop)."""
        out: list[Piece] = []
        i = bisect.bisect_right(self.ends, start)
        while start < stop and i < len(self.pieces):
            piece, before = self.pieces[i], (int(self.ends[i - 1]) if i else 0)
            hi = min(stop, int(self.ends[i]))
            if start < hi:
                out.append(Piece(piece.shard, piece.start + start - before, piece.start + hi - before))
            start = hi
            i += 1
        return out


@dataclass(frozen=True)
class Level:
    """One interrupted pass over a sequence: its world, and every (rank, worker)'s saved position."""

    world_size: int
    num_workers: int
    positions: dict[tuple[int, int], tuple[int, int]]  # (rank, worker) -> (skip, discard)


def epoch_order(n_shards: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    if not shuffle:
        return list(range(n_shards))
    rng = np.random.Generator(np.random.PCG64([seed & 0xFFFFFFFF, epoch & 0xFFFFFFFF, 0x5EED]))
    return [int(i) for i in rng.permutation(n_shards)]


def epoch_sequence(counts: list[int], seed: int, epoch: int, shuffle: bool) -> Sequence:
    """G: every shard's samples in order, shards in the epoch's permutation."""
    order = epoch_order(len(counts), seed, epoch, shuffle)
    return Sequence([Piece(s, 0, counts[s]) for s in order if counts[s] > 0])


def share(total: int, parts: int, index: int) -> tuple[int, int]:
    """[start, stop) of part `index` when `total` items are cut into `parts` contiguous runs whose
    lengths differ by at most one (the first `total % parts` runs get the extra item)."""
    base, extra = divmod(total, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def _check(rank: int, world_size: int, equalize: str | None) -> None:
    if equalize not in EQUALIZE:
        raise ConfigError(f"equalize must be 'pad', 'drop' or None (got {equalize!r})")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is outside world size {world_size}")


def weighted_cuts(weights: np.ndarray, parts: int) -> list[int]:
    """Positions cutting samples with these output counts into `parts` contiguous runs: a sample
    belongs to the run whose share of the outputs (the divmod rule) holds its midpoint, so a run
    is off its share by at most half a sample's outputs at either end."""
    middles = 2 * (np.cumsum(weights) - weights) + weights  # twice the midpoint: integers
    total = int(weights.sum())
    starts = [2 * share(total, parts, k)[0] for k in range(1, parts)]
    return [0] + [int(i) for i in np.searchsorted(middles, starts, side="left")] + [len(weights)]


def sequence_weights(sequence: Sequence, shard_weights: list[np.ndarray]) -> np.ndarray:
    """Outputs still to come of each position of a sequence (a resumed sample's are fewer)."""
    parts = [shard_weights[p.shard][p.start : p.stop] for p in sequence.pieces]
    weights = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
    position = 0
    for piece in sequence.pieces:
        for (shard, index), done in sequence.discards.items():
            if shard == piece.shard and piece.start <= index < piece.stop:
                at = position + index - piece.start
                weights[at] = max(0, weights[at] - done)
        position += piece.samples
    return weights


def rank_share(
    sequence: Sequence, rank: int, world_size: int, equalize: str | None, weights: np.ndarray | None = None
) -> tuple[list[Piece], int, int]:
    """(this rank's pieces after equalizing, the sequence position of its first sample, how many of
    its pieces' samples are its own: the rest is the padding repeat). With `weights`, the cut is on
    outputs and equalizing is left to the outputs (`output_targets`)."""
    _check(rank, world_size, equalize)
    if weights is not None:
        cuts = weighted_cuts(weights, world_size)
        return sequence.slice(cuts[rank], cuts[rank + 1]), cuts[rank], cuts[rank + 1] - cuts[rank]
    total = len(sequence)
    start, stop = share(total, world_size, rank)
    own = sequence.slice(start, stop)
    uneven = total % world_size != 0
    if equalize == "drop" and uneven and stop - start == total // world_size + 1:
        return sequence.slice(start, stop - 1), start, stop - start - 1
    if equalize == "pad" and uneven and stop - start == total // world_size:
        if own:
            return own + sequence.slice(start, start + 1), start, stop - start
        return sequence.slice(rank % total, rank % total + 1), start, 0
    return own, start, stop - start


def rank_pieces(
    counts: list[int], *, rank: int, world_size: int, seed: int, epoch: int, shuffle: bool, equalize: str | None
) -> list[Piece]:
    """Rules 1-4 for a fresh epoch."""
    _check(rank, world_size, equalize)
    return rank_share(epoch_sequence(counts, seed, epoch, shuffle), rank, world_size, equalize)[0]


def worker_run(length: int, worker: int, num_workers: int, weights: np.ndarray | None = None) -> tuple[int, int]:
    """[start, stop) of a worker's run within its rank's list of `length` samples (rule 5)."""
    if weights is None:
        return share(length, num_workers, worker)
    cuts = weighted_cuts(weights, num_workers)
    return cuts[worker], cuts[worker + 1]


def worker_pieces(pieces: list[Piece], *, worker: int, num_workers: int, weights: np.ndarray | None = None) -> list[Piece]:
    """A rank's stream cut into `num_workers` contiguous runs of equal sample counts (rule 5), or
    of outputs with `weights` (the rank's). A shard is split between at most two neighbouring workers."""
    if num_workers == 1:
        return pieces
    start, stop = worker_run(sum(p.samples for p in pieces), worker, num_workers, weights)
    return Sequence(pieces).slice(start, stop)


def output_targets(weights: np.ndarray, world_size: int, num_workers: int, equalize: str | None, rank: int) -> list[int]:
    """Outputs each worker of `rank` yields: its own with equalize=None, else the smallest ("drop")
    or largest ("pad") that the same worker has on any rank."""
    cuts = weighted_cuts(weights, world_size)
    table = []
    for r in range(world_size):
        mine = weights[cuts[r] : cuts[r + 1]]
        inner = weighted_cuts(mine, num_workers)
        table.append([int(mine[inner[k] : inner[k + 1]].sum()) for k in range(num_workers)])
    if equalize is None:
        return table[rank]
    pick = min if equalize == "drop" else max
    return [pick(row[k] for row in table) for k in range(num_workers)]


def block_permutation(seed: int, epoch: int, rank: int, worker: int, block: int, size: int) -> np.ndarray:
    """Rule 6: the order in which a worker yields block `block` (of `size` samples) of its run."""
    return np.random.Generator(np.random.PCG64([seed, epoch, rank, worker, block])).permutation(size)


def stream_positions(run_length: int, first: int, count: int, *, shuffle_buffer: int, key: tuple) -> list[int]:
    """Run positions of stream positions [first, first+count) of a worker (key = seed, epoch, rank,
    worker) whose run has `run_length` samples: the identity, or rule 6's block order."""
    if shuffle_buffer <= 1:
        return list(range(first, min(first + count, run_length)))
    out: list[int] = []
    position = first
    while position < min(first + count, run_length):
        block, offset = divmod(position, shuffle_buffer)
        size = min(shuffle_buffer, run_length - block * shuffle_buffer)
        order = block_permutation(*key, block, size)
        take = min(size - offset, first + count - position)
        out.extend(block * shuffle_buffer + int(i) for i in order[offset : offset + take])
        position += take
    return out


def _delivered(run_length: int, skip: int, shuffle_buffer: int, key: tuple) -> list[tuple[int, int]]:
    """Run-position intervals of a worker's first `skip` stream samples."""
    if shuffle_buffer <= 1:
        return [(0, min(skip, run_length))]
    whole = min(skip // shuffle_buffer * shuffle_buffer, run_length)
    tail = stream_positions(run_length, whole, skip - whole, shuffle_buffer=shuffle_buffer, key=key)
    return [(0, whole)] + [(q, q + 1) for q in tail]


def remainder(
    sequence: Sequence, level: Level, *, seed: int, epoch: int, shuffle_buffer: int, equalize: str | None,
    shard_weights: list[np.ndarray] | None = None,
) -> Sequence:
    """Rule 7: the samples of `sequence` that the interrupted pass `level` had not delivered."""
    delivered: list[tuple[int, int]] = []
    discards = dict(sequence.discards)
    weights = None if shard_weights is None else sequence_weights(sequence, shard_weights)
    for rank in range(level.world_size):
        pieces, first, own = rank_share(sequence, rank, level.world_size, equalize, weights)
        length = sum(p.samples for p in pieces)
        mine = None if weights is None else weights[first : first + length]
        for worker in range(level.num_workers):
            skip, discard = level.positions.get((rank, worker), (0, 0))
            run_start, run_stop = worker_run(length, worker, level.num_workers, mine)
            key = (seed, epoch, rank, worker)
            for lo, hi in _delivered(run_stop - run_start, skip, shuffle_buffer, key):
                lo, hi = run_start + lo, min(run_start + hi, own)  # rank-list positions past `own` are padding
                if lo < hi:
                    delivered.append((first + lo, first + hi))
            if discard and skip < run_stop - run_start:
                (q,) = stream_positions(run_stop - run_start, skip, 1, shuffle_buffer=shuffle_buffer, key=key)
                if run_start + q < own:
                    discards[sequence.sample(first + run_start + q)] = discard
    pieces: list[Piece] = []
    position = 0
    for lo, hi in sorted(delivered):
        pieces += sequence.slice(position, lo) if lo > position else []
        position = max(position, hi)
    pieces += sequence.slice(position, len(sequence))
    kept = Sequence(_merge(pieces))
    kept.discards = {sample: n for sample, n in discards.items() if _contains(kept, sample)}
    return kept


def _merge(pieces: list[Piece]) -> list[Piece]:
    out: list[Piece] = []
    for piece in pieces:
        if out and out[-1].shard == piece.shard and out[-1].stop == piece.start:
            out[-1] = Piece(piece.shard, out[-1].start, piece.stop)
        elif piece.samples:
            out.append(piece)
    return out


def _contains(sequence: Sequence, sample: tuple[int, int]) -> bool:
    shard, index = sample
    return any(p.shard == shard and p.start <= index < p.stop for p in sequence.pieces)
