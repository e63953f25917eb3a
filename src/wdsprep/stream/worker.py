"""One worker's pass over its share of a split: which samples it reads (`worker_plan`, over
stream/planning/plan.py), how it reads them (`ShardReader`: shards opened through stream/reading/read.py, remote
ones fetched ahead by stream/reading/readahead.py, an optional local cache), and the counted, padded stream of
outputs (`WorkerStream`) whose live `position` is what a resume state saves (stream/planning/state.py).

Invariants.
- Every sample is checked against its manifest row before it is yielded (stream/reading/read.py). A shard
  that cannot be read goes to the dataset's handler; a member that does not decode, to the decode
  stage's.
- A resumed worker skips whole shards unopened and seeks over samples inside a shard; it pulls
  exactly the samples the uninterrupted pass had left, in the same order (`shuffle_buffer` blocks
  are permuted by (seed, epoch, rank, worker, block), so a block is rebuilt the same).
- With stages before the counting point, each output is held until the stages make the next one,
  so a saved position never points into a sample whose outputs were all delivered. This is exact
  for stages that map, filter or expand samples one at a time (every reader stage of wdsprep), and
  for batching placed after the counting point. Without such stages (raw samples, or a fused
  decode without a handler that drops samples) an output is its sample's only one and is handed
  over as soon as it is read: nothing is read, or requested, past the output the consumer holds.
- With `equalize="pad"` a worker that meets its target short replays its first outputs (the
  rank's, or the pass's, when its own samples make none); with "drop" it stops at its target.
- A pass left open (a consumer that stopped iterating and kept the iterator, then exited) is closed
  at interpreter exit, before the modules are torn down (`_close_open_passes`, atexit): its `finally`
  and `except` clauses and its shards' descriptors are released while the names they use still
  exist, instead of printing "Exception ignored" tracebacks as the garbage of a dying interpreter.
- A worker's pieces stay numpy columns until it reads them: they become Piece objects, rows and
  read-ahead jobs a chunk at a time (`FIRST_CHUNK`, then `CHUNK` pieces; a chunk's read-ahead ends
  with it), so a share of 10^6 shards costs no Python before its first sample; the first chunk's
  read-ahead starts with the pieces of the first shuffle block only (with stages, and of the sample
  after it, made before the block's last output is handed over; stream/reading/readahead.py), and reads ahead
  over every piece once the consumer, holding its first output, asks for the next (`_Counter.start`).
"""
from __future__ import annotations

import atexit
import weakref
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from ..errors import ShardError
from ..readoptions import ReadOptions
from ..storage import local_path, open_url
from .decode import END, ReaderStage
from .planning.plan import (
    Piece,
    Sequence,
    block_permutation,
    chunked,
    output_targets,
    rank_share,
    sequence_weights,
    worker_run,
)
from .planning.catalog import Catalog
from .reading.access import ShardAccess
from .reading.read import INDEXES, LocalShard, read_samples
from .reading.readahead import ReadAhead, reads_ahead
from .planning.state import Position


NOTHING_HELD = object()  # no output held (`WorkerStream._count_held`)
_OPEN_PASSES: weakref.WeakSet = weakref.WeakSet()  # every pass's counted outputs (a generator), while it lives


def _close_open_passes(passes: weakref.WeakSet = _OPEN_PASSES) -> None:
    """At exit, before the modules are torn down: close each pass still open (not one running, if
    the exit came from inside it), so its cleanup, and that of the stages and reads it holds, runs
    in a whole interpreter."""
    for generator in list(passes):
        if not generator.gi_running:
            generator.close()


atexit.register(_close_open_passes)


def closed_at_exit(generator: Iterator) -> Iterator:
    """`generator`, closed at exit with the open passes if it is still open then (its `except` and
    `finally` clauses name module globals, which a torn-down interpreter has set to None)."""
    _OPEN_PASSES.add(generator)
    return generator


def _stamp(sample: dict, index: int, piece_start: int, epoch: int) -> dict:
    """Stamp a sample with where it sits in its shard (`__index__`, for stages that work on blocks
    of a shard), where this worker's run of that shard starts (`__piece_start__`) and the epoch."""
    sample["__index__"] = index
    sample["__piece_start__"] = piece_start
    sample["__epoch__"] = epoch
    return sample


