"""`wdsprep.dataset(...)`: a webdataset pipeline over a manifest with global shuffling, sample-exact
rank/worker dealing (stream/planning/plan.py), and exact mid-epoch resume, on the same world or another.

`ShardDataset` is the front only: the pipeline (`.compose`, `.batched`, ...), the split's shards,
the dealing options, and the `EpochProgress` (epoch, auto_epoch, interrupted passes) of its own
iteration. It is iterated in one way, `stream(worker, num_workers, progress=, resume=)`: a
`WorkerStream` (stream/worker.py) that reads the worker's share, counts and pads its outputs, and
keeps the worker's live position. Its own `__iter__` calls `stream` with the DataLoader worker it
runs in; `wdsprep.Loader` calls it inside each of its workers with the Loader's progress and
positions, and uses nothing else of this class but public methods. States are made and checked by
stream/planning/state.py (the resume contract and the elastic resume rules are there).

Resume. `state_dict()` saves this process's position (inside a DataLoader worker, torchdata's
`StatefulDataLoader`, that worker's); a resumed iteration skips the pulled samples cheaply and
discards the outputs already delivered. Exact for stages that map, filter or expand samples one
at a time (every reader stage of wdsprep), and for `.batched()` called on this object (batching is
placed after the counting point). With DataLoader workers, use `wdsprep.Loader`, which records
each worker's position in the main process. A state records the manifest's pinned location
(`location`: a Hub revision's commit, storage/hf.py); a dataset of the same location whose branch
moved since reads the recorded commit again when given the state (`_read_recorded`).

Fusion. A `ReaderStage` (`wdsprep.decode()`, stream/decode.py) placed first runs inside the
worker's reader; any other stage is applied to the reader's samples as webdataset would.

Planning. A pass's samples (the epoch's sequence, less what interrupted passes delivered; a mix's
per part) are planned once and kept on the pipeline, the latest pass only (`planned`): `len()`, each
worker's plan and the iteration share them, and `wdsprep.Loader` plans the pass in the main process
before it forks its workers (`plan_pass`), which inherit it. Pickling leaves the plan out (spawned
workers plan their own). A `ShardDataset` handed to a plain torch DataLoader is planned in each
worker, unless the main process planned that pass before the workers were forked (`len()` or
`plan_pass()` of the same epoch).
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Iterator
from typing import Sequence as Sequence_

import numpy as np
import webdataset as wds
from webdataset.compat import FluidInterface

from ..errors import ConfigError
from ..checks import one_of, whole_number
from ..readoptions import SETTINGS as READ_SETTINGS
from ..readoptions import ReadOptions
from ..shards.manifest import Manifest
from ..storage import unpinned
from .decode import ReaderStage, as_bytes
from .manifests import load_manifest
from .planning.catalog import Catalog, catalog_of
from .planning.plan import EQUALIZE, Sequence, epoch_sequence, remainder
from .reading.readahead import worker_connections
from .planning.state import EpochProgress, Epochs, Position, Resume, encode_state, parse_state, worker_level
from .worker import ShardReader, WorkerPlan, WorkerStream, worker_plan
from .world import distributed_info, worker_info


class ShardSource:
    """Pipeline stage 0 placeholder: `ShardDataset.stream` feeds this rank/worker's samples."""

    def __call__(self) -> Iterator[dict]:
        raise RuntimeError("ShardSource is driven by ShardDataset")


