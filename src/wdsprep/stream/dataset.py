"""`wdsprep.dataset(...)`: a webdataset pipeline over a manifest with global shuffling, sample-exact
rank/worker dealing (stream/plan.py), and exact mid-epoch resume, on the same world or another.

Resume contract. The pipeline counts, per DataLoader worker, how many source samples it pulled and
how many outputs the stages produced of the current one; `state_dict()` saves that, and a resumed
iteration skips the pulled samples cheaply (whole shards are not opened, samples inside a shard are
seeked over) and discards the outputs already delivered. Each output is held until the stages make
the next one, so a saved position never points into a sample whose outputs were all delivered.
This is exact for stages that map, filter or expand samples one at a time (every reader stage of
wdsprep), and for `.batched()` called on this object (batching is placed after the counting point).
With DataLoader workers, use `wdsprep.Loader`, which records each worker's position in the main
process, or torchdata's `StatefulDataLoader`, which calls `state_dict()` inside each worker (the
state is then that worker's).

Elastic resume. `load_state_dict` takes this rank's own state (same world size and workers), or the
list of every rank's state: the interrupted pass becomes a `Level` of the epoch's history, and this
pass deals what the history left (`plan.remainder`). The history is saved in `resumed_from`, so a
resumed pass can itself be resumed elastically; a state holds positions only, never sample lists.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Callable, Iterator
from typing import Sequence as Sequence_

import numpy as np
import webdataset as wds
from webdataset.compat import FluidInterface

from ..errors import ConfigError, ShardError
from ..shards.codec import Decode
from ..shards.manifest import Manifest
from .manifests import load_manifest
from ..storage import open_url
from .plan import (
    Level,
    Piece,
    Sequence,
    block_permutation,
    epoch_sequence,
    output_targets,
    rank_share,
    remainder,
    sequence_weights,
    stream_positions,
    worker_run,
)
from .read import LocalShard, read_samples
from .remote import ReadAhead, check_options, reads_ahead


def distributed_info(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """(rank, world size): explicit arguments, then torch.distributed, then RANK/WORLD_SIZE."""
    if rank is not None and world_size is not None:
        return rank, world_size
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def worker_info() -> tuple[int, int]:
    try:
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        if info is not None:
            return info.id, info.num_workers
    except ImportError:
        pass
    return int(os.environ.get("WORKER", 0)), int(os.environ.get("NUM_WORKERS", 1))


def _stamp(sample: dict, index: int, piece_start: int, epoch: int) -> dict:
    """Stamp a sample with where it sits in its shard (`__index__`, for stages that work on blocks
    of a shard), where this worker's run of that shard starts (`__piece_start__`) and the epoch."""
    sample["__index__"] = index
    sample["__piece_start__"] = piece_start
    sample["__epoch__"] = epoch
    return sample


@dataclass
class Position:
    """Where a worker's stream is: source samples fully passed, outputs of the current one delivered."""

    skip: int = 0
    discard: int = 0
    delivered: int = 0

    def as_dict(self) -> dict:
        return {"skip": self.skip, "discard": self.discard, "delivered": self.delivered}


@dataclass
class _Counter:
    pulled: int = 0
    position: Position = field(default_factory=Position)


class ShardSource:
    """Pipeline stage 0 placeholder: `ShardDataset.iterator1` feeds this rank/worker's samples."""

    def __call__(self) -> Iterator[dict]:
        raise RuntimeError("ShardSource is driven by ShardDataset")


