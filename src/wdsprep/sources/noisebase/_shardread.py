"""Reading one sequence's frames out of its shards, frame by frame, each frame checked first.

A sequence's frames are consecutive samples of one or more shards (its segments). A frame is read
by sample number through `stream.reading.access.ShardAccess`, the random access `wdsprep.MapDataset` reads
with: one bounded read of the members it needs (a positioned read locally, a Range request
remotely), every member in that span checked against the shard's index before anything is decoded
(an older shard without an index: hashed whole at its first use if local, refused with the line
naming `wdsprep reindex` if remote); each shard's index is loaded at its first use and kept. Frames
that other workers handle are not read at all. Per-sample arrays are stored sample-major, so only the leading samples asked for are
decompressed; the check still reads each member whole, since its digest covers all of it.
"""
from __future__ import annotations

import io

import msgpack
import zstandard

from ...errors import FormatError, ShardError
from ...shards.codec import decompressor, frame_size, read_npy
from ...stream.reading.access import ShardAccess
from ...stream.reading.unpack import sample_member_names


def decode_member(url: str, key: str, member: str, data: bytearray, leading: int | None):
    """Decode one `.npy` / `.npy.zst` member's (checked) bytes; with `leading`, only the first rows
    of axis 0 (only what they need is decompressed). Its header is checked against the member's size
    (or its frame's declared content) and the member cap before anything is allocated (`read_npy`)."""
    try:
        if member.endswith(".npy.zst"):
            readinto, size = decompressor().stream_reader(data, read_size=1 << 16).readinto, frame_size(data)
        elif member.endswith(".npy"):
            readinto, size = io.BytesIO(data).readinto, len(data)
        else:
            raise ShardError(url, f"member {key}.{member}: expected a .npy or .npy.zst member")
        return read_npy(readinto, leading, size)
    except zstandard.ZstdError as error:
        raise ShardError(url, f"member {key}.{member}: corrupt zstd data ({error})") from None
    except FormatError as error:
        if isinstance(error, ShardError):
            raise
        raise ShardError(url, f"member {key}.{member}: {error}") from None


class SequenceReader:
    """Frames of one sequence, read in any order.

    `segments` are (shard URL, manifest row, samples before the sequence's first frame in it, frames
    in this shard). `access` is the `ShardAccess` the frames are read through, shared with other
    readers (its shards include these); without one the reader makes its own, over its segments'
    shards, and `close` closes it. Reads may come from several threads at once.
    """

    def __init__(self, segments: list[tuple[str, dict, int, int]], file: str, keys: list[str],
                 access: ShardAccess | None = None):
        self.segments = segments
        self.file = file
        self.keys = keys
        self.owned = access is None  # then `close` closes it
        if access is None:
            shards = {url: row for url, row, _, _ in segments}
            access = ShardAccess(list(shards), list(shards.values()))
        self.access = access
        self.shards = [access.shard(url) for url, _, _, _ in segments]  # each segment's shard in `access`
        self.cameras: dict = {}  # (frame, orientation) -> re-oriented camera, for the loader

    def close(self) -> None:
        if self.owned:
            self.access.close()

    def _locate(self, frame: int) -> tuple[int, int]:
        """(shard in `access`, sample number in it) of `frame`."""
        start = 0
        for shard, (_, _, skip, count) in zip(self.shards, self.segments):
            if frame < start + count:
                return shard, skip + frame - start
            start += count
        raise ShardError(self.segments[-1][0], f"{self.file}: frame {frame} is not in its shards")

    def read(self, frame: int, wanted: dict[str, int | None]) -> tuple[dict, dict]:
        """(arrays, meta) of `frame`; `wanted` maps field -> leading rows (None: all)."""
        shard, number = self._locate(frame)
        index, url = self.access.index(shard), self.access.urls[shard]
        key, found = self.keys[frame], index.sample_keys()[number]
        if found != key:
            raise ShardError(url, f"expected sample {key!r} of {self.file}, found {found!r}")
        members = {name.split(".", 1)[0]: name for name in sample_member_names(self.access, shard, number)}
        if "meta" not in members:
            raise ShardError(url, f"sample {key!r} of {self.file} has no meta.mp member")
        names = [members["meta"], *(members[field] for field in wanted if field in members)]
        raw = self.access.read([(shard, number, names)])[0]
        meta = msgpack.unpackb(raw[members["meta"]], raw=False)
        arrays = {field: decode_member(url, key, members[field], raw[members[field]], leading)
                  for field, leading in wanted.items() if field in members}
        return arrays, meta
