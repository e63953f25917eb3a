"""A ring of reused shared-memory slabs that carries `wdsprep.Loader`'s batches from DataLoader workers.

torch's own transfer puts each tensor a worker sends into a new shared-memory segment, hands its file
descriptor to the main process over a socket (one connection per tensor), and maps and frees it
there. Here each worker owns a few slabs (`slabs` per worker), each one anonymous memory
(`memfd_create`: no name in /dev/shm, so nothing is left behind when a worker dies, however it dies).
A worker writes a batch's numeric arrays (numpy or CPU tensors, at any depth of dicts, lists and
tuples) into a free slab and sends the batch with each array replaced by a `_InSlab` marker; the
main process builds tensors that view the slab, no copy. A slab's descriptor crosses once, when the
slab is made (or grown), and is mapped as its message is unpickled (`_SharedSlab`); after that a
batch names its slab only.

Release rule. A slab is free again only when no tensor of its batch is alive: the tensors share one
storage made by `torch.frombuffer` over a per-batch holder object, the storage keeps the holder
alive, and a finalizer on the holder marks the slab free in `flags` (a byte per slab, in memory the
workers inherit when they are forked). A worker that finds none of its slabs free (the user keeps
batches past the ring) sends that batch the ordinary way, so nothing waits and no held batch is
ever overwritten. Objects that are not numeric arrays (keys, strings, dicts of metadata) go pickled
in the message, as before, and so do tensors of `SHARED_BYTES` or more that a user's collate made in
shared memory already (torch's `default_collate` does in a worker): one descriptor beats a copy.

A batch whose message the main process never reads (a pass left early: with persistent workers
torch discards what was in flight when the next pass starts) would keep its slab taken for good. So
`held` (a byte per slab) says which slabs a read batch holds, and a persistent worker starting a new
pass frees its slabs that no read batch holds (`SlabWriter.reclaim`): by then torch has read or
discarded every message the worker sent in the pass before.

The ring is made with the DataLoader (`SlabRing`, in `Loader.__iter__`: per pass, or once with
persistent workers), needs workers started by `fork` (they inherit `flags` and `held`); otherwise,
and with `pin_memory=True` (the DataLoader pins what the workers send), the Loader uses torch's
transfer.
"""
from __future__ import annotations

import collections.abc
import mmap
import os
import weakref
from multiprocessing import reduction
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import default_collate
from torch.utils.data._utils.collate import collate, default_collate_fn_map, default_convert
from webdataset.filters import combine_values, default_collation_fn

from ..errors import ConfigError

ALIGN = 64  # every array starts at a multiple of this in its slab (any dtype's alignment)
NUMERIC_KINDS = frozenset("biufc")  # numpy kinds a slab carries: bool, ints, unsigned, floats, complex
# a tensor already in shared memory at least this large crosses by torch's transfer (one descriptor)
# instead of being copied into a slab: for a 64 MiB batch the copy costs more than the descriptor
SHARED_BYTES = 8 << 20


class _SharedSlab:
    """A new slab's descriptor on its way to the main process, which maps it as the message is
    unpickled (as torch does with a tensor's): the batch may wait its turn in the DataLoader while
    the worker that sent it has finished and exited, and its descriptor with it."""

    __slots__ = ("fd", "size")

    def __init__(self, fd, size: int):
        self.fd, self.size = fd, size

    def __reduce__(self):
        return _mapped_slab, (self.fd, self.size)


def _mapped_slab(shared_fd, size: int) -> mmap.mmap | bool:
    """The slab mapped in the main process; False when its worker died before handing it over."""
    try:
        fd = shared_fd.detach()
    except (OSError, EOFError):
        return False
    try:
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


class _Stack:
    """A batch field still to be made: `values`, equal-shaped numeric arrays, stacked (into a slab)."""

    __slots__ = ("values",)

    def __init__(self, values: list):
        self.values = values


def _unstacked(batch: Any) -> Any:
    """A batch from `SlabWriter.collated` with its fields stacked (when no slab is free)."""
    if batch.__class__ is dict:
        return {key: np.stack(value.values) if value.__class__ is _Stack else value for key, value in batch.items()}
    return batch


def _stackable(values: list) -> list[np.ndarray] | None:
    """`values` (a field of a batch) as numpy arrays a slab carries, all of one shape and dtype; else None."""
    arrays = []
    for value in values:
        array = _carried(value)
        if array is None:
            return None
        arrays.append(array)
    first = arrays[0]
    if any(a.shape != first.shape or a.dtype != first.dtype for a in arrays):
        return None
    return arrays


