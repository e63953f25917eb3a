"""Reading one sequence's frames out of its shards, frame by frame, each frame checked first.

A sequence's frames are consecutive samples of one or more shards (its segments). A frame is read
through `stream.read.CheckedShard`: one bounded read of the members it needs (a positioned read
locally, a Range request remotely), every member in that span checked against the shard's index
before anything is decoded (an older shard without an index: hashed whole when opened if local,
refused with the line naming `wdsprep reindex` if remote). Frames that other workers handle are not
read at all. Per-sample arrays are stored sample-major, so only the leading samples asked for are
decompressed; the check still reads each member whole, since its digest covers all of it.
"""
from __future__ import annotations

import io

import msgpack
import zstandard

from ...errors import FormatError, ShardError
from ...shards.codec import decompressor, read_npy
from ...stream.read import CheckedShard


def decode_member(url: str, key: str, member: str, data: bytearray, leading: int | None):
    """Decode one `.npy` / `.npy.zst` member's (checked) bytes; with `leading`, only the first rows
    of axis 0 (only what they need is decompressed)."""
    if member.endswith(".npy.zst"):
        readinto = decompressor().stream_reader(data, read_size=1 << 16).readinto
    elif member.endswith(".npy"):
        readinto = io.BytesIO(data).readinto
    else:
        raise ShardError(url, f"member {key}.{member}: expected a .npy or .npy.zst member")
    try:
        return read_npy(readinto, leading)
    except zstandard.ZstdError as error:
        raise ShardError(url, f"member {key}.{member}: corrupt zstd data ({error})") from None
    except FormatError as error:
        if isinstance(error, ShardError):
            raise
        raise ShardError(url, f"member {key}.{member}: {error}") from None


class SequenceReader:
    """Frames of one sequence, read in any order.

    `segments` are (shard URL, manifest row, samples before the sequence's first frame in it, frames
    in this shard). `shards` (URL -> `CheckedShard`) holds the open shards, shared with other
    readers; the ones a reader opens go there. They are opened here, so reads (from several threads)
    only read.
    """

    def __init__(self, segments: list[tuple[str, dict, int, int]], file: str, keys: list[str],
                 shards: dict | None = None):
        self.segments = segments
        self.file = file
        self.keys = keys
        self.owned = shards is None  # then `close` closes them
        self.shards = {} if shards is None else shards
        for url, row, _, _ in segments:
            if url not in self.shards:
                self.shards[url] = CheckedShard(url, row)
        self.cameras: dict = {}  # (frame, orientation) -> re-oriented camera, for the loader

    def close(self) -> None:
        if self.owned:
            for shard in self.shards.values():
                shard.close()
            self.shards.clear()

    def _locate(self, frame: int) -> tuple[str, int]:
        """(shard URL, sample number in it) of `frame`."""
        start = 0
        for url, _, skip, count in self.segments:
            if frame < start + count:
                return url, skip + frame - start
            start += count
        raise ShardError(self.segments[-1][0], f"{self.file}: frame {frame} is not in its shards")

    def read(self, frame: int, wanted: dict[str, int | None]) -> tuple[dict, dict]:
        """(arrays, meta) of `frame`; `wanted` maps field -> leading rows (None: all)."""
        url, number = self._locate(frame)
        shard = self.shards[url]
        key, found = self.keys[frame], shard.index.keys[number]
        if found != key:
            raise ShardError(url, f"expected sample {key!r} of {self.file}, found {found!r}")
        members = {name.split(".", 1)[0]: name for name in shard.index.names(number)}
        if "meta" not in members:
            raise ShardError(url, f"sample {key!r} of {self.file} has no meta.mp member")
        raw = shard.read(number, [members["meta"], *(members[field] for field in wanted if field in members)])
        meta = msgpack.unpackb(raw[members["meta"]], raw=False)
        arrays = {field: decode_member(url, key, members[field], raw[members[field]], leading)
                  for field, leading in wanted.items() if field in members}
        return arrays, meta