class PlannedDataset(Epochs, wds.DataPipeline, FluidInterface):
    """What `wdsprep.dataset(...)` and `wdsprep.mix(...)` return: a webdataset pipeline whose samples
    are planned per (seed, epoch) before the rank/worker split, with the epoch, the state and the
    iteration they share. A subclass says what a pass reads: `stream(worker, num_workers, progress=,
    resume=)` (an iterable with a live `position`), `layout()` (what a state must match),
    `position(saved)` (a worker's position from its saved dict), `samples_per_rank()`,
    `level_value` (what an elastic resume keeps of a worker's saved position), and `plan_pass(progress)`
    (the pass planned now and kept, through `planned`)."""

    def decode(self, *args, **kwargs):
        """webdataset's own `.decode(...)` over these samples: their members are bytearrays (writable,
        so that decoders build arrays on them in place), which webdataset's decoder refuses; it gets
        each as bytes (one copy). `.compose(wdsprep.decode())` needs no copy."""
        return FluidInterface.decode(self.map(as_bytes), *args, **kwargs)

    def _init_reading(self, *, seed: int, epoch: int | None, shuffle_shards: bool, shuffle_buffer: int,
                      equalize: str | None, rank: int | None, world_size: int | None, handler: Callable,
                      read_options: ReadOptions | None, read: dict) -> None:
        # the read side's settings, checked now (wdsprep/readoptions.py): the environment's (or
        # `read_options`), each keyword given overriding it
        self.read_options = ReadOptions.given(read_options, **read)
        one_of(equalize, "equalize", EQUALIZE)
        self.seed = whole_number(seed, "seed", 0)
        epoch = None if epoch is None else whole_number(epoch, "epoch", 0)
        self.progress = EpochProgress(0 if epoch is None else epoch, epoch is None)
        self.shuffle_shards = shuffle_shards
        self.shuffle_buffer = whole_number(shuffle_buffer, "shuffle_buffer", 0, "samples permuted together; 0 or 1: none")
        self.equalize = equalize
        if world_size is not None:
            world_size = whole_number(world_size, "world_size", 1)
        if rank is not None:
            below = {} if world_size is None else {"meaning": f"below world_size={world_size}", "maximum": world_size - 1}
            rank = whole_number(rank, "rank", 0, **below)
        self.rank_arg, self.world_arg = rank, world_size
        self.handler = handler
        self._resume: dict[int, dict] = {}  # worker -> where its next pass starts (load_state_dict)
        self._position = None  # the live position of this process's current pass (for state_dict)
        self._planned: tuple | None = None  # (key, plan) of the latest pass planned (`planned`)
        self._count_at: int | None = None  # pipeline index where outputs are counted (before batching)
        self.cache = None  # optional local LRU shard cache (stream/reading/cache.py); off by default
        if self.read_options.cache_dir is not None:
            from .reading.cache import ShardCache

            self.cache = ShardCache(self.read_options.cache_dir, self.read_options.cache_bytes, self.read_options)
        self.append(ShardSource())

    # -- epochs (`Epochs`) and state (stream/planning/state.py)
    @property
    def is_batched(self) -> bool:
        """Whether `.batched()` was called on this pipeline (outputs are counted before it)."""
        return self._count_at is not None

    def rank_and_world(self) -> tuple[int, int]:
        return distributed_info(self.rank_arg, self.world_arg)

    def state_dict(self) -> dict:
        """This process's position: inside a DataLoader worker (torchdata's StatefulDataLoader) that
        worker's, otherwise a single-process iteration's (see `wdsprep.Loader` for workers)."""
        worker, num_workers = worker_info()
        if self._position is not None:
            position = self._position.as_dict()
        else:  # not iterated since a load_state_dict: the loaded position, not the epoch's start
            position = self.position(self._resume.get(worker)).as_dict()
        return encode_state(self.layout(), self.progress, num_workers, {worker: position}, **self.provenance())

    def load_state_dict(self, state: dict | list, **options) -> None:
        """Resume from this rank's own state (same world and workers), or from the list of every
        old rank's state (any world and workers: the epoch's remainder is dealt afresh). `options`:
        those of `parse_state` (a mix's `reweight=True`)."""
        _, num_workers = worker_info()
        resume = self.parse_state(state, num_workers, **options)
        self.progress = self.progress.resumed(resume)
        self._resume = dict(resume.positions)
        self._position = None  # the position is now the loaded one until the next iteration

    def parse_state(self, state: dict | list, num_workers: int, what: str = "dataset") -> Resume:
        """A state checked against this pipeline's layout and `num_workers` (stream/planning/state.py)."""
        return parse_state(state, self.layout(), num_workers, what, level_value=self.level_value)

    level_value = staticmethod(worker_level)  # what an elastic resume keeps of a worker's position

    def provenance(self) -> dict:
        """What a state records beside the layout and never matches (a dataset: its pinned location).
        Default: nothing."""
        return {}

    # -- the pass's plan, kept (the latest pass only)
    def planned(self, key: tuple, plan: Callable[[], Any]) -> Any:
        """`plan()`, the samples a pass deals, kept under `key` (what they depend on: the epoch, the
        interrupted passes' levels, ...): asked again for the same key, the kept plan. Only the latest
        is kept, so memory does not grow across epochs; another key plans anew."""
        if self._planned is not None and self._planned[0] == key:
            return self._planned[1]
        value = plan()
        self._planned = (key, value)
        return value

    def plan_pass(self, progress: EpochProgress | None = None) -> None:
        """Plans the pass `progress` describes (default this pipeline's) now, and keeps it.
        `wdsprep.Loader` calls it in the main process before it starts forked workers, which then
        inherit the plan (its pages shared, copy-on-write) instead of each planning it again."""
        raise NotImplementedError

    def __getstate__(self) -> dict:
        """What pickling sends (spawned DataLoader workers): everything but the kept plan, which is
        an epoch's columns (tens of MB at 10^6 shards) that the receiver plans itself if it reads."""
        state = dict(self.__dict__)
        state["_planned"] = None
        return state

    # -- iteration
    def iterator(self):
        worker, num_workers = worker_info()
        resume = self._resume.pop(worker, None)
        stream = self.stream(worker, num_workers, resume=self.position(resume))
        self._position = stream.position
        yield from stream
        self.progress = self.progress.pass_done()  # a resumed pass is over: the next pass deals a whole epoch
        if self.auto_epoch:
            self._position = None  # the state now points at the start of the next epoch

    def batched(self, batchsize, collation_fn=wds.filters.default_collation_fn, partial=True):
        result = copy.copy(self)
        result.pipeline = list(self.pipeline)
        if result._count_at is None:
            result._count_at = len(result.pipeline)
        result.append(_batcher(batchsize, collation_fn, partial))
        return result

    def _stages(self) -> tuple[ReaderStage | None, list, list]:
        """(a `ReaderStage` placed first, fused into the reader; the stages before the counting
        point; the stages after it: batching)."""
        stages = self.pipeline
        cut = len(stages) if self._count_at is None else self._count_at
        decode = stages[1] if cut > 1 and isinstance(stages[1], ReaderStage) else None
        first = 1 if decode is None else 2
        return decode, stages[first:cut], stages[cut:]

    def __len__(self) -> int:
        """Samples this rank yields per epoch (with equalize, the same on every rank)."""
        return self.samples_per_rank()