class ShardDataset(wds.DataPipeline, FluidInterface):
    def __init__(
        self,
        manifest: Manifest,
        split: str,
        *,
        seed: int = 0,
        epoch: int | None = None,
        shuffle_shards: bool = True,
        shuffle_buffer: int = 0,
        equalize: str | None = "pad",
        rank: int | None = None,
        world_size: int | None = None,
        handler: Callable = wds.reraise_exception,
        cache_dir: str | None = None,
        cache_bytes: int | float | None = None,
        outputs_per_sample: Sequence_[int] | Callable | None = None,
        prefetch_bytes: int | None = None,
        max_connections: int | None = None,
    ):
        super().__init__()
        if equalize not in (None, "pad", "drop"):
            raise ConfigError(f"equalize must be 'pad', 'drop' or None (got {equalize!r})")
        self.manifest = manifest
        self.split = split
        self.rows = manifest.shards(split)
        self.urls = manifest.shard_urls(split)
        self.counts = [row["samples"] for row in self.rows]
        self.seed = int(seed)
        self.auto_epoch = epoch is None
        self.epoch = 0 if epoch is None else int(epoch)
        self.shuffle_shards = shuffle_shards
        self.shuffle_buffer = int(shuffle_buffer)
        self.equalize = equalize
        self.rank_arg, self.world_arg = rank, world_size
        self.handler = handler
        self.shard_weights = self._shard_weights(outputs_per_sample)
        self._resume: dict[int, Position] = {}
        self._levels: list[Level] = []  # interrupted passes of this epoch that an elastic resume continues
        self._digest: str | None = None
        self._counter: _Counter | None = None
        self._count_at: int | None = None  # pipeline index where outputs are counted (before batching)
        self._worker_override: tuple[int, int] | None = None  # set by wdsprep.Loader inside workers
        # read-ahead of remote shards, per worker (stream/remote.py): byte budget, requests at once
        self.prefetch_bytes, self.max_connections = check_options(prefetch_bytes, max_connections)
        self.cache = None  # optional local LRU shard cache (stream/cache.py); off by default
        if cache_dir is not None:
            from .cache import ShardCache

            self.cache = ShardCache(cache_dir, cache_bytes if cache_bytes is not None else 10e9)
        self.append(ShardSource())

    def _shard_weights(self, outputs_per_sample) -> list[np.ndarray] | None:
        """Per shard, the training samples each of its samples becomes (see stream/plan.py)."""
        if outputs_per_sample is None:
            return None
        if callable(outputs_per_sample):
            outputs_per_sample = outputs_per_sample(self.manifest, self.split)
        flat = np.asarray(list(outputs_per_sample), dtype=np.int64)
        if flat.ndim != 1 or len(flat) != sum(self.counts) or (flat < 0).any():
            raise ConfigError(f"outputs_per_sample must give a count >= 0 for each of the {sum(self.counts)} samples "
                              f"of split {self.split!r} (got {len(flat)} values)")
        ends = np.cumsum(self.counts)
        return [flat[end - count : end] for end, count in zip(ends, self.counts)]

    # -- epochs and state
    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self.auto_epoch = False
        self._levels = []

    @property
    def digest(self) -> str:
        """Names, counts and sha256 of the split's shards: what a saved state must have been read from."""
        if self._digest is None:
            rows = [[row["name"], row["samples"], row.get("sha256")] for row in self.rows]
            self._digest = hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]
        return self._digest

    def _layout(self) -> dict:
        rank, world = distributed_info(self.rank_arg, self.world_arg)
        return {"dataset": self.digest, "split": self.split, "seed": self.seed, "shuffle_shards": self.shuffle_shards,
                "shuffle_buffer": self.shuffle_buffer, "equalize": self.equalize, "rank": rank, "world_size": world}

    def make_state(self, num_workers: int, positions: dict[int, dict], **extra) -> dict:
        """A rank's state: its layout, the epoch, each worker's position and the passes it resumes."""
        return {**self._layout(), "epoch": self.epoch, "num_workers": num_workers, **extra,
                "workers": {str(w): dict(p) for w, p in sorted(positions.items())},
                "resumed_from": [_level_json(level) for level in self._levels]}

    def parse_state(self, state: dict | list, num_workers: int, what: str = "dataset") -> dict[int, dict]:
        """Check a state (this rank's own, or every old rank's) and adopt its epoch and resumed passes;
        returns the worker positions to resume from (none after an elastic resume)."""
        layout = self._layout()
        states = state if isinstance(state, list) else [state]
        if not states or not all(isinstance(s, dict) for s in states):
            raise ConfigError("a state is a dict (this rank's) or a list of every rank's dicts")
        for one in states:
            for name in ("split", "seed", "dataset", "shuffle_shards", "shuffle_buffer", "equalize"):
                if one.get(name) != layout[name]:
                    raise ConfigError(f"state was saved with {name}={one.get(name)!r}, this {what} has {layout[name]!r}")
        first = states[0]
        if not isinstance(state, list):
            for name, here in (("world_size", layout["world_size"]), ("rank", layout["rank"]), ("num_workers", num_workers)):
                if first.get(name) != here:
                    raise ConfigError(
                        f"state was saved with {name}={first.get(name)!r}, this {what} has {here!r}; "
                        "to resume on another world, pass the list of every rank's state"
                    )
            self.epoch = int(first["epoch"])
            self._levels = [_level_from_json(level) for level in first.get("resumed_from", [])]
            return {int(w): dict(p) for w, p in first["workers"].items()}
        world = len(states)
        for name in ("epoch", "world_size", "num_workers", "resumed_from"):
            values = {json.dumps(s.get(name), sort_keys=True) for s in states}
            if len(values) != 1:
                raise ConfigError(f"the states disagree on {name} ({', '.join(sorted(values))})")
        if first.get("world_size") != world or sorted(s.get("rank") for s in states) != list(range(world)):
            raise ConfigError(f"the list must hold one state per rank 0..{first.get('world_size')}-1 "
                              f"(got ranks {[s.get('rank') for s in states]})")
        positions = {
            (s["rank"], int(w)): (int(p["skip"]), int(p.get("discard", 0))) for s in states for w, p in s["workers"].items()
        }
        self.epoch = int(first["epoch"])
        self._levels = [_level_from_json(level) for level in first.get("resumed_from", [])]
        self._levels.append(Level(world, int(first["num_workers"]), positions))
        return {}

    def state_dict(self) -> dict:
        """This process's position: inside a DataLoader worker (torchdata's StatefulDataLoader) that
        worker's, otherwise a single-process iteration's (see `wdsprep.Loader` for workers)."""
        worker, num_workers = self._worker_override or worker_info()
        if self._counter is not None:
            position = self._counter.position
        else:  # not iterated since a load_state_dict: the loaded position, not the epoch's start
            position = self._resume.get(worker, Position())
        return self.make_state(num_workers, {worker: position.as_dict()})

    def load_state_dict(self, state: dict | list) -> None:
        """Resume from this rank's own state (same world and workers), or from the list of every
        old rank's state (any world and workers: the epoch's remainder is dealt afresh)."""
        _, num_workers = self._worker_override or worker_info()
        self._resume = {w: Position(**p) for w, p in self.parse_state(state, num_workers).items()}
        self._counter = None  # the position is now the loaded one until the next iteration

    # -- what this worker reads
    def sequence(self, epoch: int | None = None) -> Sequence:
        """The samples this pass deals: the epoch's G, or what the interrupted passes left of it."""
        epoch = self.epoch if epoch is None else epoch
        sequence = epoch_sequence(self.counts, self.seed, epoch, self.shuffle_shards)
        for level in self._levels:
            sequence = remainder(sequence, level, seed=self.seed, epoch=epoch, shuffle_buffer=self.shuffle_buffer,
                                 equalize=self.equalize, shard_weights=self.shard_weights)
        return sequence

    def plan(self, worker: int = 0, num_workers: int = 1, epoch: int | None = None) -> WorkerPlan:
        rank, world = distributed_info(self.rank_arg, self.world_arg)
        sequence = self.sequence(epoch)
        weights = None if self.shard_weights is None else sequence_weights(sequence, self.shard_weights)
        mine, first, own = rank_share(sequence, rank, world, self.equalize, weights)
        length = sum(p.samples for p in mine)
        rank_weights = None if weights is None else weights[first : first + length]
        run = worker_run(length, worker, num_workers, rank_weights)
        target = None
        if weights is not None and self.equalize is not None:
            target = output_targets(weights, world, num_workers, self.equalize, rank)[worker]
        return WorkerPlan(sequence, mine, own, run, Sequence(mine).slice(*run), target)

    def pieces(self, worker: int = 0, num_workers: int = 1, epoch: int | None = None) -> list[Piece]:
        return self.plan(worker, num_workers, epoch).pieces

    def samples_per_rank(self, epoch: int | None = None, num_workers: int = 1) -> int:
        """Samples this rank reads per epoch; with `outputs_per_sample`, the training samples it
        yields, which with equalize depend on the worker count (each worker meets its own target)."""
        if self.shard_weights is None:
            return sum(p.samples for p in self.plan(0, 1, epoch).rank_pieces)
        total = 0
        for worker in range(num_workers):
            plan = self.plan(worker, num_workers, epoch)
            if plan.target is not None:
                total += plan.target
            else:
                total += int(sequence_weights(Sequence(plan.pieces, plan.sequence.discards), self.shard_weights).sum())
        return total

    def _carried_discards(self, plan: WorkerPlan, worker: int) -> dict[int, int]:
        """Stream positions of this worker's samples whose outputs were partly delivered before an
        elastic resume -> how many outputs to discard (the padding repeat discards nothing)."""
        if not plan.sequence.discards:
            return {}
        rank, _ = distributed_info(self.rank_arg, self.world_arg)
        run_start, run_stop = plan.run
        run = Sequence(plan.pieces)
        owned = max(0, min(run_stop, plan.own) - run_start)
        found: dict[int, int] = {}
        position = 0
        for piece in run.pieces:
            for (shard, index), count in plan.sequence.discards.items():
                if shard == piece.shard and piece.start <= index < piece.stop and position + index - piece.start < owned:
                    found[position + index - piece.start] = count
            position += piece.samples
        if self.shuffle_buffer <= 1 or not found:
            return found
        order = stream_positions(len(run), 0, len(run), shuffle_buffer=self.shuffle_buffer,
                                 key=(self.seed, self.epoch, rank, worker))
        where = {q: p for p, q in enumerate(order)}
        return {where[q]: count for q, count in found.items()}

    def _iter_pieces(self, pieces: list[Piece], skip: int, held: dict | None = None, keep: bool = True) -> Iterator:
        """This worker's raw samples, checked against their rows. With `held` (a dict), samples of
        local shards come as ints, `slot << 32 | sample number`, with `held[slot]` = (LocalShard,
        piece start): copied out when delivered (`_source_iterator`). Without `keep`, a shard's slot goes when
        the next shard is read (for a consumer that takes every int before asking for the next).
        Remote pieces are fetched ahead of the reader (`_read_ahead`)."""
        epoch = self.epoch
        slot = max(held, default=0) if held is not None else 0
        runs = []  # (piece, first sample to read)
        for piece in pieces:
            if skip >= piece.samples:
                skip -= piece.samples
                continue
            runs.append((piece, piece.start + skip))
            skip = 0
        ahead = self._read_ahead(runs)
        try:
            for piece, first in runs:
                url = self.urls[piece.shard]
                try:
                    row = self.rows[piece.shard]
                    index = None
                    if ahead is not None and reads_ahead(url, row):
                        stream = ahead.open(url, first, piece.stop)
                        index = stream.index
                    elif self.cache:
                        stream = self.cache.open(url, row.get("sha256"), row.get("bytes"))
                    else:
                        stream = open_url(url)
                    with stream:
                        # every sample is checked against the row before it is yielded (stream/read.py)
                        at = first
                        for sample in read_samples(url, row, first, piece.stop, stream, lazy=held is not None,
                                                   in_order=not keep, index=index):
                            if sample.__class__ is LocalShard:
                                if not keep:
                                    held.clear()
                                slot += 1
                                held[slot] = (sample, piece.start)
                                yield from sample.checked(slot << 32)
                                continue
                            yield _stamp(sample, at, piece.start, epoch)
                            at += 1
                except ShardError as error:
                    if self.handler(error):
                        continue
                    break
        finally:
            if ahead is not None:
                ahead.close()

    def _read_ahead(self, runs: list[tuple[Piece, int]]) -> ReadAhead | None:
        """The read-ahead of this worker's remote pieces (stream/remote.py), or None: nothing remote
        with an index to read, `prefetch_bytes=0`, or a cache (which tees whole shards as they stream)."""
        if not self.prefetch_bytes or self.cache is not None:
            return None
        jobs = [(self.urls[piece.shard], self.rows[piece.shard], first, piece.stop) for piece, first in runs
                if reads_ahead(self.urls[piece.shard], self.rows[piece.shard])]
        if not jobs:
            return None
        return ReadAhead(jobs, prefetch_bytes=self.prefetch_bytes, max_connections=self.max_connections)

    def _block_shuffled(self, pieces: list[Piece], skip: int, worker_key: tuple, held: dict) -> Iterator:
        """Blocks of `shuffle_buffer` consecutive samples, each permuted. Samples of local shards are
        held as ints (checked already; see `_iter_pieces`) and copied out by the consumer only when
        delivered (before it asks for the next), so the buffer holds no sample bytes, gives the
        cyclic GC nothing to track, and each copy lands in memory the previous sample freed."""
        size = self.shuffle_buffer
        block = skip // size
        offset = skip - block * size
        stream = self._iter_pieces(pieces, block * size, held)
        while True:
            buffer = [s for _, s in zip(range(size), stream)]
            if not buffer:
                return
            order = block_permutation(self.seed, self.epoch, *worker_key, block, len(buffer))
            for i in order[offset:]:
                yield buffer[i]
            current = max(held, default=None)  # shards before the one being read are done: let them go
            for slot in [slot for slot in held if slot != current]:
                del held[slot]
            offset = 0
            block += 1

    def _source_iterator(self, pieces: list[Piece], worker: int, resume: Position, counter: _Counter,
                         decode: Decode | None = None) -> Iterator[dict]:
        """This worker's samples, counted as pulled; with `decode` (a `wdsprep.decode()` stage placed
        first), decoded as they are copied out of local shards (fused: no raw sample in between).
        A shard that cannot be read when a sample is taken goes to the dataset's handler (as when
        it is checked), a member that does not decode to the decode stage's."""
        rank, _ = distributed_info(self.rank_arg, self.world_arg)
        held: dict = {}
        if self.shuffle_buffer > 1:
            samples = self._block_shuffled(pieces, resume.skip, (rank, worker), held)
        else:
            samples = self._iter_pieces(pieces, resume.skip, held, keep=False)
        counter.pulled = resume.skip
        handler, epoch = self.handler, self.epoch
        if decode is None:
            for item in samples:
                counter.pulled += 1
                if item.__class__ is dict:
                    yield item
                    continue
                shard, piece_start = held[item >> 32]
                index = item & 0xFFFFFFFF
                try:
                    sample = shard.take(index)
                except ShardError as error:
                    if handler(error):
                        continue
                    return
                yield _stamp(sample, index, piece_start, epoch)
            return
        strip, torch, skips = decode.strip, decode.torch, decode.skips
        for item in samples:
            counter.pulled += 1
            if item.__class__ is dict:
                try:
                    sample = decode.sample(item)
                except ShardError as error:
                    if skips(error):
                        continue
                    return
                yield sample
                continue
            shard, piece_start = held[item >> 32]
            index = item & 0xFFFFFFFF
            try:
                members = shard.members(index)
            except ShardError as error:
                if handler(error):
                    continue
                return
            try:
                sample = shard.decode_members(index, members, strip, torch)
            except ShardError as error:  # as the stage would: its handler skips the sample or ends the stream
                if skips(error):
                    continue
                return
            yield _stamp(sample, index, piece_start, epoch)

    # -- iteration with counting
    @staticmethod
    def _count(outputs: Iterator, resume: Position, counter: _Counter, discards: dict[int, int],
               limit: int | None = None) -> Iterator:
        """Counts outputs per source sample; `discards`: stream position -> outputs already delivered;
        `limit`: stop once that many outputs were delivered (counting those before a resume).

        Each output is held until the next one is made, so that when it is delivered the position
        already knows whether its sample is finished: a finished sample is counted as passed
        (discard 0), and only a sample with outputs still to come is saved as partly delivered."""
        position = counter.position = Position(resume.skip, resume.discard, resume.delivered)
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
            if seen > discards.get(sample, 0):
                pending, pending_sample, pending_seen, holding = output, sample, seen, True
        if holding and (limit is None or position.delivered < limit):
            position.skip, position.discard = counter.pulled, 0
            position.delivered += 1
            yield pending
        elif holding:
            return
        position.skip, position.discard = counter.pulled, 0  # a finished pass: everything was delivered

    def _pad_outputs(self, outputs: Iterator, counter: _Counter, plan: WorkerPlan, worker: int, stages: list,
                     decode: Decode | None = None) -> Iterator:
        """Extend a worker's outputs to its target by replaying its first outputs (the rank's, or
        the pass's, when it has none)."""
        yield from outputs
        position = counter.position
        own = int(sequence_weights(Sequence(plan.pieces, plan.sequence.discards), self.shard_weights).sum())
        done = position.delivered - own  # repeats delivered before a resume
        for pieces in (plan.pieces, plan.rank_pieces, plan.sequence.pieces):
            if sum(p.samples for p in pieces):
                break
        index = 0  # position in the endless replay of `pieces`
        while position.delivered < plan.target:
            replay = self._source_iterator(pieces, worker, Position(), _Counter(), decode)
            for step in stages:
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

    def iterator1(self):
        worker, num_workers = self._worker_override or worker_info()
        resume = self._resume.pop(worker, Position())
        counter = self._counter = _Counter()
        stages = self.pipeline
        cut = len(stages) if self._count_at is None else self._count_at
        decode = stages[1] if cut > 1 and isinstance(stages[1], Decode) else None  # fused into the reader
        first = 1 if decode is None else 2
        plan = self.plan(worker, num_workers)
        source = self._source_iterator(plan.pieces, worker, resume, counter, decode)
        for step in stages[first:cut]:
            source = self.invoke(step, source)
        limit = plan.target if self.equalize == "drop" else None
        source = self._count(source, resume, counter, self._carried_discards(plan, worker), limit)
        if plan.target is not None and self.equalize == "pad":
            source = self._pad_outputs(source, counter, plan, worker, stages[first:cut], decode)
        for step in stages[cut:]:
            source = self.invoke(step, source)
        return source

    def iterator(self):
        yield from self.iterator1()
        self._levels = []  # a resumed pass is over: the next pass deals a whole epoch
        if self.auto_epoch:
            self.epoch += 1
            self._counter = None  # the state now points at the start of the next epoch

    def batched(self, batchsize, collation_fn=wds.filters.default_collation_fn, partial=True):
        result = copy.copy(self)
        result.pipeline = list(self.pipeline)
        if result._count_at is None:
            result._count_at = len(result.pipeline)
        result.append(_batcher(batchsize, collation_fn, partial))
        return result

    def __len__(self) -> int:
        """Samples this rank yields per epoch (with equalize, the same on every rank)."""
        return self.samples_per_rank()


