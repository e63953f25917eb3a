"""`wdsprep.Loader`: a DataLoader over a `ShardDataset` whose `state_dict()` resumes exactly.

Each worker batches its own stream and sends, with every batch, its position after that batch. The
main process keeps the latest position per worker and which worker delivered last. PyTorch's
DataLoader hands out batches round-robin over workers (skipping exhausted ones), so on resume the
workers are rotated to start with the worker that would have delivered next, and each one skips to
its saved position: the resumed run yields exactly the batches the uninterrupted run had left.
`load_state_dict` also takes the list of every rank's state, for any world size and num_workers
(an elastic resume: see stream/dataset.py); the resumed run then starts with worker 0.
"""
from __future__ import annotations

import collections.abc
import copy
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torch.utils.data._utils.collate import default_convert
from webdataset.filters import default_collation_fn

from ..errors import ConfigError
from .dataset import Position, ShardDataset


class _WorkerStream(IterableDataset):
    def __init__(self, dataset: ShardDataset, num_workers: int, rotation: int, batch_size, collate_fn, partial):
        self.dataset = dataset
        self.num_workers = num_workers
        self.rotation = rotation
        self.batch_size = batch_size
        self.collate_fn = collate_fn
        self.partial = partial

    def __iter__(self):
        info = get_worker_info()
        slot = info.id if info is not None else 0
        logical = (slot + self.rotation) % self.num_workers
        dataset = copy.copy(self.dataset)
        dataset._worker_override = (logical, self.num_workers)
        outputs = dataset.iterator1()
        if self.batch_size is None:
            for sample in outputs:
                yield logical, dataset._counter.position.as_dict(), sample
            return
        batch: list = []
        for sample in outputs:
            batch.append(sample)
            if len(batch) == self.batch_size:
                yield logical, dataset._counter.position.as_dict(), self.collate_fn(batch)
                batch = []
        if batch and self.partial:
            yield logical, dataset._counter.position.as_dict(), self.collate_fn(batch)


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


def _convert_payload(item: tuple) -> tuple:
    logical, position, payload = item
    return logical, position, convert(payload)


class Loader:
    """Iterate batches of a `wdsprep.dataset(...)` pipeline with DataLoader workers, resumably."""

    def __init__(
        self,
        dataset: ShardDataset,
        batch_size: int | None = None,
        *,
        num_workers: int = 0,
        collate_fn: Callable[[list], Any] = default_collation_fn,
        partial: bool = True,
        epoch: int | None = None,
        **dataloader_options: Any,
    ):
        if not isinstance(dataset, ShardDataset):
            raise ConfigError("wdsprep.Loader needs a pipeline made by wdsprep.dataset(...)")
        if dataset._count_at is not None:
            raise ConfigError("batch with Loader(batch_size=...), not .batched(), so positions stay exact")
        dataloader_options.pop("persistent_workers", None)  # each epoch needs fresh worker state
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.collate_fn = collate_fn
        self.partial = partial
        self.options = dataloader_options
        self.auto_epoch = epoch is None
        self.epoch = dataset.epoch if epoch is None else int(epoch)
        self._positions: dict[int, dict] = {}
        self._levels: list = []  # the interrupted passes an elastic resume continues (see stream/plan.py)
        self._rotation = 0
        self._next_worker = 0

    @property
    def logical_workers(self) -> int:
        return max(1, self.num_workers)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self.auto_epoch = False
        self._positions = {}
        self._levels = []
        self._next_worker = 0

    def __iter__(self) -> Iterator[Any]:
        dataset = copy.copy(self.dataset)
        dataset.pipeline = list(self.dataset.pipeline)
        dataset.epoch = self.epoch
        dataset.auto_epoch = False
        dataset._resume = {w: Position(**p) for w, p in self._positions.items()}
        dataset._levels = list(self._levels)
        rotation = self._next_worker
        stream = _WorkerStream(dataset, self.logical_workers, rotation, self.batch_size, self.collate_fn, self.partial)
        loader = DataLoader(
            stream, batch_size=None, num_workers=self.num_workers, collate_fn=_convert_payload, **self.options
        )
        for logical, position, batch in loader:
            self._positions[logical] = position
            self._next_worker = (logical + 1) % self.logical_workers
            yield batch
        if self.auto_epoch:
            self.epoch += 1
        self._positions = {}
        self._levels = []
        self._next_worker = 0

    def state_dict(self) -> dict:
        saved = copy.copy(self.dataset)
        saved.epoch, saved._levels = self.epoch, self._levels
        return saved.make_state(self.logical_workers, self._positions, next_worker=self._next_worker)

    def load_state_dict(self, state: dict | list) -> None:
        """This rank's own state (same world size and num_workers), or the list of every old rank's
        state (any world size and num_workers)."""
        restored = copy.copy(self.dataset)
        self._positions = restored.parse_state(state, self.logical_workers, "loader")
        self.epoch, self._levels = restored.epoch, restored._levels
        self._next_worker = int(state.get("next_worker", 0)) if isinstance(state, dict) else 0