def stamp_kept(sample: dict, kept: frozenset[str], index: int, piece_start: int, epoch: int) -> dict:
    """A sample decoded in the reader (with `__url__` if its decode stage keeps it) with the rest of
    the bookkeeping the stage keeps (`kept`)."""
    for name, value in (("__index__", index), ("__piece_start__", piece_start), ("__epoch__", epoch)):
        if name in kept:
            sample[name] = value
    return sample


def fused(decode: ReaderStage | None) -> tuple[bool, bool, frozenset[str], bool]:
    """What a decode fused into the reader asks of it: (strip, torch, the bookkeeping it keeps, whether
    that holds `__url__`)."""
    if decode is None:
        return False, False, frozenset(), False
    return decode.strip, decode.torch, decode.kept, "__url__" in decode.kept


@dataclass
class WorkerPlan:
    """What one worker of this rank reads in this pass (see stream/planning/plan.py)."""

    sequence: Sequence  # the pass's samples (G, or the remainder after an elastic resume)
    rank_pieces: Sequence  # this rank's list, after equalizing
    own: int  # samples of rank_pieces that are the rank's own (the rest is the padding repeat)
    run: tuple[int, int]  # this worker's [start, stop) within rank_pieces
    pieces: Sequence  # this worker's samples
    target: int | None  # outputs to yield (balancing on training samples with equalize), else None

    def outputs(self, shard_weights: list[np.ndarray] | None) -> int:
        """Outputs this worker yields in the pass: its target, else one per sample (or, with
        `shard_weights`, its samples' outputs less those delivered before an elastic resume)."""
        if self.target is not None:
            return self.target
        if shard_weights is None:
            return len(self.pieces)
        return int(sequence_weights(self.pieces.with_discards(self.sequence.discards), shard_weights).sum())


def worker_plan(sequence: Sequence, rank: int, world: int, worker: int, num_workers: int, equalize: str | None,
                shard_weights: list[np.ndarray] | None) -> WorkerPlan:
    """The share of `sequence` that `worker` of `rank` reads, and its output target."""
    weights = None if shard_weights is None else sequence_weights(sequence, shard_weights)
    mine, first, own = rank_share(sequence, rank, world, equalize, weights)
    length = len(mine)
    rank_weights = None if weights is None else weights[first : first + length]
    run = worker_run(length, worker, num_workers, rank_weights)
    target = None
    if weights is not None and equalize is not None:
        target = output_targets(weights, world, num_workers, equalize, rank)[worker]
    return WorkerPlan(sequence, mine, own, run, mine.slice(*run), target)


@dataclass
class _Counter:
    """What a worker's reader and its counting point share in a pass."""

    pulled: int = 0  # source samples this worker pulled in the pass
    started: bool = False  # the start window has ended (`start`)
    ahead: ReadAhead | None = None  # the read-ahead of the chunk being read, if any

    def start(self) -> None:
        """End the read-ahead's start window: from now on it reads ahead over every piece (within its
        budget). The counting point calls it when the consumer, holding its first output, asks for the
        next; the reader, when it has made the first block without that (stages that drop samples)."""
        if not self.started:
            self.started = True
            if self.ahead is not None:
                self.ahead.widen()


FIRST_CHUNK, CHUNK = 64, 1024  # pieces materialised at a time: a small first chunk, then larger ones


