"""`wdsprep.dataset(...)`: a webdataset pipeline over a manifest with global shuffling, equal ranks
and exact mid-epoch resume.

Resume contract. The pipeline counts, per DataLoader worker, how many source samples it pulled and
how many outputs the stages produced since the last pull; `state_dict()` saves that, and a resumed
iteration skips the pulled samples cheaply (whole shards are not opened, samples inside a shard are
seeked over) and discards the outputs already delivered. This is exact for stages that map, filter
or expand samples one at a time (every reader stage of wdsprep), and for `.batched()` called on this
object (batching is placed after the counting point). With DataLoader workers, use `wdsprep.Loader`,
which records each worker's position in the main process.
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
import webdataset as wds
from webdataset.compat import FluidInterface

from ..errors import ConfigError, ShardError
from ..shards.manifest import Manifest
from ..shards.tarformat import iter_samples
from .manifests import load_manifest
from .opener import open_url
from .plan import Piece, rank_pieces, worker_pieces


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
    last_pulled: int = -1


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
        check_counts: bool = True,
        cache_dir: str | None = None,
        cache_bytes: int | float | None = None,
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
        self.check_counts = check_counts
        self._resume: dict[int, Position] = {}
        self._counter: _Counter | None = None
        self._count_at: int | None = None  # pipeline index where outputs are counted (before batching)
        self._worker_override: tuple[int, int] | None = None  # set by wdsprep.Loader inside workers
        self.cache = None  # optional local LRU shard cache (stream/cache.py); off by default
        if cache_dir is not None:
            from .cache import ShardCache

            self.cache = ShardCache(cache_dir, cache_bytes if cache_bytes is not None else 10e9)
        self.append(ShardSource())

    # -- epochs and state
    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self.auto_epoch = False

    def _layout(self) -> dict:
        rank, world = distributed_info(self.rank_arg, self.world_arg)
        return {"seed": self.seed, "rank": rank, "world_size": world, "split": self.split, "shards": len(self.rows)}

    def state_dict(self) -> dict:
        """Position of a single-process iteration (see `wdsprep.Loader` for DataLoader workers)."""
        position = self._counter.position if self._counter else Position()
        return {**self._layout(), "epoch": self.epoch, "num_workers": 1, "workers": {"0": position.as_dict()}}

    def load_state_dict(self, state: dict) -> None:
        layout = self._layout()
        for name in ("seed", "world_size", "split", "shards"):
            if state.get(name) != layout[name]:
                raise ConfigError(f"state was saved with {name}={state.get(name)!r}, this dataset has {layout[name]!r}")
        self.epoch = int(state["epoch"])
        self._resume = {int(w): Position(**p) for w, p in state["workers"].items()}

    # -- what this worker reads
    def pieces(self, worker: int = 0, num_workers: int = 1, epoch: int | None = None) -> list[Piece]:
        rank, world = distributed_info(self.rank_arg, self.world_arg)
        mine = rank_pieces(
            self.counts,
            rank=rank,
            world_size=world,
            seed=self.seed,
            epoch=self.epoch if epoch is None else epoch,
            shuffle=self.shuffle_shards,
            equalize=self.equalize,
        )
        return worker_pieces(mine, worker=worker, num_workers=num_workers)

    def samples_per_rank(self, epoch: int | None = None) -> int:
        return sum(p.samples for p in self.pieces(0, 1, epoch))

    def _iter_pieces(self, pieces: list[Piece], skip: int) -> Iterator[dict]:
        for piece in pieces:
            if skip >= piece.samples:
                skip -= piece.samples
                continue
            url = self.urls[piece.shard]
            expected = piece.samples - skip
            got = 0
            try:
                row = self.rows[piece.shard]
                stream = self.cache.open(url, row.get("sha256"), row.get("bytes")) if self.cache else open_url(url)
                with stream:
                    first = piece.start + skip
                    for sample in iter_samples(stream, url, skip=first):
                        if got == expected:
                            break
                        # where the sample sits, for stages that work on blocks of a shard
                        sample["__index__"] = first + got
                        sample["__piece_start__"] = piece.start  # this worker's run of the shard starts here
                        sample["__epoch__"] = self.epoch
                        got += 1
                        yield sample
                if self.check_counts and got < expected:
                    raise ShardError(url, f"shard ended after {piece.start + skip + got} samples, manifest says {self.counts[piece.shard]}")
            except ShardError as error:
                if self.handler(error):
                    continue
                break
            skip = 0

    def _block_shuffled(self, pieces: list[Piece], skip: int, worker_key: tuple) -> Iterator[dict]:
        size = self.shuffle_buffer
        block = skip // size
        offset = skip - block * size
        stream = self._iter_pieces(pieces, block * size)
        while True:
            buffer = [s for _, s in zip(range(size), stream)]
            if not buffer:
                return
            rng = np.random.Generator(np.random.PCG64([self.seed, self.epoch, *worker_key, block]))
            order = rng.permutation(len(buffer))
            for i in order[offset:]:
                yield buffer[i]
            offset = 0
            block += 1

    def _source_iterator(self, worker: int, num_workers: int, resume: Position, counter: _Counter) -> Iterator[dict]:
        rank, _ = distributed_info(self.rank_arg, self.world_arg)
        pieces = self.pieces(worker, num_workers)
        if self.shuffle_buffer > 1:
            samples = self._block_shuffled(pieces, resume.skip, (rank, worker))
        else:
            samples = self._iter_pieces(pieces, resume.skip)
        counter.pulled = resume.skip
        for sample in samples:
            counter.pulled += 1
            yield sample

    # -- iteration with counting
    @staticmethod
    def _count(outputs: Iterator, resume: Position, counter: _Counter) -> Iterator:
        position = counter.position = Position(resume.skip, 0, resume.delivered)
        to_discard = resume.discard
        for output in outputs:
            if counter.pulled != counter.last_pulled:
                counter.last_pulled = counter.pulled
                position.skip = counter.pulled - 1
                position.discard = 0
            position.discard += 1
            if to_discard:
                to_discard -= 1
                continue
            position.delivered += 1
            yield output
        position.skip = counter.pulled  # a finished pass: everything was delivered
        position.discard = 0

    def iterator1(self):
        worker, num_workers = self._worker_override or worker_info()
        resume = self._resume.pop(worker, Position())
        counter = self._counter = _Counter()
        stages = self.pipeline
        cut = len(stages) if self._count_at is None else self._count_at
        source = self._source_iterator(worker, num_workers, resume, counter)
        for step in stages[1:cut]:
            source = self.invoke(step, source)
        source = self._count(source, resume, counter)
        for step in stages[cut:]:
            source = self.invoke(step, source)
        return source

    def iterator(self):
        yield from self.iterator1()
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
) -> ShardDataset:
    """A webdataset pipeline of raw shard samples (compose `wdsprep.decode()` or a reader stage).

    `cache_dir`/`cache_bytes`: keep remote shards in a local LRU cache bounded in bytes (default
    10 GB when only `cache_dir` is given); without `cache_dir` nothing is written to local disk."""
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
    )
