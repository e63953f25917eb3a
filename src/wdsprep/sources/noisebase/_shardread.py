"""Streaming one sequence's frames out of shards, member by member.

A reader keeps one stream open per sequence and walks its tar members in order. Members a batch
does not need, and whole frames another worker handles, are skipped (seeked over when the stream
can seek, read past otherwise); per-sample arrays are decompressed only up to the samples asked
for (they are stored sample-major).
"""
from __future__ import annotations

import ast
import io
import threading
from typing import BinaryIO

import msgpack
import numpy as np
import zstandard

from ...errors import ShardError

BLOCK = 512
_headers: dict[bytes, tuple] = {}
_headers_lock = threading.Lock()
_local = threading.local()  # zstd decompressors are not thread-safe: one per thread


def _decompressor() -> zstandard.ZstdDecompressor:
    dctx = getattr(_local, "dctx", None)
    if dctx is None:
        dctx = _local.dctx = zstandard.ZstdDecompressor()
    return dctx


def _open(url: str) -> BinaryIO:
    from ...stream.opener import open_url

    return open_url(url)


class _TarCursor:
    """Sequential ustar member headers over a stream, with data read or skipped on demand."""

    def __init__(self, url: str):
        self.url = url
        self.stream = _open(url)
        try:
            self.seekable = bool(self.stream.seekable())
        except (AttributeError, ValueError):
            self.seekable = False
        self.pending: tuple[str, int] | None = None  # header read but data not consumed
        self._remaining = 0

    def close(self) -> None:
        self.stream.close()

    def next_member(self) -> tuple[str, int] | None:
        """(name, size) of the next regular member, or None at the end of the archive."""
        if self._remaining:
            self.skip()
        while True:
            block = self.stream.read(BLOCK)
            if not block or not any(block):
                return None
            if len(block) < BLOCK:
                raise ShardError(self.url, "truncated shard: a tar header is cut short")
            checksum = int(block[148:156].split(b"\0", 1)[0].strip() or b"0", 8)
            if checksum != sum(block[:148]) + 256 + sum(block[156:]):
                raise ShardError(self.url, "corrupt tar header (checksum mismatch)")
            size = int(block[124:136].split(b"\0", 1)[0].strip() or b"0", 8)
            name = block[0:100].split(b"\0", 1)[0]
            prefix = block[345:500].split(b"\0", 1)[0] if block[257:262] == b"ustar" else b""
            if prefix:
                name = prefix + b"/" + name
            self._remaining = size + (-size % BLOCK)
            self._size = size
            if block[156:157] in (b"0", b"\0"):
                return name.decode("utf-8"), size
            self.skip()  # directories, PAX/GNU records: wdsprep shards have none; pass over

    def read(self, count: int | None = None) -> bytes:
        """The member's data (or its first `count` bytes; the rest is skipped later)."""
        count = self._size if count is None else min(count, self._size)
        data = self.stream.read(count)
        if len(data) != count:
            raise ShardError(self.url, "truncated shard: member data is cut short")
        self._remaining -= count
        self._size -= count
        return data

    def skip(self) -> None:
        if self._remaining <= 0:
            return
        if self.seekable:
            self.stream.seek(self._remaining, io.SEEK_CUR)
        else:
            left = self._remaining
            while left:
                chunk = self.stream.read(min(left, 1 << 20))
                if not chunk:
                    raise ShardError(self.url, "truncated shard: member data is cut short")
                left -= len(chunk)
        self._remaining = 0
        self._size = 0


class _MemberSource:
    """The current member's remaining data as a readable (for zstd's streaming reader)."""

    def __init__(self, cursor: _TarCursor):
        self.cursor = cursor

    def read(self, size: int = -1) -> bytes:
        left = self.cursor._size
        return self.cursor.read(left if size is None or size < 0 else min(size, left)) if left else b""


def _read_exact(reader, count: int, what: str) -> bytearray:
    buffer = bytearray(count)
    view = memoryview(buffer)
    filled = 0
    while filled < count:
        n = reader.readinto(view[filled:])
        if not n:
            raise ShardError(what, "truncated array data")
        filled += n
    return buffer