def default_collation(samples: list) -> Any:
    """webdataset's `default_collation_fn` (the Loader's default collate), except that a field whose
    arrays differ in shape is one ConfigError line naming the field, two shapes and the samples (and
    their parts, in a mix) that have them, where webdataset's is a bare AssertionError."""
    first = samples[0] if samples else None
    if isinstance(first, dict):
        for key in first:
            uneven_field([row.get(key) for row in samples], key, samples)
    elif isinstance(first, (list, tuple)):
        for key in range(len(first)):
            uneven_field([row[key] if key < len(row) else None for row in samples], key, samples)
    return default_collation_fn(samples)


def uneven_field(values: list, key: Any, samples: list) -> None:
    """The ConfigError of `default_collation` when `values` (field `key` of each sample) are arrays
    that webdataset's collate would stack and their shapes differ."""
    if not isinstance(values[0], (np.ndarray, torch.Tensor)):
        return
    shapes = [tuple(getattr(value, "shape", ())) for value in values]
    other = next((i for i, shape in enumerate(shapes) if shape != shapes[0]), None)
    if other is None:
        return

    def where(i: int) -> str:
        sample = samples[i]
        if not isinstance(sample, dict):
            return f"sample {i} of the batch"
        part = f"part {sample['__part__']!r} " if "__part__" in sample else ""
        return f"{part}sample {sample.get('__key__', i)!r}"

    raise ConfigError(f"batch field {key!r}: shapes differ, {shapes[0]} in {where(0)} and {shapes[other]} in "
                      f"{where(other)}: the Loader's default collate stacks a field of one shape; give collate_fn= "
                      "(one that pads, or that keeps a list)")


def _deferred(original):
    """torch's `default_collate` step for tensors or numpy arrays (`original`), its stack left to the
    slab (`_Stack`) when the field is numeric and of one shape; anything else as torch does it (the
    same result, or the same error for fields of different shapes or of strings)."""
    def step(batch, *, collate_fn_map):
        arrays = _stackable(batch)
        return original(batch, collate_fn_map=collate_fn_map) if arrays is None else _Stack(arrays)

    return step


# torch's default_collate with the tensor and numpy-array steps deferred to the slab (`SlabWriter.default_collated`)
_SLAB_COLLATE_MAP = {key: _deferred(step) if key in (torch.Tensor, np.ndarray) else step
                     for key, step in default_collate_fn_map.items()}


