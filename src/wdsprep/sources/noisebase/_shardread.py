"""Streaming one sequence's frames out of shards, member by member (`tarformat.TarCursor`).

A reader keeps one stream open per sequence and walks its tar members in order. Members a batch
does not need, and whole frames another worker handles, are skipped (seeked over when the stream
can seek, read past otherwise); per-sample arrays are decompressed only up to the samples asked
for (they are stored sample-major).
"""
from __future__ import annotations

import msgpack
import zstandard

from ...errors import FormatError, ShardError
from ...shards.codec import decompressor, read_npy
from ...shards.tarformat import Member, TarCursor


def _open_cursor(url: str) -> TarCursor:
    from ...storage import open_url

    return TarCursor(open_url(url), url)


def decode_member(cursor: TarCursor, member: str, leading: int | None):
    """Decode the current `.npy` / `.npy.zst` member; with `leading`, only the first rows of axis 0.

    Only the bytes needed are read (and decompressed): the rest of the member is skipped later.
    """
    if member.endswith(".npy.zst"):
        readinto = decompressor().stream_reader(cursor, read_size=1 << 16, closefd=False).readinto
    elif member.endswith(".npy"):
        readinto = cursor.readinto
    else:
        raise ShardError(cursor.url, f"{member}: expected a .npy or .npy.zst member")
    try:
        return read_npy(readinto, leading)
    except zstandard.ZstdError as error:
        raise ShardError(cursor.url, f"member {member}: corrupt zstd data ({error})") from None
    except FormatError as error:
        if isinstance(error, ShardError):
            raise
        raise ShardError(cursor.url, f"member {member}: {error}") from None


class SequenceReader:
    """Frames of one sequence, read forward through its shard segments.

    `segments` are (shard URL, samples to pass before the sequence's first frame, frames in this
    shard). Asking for a frame before the current one reopens the stream (a new epoch).
    """

    def __init__(self, segments: list[tuple[str, int, int]], file: str, keys: list[str]):
        self.segments = segments
        self.file = file
        self.keys = keys
        self.cursor: TarCursor | None = None
        self.segment = -1
        self.next_frame = 0  # the frame whose members come next
        self._carry: Member | None = None  # a member header read ahead (next frame's)
        self.cameras: dict = {}  # (frame, orientation) -> re-oriented camera, for the loader

    def close(self) -> None:
        if self.cursor is not None:
            self.cursor.stream.close()
            self.cursor = None

    def _segment_of(self, frame: int) -> int:
        start = 0
        for index, (_, _, count) in enumerate(self.segments):
            if frame < start + count:
                return index
            start += count
        raise ShardError(self.segments[-1][0], f"{self.file}: frame {frame} is not in its shards")

    def read(self, frame: int, wanted: dict[str, int | None]) -> tuple[dict, dict]:
        """(arrays, meta) of `frame`; `wanted` maps field -> leading rows (None: all)."""
        if frame < self.next_frame or self.cursor is None:
            self._restart()
        try:
            while self.next_frame < frame:
                self._read_frame(None)
            return self._read_frame(wanted)
        except BaseException:
            self._restart()  # the stream position is unknown now: the next read starts over
            raise

    def _restart(self) -> None:
        self.close()
        self.next_frame = 0
        self.segment = -1
        self._carry = None

    def _read_frame(self, wanted: dict[str, int | None] | None) -> tuple[dict, dict]:
        frame = self.next_frame
        segment = self._segment_of(frame)
        if segment != self.segment:
            self._open_at_sequence(segment)
        key = self.keys[frame]
        arrays: dict = {}
        meta = None
        cursor = self.cursor
        while True:
            member = self._carry if self._carry is not None else cursor.next()
            self._carry = None
            if member is None:
                break
            name = member.name
            if name.startswith("__"):  # the shard's sample index (its last member): no frame
                continue
            member_key, _, field_ext = name.partition(".")
            if member_key != key:
                if meta is None and not arrays:
                    raise ShardError(cursor.url, f"expected sample {key!r} of {self.file}, found {member_key!r}")
                self._carry = member  # first member of the next frame
                break
            field = field_ext.split(".", 1)[0]
            if wanted is None:  # passing over a frame another worker handles
                cursor.skip()
                meta = meta or {}
            elif field == "meta":
                meta = msgpack.unpackb(cursor.read(), raw=False)
            elif field in wanted:
                arrays[field] = decode_member(cursor, name, wanted[field])
            else:
                cursor.skip()
        if meta is None:
            raise ShardError(cursor.url, f"sample {key!r} of {self.file} has no meta.mp member")
        self.next_frame = frame + 1
        return arrays, meta

    def _open_at_sequence(self, segment: int) -> None:
        """Open a segment's shard positioned on the sequence's first sample in it."""
        self.close()
        url, skip, _ = self.segments[segment]
        self.cursor = _open_cursor(url)
        self.segment = segment
        self._carry = None
        passed, current = 0, None
        while True:
            member = self.cursor.next()
            if member is None:
                raise ShardError(url, f"shard ends before sample {skip}, where {self.file} should start")
            key = member.name.split(".", 1)[0]
            if key != current:
                if current is not None:
                    passed += 1
                current = key
            if passed == skip:
                self._carry = member
                return
            self.cursor.skip()
