"""Plain POSIX ustar, written and read by hand for speed and byte-for-byte determinism.

Writing: one 512-byte ustar header per member (mode 0644, uid/gid 0, empty user/group, mtime 0,
no PAX or GNU extensions), data padded to 512 bytes, and two zero blocks at the end (no record
padding, so a shard's size is exactly what its samples need). A header is a fixed template with
the name, size and checksum filled in; the part that depends on the size alone is cached, and the
checksum is the template's byte sum plus those of the filled fields (no pass over 512 bytes).

Reading: ONE header parser (`parse_header`) and ONE cursor (`TarCursor`) that every reader of
shards uses (`iter_members`, `group_samples`/`iter_samples`, `index_samples`, the read path's
fallback for shards without an index, `wdsprep reindex`), and ONE grouping of members into samples
(`sample_members`) that every reader of samples uses. The cursor walks members in order over
any binary stream; a member's data is read whole, read in part (`readinto`, the rest skipped
later) or skipped (seeked over when the stream can seek). It accepts
what other writers produce: GNU long names (`L`), PAX `path`/`size` records (`x`; global `g`
records are ignored), base-256 numbers, typeflag `7` (contiguous file) as a regular file. Every
defect -- a checksum mismatch, a bad number, a stream cut short -- is a `ShardError` naming the
shard, the byte offset and the member it follows. Member data lands in bytearrays, so decoders
build writable arrays without another copy. A header's size is never trusted beyond the bytes
there are: in a file (whose size is known) a header declaring more than follows it is refused as it
is read, and from a stream of unknown length a member larger than `GROW` is read in pieces of that
size, so a header declaring gigabytes costs at most what the stream holds.

Member names. A sample member is named `<key>.<field>` (`split_key`): the key has no dot, no `/`,
no `\\`, no NUL and does not start with `__`; the field is dot-separated non-empty parts without
those characters, not starting with `__`. So a name is never a path: no `/`, no `..`, no leading
`/`, and a field never collides with the `__key__`/`__url__` entries of a sample. The writer
writes only such names (`writer.check_key`, the encoder's field rule); `sample_members` skips
metadata members `__name__` (the sample index, webdataset's convention) and refuses every other
name with a `ShardError` naming it, so no reader, `verify` or `reindex` passes a path through.
"""
from __future__ import annotations

import io
import os
import re
import zlib
from typing import BinaryIO, Callable, Iterator, NamedTuple

from ..errors import FormatError, ShardError

BLOCK = 512
END_OF_ARCHIVE = b"\0" * (2 * BLOCK)
_PART = r"[^./\\\0]+"  # one dot-free part of a name: no '/', no '\\', no NUL
KEY = re.compile(rf"(?!__){_PART}")  # a sample key (fullmatch)
FIELD = re.compile(rf"(?!__){_PART}(?:\.{_PART})*")  # a member's field and extensions (fullmatch)
_MEMBER = re.compile(rf"({KEY.pattern})\.({FIELD.pattern})")
_META = re.compile(r"__[^./\\\0]*__")  # `__wdsprep_index__`: skipped, as webdataset does
NAME_RULE = "(no '/', no '..', no leading '/' or '__')"


def _octal(value: int, width: int) -> bytes:
    text = b"%0*o" % (width - 1, value)
    if len(text) > width - 1:
        raise FormatError(f"value {value} does not fit a {width}-byte ustar field")
    return text + b"\0"


def _byte_sum(block: bytes) -> int:
    # adler32's low half is 1 + the byte sum mod 65521; a 256-byte half sums to at most 65280: exact
    return (zlib.adler32(block[:256]) & 0xFFFF) + (zlib.adler32(block[256:]) & 0xFFFF) - 2


def _template() -> bytearray:
    block = bytearray(BLOCK)
    block[100:108] = b"0000644\0"
    block[108:116] = b"0000000\0"
    block[116:124] = b"0000000\0"
    block[136:148] = _octal(0, 12)
    block[148:156] = b" " * 8
    block[156:157] = b"0"
    block[257:263] = b"ustar\0"
    block[263:265] = b"00"
    block[329:337] = b"0000000\0"
    block[337:345] = b"0000000\0"
    return block


_TEMPLATE = bytes(_template())  # the fields every header shares (mode, ids, mtime 0, ustar magic)


_TEMPLATE_SUM = _byte_sum(_TEMPLATE)  # name, size and prefix are zeros there: they add their own sums
_MIDDLE, _AFTER_SUM = _TEMPLATE[100:124], _TEMPLATE[136:148]
_TAIL = _TEMPLATE[156:]  # typeflag to the end: the same in every header (no prefix)


