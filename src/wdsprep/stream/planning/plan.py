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
   (`worker_run`): equal per-worker counts on every rank are what keep batch counts equal when
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

A stream is a `Sequence` of pieces (shard index, first sample, end sample), held as numpy columns
so that planning a split of a million shards makes no per-shard Python object; the same arguments
give the same pieces on any machine. A run of whole passes over a split's shards, each pass in its own
shard order (a mix's part that cycles, stream/mix.py rule M3), is held as a rule instead: `Passes`,
positions [lo, hi) of the endless run of passes, whose pass j is made (its order, one permutation)
only when one of its positions is asked for. An epoch of 10^12 samples over a part of 8 is then a
few numbers: its length, a rank's and a worker's share and the first sample cost no Python step per
pass; pieces are made a pass at a time as a worker reads them (`chunked`). `Joined` is the few runs
of either kind one after the other (a rank's share and its padding repeat, an elastic remainder).
The three kinds answer the same questions (len, slice, sample, position_of, weights, blocks), so
rules 3-7 above are written once, for any of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ...checks import one_of, whole_number

EQUALIZE = (None, "pad", "drop")


@dataclass(frozen=True)
class Piece:
    shard: int  # index into the manifest's shard list of the split
    start: int  # first sample within the shard
    stop: int  # one past the last sample
    cycle: int = 0  # which pass over its part a piece belongs to (a part that cycles repeats shards)

    @property
    def samples(self) -> int:
        return self.stop - self.start


_EMPTY = np.zeros(0, dtype=np.int64)


class Sequence:
    """An ordered run of samples: pieces (shard, start, stop, cycle) held as numpy columns, plus the
    outputs already delivered of some samples (`discards`, keyed by (cycle, shard, index)). Nothing
    is made per piece until pieces are iterated, so a sequence of a million shards costs a few arrays."""

    __slots__ = ("shard", "start", "stop", "cycle", "ends", "discards")

    def __init__(self, shard=_EMPTY, start=_EMPTY, stop=_EMPTY, cycle=None, discards: dict | None = None):
        self.shard = np.asarray(shard, dtype=np.int64)
        self.start = np.asarray(start, dtype=np.int64)
        self.stop = np.asarray(stop, dtype=np.int64)
        self.cycle = np.zeros(len(self.shard), np.int64) if cycle is None else np.asarray(cycle, dtype=np.int64)
        self.ends = np.cumsum(self.stop - self.start)
        self.discards = {} if discards is None else discards

    @classmethod
    def of(cls, pieces, discards: dict | None = None) -> "Sequence":
        """A sequence of these `Piece`s, in order."""
        pieces = list(pieces)
        columns = [[getattr(p, name) for p in pieces] for name in ("shard", "start", "stop", "cycle")]
        return cls(*columns, discards=discards)

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    @property
    def piece_count(self) -> int:
        return len(self.shard)

    def __iter__(self):
        for shard, start, stop, cycle in zip(self.shard.tolist(), self.start.tolist(), self.stop.tolist(),
                                             self.cycle.tolist()):
            yield Piece(shard, start, stop, cycle)

    @property
    def pieces(self) -> list[Piece]:
        return list(self)

    def __add__(self, other: "Sequence") -> "Sequence":
        return concat([self, other], merge=False)

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and self.pieces == other.pieces

    def __repr__(self) -> str:
        return f"Sequence({self.pieces!r})"

    def with_discards(self, discards: dict) -> "Sequence":
        return Sequence(self.shard, self.start, self.stop, self.cycle, discards)

    def sample(self, position: int) -> tuple[int, int, int]:
        """(cycle, shard, index) at a position of the sequence."""
        i = int(np.searchsorted(self.ends, position, side="right"))
        before = int(self.ends[i - 1]) if i else 0
        return int(self.cycle[i]), int(self.shard[i]), int(self.start[i]) + position - before

    def slice(self, start: int, stop: int) -> "Sequence":
        """The pieces of positions [start, stop)."""
        stop = min(stop, len(self))
        if start >= stop:
            return Sequence()
        first = int(np.searchsorted(self.ends, start, side="right"))
        last = int(np.searchsorted(self.ends, stop, side="left"))  # the piece holding position stop - 1
        lo = self.start[first : last + 1].copy()
        hi = self.stop[first : last + 1].copy()
        lo[0] += start - (int(self.ends[first]) - int(hi[0]) + int(lo[0]))  # start - the piece's first position
        hi[-1] -= int(self.ends[last]) - stop
        return Sequence(self.shard[first : last + 1], lo, hi, self.cycle[first : last + 1])

    def weights(self, shard_weights: list[np.ndarray]) -> np.ndarray:
        """Outputs still to come of each position (a sample with delivered outputs has fewer)."""
        return _less_discards(self, self.base_weights(shard_weights))

    def base_weights(self, shard_weights: list[np.ndarray]) -> np.ndarray:
        """Outputs of each position's sample, delivered ones not taken off."""
        parts = [shard_weights[p.shard][p.start : p.stop] for p in self]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    def blocks(self):
        """The pieces as explicit sequences, in order (here: this one)."""
        if self.piece_count:
            yield self

    def pieces_between(self, first: int, last: int) -> "Sequence":
        """Pieces first..last-1, as a sequence."""
        return Sequence(self.shard[first:last], self.start[first:last], self.stop[first:last], self.cycle[first:last])

    def resumed_at(self, skip: int) -> tuple["Sequence", int]:
        """(what a worker that passed `skip` samples still iterates, the samples of it to skip): the
        pieces as they are (a skipped piece is passed over unopened)."""
        return self, skip

    def position_of(self, cycle: int, shard: int, index: int) -> int | None:
        """The position of a sample in this sequence, or None when it is not in it."""
        hits = np.flatnonzero((self.shard == shard) & (self.cycle == cycle) & (self.start <= index) & (index < self.stop))
        if not len(hits):
            return None
        i = int(hits[0])
        return int(self.ends[i]) - int(self.stop[i]) + index

    def contains(self, sample: tuple[int, int, int]) -> bool:
        return self.position_of(*sample) is not None


def _less_discards(sequence, weights: np.ndarray) -> np.ndarray:
    """`weights` of a sequence's positions less the outputs its `discards` say were delivered."""
    for (cycle, shard, index), done in sequence.discards.items():
        at = sequence.position_of(cycle, shard, index)
        if at is not None:
            weights[at] = max(0, weights[at] - done)
    return weights


class _Blocks:
    """What a sequence made block by block (`Passes`, `Joined`) answers from its `blocks()`,
    `slice()`, `position_of()` and `base_weights()`."""

    __slots__ = ()

    def __iter__(self):
        for block in self.blocks():
            yield from block

    @property
    def pieces(self) -> list[Piece]:
        return list(self)

    def contains(self, sample: tuple[int, int, int]) -> bool:
        return self.position_of(*sample) is not None

    def weights(self, shard_weights: list[np.ndarray]) -> np.ndarray:
        return _less_discards(self, self.base_weights(shard_weights))

    def resumed_at(self, skip: int):
        """Positions from `skip` on, none to skip: the passes before are never made."""
        return self.slice(skip, len(self)), 0

    def __add__(self, other):
        return concat([self, other], merge=False)

    def __eq__(self, other) -> bool:
        return hasattr(other, "blocks") and self.pieces == list(other)


class Passes(_Blocks):
    """Positions [lo, hi) of the endless run of passes over a split's shards (see the module
    docstring): pass j holds every shard with samples (`counts`, one per shard) in the order
    `order(j)` (an array of those shards: a picklable function of j), each as one piece of cycle j.
    A pass is made when a position in it is asked for, and the latest two are kept."""

    __slots__ = ("counts", "order", "lo", "hi", "discards", "per_pass", "_made")

    def __init__(self, counts: np.ndarray, order: Callable[[int], np.ndarray], lo: int, hi: int,
                 discards: dict | None = None, made: dict | None = None):
        self.counts, self.order = np.asarray(counts, dtype=np.int64), order
        self.per_pass = int(self.counts.sum())
        if self.per_pass <= 0 or not 0 <= lo <= hi:
            raise ValueError(f"Passes over {self.per_pass} samples a pass, positions [{lo}, {hi})")
        self.lo, self.hi = int(lo), int(hi)
        self.discards = {} if discards is None else discards
        self._made = {} if made is None else made  # pass -> its pieces (a Sequence), shared by the slices of one run

    def __len__(self) -> int:
        return self.hi - self.lo

    def made(self, cycle: int) -> Sequence:
        """Pass `cycle` as explicit pieces: its shards in order (`shard`), each whole, and the end
        position of each within the pass (`ends`)."""
        found = self._made.get(cycle)
        if found is None:
            order = np.asarray(self.order(cycle), dtype=np.int64)
            found = Sequence(order, np.zeros(len(order), np.int64), self.counts[order], np.full(len(order), cycle, np.int64))
            if len(self._made) >= 2:
                self._made.pop(next(iter(self._made)))
            self._made[cycle] = found
        return found

    def slice(self, start: int, stop: int) -> "Passes | Sequence":
        stop = min(stop, len(self))
        if start >= stop:
            return Sequence()
        return self._run(self.lo + start, self.lo + stop)

    def _run(self, lo: int, hi: int, discards: dict | None = None) -> "Passes":
        """Positions [lo, hi) of the same passes (checked, counted and made already: shared)."""
        run = Passes.__new__(Passes)
        run.counts, run.order, run.per_pass, run._made = self.counts, self.order, self.per_pass, self._made
        run.lo, run.hi, run.discards = lo, hi, {} if discards is None else discards
        return run

    def pass_pieces(self, cycle: int, first: int, last: int) -> Sequence:
        """Positions [first, last) of pass `cycle`, as explicit pieces."""
        return self.made(cycle).slice(first, last)

    def blocks(self):
        """The pieces a pass at a time (each pass made when it is reached)."""
        if not len(self):
            return
        first, last = self.lo // self.per_pass, (self.hi - 1) // self.per_pass
        for cycle in range(first, last + 1):
            begin = cycle * self.per_pass
            yield self.pass_pieces(cycle, max(self.lo, begin) - begin, min(self.hi, begin + self.per_pass) - begin)

    def explicit(self) -> Sequence:
        return concat(list(self.blocks()), merge=False)

    def sample(self, position: int) -> tuple[int, int, int]:
        cycle, offset = divmod(self.lo + position, self.per_pass)
        made = self.made(cycle)
        i = int(np.searchsorted(made.ends, offset, side="right"))
        shard = int(made.shard[i])
        return cycle, shard, offset - (int(made.ends[i]) - int(self.counts[shard]))

    def position_of(self, cycle: int, shard: int, index: int) -> int | None:
        if not (0 <= shard < len(self.counts) and 0 <= index < self.counts[shard] and cycle >= 0):
            return None
        if not self.lo // self.per_pass <= cycle <= max(self.lo, self.hi - 1) // self.per_pass:
            return None  # a pass this window does not reach: not made
        made = self.made(cycle)
        (at,) = np.flatnonzero(made.shard == shard)
        position = cycle * self.per_pass + int(made.ends[at]) - int(self.counts[shard]) + index
        return position - self.lo if self.lo <= position < self.hi else None

    def base_weights(self, shard_weights: list[np.ndarray]) -> np.ndarray:
        parts = [block.base_weights(shard_weights) for block in self.blocks()]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def with_discards(self, discards: dict) -> "Passes":
        return self._run(self.lo, self.hi, discards)

    def __repr__(self) -> str:
        return f"Passes({self.per_pass} samples a pass, positions [{self.lo}, {self.hi}))"


class Joined(_Blocks):
    """Runs of either kind (`Sequence`, `Passes`) one after the other: a rank's share and its padding
    repeat, or what an elastic resume left of a run of passes (a few runs, whatever the epoch)."""

    __slots__ = ("runs", "ends", "discards")

    def __init__(self, runs: list, discards: dict | None = None):
        self.runs = runs
        self.ends = np.cumsum([len(run) for run in runs]).astype(np.int64)
        self.discards = {} if discards is None else discards

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def _run_at(self, position: int) -> tuple[int, int]:
        """(the run holding a position, the position's offset in it)."""
        i = int(np.searchsorted(self.ends, position, side="right"))
        return i, position - (int(self.ends[i - 1]) if i else 0)

    def slice(self, start: int, stop: int):
        stop = min(stop, len(self))
        if start >= stop:
            return Sequence()
        parts, begin = [], 0
        for run, end in zip(self.runs, self.ends.tolist()):
            if begin < stop and start < end:
                parts.append(run.slice(max(start, begin) - begin, min(stop, end) - begin))
            begin = end
        return concat(parts, merge=False)

    def blocks(self):
        for run in self.runs:
            yield from run.blocks()

    def sample(self, position: int) -> tuple[int, int, int]:
        i, offset = self._run_at(position)
        return self.runs[i].sample(offset)

    def position_of(self, cycle: int, shard: int, index: int) -> int | None:
        begin = 0
        for run, end in zip(self.runs, self.ends.tolist()):
            at = run.position_of(cycle, shard, index)
            if at is not None:
                return begin + at
            begin = end
        return None

    def base_weights(self, shard_weights: list[np.ndarray]) -> np.ndarray:
        return np.concatenate([run.base_weights(shard_weights) for run in self.runs])

    def with_discards(self, discards: dict) -> "Joined":
        return Joined(self.runs, discards)

    def __repr__(self) -> str:
        return f"Joined({self.runs!r})"


def chunked(sequence, first: int, size: int):
    """The pieces of any sequence as explicit `Sequence`s of `first` pieces, then `size` at a time
    (a `Passes` makes each pass as it is reached)."""
    held: list[Sequence] = []
    count, want = 0, first
    for block in sequence.blocks():
        at = 0
        while at < block.piece_count:
            take = min(want - count, block.piece_count - at)
            held.append(block if take == block.piece_count else block.pieces_between(at, at + take))
            count, at = count + take, at + take
            if count == want:
                yield held[0] if len(held) == 1 else concat(held, merge=False)
                held, count, want = [], 0, size
    if held:
        yield held[0] if len(held) == 1 else concat(held, merge=False)


def concat(sequences, merge: bool = True):
    """The pieces of several sequences, one after the other (with `merge`, adjacent runs of a shard
    in the same cycle become one piece). Explicit sequences give one; a `Passes` among them, a
    `Joined` of the runs (the explicit ones between them concatenated)."""
    sequences = [s for s in sequences if len(s)]
    if not all(isinstance(s, Sequence) for s in sequences):
        runs: list = []
        for one in sequences:
            for run in (one.runs if isinstance(one, Joined) else [one]):
                if isinstance(run, Sequence) and runs and isinstance(runs[-1], Sequence):
                    runs[-1] = concat([runs[-1], run], merge)
                else:
                    runs.append(run)
        return runs[0] if len(runs) == 1 else Joined(runs)
    if not sequences:
        return Sequence()
    shard = np.concatenate([s.shard for s in sequences])
    start = np.concatenate([s.start for s in sequences])
    stop = np.concatenate([s.stop for s in sequences])
    cycle = np.concatenate([s.cycle for s in sequences])
    return _merged(shard, start, stop, cycle) if merge else Sequence(shard, start, stop, cycle)


def _merged(shard, start, stop, cycle) -> Sequence:
    """Pieces with adjacent runs of one shard (and cycle) merged, empty pieces left out."""
    keep = stop > start
    shard, start, stop, cycle = shard[keep], start[keep], stop[keep], cycle[keep]
    if len(shard) > 1:
        joins = (shard[1:] == shard[:-1]) & (cycle[1:] == cycle[:-1]) & (start[1:] == stop[:-1])
        if joins.any():
            heads = np.concatenate([[True], ~joins])
            last = np.concatenate([np.flatnonzero(heads)[1:] - 1, [len(shard) - 1]])
            shard, cycle, start, stop = shard[heads], cycle[heads], start[heads], stop[last]
    return Sequence(shard, start, stop, cycle)


@dataclass(frozen=True)
class Level:
    """One interrupted pass over a sequence: its world, and every (rank, worker)'s saved position."""

    world_size: int
    num_workers: int
    positions: dict[tuple[int, int], tuple[int, int]]  # (rank, worker) -> (skip, discard)


def keyed(key) -> np.random.Generator:
    """`np.random.Generator(np.random.PCG64(key))` for a sequence of ints >= 0, the same generator
    made faster: its SeedSequence is given the 32-bit words numpy would make of the ints (each int's
    words, low first, 0 one word) as one array when every int is one word; numpy makes them one
    Python int at a time, about a third of the 23 µs a block permutation of 500 costs that way."""
    try:  # as Python ints: numpy would wrap a numpy int of more than one word where it refuses a Python one
        words = np.array([int(v) for v in key], dtype=np.uint32)  # ints of one word each: numpy's words exactly
    except OverflowError:  # an int of more words (a seed >= 2**32), or a negative one (numpy refuses it)
        words = key
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(words)))