class ShardReader:
    """Reads the samples of pieces of a split's shards, for one worker of one pass: `catalog` is the
    split (its shards' urls and rows, and the samples a selection keeps: pieces are in selected
    positions), `key` = (seed, epoch, rank, worker[, part]) orders `shuffle_buffer` blocks.
    `options` (the dataset's `ReadOptions`) are what remote shards are read with: the read-ahead's
    budget, and the retries, timeouts and rate floor of every request; `max_connections` the
    worker's requests at once."""

    def __init__(self, catalog: Catalog, *, handler: Callable, cache, options: ReadOptions,
                 max_connections: int, shuffle_buffer: int, key: tuple[int, ...]):
        self.catalog = catalog
        self.urls, self.rows, self.handler, self.cache = catalog.urls, catalog.rows, handler, cache
        # shards on a local filesystem (a dataset's shards share one location): see `WorkerStream.holds_outputs`
        self.local = len(self.urls) > 0 and local_path(self.urls[0]) is not None
        self.options, self.max_connections = options, max_connections
        self.shuffle_buffer = shuffle_buffer
        self.key = key  # (seed, epoch, rank, worker[, part]): what keys this worker's shuffle blocks
        self.epoch = key[1]

    def _iter_pieces(self, pieces: Sequence, skip: int, counter: _Counter, held: dict | None = None,
                     keep: bool = True, made_ahead: int = 1) -> Iterator:
        """This worker's raw samples, checked against their rows. With `held` (a dict), samples of
        local shards come as ints, `slot << 32 | sample number`, with `held[slot]` = (LocalShard,
        piece start, the cache entry it reads or None, the shard's row): copied out when delivered (`samples`). A cache
        entry that fails its check is dropped (`ShardCache.drop`) and the piece read on from its URL.
        Without `keep`, a shard's slot goes when the next shard is read (for a consumer that takes
        every int before asking for the next).
        Remote pieces are fetched ahead of the reader (`_read_ahead`), at first those of the first
        block only, until `counter.start()`; `made_ahead`: samples the consumer reads before it hands
        over the one before (see `samples`)."""
        epoch = self.epoch
        slot = max(held, default=0) if held is not None else 0
        # the read-ahead's start window: the first block (and the samples made before it is handed over);
        # it ends when the consumer asks for its second output (`_Counter.start`), at the latest here
        widen_after = 0 if counter.started else max(self.shuffle_buffer, 1) + made_ahead
        # pieces are materialised (Piece objects, rows, read-ahead jobs) a chunk at a time: a rank's
        # share of 10^6 shards would otherwise cost seconds of Python before its first sample (and a
        # run of passes is made a pass at a time: stream/planning/plan.py's `Passes`)
        pieces, skip = pieces.resumed_at(skip)
        for chunk in chunked(pieces, FIRST_CHUNK, CHUNK):
            runs = []  # (piece, first sample to read): runs of consecutive sample numbers
            for piece in chunk:
                if skip >= piece.samples:
                    skip -= piece.samples
                    continue
                if self.catalog.selection is None:
                    runs.append((piece, piece.start + skip))
                else:  # a piece of selected positions: the runs of consecutive samples it keeps
                    runs += [(Piece(piece.shard, a, b, piece.cycle), a)
                             for a, b in self.catalog.runs(piece.shard, piece.start + skip, piece.stop)]
                skip = 0
            ahead = counter.ahead = self._read_ahead(runs, 0 if counter.started else widen_after)
            stopped = False
            try:
                for piece, first in runs:
                    url = self.urls[piece.shard]
                    at = first  # the next sample of the piece to read
                    entry = None  # the cache entry read, if any: a check it fails drops it, and `at` on is read again
                    while True:
                        try:
                            row = self.rows[piece.shard]
                            index = None
                            if ahead is not None and reads_ahead(url, row):
                                stream = ahead.open(url, first, piece.stop)
                                index = stream.index
                            elif self.cache:
                                stream, entry = self.cache.open_entry(url, row.get("sha256"), row.get("bytes"))
                            else:
                                stream = open_url(url, self.options)
                            with stream:
                                # every sample is checked against the row before it is yielded (stream/reading/read.py)
                                for sample in read_samples(url, row, at, piece.stop, stream, lazy=held is not None,
                                                           in_order=not keep, index=index):
                                    if sample.__class__ is not dict:  # a LocalShard (or a packed one: reading/unpack.py)
                                        if not keep:
                                            held.clear()
                                        slot += 1
                                        held[slot] = (sample, piece.start, entry, row)
                                        if entry is None:
                                            yield from sample.checked(slot << 32)
                                            continue
                                        for tagged in sample.checked(slot << 32):  # how far the entry checked out
                                            yield tagged
                                            at = (tagged & 0xFFFFFFFF) + 1
                                        continue
                                    yield _stamp(sample, at, piece.start, epoch)
                                    at += 1
                                    if widen_after:  # asked for more: the first block was made
                                        widen_after -= 1
                                        if not widen_after:
                                            counter.start()
                            break
                        except ShardError as error:
                            if entry is not None and not entry.dropped:  # the cache's copy, not the shard
                                self.cache.drop(entry, url, error)
                                entry = None
                                continue
                            stopped = not self.handler(error)
                            break
                    if stopped:
                        break
            finally:
                if ahead is not None:
                    ahead.close()
                counter.ahead = None
            if stopped:
                return

    def _read_ahead(self, runs: list[tuple[Piece, int]], first_block: int = 0) -> ReadAhead | None:
        """The read-ahead of this worker's remote pieces (stream/reading/readahead.py), or None: nothing remote
        with an index to read (local shards: the split's are all local), `prefetch_bytes=0`, or a cache
        (which tees whole shards as they stream)."""
        if self.local or not self.options.prefetch_bytes or self.cache is not None:
            return None
        jobs = [(self.urls[piece.shard], self.rows[piece.shard], first, piece.stop) for piece, first in runs
                if reads_ahead(self.urls[piece.shard], self.rows[piece.shard])]
        if not jobs:
            return None
        # at the start (`first_block` samples still to deliver), only the pieces those need
        first_jobs = None
        if first_block:
            first_jobs = int(np.searchsorted(np.cumsum([stop - first for _, _, first, stop in jobs]), first_block)) + 1
        return ReadAhead(jobs, options=self.options, max_connections=self.max_connections, first_jobs=first_jobs)

    def _block_shuffled(self, pieces: Sequence, skip: int, held: dict, counter: _Counter,
                        made_ahead: int = 1) -> Iterator:
        """Blocks of `shuffle_buffer` consecutive samples, each permuted. Samples of local shards are
        held as ints (checked already; see `_iter_pieces`) and copied out by the consumer only when
        delivered (before it asks for the next), so the buffer holds no sample bytes, gives the
        cyclic GC nothing to track, and each copy lands in memory the previous sample freed."""
        size = self.shuffle_buffer
        block = skip // size
        offset = skip - block * size
        stream = self._iter_pieces(pieces, block * size, counter, held, made_ahead=made_ahead)
        while True:
            buffer = [s for _, s in zip(range(size), stream)]
            if not buffer:
                return
            order = block_permutation(*self.key, block, len(buffer))
            for i in order[offset:].tolist():
                yield buffer[i]
            # shards before the one being read are done: their windows go back to the pool now (the
            # consumer may still hold the shard a moment), as do the ones of this block in the shard read
            current = max(held, default=None)
            for slot in [slot for slot in held if slot != current]:
                held.pop(slot)[0].release(keep_newest=False)
            if current is not None:
                held[current][0].release()
            offset = 0
            block += 1

    def items(self, pieces: Sequence, skip: int, counter: _Counter, held: dict, made_ahead: int = 1) -> Iterator:
        """What this worker's samples are taken from, from `skip` on: ints of local shards (`held`
        says their shards) and whole samples (`_iter_pieces`), block-shuffled with a shuffle buffer."""
        if self.shuffle_buffer > 1:
            return self._block_shuffled(pieces, skip, held, counter, made_ahead)
        return self._iter_pieces(pieces, skip, counter, held, keep=False, made_ahead=made_ahead)

    def samples(self, pieces: Sequence, skip: int, counter: _Counter, decode: ReaderStage | None = None,
                made_ahead: int = 1) -> Iterator[dict]:
        """This worker's samples from `skip` on, counted as pulled; with `decode` (a `ReaderStage`
        placed first), decoded as they are copied out of local shards (fused: no raw sample in between).
        A shard that cannot be read when a sample is taken goes to the handler (as when it is
        checked), a member that does not decode to the decode stage's (`taken`). `made_ahead`: how
        many samples the consumer pulls before it hands over the one before (1 when stages sit before
        the counting point, `WorkerStream._count`; 0 when outputs are the samples): the read-ahead's
        start window."""
        held: dict = {}
        items = self.items(pieces, skip, counter, held, made_ahead)
        counter.pulled = skip
        epoch = self.epoch
        strip, torch, kept, with_url = fused(decode)
        for item in items:
            counter.pulled += 1
            if item.__class__ is not dict:  # a sample of a local (or cached) shard, checked: taken here
                shard, piece_start, _, _ = held[item >> 32]
                index = item & 0xFFFFFFFF
                try:  # copied out of the shard's buffer: raw, or decoded where it lies when fused
                    if decode is None:
                        yield _stamp(shard.take(index), index, piece_start, epoch)
                        continue
                    sample = shard.decode_members(index, shard.members(index), strip, torch, with_url)
                except ShardError:  # taken again, step by step, each failure to its handler
                    sample = self.taken(item, held, decode)
                else:
                    yield stamp_kept(sample, kept, index, piece_start, epoch) if kept else sample
                    continue
            else:
                sample = self.taken(item, held, decode)
            if sample is END:
                return
            if sample is not None:
                yield sample

    def taken(self, item, held: dict, decode: ReaderStage | None) -> dict | None:
        """One item of `items` as `samples` hands it out: a sample, None (skipped by a handler) or
        END (a handler ended the stream). A shard that cannot be read when its sample is taken goes
        to the dataset's handler, after the sample was read again from its URL where a cache entry
        failed (`_read_again`); a member that does not decode, to the decode stage's."""
        if item.__class__ is not dict:
            shard, piece_start, entry, row = held[item >> 32]
            index = item & 0xFFFFFFFF
            try:
                sample = shard.take(index) if decode is None else shard.members(index)
            except ShardError as error:
                try:
                    item = self._read_again(entry, shard, row, index, piece_start, error)
                except ShardError as failed:
                    return None if self.handler(failed) else END
            else:
                if decode is None:
                    return _stamp(sample, index, piece_start, self.epoch)
                strip, torch, kept, with_url = fused(decode)
                try:
                    sample = shard.decode_members(index, sample, strip, torch, with_url)
                except ShardError as error:  # as the stage would: its handler skips the sample or ends the stream
                    return None if decode.skips(error) else END
                return stamp_kept(sample, kept, index, piece_start, self.epoch) if kept else sample
        # a whole sample (of a remote shard, or read again from its URL)
        return item if decode is None else decode.decoded(item)

    def _read_again(self, entry, shard: LocalShard, row: dict, index: int, piece_start: int, error: ShardError) -> dict:
        """Sample `index` of `shard` (its manifest `row`), whose cache `entry` failed its check as the
        sample was taken (`error`): the entry dropped, the sample read alone from the shard's URL by
        the one checked random read (stream/reading/access.py: one request; its index, loaded from the
        entry and checked, is the streaming readers' `INDEXES`') and stamped. Without an entry,
        `error` is the shard's."""
        if entry is None:
            raise error
        self.cache.drop(entry, shard.url, error)
        access = ShardAccess([shard.url], [row], options=self.options, indexes=INDEXES)
        return _stamp(access.read([(0, index, None)])[0], index, piece_start, self.epoch)

    def carried_discards(self, plan: WorkerPlan) -> dict[int, int]:
        """Stream positions of this worker's samples whose outputs were partly delivered before an
        elastic resume -> how many outputs to discard (the padding repeat discards nothing)."""
        if not plan.sequence.discards:
            return {}
        run_start, run_stop = plan.run
        run = plan.pieces
        owned = max(0, min(run_stop, plan.own) - run_start)
        found: dict[int, int] = {}
        for sample, count in plan.sequence.discards.items():
            position = run.position_of(*sample)
            if position is not None and position < owned:
                found[position] = count
        if self.shuffle_buffer <= 1 or not found:
            return found
        return {self._stream_position(len(run), q): count for q, count in found.items()}

    def _stream_position(self, run_length: int, q: int) -> int:
        """Where run position `q` comes in this worker's block-shuffled stream (rule 6): its block's
        permutation only, not the whole run's."""
        block = q // self.shuffle_buffer
        first = block * self.shuffle_buffer
        order = block_permutation(*self.key, block, min(self.shuffle_buffer, run_length - first))
        return first + int(np.flatnonzero(order == q - first)[0])