@dataclass
class WorkerPlan:
    """What one worker of this rank reads in this pass (see stream/plan.py)."""

    sequence: Sequence  # the pass's samples (G, or the remainder after an elastic resume)
    rank_pieces: list[Piece]  # this rank's list, after equalizing
    own: int  # samples of rank_pieces that are the rank's own (the rest is the padding repeat)
    run: tuple[int, int]  # this worker's [start, stop) within rank_pieces
    pieces: list[Piece]  # this worker's samples
    target: int | None  # outputs to yield (balancing on training samples with equalize), else None


def _batcher(batchsize: int, collation_fn: Callable | None, partial: bool):
    """Batching that yields as soon as a batch is full (webdataset's waits for the next sample,
    which would put the saved position one sample ahead)."""

    def stage(source):
        batch: list = []
        for sample in source:
            batch.append(sample)
            if len(batch) == batchsize:
                yield collation_fn(batch) if collation_fn is not None else batch
                batch = []
        if batch and partial:
            yield collation_fn(batch) if collation_fn is not None else batch

    return stage


def dataset(
    manifest_url: str | Manifest,
    split: str = "train",
    *,
    seed: int = 0,
    epoch: int | None = None,
    shuffle_shards: bool = True,
    shuffle_buffer: int = 0,
    equalize: str | None = "pad",
    rank: int | None = None,
    world_size: int | None = None,
    handler: Callable = wds.reraise_exception,
    cache_dir: str | None = None,
    cache_bytes: int | float | None = None,
    outputs_per_sample: Sequence_[int] | Callable | None = None,
    prefetch_bytes: int | None = None,
    max_connections: int | None = None,
) -> ShardDataset:
    """A webdataset pipeline of raw shard samples (compose `wdsprep.decode()` or a reader stage).

    `cache_dir`/`cache_bytes`: keep remote shards in a local LRU cache bounded in bytes (default
    10 GB when only `cache_dir` is given); without `cache_dir` nothing is written to local disk.

    `outputs_per_sample`: how many training samples the composed reader stage makes of each shard
    sample (one count per sample of the split, in manifest order, or a function (manifest, split)
    -> counts, e.g. `wdsprep.minecraft.pair_counts(history_length=4)`): ranks and workers are then
    balanced, and equalized, on training samples, and `len()` counts them (see stream/plan.py).

    `prefetch_bytes` / `max_connections`: the read-ahead of remote (http(s)://, s3://) shards, per
    DataLoader worker (or per process without workers): at most `max_connections` Range requests at
    once (default 12, `WDSPREP_MAX_CONNECTIONS`), at most `prefetch_bytes` fetched ahead and not yet
    read (default 64 MiB, `WDSPREP_PREFETCH_BYTES`); `prefetch_bytes=0` reads each piece as one
    sequential stream instead (see stream/remote.py and docs/objectstore.md)."""
    manifest = manifest_url if isinstance(manifest_url, Manifest) else load_manifest(manifest_url)
    return ShardDataset(
        manifest,
        split,
        seed=seed,
        epoch=epoch,
        shuffle_shards=shuffle_shards,
        shuffle_buffer=shuffle_buffer,
        equalize=equalize,
        rank=rank,
        world_size=world_size,
        handler=handler,
        cache_dir=cache_dir,
        cache_bytes=cache_bytes,
        outputs_per_sample=outputs_per_sample,
        prefetch_bytes=prefetch_bytes,
        max_connections=max_connections,
    )


def _level_json(level: Level) -> dict:
    positions = [[r, w, skip, discard] for (r, w), (skip, discard) in sorted(level.positions.items())]
    return {"world_size": level.world_size, "num_workers": level.num_workers, "positions": positions}


def _level_from_json(data: dict) -> Level:
    positions = {(int(r), int(w)): (int(skip), int(discard)) for r, w, skip, discard in data["positions"]}
    return Level(int(data["world_size"]), int(data["num_workers"]), positions)