def _npy_header(reader, what: str):
    """(dtype, shape, fortran_order, header bytes) of the .npy stream's header."""
    prefix = bytes(_read_exact(reader, 10, what))
    if prefix[:6] != b"\x93NUMPY":
        raise ShardError(what, "not .npy data (bad magic)")
    if prefix[6] == 1:
        length = int.from_bytes(prefix[8:10], "little")
    else:  # format 2/3: 4-byte header length
        prefix += bytes(_read_exact(reader, 2, what))
        length = int.from_bytes(prefix[8:12], "little")
    header = bytes(_read_exact(reader, length, what))
    parsed = _headers.get(header)
    if parsed is None:
        with _headers_lock:  # CPython 3.11's parser is not safe to run from several threads at once
            try:
                meta = ast.literal_eval(header.decode("latin1"))
                parsed = (np.dtype(meta["descr"]), tuple(meta["shape"]), bool(meta["fortran_order"]))
            except (ValueError, SyntaxError, KeyError, TypeError) as error:
                raise ShardError(what, f"unreadable .npy header ({error})") from None
            if parsed[0].hasobject:
                raise ShardError(what, "object arrays are refused")
            if len(_headers) < 1024:
                _headers[header] = parsed
    return (*parsed, len(prefix) + length)


def decode_member(cursor: _TarCursor, member: str, leading: int | None) -> np.ndarray:
    """Decode the current `.npy` / `.npy.zst` member; with `leading`, only the first rows of axis 0.

    Only the bytes needed are read (and decompressed): the rest of the member is skipped.
    """
    if member.endswith(".npy.zst"):
        reader = _decompressor().stream_reader(_MemberSource(cursor), read_size=1 << 16)
    elif member.endswith(".npy"):
        reader = _DirectMember(cursor)
    else:
        raise ShardError(cursor.url, f"{member}: expected a .npy or .npy.zst member")
    try:
        dtype, shape, fortran, _ = _npy_header(reader, f"{cursor.url}: {member}")
        if fortran:
            raise ShardError(cursor.url, f"{member}: Fortran-ordered arrays are not produced by the converter")
        if leading is not None and shape:
            shape = (min(leading, shape[0]), *shape[1:])
        count = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        buffer = _read_exact(reader, count, f"{cursor.url}: {member}")
    except zstandard.ZstdError as error:
        raise ShardError(cursor.url, f"{member}: corrupt zstd data ({error})") from None
    return np.frombuffer(buffer, dtype=dtype).reshape(shape)


class _DirectMember:
    """`readinto` straight from the shard stream, bounded by the member's size."""

    def __init__(self, cursor: _TarCursor):
        self.cursor = cursor

    def readinto(self, view) -> int:
        count = min(len(view), self.cursor._size)
        if not count:
            return 0
        data = self.cursor.read(count)
        view[: len(data)] = data
        return len(data)


class SequenceReader:
    """Frames of one sequence, read forward through its shard segments.

    `segments` are (shard URL, samples to pass before the sequence's first frame, frames in this
    shard). Asking for a frame before the current one reopens the stream (a new epoch).
    """

    def __init__(self, segments: list[tuple[str, int, int]], file: str, keys: list[str]):
        self.segments = segments
        self.file = file
        self.keys = keys
        self.cursor: _TarCursor | None = None
        self.segment = -1
        self.next_frame = 0  # the frame whose members come next
        self._carry: tuple[str, int] | None = None  # a member header read ahead (next frame's)
        self.cameras: dict = {}  # (frame, orientation) -> re-oriented camera, for the loader

    def close(self) -> None:
        if self.cursor is not None:
            self.cursor.close()
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
            member = self._carry if self._carry is not None else cursor.next_member()
            self._carry = None
            if member is None:
                break
            name, _ = member
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
        self.cursor = _TarCursor(url)
        self.segment = segment
        self._carry = None
        passed, current = 0, None
        while True:
            member = self.cursor.next_member()
            if member is None:
                raise ShardError(url, f"shard ends before sample {skip}, where {self.file} should start")
            key = member[0].split(".", 1)[0]
            if key != current:
                if current is not None:
                    passed += 1
                current = key
            if passed == skip:
                self._carry = member
                return
            self.cursor.skip()
