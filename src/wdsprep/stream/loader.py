"""`wdsprep.Loader`: a DataLoader over a `ShardDataset` whose `state_dict()` resumes exactly.

Each worker batches its own stream and sends, with every batch, its position after that batch: in
the Loader's own message `(logical worker, position, batch, slab)`, beside the batch, never inside
it, so whatever `collate_fn` made the batch (one that keeps only the keys, torch's default_collate)
the position is exact. The batch's arrays come through a ring of shared-memory slabs
(stream/slabs.py) when workers are forked and `slabs > 0`, else by torch's transfer. Each pass has
new workers, or with `persistent_workers=True` the same ones, which read each pass's start (a
`_Pass`) from shared memory the main process writes before it (`_PassChannel`). The main
process keeps the latest position per worker and which worker delivered last. PyTorch's
DataLoader hands out batches round-robin over workers (skipping exhausted ones), so on resume the
workers are rotated to start with the worker that would have delivered next, and each one skips to
its saved position: the resumed run yields exactly the batches the uninterrupted run had left.
`load_state_dict` also takes the list of every rank's state, for any world size and num_workers
(an elastic resume: see stream/planning/state.py); the resumed run then starts with worker 0.

The Loader drives the dataset through its public API only: each worker iterates
`ShardDataset.stream(worker, num_workers, progress=, resume=)` with the Loader's own `EpochProgress`
(epoch, interrupted passes) and that worker's saved position, and states are encoded and checked by
stream/planning/state.py against `ShardDataset.layout()` (tests/core/test_import_graph.py checks, over this
file's syntax tree, that it touches no private attribute).

Planning. Each pass's samples are planned once, in the main process, before forked workers start
(`plan_pass`): the workers inherit the plan (the dataset keeps the latest pass's, stream/dataset.py),
its pages shared copy-on-write, and plan nothing themselves (at 10^6 shards, ~49 MB of columns that
each worker held a private copy of). Spawned workers get the dataset pickled without the plan, and
plan their pass themselves; so do persistent workers from their second pass on (they were forked
before it was planned).
"""
from __future__ import annotations

import collections.abc
import functools
import multiprocessing
import pickle
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
# torch's worker loop seeds numpy's global generator, which imports numpy.random (~5 ms of CPU) in
# every worker that does not inherit it: imported here, forked workers inherit it
import numpy.random  # noqa: F401
import torch
from torch.utils.data import DataLoader, IterableDataset, default_collate, get_worker_info
from torch.utils.data._utils.collate import default_convert
from webdataset.filters import default_collation_fn

from ..checks import whole_number
from ..errors import ConfigError, WdsprepError, raised_in_worker
from .dataset import PlannedDataset
from .slabs import SlabRing, default_collation
from .planning.state import EpochProgress, Epochs, encode_state
from .worker import closed_at_exit


@dataclass(frozen=True)
class _Pass:
    """What a pass's workers need besides the pipeline: which worker delivers first (`rotation`),
    the epoch and interrupted passes (`progress`), and each logical worker's saved position."""

    rotation: int
    progress: EpochProgress
    positions: dict[int, dict]


class _PassChannel:
    """How persistent workers learn each pass's `_Pass`: the main process writes it (pickled) into
    shared memory before the pass starts, each worker reads it when its pass's iterator starts. A
    pass that does not fit says so (`write` -> False): the Loader then starts new workers."""

    def __init__(self, context, first: _Pass):
        data = pickle.dumps(first, protocol=pickle.HIGHEST_PROTOCOL)
        self.capacity = max(1 << 20, 2 * len(data))
        self.memory = context.RawArray("B", 8 + self.capacity)  # inherited by forked workers, pickled to spawned ones
        self.write(first, data)

    def write(self, state: _Pass, data: bytes | None = None) -> bool:
        data = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL) if data is None else data
        if len(data) > self.capacity:
            return False
        view = memoryview(self.memory).cast("B")
        view[8 : 8 + len(data)] = data
        view[:8] = len(data).to_bytes(8, "little")
        return True

    def read(self) -> _Pass:
        view = memoryview(self.memory).cast("B")
        size = int.from_bytes(view[:8], "little")
        return pickle.loads(view[8 : 8 + size])


