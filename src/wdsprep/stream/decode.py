"""`wdsprep.decode()`: the stage that decodes raw shard samples, beside the reader it can run inside.

Fusion is declared, never guessed: a stage that is a `ReaderStage` says that `ShardDataset` may run
it inside the worker's reader when it is the pipeline's first stage (before any `.batched()`). Then
each member of a local shard is decoded straight from the shard's read buffer
(`LocalShard.decode_members` in stream/reading/read.py), with no raw sample in between, and samples that
come whole (remote or cached shards) go through `sample`. Anywhere else (later in a pipeline, or
after plain `wds.WebDataset`) the stage maps raw samples with `decode_sample`. Both ways give the
same samples, and a sample that does not decode goes to `handler` either way
(tests/core/test_fused_decode.py checks one against the other).

Bookkeeping. A raw sample says where it came from (`__url__`, `__index__` in its shard,
`__piece_start__` of its worker's run of that shard, `__epoch__`): the source reader stages read
them. A decoded sample carries `__key__` and its fields only (a mix adds `__part__`), unless the
stage is asked for some of `BOOKKEEPING` (`decode(bookkeeping=True)` or a tuple of names): a user's
collate never batches what it did not ask for. Resume positions never travel in samples at all
(stream/planning/state.py; `wdsprep.Loader` sends them beside each batch).

This module imports neither webdataset nor torch: `import wdsprep` loads it.
"""
from __future__ import annotations

from typing import Callable, Iterable

from ..checks import one_of
from ..errors import ShardError
from ..shards.codec import decode_sample
from ..shards.packed import iter_unpacked


END = object()  # what `ReaderStage.decoded` gives when the handler ends the stream

# what the reader stamps on a raw sample beside `__key__` (stream/worker.py, stream/reading/read.py)
BOOKKEEPING = ("__url__", "__index__", "__piece_start__", "__epoch__")


def as_bytes(sample: dict) -> dict:
    """A raw sample with its members as bytes (what webdataset's own decoder takes), the rest as it is."""
    return {name: bytes(value) if value.__class__ is bytearray else value for name, value in sample.items()}


def bookkeeping_kept(bookkeeping: bool | str | Iterable[str]) -> frozenset[str]:
    """The bookkeeping entries a decode stage keeps: True all of `BOOKKEEPING`, False none, or the
    names given (one ConfigError line for a name that is not bookkeeping)."""
    if bookkeeping is True or bookkeeping is False:
        return frozenset(BOOKKEEPING if bookkeeping else ())
    names = (bookkeeping,) if isinstance(bookkeeping, str) else tuple(bookkeeping)
    return frozenset(one_of(name, "decode(bookkeeping=...)", BOOKKEEPING) for name in names)


class ReaderStage:
    """A pipeline stage that the dataset may run inside its reader (see the module docstring): it
    decodes with `strip` / `torch` as `decode_sample` does, decodes a whole raw sample with
    `sample`, says with `skips` whether a sample that does not decode is skipped, and keeps of
    `BOOKKEEPING` only the names in `kept` (the fused reader stamps only those)."""

    __slots__ = ()
    strip: bool
    torch: bool
    kept: frozenset[str]

    def sample(self, sample: dict) -> dict:
        raise NotImplementedError

    def skips(self, error: ShardError) -> bool:
        raise NotImplementedError

    @property
    def drops(self) -> bool:
        """Whether a sample may give no output (a handler that skips it or ends the stream): the
        stream then makes the next sample before it hands one over, as for any stage (stream/worker.py)."""
        return True

    def decoded(self, sample: dict) -> dict | None:
        """`sample` decoded; None when it does not decode and is skipped, `END` when that ends the stream."""
        try:
            return self.sample(sample)
        except ShardError as error:
            return None if self.skips(error) else END


class Decode(ReaderStage):
    """The `wdsprep.decode()` pipeline stage; a `ReaderStage`, so fused into the dataset's reader
    when it comes first, and a plain map of raw samples anywhere else."""

    __slots__ = ("strip", "torch", "handler", "kept", "dropped")

    def __init__(self, strip: bool = False, torch: bool = False, handler: Callable | None = None,
                 bookkeeping: bool | str | Iterable[str] = False):
        self.strip, self.torch, self.handler = strip, torch, handler
        self.kept = bookkeeping_kept(bookkeeping)
        self.dropped = tuple(name for name in BOOKKEEPING if name not in self.kept)

    def sample(self, sample: dict) -> dict:
        decoded = decode_sample(sample, strip=self.strip, torch=self.torch)  # errors still name the shard
        for name in self.dropped:
            decoded.pop(name, None)
        return decoded

    def skips(self, error: ShardError) -> bool:
        """A sample that does not decode: true skips it, false ends the stream (`handler`); without
        a handler the error is raised."""
        if self.handler is None:
            raise error
        return bool(self.handler(error))

    @property
    def drops(self) -> bool:
        return self.handler is not None  # without one, a sample decodes or its error is raised

    def __call__(self, source):
        for sample in iter_unpacked(source):  # a plain reader's packed blocks: their samples (shards/packed.py)
            decoded = self.decoded(sample)
            if decoded is END:
                return
            if decoded is not None:
                yield decoded


def decode(*, strip: bool = False, torch: bool = False, handler: Callable | None = None,
           bookkeeping: bool | str | Iterable[str] = False) -> Decode:
    """A pipeline stage for `.compose(wdsprep.decode())`: decodes every extension in `CODECS`.

    Keys keep their extensions like webdataset's `.decode()` unless `strip=True`; `torch=True`
    turns arrays into tensors. `handler` (e.g. `wds.warn_and_continue`) gets a sample's
    `ShardError`: true skips the sample, false ends the stream; without one the error propagates.
    A decoded sample carries `__key__` and its fields; `bookkeeping=True` (or some of the names
    `__url__`, `__index__`, `__piece_start__`, `__epoch__`) keeps where it came from as well.
    """
    return Decode(strip, torch, handler, bookkeeping)