class ShardDataset(PlannedDataset):
    """The pipeline `wdsprep.dataset(...)` returns (see the module docstring). It is iterated in
    one way only, `stream(worker, num_workers, ...)`, which both its own `__iter__` and
    `wdsprep.Loader` call. Used directly as a torch DataLoader's dataset, its workers plan the pass
    themselves, unless `plan_pass()` (or `len()`) planned the same pass before they were forked."""

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
        outputs_per_sample: Sequence_[int] | Callable | None = None,
        keys=None,
        select: str | None = None,
        fraction: float | None = None,
        limit: int | None = None,
        read_options: ReadOptions | None = None,
        **read: Any,
    ):
        super().__init__()
        self._init_reading(seed=seed, epoch=epoch, shuffle_shards=shuffle_shards, shuffle_buffer=shuffle_buffer,
                           equalize=equalize, rank=rank, world_size=world_size, handler=handler,
                           read_options=read_options, read=read)
        self.split = split
        self._selection = {"keys": keys, "select": select, "fraction": fraction, "limit": limit}
        self._outputs_per_sample = outputs_per_sample
        self._open(manifest)

    def _open(self, manifest: Manifest) -> None:
        """Read `manifest`'s split: its shards and what the selection keeps of them (stream/planning/catalog.py)."""
        self.manifest = manifest
        self.catalog = catalog_of(manifest, self.split, seed=self.seed, **self._selection)
        self.rows, self.urls, self.counts = self.catalog.rows, self.catalog.urls, self.catalog.counts
        self.shard_weights = shard_weights(self.catalog, self._outputs_per_sample)
        self._planned = None

    @property
    def digest(self) -> str:
        """Names, counts and sha256 of the split's shards: what a saved state must have been read from."""
        return self.catalog.digest

    def layout(self) -> dict:
        """What a state saved from this pipeline records and a loaded one must match (stream/planning/state.py)."""
        rank, world = self.rank_and_world()
        return {"dataset": self.digest, "split": self.split, "seed": self.seed, "shuffle_shards": self.shuffle_shards,
                "shuffle_buffer": self.shuffle_buffer, "equalize": self.equalize, "rank": rank, "world_size": world,
                "selection": self.catalog.selection_text}

    def provenance(self) -> dict:
        """Where the data was read from, recorded in a state beside the layout and not matched on
        resume: the manifest's pinned `location` (`_read_recorded`)."""
        return {"location": self.manifest.url}

    def parse_state(self, state: dict | list, num_workers: int, what: str = "dataset") -> Resume:
        """A state checked against this dataset (stream/planning/state.py), after reading again the pinned
        location it records where this dataset's own has moved on from it (`_read_recorded`)."""
        self._read_recorded(state)
        return super().parse_state(state, num_workers, what)

    def _read_recorded(self, state: dict | list) -> None:
        """A state saved from a pinned location (`storage.pin`: a Hub commit) of which this dataset's
        is a later pin (its branch moved since): read the recorded one, so a resumed run reads the
        bytes the interrupted one read, however the branch moved."""
        first = state[0] if isinstance(state, list) and state else state
        recorded = first.get("location") if isinstance(first, dict) else None
        here = self.manifest.url
        if isinstance(recorded, str) and here and recorded != here and unpinned(recorded) == unpinned(here):
            self._open(load_manifest(recorded, self.read_options))

    @staticmethod
    def position(saved: dict | None) -> Position:
        return Position() if saved is None else Position(**saved)

    # -- what this worker reads
    def sequence(self, epoch: int | None = None, progress: EpochProgress | None = None) -> Sequence:
        """The samples a pass deals: the epoch's G, or what the interrupted passes left of it
        (`progress`: the epoch and passes, default this pipeline's; `epoch` overrides its epoch).
        Planned once per (epoch, interrupted passes) and kept (`planned`): len(), the plan of each
        worker and the iteration share it."""
        progress = self.progress if progress is None else progress
        epoch = progress.epoch if epoch is None else epoch
        return self.planned((epoch, progress.levels), lambda: self._planned_sequence(epoch, progress.levels))

    def _planned_sequence(self, epoch: int, levels: tuple) -> Sequence:
        sequence = epoch_sequence(self.counts, self.seed, epoch, self.shuffle_shards)
        for level in levels:
            sequence = remainder(sequence, level, seed=self.seed, epoch=epoch, shuffle_buffer=self.shuffle_buffer,
                                 equalize=self.equalize, shard_weights=self.shard_weights)
        return sequence

    def plan_pass(self, progress: EpochProgress | None = None) -> None:
        self.sequence(progress=progress)

    def plan(self, worker: int = 0, num_workers: int = 1, epoch: int | None = None,
             progress: EpochProgress | None = None) -> WorkerPlan:
        rank, world = self.rank_and_world()
        return worker_plan(self.sequence(epoch, progress), rank, world, worker, num_workers, self.equalize,
                           self.shard_weights)

    def samples_per_rank(self, epoch: int | None = None, num_workers: int = 1) -> int:
        """Samples this rank reads per epoch; with `outputs_per_sample`, the training samples it
        yields, which with equalize depend on the worker count (each worker meets its own target)."""
        return sum(self.plan(worker, num_workers, epoch).outputs(self.shard_weights) for worker in range(num_workers))

    # -- iteration
    def stream(self, worker: int = 0, num_workers: int = 1, *, progress: EpochProgress | None = None,
               resume: Position | None = None) -> WorkerStream:
        """One worker's pass, the one way this pipeline is iterated: its outputs (after every stage),
        and its live `position` after the latest one (stream/worker.py). `progress`: the epoch and
        the interrupted passes it continues (default this pipeline's); `resume`: where the worker
        starts (default the pass's start). Changes nothing on this pipeline."""
        progress = self.progress if progress is None else progress
        rank, _ = self.rank_and_world()
        decode, stages, after = self._stages()
        options = self.read_options
        reader = ShardReader(self.catalog, handler=self.handler, cache=self.cache, options=options,
                             max_connections=worker_connections(options.max_connections, num_workers),
                             shuffle_buffer=self.shuffle_buffer, key=(self.seed, progress.epoch, rank, worker))
        return WorkerStream(reader, self.plan(worker, num_workers, progress=progress), resume or Position(),
                            stages=stages, after=after, invoke=self.invoke, decode=decode,
                            equalize=self.equalize, shard_weights=self.shard_weights)