def epoch_order(n_shards: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The epoch's shard permutation (int64), a numpy column: no Python object per shard."""
    if not shuffle:
        return np.arange(n_shards, dtype=np.int64)
    rng = keyed([seed & 0xFFFFFFFF, epoch & 0xFFFFFFFF, 0x5EED])
    return rng.permutation(n_shards).astype(np.int64, copy=False)


def epoch_sequence(counts, seed: int, epoch: int, shuffle: bool) -> Sequence:
    """G: every shard's samples in order, shards in the epoch's permutation."""
    counts = np.asarray(counts, dtype=np.int64)
    order = epoch_order(len(counts), seed, epoch, shuffle)
    order = order[counts[order] > 0]
    return Sequence(order, np.zeros(len(order), np.int64), counts[order])


def share(total: int, parts: int, index: int) -> tuple[int, int]:
    """[start, stop) of part `index` when `total` items are cut into `parts` contiguous runs whose
    lengths differ by at most one (the first `total % parts` runs get the extra item)."""
    base, extra = divmod(total, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def _check(rank: int, world_size: int, equalize: str | None) -> None:
    one_of(equalize, "equalize", EQUALIZE)
    whole_number(rank, "rank", 0, f"below world_size={world_size}", maximum=world_size - 1)


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
    return sequence.weights(shard_weights)


def rank_share(
    sequence: Sequence, rank: int, world_size: int, equalize: str | None, weights: np.ndarray | None = None
) -> tuple[Sequence, int, int]:
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


def worker_run(length: int, worker: int, num_workers: int, weights: np.ndarray | None = None) -> tuple[int, int]:
    """[start, stop) of a worker's run within its rank's list of `length` samples (rule 5)."""
    if weights is None:
        return share(length, num_workers, worker)
    cuts = weighted_cuts(weights, num_workers)
    return cuts[worker], cuts[worker + 1]


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


def block_permutation(*key_block_size: int) -> np.ndarray:
    """Rule 6: the order in which a worker yields a block of its run, `block_permutation(seed,
    epoch, rank, worker, block, size)`; a part of a mix other than the first puts its index after
    the worker (stream/mix.py)."""
    *key, size = key_block_size
    return keyed(key).permutation(size)


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
    shard_weights: list[np.ndarray] | None = None, key: tuple = (),
) -> Sequence:
    """Rule 7: the samples of `sequence` that the interrupted pass `level` had not delivered."""
    delivered: list[tuple[int, int]] = []
    discards = dict(sequence.discards)
    weights = None if shard_weights is None else sequence_weights(sequence, shard_weights)
    for rank in range(level.world_size):
        pieces, first, own = rank_share(sequence, rank, level.world_size, equalize, weights)
        length = len(pieces)
        mine = None if weights is None else weights[first : first + length]
        for worker in range(level.num_workers):
            skip, discard = level.positions.get((rank, worker), (0, 0))
            run_start, run_stop = worker_run(length, worker, level.num_workers, mine)
            block_key = (seed, epoch, rank, worker, *key)
            for lo, hi in _delivered(run_stop - run_start, skip, shuffle_buffer, block_key):
                lo, hi = run_start + lo, min(run_start + hi, own)  # rank-list positions past `own` are padding
                if lo < hi:
                    delivered.append((first + lo, first + hi))
            if discard and skip < run_stop - run_start:
                (q,) = stream_positions(run_stop - run_start, skip, 1, shuffle_buffer=shuffle_buffer, key=block_key)
                if run_start + q < own:
                    discards[sequence.sample(first + run_start + q)] = discard
    kept_runs: list[Sequence] = []
    position = 0
    for lo, hi in sorted(delivered):
        if lo > position:
            kept_runs.append(sequence.slice(position, lo))
        position = max(position, hi)
    kept_runs.append(sequence.slice(position, len(sequence)))
    kept = concat(kept_runs)
    kept.discards = {sample: n for sample, n in discards.items() if kept.contains(sample)}
    return kept