def _small_sum(data: bytes) -> int:
    # adler32's low half is 1 + the byte sum mod 65521: exact for fields of at most 256 bytes
    return (zlib.adler32(data) & 0xFFFF) - 1


_SIZED: dict[int, tuple[bytes, int]] = {}  # data size -> (header bytes 100..148, template sum + size field sum)


def _sized(size: int) -> tuple[bytes, int]:
    """The header part that depends on the size only; sizes repeat across a shard's samples: cached."""
    found = _SIZED.get(size)
    if found is None:
        size_field = _octal(size, 12)
        found = (_MIDDLE + size_field + _AFTER_SUM, _TEMPLATE_SUM + _small_sum(size_field))
        if len(_SIZED) < 4096:
            _SIZED[size] = found
    return found


def header(name: str, size: int) -> bytes:
    """A deterministic ustar header for a regular file (the template with name, size and checksum
    filled in; the checksum adds the filled fields' sums to the template's). Member names are plain
    (no '/'), so ustar's prefix field, which holds a path's directories, is never used."""
    raw = name.encode("utf-8")
    if len(raw) > 100:
        raise FormatError(f"member name too long for ustar ({len(raw)} bytes, at most 100): {name!r}")
    middle, checksum = _SIZED.get(size) or _sized(size)
    return b"".join((raw.ljust(100, b"\0"), middle, b"%06o\0 " % (checksum + _small_sum(raw)), _TAIL))


def padding(size: int) -> bytes:
    return b"\0" * (-size % BLOCK)


def split_key(name: str) -> tuple[str, str] | None:
    """(key, field) of a plain member name `<key>.<field>` (module docstring; webdataset's split at
    the first dot), None for any other name."""
    match = _MEMBER.fullmatch(name)
    return None if match is None else (match.group(1), match.group(2))


def is_meta_name(name: str) -> bool:
    """A `__name__` member (no dot): metadata, not a sample member (the sample index)."""
    return _META.fullmatch(name) is not None


# ------------------------------------------------------------------------------------------ read
REGULAR = (b"0", b"\0", b"7")  # typeflag 7 (contiguous file) is a regular file to every reader


class Member(NamedTuple):
    name: str
    size: int
    offset: int  # archive offset of the member's data
    start: int  # archive offset of its first header block (GNU/PAX records included)


def _number(field: bytes, url: str, where: int) -> int:
    if field[:1] == b"\x80":  # GNU base-256 (positive)
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise ShardError(url, f"corrupt tar header at byte {where} (number field {bytes(field)!r})") from None


def parse_header(block: bytes, url: str, where: int) -> tuple[bytes, int, bytes]:
    """(name, data size, typeflag) of one 512-byte ustar/GNU header; checks its checksum."""
    stored = _number(block[148:156], url, where)
    if stored != _byte_sum(block) - sum(block[148:156]) + 256:
        raise ShardError(url, f"corrupt tar header at byte {where} (checksum mismatch)")
    size = _number(block[124:136], url, where)
    name = block[0:100].split(b"\0", 1)[0]
    if block[257:262] == b"ustar":
        prefix = block[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name, size, block[156:157]


def _pax_records(data: bytes, url: str, where: int) -> dict[bytes, bytes]:
    """The records of a PAX header: `<length> <key>=<value>\\n` each, its length counting itself; a
    record that does not (a length of 0 would never advance) or a `size` that is not a number is corrupt."""
    records, pos = {}, 0
    while pos < len(data) and data[pos:pos + 1] != b"\0":
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space]) if space > pos else 0
            if length <= space - pos or pos + length > len(data):
                raise ValueError(length)
            key, _, value = data[space + 1 : pos + length - 1].partition(b"=")
            if key == b"size" and not value.isdigit():
                raise ValueError(value)
        except ValueError:
            raise ShardError(url, f"corrupt PAX header at byte {where}") from None
        records[key] = value
        pos += length
    return records


SEEK_OVER = 1 << 20  # skips longer than this seek (when the stream can); shorter ones read through
GROW = 16 << 20  # a member read from a stream of unknown length is read in pieces of this size


def _is_file(stream: BinaryIO) -> bool:
    try:
        stream.fileno()
        return True
    except (AttributeError, OSError, io.UnsupportedOperation):
        return False


def _seekable(stream: BinaryIO) -> bool:
    try:
        return stream.seekable()
    except (AttributeError, ValueError):
        return False