def shard_weights(catalog: Catalog, outputs_per_sample) -> list[np.ndarray] | None:
    """Per shard, the training samples each of its kept samples becomes (see stream/planning/plan.py), from
    `outputs_per_sample` (one count per sample of the split, or a function (manifest, split) -> counts)."""
    if outputs_per_sample is None:
        return None
    if callable(outputs_per_sample):
        outputs_per_sample = outputs_per_sample(catalog.manifest, catalog.split)
    flat = np.asarray(list(outputs_per_sample), dtype=np.int64)
    sizes = catalog.sizes
    if flat.ndim != 1 or len(flat) != sizes.sum() or (flat < 0).any():
        raise ConfigError(f"outputs_per_sample must give a count >= 0 for each of the {sizes.sum()} samples "
                          f"of split {catalog.split!r} (got {len(flat)} values)")
    ends = np.cumsum(sizes)
    per_shard = [flat[end - size : end] for end, size in zip(ends, sizes)]
    # a selection's pieces count kept samples: shard s's weights are those of its kept samples
    return [w if (kept := catalog.members(s)) is None else w[kept] for s, w in enumerate(per_shard)]


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


def dataset(manifest_url: str | Manifest, split: str = "train", **options) -> ShardDataset:
    """A webdataset pipeline of raw shard samples (compose `wdsprep.decode()` or a reader stage):
    `ShardDataset(manifest, split, **options)`, the manifest loaded from any location first. The
    options are ShardDataset's keywords (seed, epoch, shuffle_shards, shuffle_buffer, equalize, rank,
    world_size, handler, outputs_per_sample; the selection: keys, select, fraction, limit, see
    stream/planning/catalog.py) and the read side's settings: `read_options=` (a `wdsprep.ReadOptions`; None:
    the environment's) and its fields as keywords (prefetch_bytes, max_connections, retries, timeout,
    min_rate, rate_window, skip_by_reading, cache_dir, cache_bytes, ...), each overriding it and its
    `WDSPREP_*` variable. The
    environment is read now, once, and every value is checked before the manifest is fetched: a bad
    one is one `ConfigError` line naming the keyword or variable (docs/objectstore.md#settings).

    `cache_dir`/`cache_bytes`: keep remote shards in a local LRU cache bounded in bytes (default
    10 GB when only `cache_dir` is given); without `cache_dir` nothing is written to local disk.

    `outputs_per_sample`: how many training samples the composed reader stage makes of each shard
    sample (one count per sample of the split, in manifest order, or a function (manifest, split)
    -> counts, e.g. `wdsprep.minecraft.pair_counts(history_length=4)`): ranks and workers are then
    balanced, and equalized, on training samples, and `len()` counts them (see stream/planning/plan.py).

    `prefetch_bytes` / `max_connections`: the read-ahead of remote (http(s)://, s3://) shards, per
    DataLoader worker (or per process without workers): at most `max_connections` Range requests at
    once (default: 32 per rank shared by its workers, at least 8 each; `WDSPREP_MAX_CONNECTIONS` sets
    a number per worker), at most `prefetch_bytes` fetched ahead and not yet
    read (default 64 MiB, `WDSPREP_PREFETCH_BYTES`); `prefetch_bytes=0` reads each piece as one
    sequential stream instead (see stream/reading/readahead.py and docs/objectstore.md)."""
    read = {name: options.pop(name) for name in list(options) if name in READ_SETTINGS}
    read_options = ReadOptions.given(options.pop("read_options", None), **read)
    manifest = manifest_url if isinstance(manifest_url, Manifest) else load_manifest(manifest_url, read_options)
    return ShardDataset(manifest, split, read_options=read_options, **options)