class WorkerStream:
    """One worker's pass: iterating it yields the outputs of `stages` over the plan's samples (then
    `after`, the stages past the counting point: batching), from `resume` on; `position` is the
    worker's live position after the latest output, what a state saves (stream/planning/state.py).

    `invoke(stage, source)` applies one stage (the pipeline's own); `decode`, a `ReaderStage`
    fused into the reader, is then not among `stages`."""

    def __init__(self, reader: ShardReader, plan: WorkerPlan, resume: Position, *, stages: list, after: list,
                 invoke: Callable, decode: ReaderStage | None, equalize: str | None,
                 shard_weights: list[np.ndarray] | None):
        self.reader, self.plan, self.resume = reader, plan, resume
        self.stages, self.after, self.invoke, self.decode = stages, after, invoke, decode
        self.equalize, self.shard_weights = equalize, shard_weights
        self.position = Position(resume.skip, resume.discard, resume.delivered)

    def __iter__(self) -> Iterator:
        plan, resume, counter = self.plan, self.resume, _Counter()
        holds = self.holds_outputs
        source = self.reader.samples(plan.pieces, resume.skip, counter, self.decode, made_ahead=int(holds))
        for step in self.stages:
            source = self.invoke(step, source)
        limit = plan.target if self.equalize == "drop" else None
        discards = self.reader.carried_discards(plan)
        if not holds:
            source = self._count_each(source, counter, discards, limit)
        elif self.stages or discards or resume.discard or limit is not None:
            source = self._count(source, counter, discards, limit)
        else:
            source = self._count_held(source, counter)
        if plan.target is not None and self.equalize == "pad":
            source = self._pad_outputs(source)
        closed_at_exit(source)  # a generator of ours (the stages after it, batching, may be anything)
        for step in self.after:
            source = self.invoke(step, source)
        return source

    @property
    def takeable(self) -> bool:
        """Whether a consumer that takes from several streams in turn (stream/mix.py) may take this
        pass's samples itself (`taker`): each output a decoded sample of a local shard, held until the
        next is made (`_count_held`), none to discard."""
        plan, resume = self.plan, self.resume
        return not (self.decode is None or self.stages or self.after or not self.reader.local or resume.discard
                    or plan.target is not None or self.reader.carried_discards(plan))

    def taker(self) -> "Taker":
        """This pass as a `Taker`, for a consumer that found it `takeable`."""
        return Taker(self)

    @property
    def holds_outputs(self) -> bool:
        """Whether an output is handed over only once the next is made (`_count`): with stages before
        the counting point, a fused decode whose handler may drop a sample, or local shards. Otherwise
        (remote shards) each output is its sample's only one and goes at once (`_count_each`), so a
        rank's first sample waits for no request of the piece after it. Locally the next sample costs
        no request, and holding it keeps the memory a consumer frees with a batch in use: a batch of
        large samples freed while no later sample was allocated above it was handed back to the system
        by the allocator and faulted in again for the next batch (256 one-MiB samples in batches of 64:
        4x the page faults, 2.4x the CPU)."""
        return bool(self.stages) or (self.decode is not None and self.decode.drops) or self.reader.local

    def _count(self, outputs: Iterator, counter: _Counter, discards: dict[int, int], limit: int | None = None) -> Iterator:
        """Counts outputs per source sample; `discards`: stream position -> outputs already delivered;
        `limit`: stop once that many outputs were delivered (counting those before a resume).

        Each output is held until the next one is made, so that when it is delivered the position
        already knows whether its sample is finished: a finished sample is counted as passed
        (discard 0), and only a sample with outputs still to come is saved as partly delivered."""
        resume, position = self.resume, self.position
        if resume.discard:
            discards = {**discards, resume.skip: resume.discard}
        current, seen = -1, 0
        pending, pending_sample, pending_seen, holding = None, -1, 0, False
        for output in outputs:
            sample = counter.pulled - 1  # the source sample this output was made from
            if sample != current:
                current, seen = sample, 0
            seen += 1
            if holding and limit is not None and position.delivered >= limit:
                return  # the position stays at the last output delivered
            if holding:
                if sample == pending_sample:
                    position.skip, position.discard = pending_sample, pending_seen
                else:  # the held output was its sample's last
                    position.skip, position.discard = sample, min(seen, discards.get(sample, 0))
                position.delivered += 1
                holding = False
                yield pending
                if not counter.started:  # the consumer holds an output and asks for more
                    counter.start()
            if seen > discards.get(sample, 0):
                pending, pending_sample, pending_seen, holding = output, sample, seen, True
        if holding and (limit is None or position.delivered < limit):
            position.skip, position.discard = counter.pulled, 0
            position.delivered += 1
            yield pending
        elif holding:
            return
        position.skip, position.discard = counter.pulled, 0  # a finished pass: everything was delivered

    def _count_held(self, outputs: Iterator, counter: _Counter) -> Iterator:
        """`_count` where a sample makes at most one output (no stage before the counting point),
        none is to be discarded and no output target cuts the pass (no discards, no limit): the
        same positions, by fewer steps per output (a packed small sample is read in a few µs;
        `_count`'s general bookkeeping took a sixth of it)."""
        position, pending = self.position, NOTHING_HELD
        for output in outputs:
            if pending is not NOTHING_HELD:
                position.skip, position.discard = counter.pulled - 1, 0  # resume at the sample held
                position.delivered += 1
                yield pending
                if not counter.started:  # the consumer holds an output and asks for more
                    counter.start()
            pending = output
        if pending is not NOTHING_HELD:
            position.skip, position.discard = counter.pulled, 0
            position.delivered += 1
            yield pending
        position.skip, position.discard = counter.pulled, 0  # a finished pass: everything was delivered

    def _count_each(self, outputs: Iterator, counter: _Counter, discards: dict[int, int], limit: int | None = None) -> Iterator:
        """`_count` for a stream of remote shards whose outputs are its samples (no stage before the
        counting point: at most one output per sample, a fused decode's; see `holds_outputs`). An
        output's sample is finished when it is made, so it is handed over at once: nothing is read
        past the output the consumer holds (a remote rank's first sample waits for no request of the
        piece after it)."""
        resume, position = self.resume, self.position
        if resume.discard:
            discards = {**discards, resume.skip: resume.discard}
        if limit is not None and position.delivered >= limit:
            return
        for output in outputs:
            position.skip, position.discard = counter.pulled, 0
            if discards.get(counter.pulled - 1, 0):
                continue  # its one output was delivered before the resume
            position.delivered += 1
            yield output
            if not counter.started:  # the consumer holds an output and asks for more
                counter.start()
            if limit is not None and position.delivered >= limit:
                return  # the position stays at the last output delivered
        position.skip, position.discard = counter.pulled, 0  # a finished pass: everything was delivered

    def _pad_outputs(self, outputs: Iterator) -> Iterator:
        """Extend a worker's outputs to its target by replaying its first outputs (the rank's, or
        the pass's, when its samples make none)."""
        yield from outputs
        plan, position = self.plan, self.position
        own = int(sequence_weights(plan.pieces.with_discards(plan.sequence.discards), self.shard_weights).sum())
        done = position.delivered - own  # repeats delivered before a resume
        for pieces in (plan.pieces, plan.rank_pieces, plan.sequence):
            if len(pieces) and sequence_weights(pieces, self.shard_weights).sum() > 0:
                break
        index = 0  # position in the endless replay of `pieces`
        while position.delivered < plan.target:
            replay = self.reader.samples(pieces, 0, _Counter(), self.decode, made_ahead=int(self.holds_outputs))
            for step in self.stages:
                replay = self.invoke(step, replay)
            before = index
            for output in replay:
                if position.delivered >= plan.target:
                    return
                index += 1
                if index <= done:
                    continue
                position.delivered += 1
                yield output
            if index == before:
                return  # nothing to repeat: the stages make no output at all