class _InSlab:
    """Where a batch's array was: the `index`-th array of the batch's slab."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __reduce__(self):
        return _InSlab, (self.index,)


def _carried(value: Any) -> np.ndarray | None:
    """`value` as a numpy array if a slab carries it (numeric, native byte order, CPU), else None."""
    cls = value.__class__
    if cls is not np.ndarray:
        if isinstance(value, torch.Tensor):
            if value.device.type != "cpu" or value.layout != torch.strided or value.dtype == torch.bfloat16:
                return None
            if value.nbytes >= SHARED_BYTES and value.is_shared():
                return None  # made in shared memory already (torch's default_collate in a worker): its descriptor is cheaper than a copy
            value = value.detach().resolve_conj().resolve_neg().numpy()
        elif isinstance(value, np.generic):
            value = np.asarray(value)  # a numpy scalar: a 0-d tensor, as torch's default_convert makes it
        else:
            return None
    dtype = value.dtype
    return value if dtype.kind in NUMERIC_KINDS and dtype.isnative else None


class _Walk:
    """The walk of a batch in a worker: every leaf of its dicts, lists, tuples and namedtuples given
    to `each`; `paths` the keys down to each leaf that `each` marked `_InSlab` (plain tuples become
    lists, as torch's default_convert makes them), `rebuild` true when one lies under a namedtuple
    (which cannot be assigned into: the main process then walks the whole batch)."""

    def __init__(self, each):
        self.each, self.paths, self.rebuild, self.path = each, [], False, []

    def __call__(self, batch: Any) -> Any:
        if isinstance(batch, collections.abc.Mapping):
            out = {}
            for key, value in batch.items():
                self.path.append(key)
                out[key] = self(value)
                self.path.pop()
            return out
        named = isinstance(batch, tuple) and hasattr(batch, "_fields")
        if named or isinstance(batch, (list, tuple)):
            out = []
            for i, value in enumerate(batch):
                self.path.append(i)
                out.append(self(value))
                self.path.pop()
            if named:
                before = len(self.paths)
                result = type(batch)(*out)
                self.rebuild = self.rebuild or len(self.paths) > before
                return result
            return out
        leaf = self.each(batch)
        if leaf.__class__ is _InSlab:
            self.paths.append(tuple(self.path))
        return leaf


def _replaced(batch: Any, each) -> Any:
    """`batch` with `each(leaf)` for every leaf of its dicts, lists, tuples and namedtuples."""
    if isinstance(batch, collections.abc.Mapping):
        return {key: _replaced(value, each) for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(_replaced(value, each) for value in batch))
    if isinstance(batch, (list, tuple)):
        return [_replaced(value, each) for value in batch]
    return each(batch)


def _aligned(size: int) -> int:
    return size + (-size % ALIGN)


class SlabRing:
    """The ring of a DataLoader's workers: `flags` (one byte per slab, 1 = taken: written, not yet
    free again) and `held` (1 = a batch the main process read views it) shared with the workers
    forked after it is made; `writer(worker)` in a worker, `read(...)` in the main process."""

    def __init__(self, num_workers: int, slabs: int):
        self.num_workers, self.slabs = num_workers, slabs
        self.flags = mmap.mmap(-1, max(1, num_workers * slabs))  # anonymous and shared: inherited by fork
        self.held = mmap.mmap(-1, max(1, num_workers * slabs))
        self._maps: dict[tuple[int, int], tuple[int, mmap.mmap]] = {}  # (worker, slab) -> (generation, map)

    # -- in a worker
    def writer(self, worker: int) -> SlabWriter:
        return SlabWriter(self.flags, worker * self.slabs, self.slabs, self.held)

    def _free(self, slab: int) -> None:
        """The finalizer of a read batch's holder: its slab free again."""
        self.flags[slab] = 0
        self.held[slab] = 0

    # -- in the main process
    def read(self, payload: Any, slab: tuple) -> Any:
        """The batch a worker sent: its arrays as tensors viewing the slab (which goes back to the
        worker when the last of them is gone)."""
        worker, number, generation, shared, fields, paths = slab
        key = (worker, number)
        if shared is not None:  # a new or grown slab, mapped when its message arrived
            if shared is False:
                raise RuntimeError(f"DataLoader worker {worker} exited before its batch's slab was received")
            self._maps[key] = (generation, shared)
        mapped_generation, mapped = self._maps[key]
        assert mapped_generation == generation, "a slab's descriptor arrives before its first batch"
        used = fields[-1][0] + fields[-1][1]
        holder = np.frombuffer(mapped, np.uint8, count=max(used, 1))
        self.held[worker * self.slabs + number] = 1
        weakref.finalize(holder, self._free, worker * self.slabs + number)
        storage = torch.frombuffer(holder, dtype=torch.uint8)  # keeps `holder` until its last view goes
        del holder
        tensors = [_view(storage, offset, nbytes, dtype, shape) for offset, nbytes, dtype, shape in fields]
        if paths is None:  # an array under a namedtuple: rebuilt by a whole walk
            return _replaced(payload, lambda leaf: tensors[leaf.index] if leaf.__class__ is _InSlab else leaf)
        if paths == [()]:
            return tensors[0]
        for path, tensor in zip(paths, tensors):
            parent = payload
            for step in path[:-1]:
                parent = parent[step]
            parent[path[-1]] = tensor
        return payload


_TORCH_DTYPES: dict[str, torch.dtype] = {}


def _torch_dtype(dtype: str) -> torch.dtype:
    found = _TORCH_DTYPES.get(dtype)
    if found is None:
        found = _TORCH_DTYPES[dtype] = torch.from_numpy(np.empty(0, np.dtype(dtype))).dtype
    return found


def _view(storage: torch.Tensor, offset: int, nbytes: int, dtype: str, shape: tuple) -> torch.Tensor:
    return storage[offset : offset + nbytes].view(_torch_dtype(dtype)).view(shape)


