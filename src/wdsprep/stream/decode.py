"""`wdsprep.decode()`: the stage that decodes raw shard samples, beside the reader it can run inside.

Fusion is declared, never guessed: a stage that is a `ReaderStage` says that `ShardDataset` may run
it inside the worker's reader when it is the pipeline's first stage (before any `.batched()`). Then
each member of a local shard is decoded straight from the shard's read buffer
(`LocalShard.decode_members` in stream/read.py), with no raw sample in between, and samples that
come whole (remote or cached shards) go through `sample`. Anywhere else (later in a pipeline, or
after plain `wds.WebDataset`) the stage maps raw samples with `decode_sample`. Both ways give the
same samples, and a sample that does not decode goes to `handler` either way
(tests/core/test_fused_decode.py checks one against the other).

This module imports neither webdataset nor torch: `import wdsprep` loads it.
"""
from __future__ import annotations

from typing import Callable

from ..errors import ShardError
from ..shards.codec import decode_sample


END = object()  # what `ReaderStage.decoded` gives when the handler ends the stream


class ReaderStage:
    """A pipeline stage that the dataset may run inside its reader (see the module docstring): it
    decodes with `strip` / `torch` as `decode_sample` does, decodes a whole raw sample with
    `sample`, and says with `skips` whether a sample that does not decode is skipped."""

    __slots__ = ()
    strip: bool
    torch: bool

    def sample(self, sample: dict) -> dict:
        raise NotImplementedError

    def skips(self, error: ShardError) -> bool:
        raise NotImplementedError

    def decoded(self, sample: dict) -> dict | None:
        """`sample` decoded; None when it does not decode and is skipped, `END` when that ends the stream."""
        try:
            return self.sample(sample)
        except ShardError as error:
            return None if self.skips(error) else END


class Decode(ReaderStage):
    """The `wdsprep.decode()` pipeline stage; a `ReaderStage`, so fused into the dataset's reader
    when it comes first, and a plain map of raw samples anywhere else."""

    __slots__ = ("strip", "torch", "handler")

    def __init__(self, strip: bool = False, torch: bool = False, handler: Callable | None = None):
        self.strip, self.torch, self.handler = strip, torch, handler

    def sample(self, sample: dict) -> dict:
        return decode_sample(sample, strip=self.strip, torch=self.torch)

    def skips(self, error: ShardError) -> bool:
        """A sample that does not decode: true skips it, false ends the stream (`handler`); without
        a handler the error is raised."""
        if self.handler is None:
            raise error
        return bool(self.handler(error))

    def __call__(self, source):
        for sample in source:
            decoded = self.decoded(sample)
            if decoded is END:
                return
            if decoded is not None:
                yield decoded


def decode(*, strip: bool = False, torch: bool = False, handler: Callable | None = None) -> Decode:
    """A pipeline stage for `.compose(wdsprep.decode())`: decodes every extension in `CODECS`.

    Keys keep their extensions like webdataset's `.decode()` unless `strip=True`; `torch=True`
    turns arrays into tensors. `handler` (e.g. `wds.warn_and_continue`) gets a sample's
    `ShardError`: true skips the sample, false ends the stream; without one the error propagates.
    """
    return Decode(strip, torch, handler)