class Taker:
    """A `WorkerStream`'s pass whose samples a mix takes itself (`WorkerStream.taker`): the reader's
    items (`ShardReader.items`, closed at exit with the open passes), the shards they are taken from
    (`held`) and the live `position`, which the mix counts. A mix takes an output of one part per
    slot, and each part's generators resumed in turn (the reader's, the counting point's) cost more
    than the taking itself: their frames, blocks and positions are touched part after part. The mix
    takes each sample as `ShardReader.samples` does, each failure by `taken`, and counts it as
    `WorkerStream._count_held` does (stream/mix.py `_taken_in_turn`)."""

    __slots__ = ("reader", "items", "held", "counter", "position", "decode", "fused", "epoch")

    def __init__(self, stream: WorkerStream):
        self.reader = reader = stream.reader
        self.decode = stream.decode
        self.held: dict = {}
        self.counter = _Counter()  # (its `pulled` is not kept: the mix counts the position itself)
        self.items = closed_at_exit(reader.items(stream.plan.pieces, stream.resume.skip, self.counter, self.held,
                                                 made_ahead=1))
        self.position, self.epoch = stream.position, reader.epoch
        self.fused = fused(stream.decode)

    def next_output(self):
        """The part's next output taken from its items by `taken` (the mix takes a part's first output
        so, the rest itself), or END (none left); each item that gave none counted as passed."""
        for item in self.items:
            sample = self.taken(item)
            if sample.__class__ is dict:
                return sample
            self.position.skip += 1
            if sample is END:
                break
        return END

    def taken(self, item):
        """An item the mix did not take at once (a whole sample, or one whose taking failed): its
        sample, None (a handler skipped it) or END (a handler ended the part's stream: its reads are
        closed)."""
        sample = self.reader.taken(item, self.held, self.decode)
        if sample is END:
            self.items.close()
        return sample