@dataclass(eq=False)
class _WorkerBatches(IterableDataset):
    """What each DataLoader worker iterates: its logical worker's `ShardDataset.stream`, batched,
    each batch sent with the worker's position after it. The pass comes as a `_Pass` (fresh
    workers) or through a `_PassChannel` (persistent workers, which iterate this once per pass)."""

    dataset: PlannedDataset
    num_workers: int
    this_pass: _Pass | _PassChannel
    batch_size: int | None
    collate_fn: Callable
    partial: bool
    ring: SlabRing | None = None  # the slabs (stream/slabs.py), or None: torch's transfer
    _writer: Any = field(default=None, init=False, repr=False)  # this worker's SlabWriter: lives as long as the worker

    def __iter__(self):
        info = get_worker_info()
        this_pass = self.this_pass.read() if isinstance(self.this_pass, _PassChannel) else self.this_pass
        slot = info.id if info is not None else 0
        logical = (slot + this_pass.rotation) % self.num_workers
        saved = this_pass.positions.get(logical)
        stream = self.dataset.stream(logical, self.num_workers, progress=this_pass.progress,
                                     resume=self.dataset.position(saved))
        position = stream.position
        # what the main process gets: (logical worker, its position after this batch, the batch, its slab)
        write, collated = self._senders(info)
        if self.batch_size is None:
            for sample in stream:
                yield logical, position.as_dict(), *write(sample)
            return
        batch: list = []
        for sample in stream:
            batch.append(sample)
            if len(batch) == self.batch_size:
                yield logical, position.as_dict(), *collated(batch)
                batch = []
        if batch and self.partial:
            yield logical, position.as_dict(), *collated(batch)

    def _senders(self, info) -> tuple[Callable, Callable]:
        """(a sample or batch -> (payload, slab); samples -> their batch's (payload, slab)): into this
        worker's slabs when there is a ring, the Loader's default collate stacking straight into them."""
        if self.ring is None or info is None:
            collate = default_collation if self.collate_fn is default_collation_fn else self.collate_fn
            return _unslabbed, lambda samples: (collate(samples), None)
        if self._writer is None:
            self._writer = self.ring.writer(info.id)
        else:
            self._writer.reclaim()  # a persistent worker's next pass: what the last one left in flight
        writer = self._writer
        if self.collate_fn is default_collation_fn:
            return writer.write, writer.collated
        if self.collate_fn is default_collate:
            return writer.write, writer.default_collated
        return writer.write, lambda samples: writer.write(self.collate_fn(samples))


def _unslabbed(batch: Any) -> tuple[Any, None]:
    return batch, None


_BYTES_LIKE = (str, bytes, bytearray, memoryview)


def convert(data: Any) -> Any:
    """torch's `default_convert` (numpy arrays -> tensors, recursively), except that bytes-like and
    str values are left alone: torch walks a `bytearray` element by element (~1 s per MB), and raw
    shard members are bytearrays."""
    if isinstance(data, _BYTES_LIKE) or isinstance(data, torch.Tensor):
        return data
    if isinstance(data, collections.abc.Mapping):
        return {key: convert(value) for key, value in data.items()}
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        return type(data)(*(convert(value) for value in data))
    if isinstance(data, collections.abc.Sequence):
        return [convert(value) for value in data]
    return default_convert(data)


# A tensor a worker sends goes through shared memory: one segment, one file descriptor handed to the
# main process over a socket (a connection and an authentication round trip each). For a batch's small
# numeric fields (indices, epochs, labels: a few hundred bytes) that costs far more than their bytes;
# top-level numpy fields smaller than this travel pickled inside the batch's message instead and become
# tensors in the main process (`_received`). Large fields still go through shared memory.
INLINE_BYTES = 64 * 1024


def _is_small_array(value: Any) -> bool:
    return isinstance(value, np.ndarray) and value.nbytes < INLINE_BYTES


def _top_level(batch: Any, inline: Callable[[Any], Any], rest: Callable[[Any], Any]) -> Any:
    """`batch` with `inline` applied to its small top-level numpy fields and `rest` to everything else."""
    def each(value: Any) -> Any:
        return inline(value) if _is_small_array(value) else rest(value)

    if isinstance(batch, collections.abc.Mapping):
        return {key: each(value) for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(each(value) for value in batch))
    if isinstance(batch, (list, tuple)):
        return [each(value) for value in batch]
    return rest(batch)


def _convert_payload(item: tuple, inline: bool = False) -> tuple:
    """Runs where the DataLoader collates: in each worker (`inline`: small top-level fields stay numpy,
    see INLINE_BYTES), or in the main process without workers (everything converted). A batch whose
    arrays are in a slab is left as it is: the main process converts what is not in the slab."""
    logical, position, payload, slab = item
    if slab is not None:
        return item
    if inline:
        return logical, position, _top_level(payload, lambda value: value, convert), None
    return logical, position, convert(payload), None


def _forks(context: Any) -> bool:
    """Whether DataLoader workers started with `multiprocessing_context=context` are forked (they
    then inherit a `SlabRing`'s flags)."""
    if context is None:
        return multiprocessing.get_start_method() == "fork"
    return (context if isinstance(context, str) else context.get_start_method()) == "fork"


def _received(batch: Any) -> Any:
    """In the main process: the fields a worker left as numpy arrays, converted."""
    return _top_level(batch, convert, lambda value: value)