class TarCursor:
    """Regular members of a tar stream, in order, with their data read whole, in part or skipped.

    `next()` moves to the next regular member (skipping what is left of the current one) and returns
    it, or None at the end of the archive. `read()` / `readinto()` consume the current member's
    data from where the last read stopped; `skip()` passes over the rest. `offset` is the archive
    offset of the stream's current position (`start`: where the stream stands when handed over);
    `header` is the last 512-byte header block read (the current member's own, after any GNU/PAX
    records about it).
    """

    def __init__(self, stream: BinaryIO, url: str = "<stream>", *, start: int = 0):
        self.stream = stream
        self.url = url
        self.offset = start
        self.member: Member | None = None
        self.left = 0  # data bytes of the current member not consumed yet
        self._pad = 0
        self._seekable = _seekable(stream)
        self._local = _is_file(stream)
        self._length: int | None = None
        self.limit = self._stream_length() if self._local else None  # the archive's size, where it is known
        self._block = bytearray(BLOCK)
        self.header = b""

    def _what(self) -> str:
        return f"after member {self.member.name!r}" if self.member else "at the start"

    def _fill(self, view: memoryview | bytearray, what: str, before: int = 0, total: int | None = None) -> None:
        """Fill `view` from the stream; `before` and `total`: what the error counts (the bytes of `what`
        read before `view`, all of them), when `view` is part of it."""
        view = memoryview(view)
        filled = 0
        while filled < len(view):
            n = self.stream.readinto(view[filled:])
            if not n:
                raise ShardError(self.url, f"truncated shard: {what} ends after {before + filled} of "
                                           f"{len(view) if total is None else total} bytes")
            filled += n
        self.offset += len(view)

    def _stream_length(self) -> int:
        if self._length is None:  # once: seeking to the end on every skip would drop read-ahead
            try:
                self._length = os.fstat(self.stream.fileno()).st_size
            except (AttributeError, OSError, io.UnsupportedOperation):
                here = self.stream.tell()
                self._length = self.stream.seek(0, io.SEEK_END)
                self.stream.seek(here)
        return self._length

    def _pass(self, count: int, what: str) -> None:
        if not count:
            return
        # short skips of a remote stream read through: a seek there may cost a new request
        if self._seekable and (count > SEEK_OVER or self._length is not None or self._local):
            if self.offset + count > self._stream_length():
                raise ShardError(self.url, f"truncated shard: {what} runs past the end of the file")
            self.offset += count
            self.stream.seek(self.offset)
            return
        scratch = bytearray(min(count, 1 << 20))
        while count:
            step = min(count, len(scratch))
            self._fill(memoryview(scratch)[:step], what)
            count -= step

    def skip(self) -> None:
        """Pass over what is left of the current member's data and padding."""
        what = f"member {self.member.name!r}" if self.member else "a member"
        self._pass(self.left + self._pad, what)
        self.left = self._pad = 0

    def readinto(self, view) -> int:
        """Up to len(view) more bytes of the current member's data; 0 at its end."""
        count = min(len(view), self.left)
        if count:
            self._fill(memoryview(view)[:count], f"member {self.member.name!r}")
            self.left -= count
        return count

    def read(self, count: int | None = None) -> bytearray:
        """The member's next `count` data bytes (all that is left by default), in a new bytearray: at
        once where the header's size was checked against the file's, else in pieces of `GROW` bytes."""
        want = self.left if count is None else min(count, self.left)
        if want <= GROW or self.limit is not None:
            data = bytearray(want)
            self.readinto(data)
            return data
        data = bytearray()
        while len(data) < want:  # what the header declares is not known to be there
            piece = bytearray(min(GROW, want - len(data)))
            self._fill(piece, f"member {self.member.name!r}", len(data), want)
            self.left -= len(piece)
            data += piece
        return data

    def _header(self) -> tuple[bytes, int, bytes, int] | None:
        where = self.offset
        n = self.stream.readinto(self._block)
        if n == 0:
            return None  # no end-of-archive blocks: tolerated like tar does, but only at a boundary
        if n < BLOCK:
            self._fill(memoryview(self._block)[n:], f"the tar header {self._what()}")
            self.offset += n
        else:
            self.offset += BLOCK
        block = self.header = bytes(self._block)
        if not any(block):
            return None
        return (*parse_header(block, self.url, where), where)

    def next(self) -> Member | None:
        if self.left or self._pad:
            self.skip()
        long_name: bytes | None = None
        pax: dict[bytes, bytes] = {}
        start = self.offset
        while True:
            parsed = self._header()
            if parsed is None:
                self.member = None
                return None
            name, size, typeflag, where = parsed
            if b"size" in pax:
                size = int(pax[b"size"])
            if self.limit is not None and self.offset + size > self.limit:
                raise ShardError(self.url, f"truncated shard: the tar header at byte {where} ({name.decode('utf-8', 'replace')!r:.80}) "
                                           f"declares {size} bytes, the shard holds {self.limit - self.offset} after it")
            pad = -size % BLOCK
            if typeflag in (b"L", b"x", b"g", b"K"):  # records about the next member
                self.member, self.left, self._pad = Member(name.decode("utf-8", "replace"), size, self.offset, where), size, pad
                data = bytes(self.read())
                self.skip()
                if typeflag == b"L":
                    long_name = data.split(b"\0", 1)[0]
                elif typeflag == b"x":
                    pax = _pax_records(data, self.url, where)
                continue
            if b"path" in pax:
                name = pax[b"path"]
            elif long_name is not None:
                name = long_name
            try:
                text = name.decode("utf-8")
            except UnicodeDecodeError:
                raise ShardError(self.url, f"corrupt tar header at byte {where} (member name is not UTF-8)") from None
            self.member = Member(text, size, self.offset, start)
            self.left, self._pad = size, pad
            if typeflag in REGULAR:
                return self.member
            self.skip()  # directories, links, devices: not data
            long_name, pax, start = None, {}, self.offset