class SlabWriter:
    """A worker's slabs: `write(batch)` puts its arrays in a free slab -> (payload, slab description),
    or (batch, None) when none is free or there is nothing to carry."""

    def __init__(self, flags: mmap.mmap, first: int, slabs: int, held: mmap.mmap):
        self.flags, self.first, self.slabs, self.held = flags, first, slabs, held
        self.worker = first // slabs if slabs else 0
        self.maps: list[mmap.mmap | None] = [None] * slabs
        self.generations = [0] * slabs

    def _free(self) -> int | None:
        flags, first = self.flags, self.first
        for number in range(self.slabs):
            if flags[first + number] == 0:
                return number
        return None

    def reclaim(self) -> None:
        """At the start of a pass after another (persistent workers): the slabs of batches the main
        process never read (discarded when the pass before was left early) are free again, each a
        new slab (the discarded message may have been the one carrying its descriptor)."""
        for number in range(self.slabs):
            slab = self.first + number
            if self.flags[slab] == 1 and self.held[slab] == 0:
                self.maps[number] = None  # unmapped when nothing views it any more
                self.flags[slab] = 0

    def write(self, batch: Any, unslabbed: Callable[[Any], Any] = _unstacked) -> tuple[Any, tuple | None]:
        """`unslabbed(batch)` is what goes the ordinary way when no slab is free."""
        number = self._free()
        if number is None:
            return unslabbed(batch), None
        sources: list = []  # per field: an array to copy, or the list of arrays to stack (`_Stack`)
        fields: list[tuple] = []
        at = 0

        def collect(leaf):
            nonlocal at
            if leaf.__class__ is _Stack:
                first, source = leaf.values[0], leaf.values
                shape, dtype, nbytes = (len(source), *first.shape), first.dtype, first.nbytes * len(source)
            else:
                source = _carried(leaf)
                if source is None:  # what torch's default_convert does to it (a string array stays)
                    return default_convert(leaf) if leaf.__class__ is np.ndarray else leaf
                shape, dtype, nbytes = source.shape, source.dtype, source.nbytes
            fields.append((at, nbytes, dtype.str, shape))
            sources.append(source)
            at += _aligned(nbytes)
            return _InSlab(len(sources) - 1)

        walk = _Walk(collect)
        payload = walk(batch)
        if not sources:
            return batch, None
        shared = self._fit(number, at)
        mapped = self.maps[number]
        self.flags[self.first + number] = 1  # the main process's until the batch's tensors are gone
        for (offset, nbytes, dtype, shape), source in zip(fields, sources):
            dtype = np.dtype(dtype)
            view = np.frombuffer(mapped, dtype, count=nbytes // dtype.itemsize, offset=offset).reshape(shape)
            if source.__class__ is list:
                np.stack(source, out=view)
            else:
                view[...] = source
        return payload, (self.worker, number, self.generations[number], shared, fields,
                         None if walk.rebuild else walk.paths)

    def collated(self, samples: list) -> tuple[Any, tuple | None]:
        """webdataset's `default_collation_fn(samples)` (the Loader's default collate) written as
        `write` would write it, each field of equal-shaped numeric arrays stacked straight into the
        slab (no batch array made first)."""
        first = samples[0] if samples else None
        if first.__class__ is not dict or any(row.keys() != first.keys() for row in samples):
            return self.write(default_collation(samples))  # tuples, or rows that differ (it raises)
        batch = {}
        for key in first:
            values = [row[key] for row in samples]
            arrays = _stackable(values) if all(v.__class__ is np.ndarray for v in values) else None
            if arrays is None:
                uneven_field(values, key, samples)
            batch[key] = combine_values(values) if arrays is None else _Stack(arrays)
        return self.write(batch)

    def default_collated(self, samples: list) -> tuple[Any, tuple | None]:
        """torch's `default_collate(samples)` written as `write` would write it, each stack of equal-shaped
        numeric tensors or arrays made straight in the slab: in a worker `default_collate` itself would
        stack into a new shared-memory segment, which `write` would then copy. With no slab free,
        `default_collate` itself."""
        return self.write(collate(samples, collate_fn_map=_SLAB_COLLATE_MAP),
                          lambda _: default_collate(samples))

    def _fit(self, number: int, size: int):
        """Slab `number` at least `size` bytes: a new anonymous one when it is smaller (its descriptor
        to send, else None)."""
        mapped = self.maps[number]
        if mapped is not None and len(mapped) >= size:
            return None
        size = max(1 << 20, size + size // 4)
        size += -size % mmap.PAGESIZE
        fd = os.memfd_create("wdsprep-slab", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            if mapped is not None:
                mapped.close()
            self.maps[number] = mmap.mmap(fd, size)
            self.generations[number] += 1
            return _SharedSlab(reduction.DupFd(fd), size)  # a duplicate, handed over when the main process asks
        finally:
            os.close(fd)