class Loader(Epochs):
    """Iterate batches of a `wdsprep.dataset(...)` pipeline with DataLoader workers, resumably."""

    progress: EpochProgress  # the Loader's own epoch and interrupted passes (`Epochs`: epoch, set_epoch)

    def __init__(
        self,
        dataset: PlannedDataset,
        batch_size: int | None = None,
        *,
        num_workers: int = 0,
        collate_fn: Callable[[list], Any] = default_collation_fn,
        partial: bool = True,
        epoch: int | None = None,
        slabs: int | None = None,
        **dataloader_options: Any,
    ):
        if not isinstance(dataset, PlannedDataset):
            raise ConfigError("wdsprep.Loader needs a pipeline made by wdsprep.dataset(...) or wdsprep.mix(...)")
        if dataset.is_batched:
            raise ConfigError("batch with Loader(batch_size=...), not .batched(), so positions stay exact")
        # workers kept from pass to pass (each pass told its state through a `_PassChannel`)
        self.persistent = bool(dataloader_options.pop("persistent_workers", False)) and num_workers > 0
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.collate_fn = collate_fn
        self.partial = partial
        self.options = dataloader_options
        # shared-memory slabs per worker (stream/slabs.py): the batches in flight (prefetch_factor), the
        # one the loop holds and the one before it; 0: torch's transfer
        if slabs is None:
            slabs = (dataloader_options.get("prefetch_factor") or 2) + 2
        self.slabs = whole_number(slabs, "slabs", 0, "shared-memory slabs per worker; 0: none", text=False)
        # the epoch and the interrupted passes an elastic resume continues (stream/planning/state.py)
        self.progress = EpochProgress(dataset.epoch if epoch is None else int(epoch), epoch is None)
        self._positions: dict[int, dict] = {}  # logical worker -> its position after its latest batch
        self._next_worker = 0
        self._kept = None  # persistent workers: (DataLoader, its SlabRing or None, its _PassChannel)

    @property
    def logical_workers(self) -> int:
        return max(1, self.num_workers)

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self._positions = {}
        self._next_worker = 0

    def uses_slabs(self) -> bool:
        """Whether batches from workers come through a `SlabRing` (stream/slabs.py): workers that are
        forked, slabs asked for, and no `pin_memory` (the DataLoader pins what the workers send)."""
        return (self.num_workers > 0 and self.slabs > 0 and not self.options.get("pin_memory")
                and _forks(self.options.get("multiprocessing_context")))

    def _inline(self) -> bool:
        """Whether workers leave a batch's small top-level numpy fields to the main process (INLINE_BYTES).
        Not with `pin_memory`: pinned memory is filled by the DataLoader from what the workers sent, so
        every field must be a tensor there."""
        return self.num_workers > 0 and not self.options.get("pin_memory")

    def _dataloader(self, this_pass: _Pass) -> tuple[DataLoader, SlabRing | None]:
        """The pass's DataLoader and ring: new ones, or with persistent workers the kept ones, told
        the pass through their channel (new ones when it does not fit)."""
        if self.persistent and self._kept is not None:
            loader, ring, channel = self._kept
            if channel.write(this_pass):
                return loader, ring
            self._kept = None  # its workers go with the old DataLoader
        if self.num_workers > 0 and _forks(self.options.get("multiprocessing_context")):
            self.dataset.plan_pass(self.progress)  # before the workers fork: they inherit the plan
        ring = SlabRing(self.num_workers, self.slabs) if self.uses_slabs() else None
        context = self.options.get("multiprocessing_context")
        if context is None or isinstance(context, str):
            context = multiprocessing.get_context(context)
        source = _PassChannel(context, this_pass) if self.persistent else this_pass
        stream = _WorkerBatches(self.dataset, self.logical_workers, source, self.batch_size, self.collate_fn,
                                self.partial, ring)
        loader = DataLoader(stream, batch_size=None, num_workers=self.num_workers, persistent_workers=self.persistent,
                            collate_fn=functools.partial(_convert_payload, inline=self._inline()), **self.options)
        if self.persistent:
            self._kept = (loader, ring, source)
        return loader, ring

    def __iter__(self) -> Iterator[Any]:
        return closed_at_exit(self._batches())

    def _batches(self) -> Iterator[Any]:
        loader, ring = self._dataloader(_Pass(self._next_worker, self.progress, dict(self._positions)))
        inline = self._inline()
        try:
            for logical, position, batch, slab in loader:
                if slab is not None:
                    batch = ring.read(batch, slab)
                elif inline:
                    batch = _received(batch)
                self._positions[logical] = position
                self._next_worker = (logical + 1) % self.logical_workers
                yield batch
        except WdsprepError as error:  # raised in a worker: torch's wrapper holds its traceback; its one line
            self._kept = None
            failed = raised_in_worker(error)
            if failed is error:
                raise
            raise failed from None
        except Exception:
            self._kept = None  # a worker failed: the next pass starts new ones
            raise
        self.progress = self.progress.pass_done()
        self._positions = {}
        self._next_worker = 0

    def state_dict(self) -> dict:
        return encode_state(self.dataset.layout(), self.progress, self.logical_workers, self._positions,
                            next_worker=self._next_worker, **self.dataset.provenance())

    def load_state_dict(self, state: dict | list, **options) -> None:
        """This rank's own state (same world size and num_workers), or the list of every old rank's
        state (any world size and num_workers). `options`: the dataset's (a mix's `reweight=True`)."""
        resume = self.dataset.parse_state(state, self.logical_workers, "loader", **options)
        self.progress = self.progress.resumed(resume)
        self._positions = resume.positions
        self._next_worker = int(state.get("next_worker", 0)) if isinstance(state, dict) else 0