def iter_members(
    stream: BinaryIO, url: str = "<stream>", skip_data: Callable[[str], bool] | None = None
) -> Iterator[tuple[str, bytearray | None]]:
    """Yield (name, data) for every regular file, in archive order.

    `skip_data(name)` true means the member's data is not needed: it is passed over (seeked when the
    stream allows) and yielded as None.
    """
    cursor = TarCursor(stream, url, start=stream.tell() if _seekable(stream) else 0)
    while (member := cursor.next()) is not None:
        if skip_data is not None and skip_data(member.name):
            cursor.skip()
            yield member.name, None
        else:
            data = cursor.read()
            yield member.name, data


def sample_members(cursor: TarCursor, url: str) -> Iterator[tuple[int, str, str, Member]]:
    """(sample number, key, field, member) of every sample member, in archive order: consecutive
    members with one key are one sample. The one grouping of every tar reader (`group_samples`,
    `index_samples`, `wdsprep reindex`). Metadata members (`__name__`: the sample index) are
    skipped; any other name that is not `<key>.<field>` (a path, `..`, an absolute name), and a
    member named twice in one sample, is a `ShardError` naming it. The caller reads the member's
    data (or leaves it: the cursor's `next()` passes over what is left) before asking for the next."""
    number, key, fields = -1, None, set()
    while (member := cursor.next()) is not None:
        parts = split_key(member.name)
        if parts is None:
            if is_meta_name(member.name):
                continue
            raise ShardError(url, f"member {member.name!r} at byte {member.start} is not a plain name <key>.<field> "
                                  f"{NAME_RULE}: refused")
        if parts[0] != key:
            number, key, fields = number + 1, parts[0], set()
        field = parts[1].lower()
        if field in fields:
            raise ShardError(url, f"duplicate member {member.name!r} in sample {key!r}")
        fields.add(field)
        yield number, key, parts[1], member


def group_samples(cursor: TarCursor, url: str, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, dict | None]]:
    """(index, sample) for every sample of the archive (`sample_members`), each as `{"__key__",
    "__url__", field: bytearray}`; samples outside [start, stop) come as None, their data passed
    over unread (seeked where the stream can)."""
    current: dict | None = None
    index = -1
    wanted = False
    for number, key, field, _ in sample_members(cursor, url):
        if number != index:
            if index >= 0:
                yield index, current if wanted else None
            index = number
            wanted = start <= index and (stop is None or index < stop)
            current = {"__key__": key, "__url__": url}
        if wanted:
            current[field.lower()] = cursor.read()
    if index >= 0:
        yield index, current if wanted else None


def iter_samples(stream: BinaryIO, url: str = "<stream>", skip: int = 0) -> Iterator[dict]:
    """Samples (`__key__`, `__url__`, field -> bytearray) of a tar stream, in order; the first `skip`
    are passed over without reading their data where the stream can seek (see `group_samples`)."""
    cursor = TarCursor(stream, url, start=stream.tell() if _seekable(stream) else 0)
    for _, sample in group_samples(cursor, url, skip):
        if sample is not None:
            yield sample


def index_samples(path: str) -> list[tuple[str, dict[str, tuple[int, int]]]]:
    """[(sample key, {field: (data offset, size)})] of a local shard, from its headers only
    (`sample_members`). For random access (map-style datasets): reading one member is then a seek
    and a read.
    """
    samples: list[tuple[str, dict[str, tuple[int, int]]]] = []
    with open(path, "rb") as handle:
        for number, key, field, member in sample_members(TarCursor(handle, path), path):
            if number == len(samples):
                samples.append((key, {}))
            samples[-1][1][field.lower()] = (member.offset, member.size)
    return samples
