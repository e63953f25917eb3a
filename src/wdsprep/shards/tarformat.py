"""Plain POSIX ustar, written and read by hand for speed and byte-for-byte determinism.

Writing: one 512-byte ustar header per member (mode 0644, uid/gid 0, empty user/group, mtime 0,
no PAX or GNU extensions), data padded to 512 bytes, and two zero blocks at the end (no record
padding, so a shard's size is exactly what its samples need). Reading: a sequential stream parser
that checks header checksums, names the shard on truncation or corruption, and reads member data
into bytearrays so decoders can build writable arrays without another copy.
"""
from __future__ import annotations

import os
import re
from typing import BinaryIO, Callable, Iterator

from ..errors import FormatError, ShardError

BLOCK = 512
END_OF_ARCHIVE = b"\0" * (2 * BLOCK)
_KEY_EXT = re.compile(r"^((?:.*/|)[^./]+)\.([^/]+)$")


def _octal(value: int, width: int) -> bytes:
    text = b"%0*o" % (width - 1, value)
    if len(text) > width - 1:
        raise FormatError(f"value {value} does not fit a {width}-byte ustar field")
    return text + b"\0"


def _split_name(name: str) -> tuple[bytes, bytes]:
    raw = name.encode("utf-8")
    if len(raw) <= 100:
        return raw, b""
    # ustar allows a 155-byte prefix joined to a 100-byte name at a '/'
    for cut in range(len(raw) - 1, 0, -1):
        if raw[cut : cut + 1] == b"/" and cut <= 155 and len(raw) - cut - 1 <= 100:
            return raw[cut + 1 :], raw[:cut]
    raise FormatError(f"member name too long for ustar ({len(raw)} bytes): {name!r}")


def header(name: str, size: int) -> bytes:
    """A deterministic ustar header for a regular file."""
    base, prefix = _split_name(name)
    block = bytearray(BLOCK)
    block[0 : len(base)] = base
    block[100:108] = b"0000644\0"
    block[108:116] = b"0000000\0"
    block[116:124] = b"0000000\0"
    block[124:136] = _octal(size, 12)
    block[136:148] = _octal(0, 12)
    block[148:156] = b" " * 8
    block[156:157] = b"0"
    block[257:263] = b"ustar\0"
    block[263:265] = b"00"
    block[329:337] = b"0000000\0"
    block[337:345] = b"0000000\0"
    block[345 : 345 + len(prefix)] = prefix
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def padding(size: int) -> bytes:
    return b"\0" * (-size % BLOCK)


def member_bytes(name: str, data: bytes) -> int:
    """Bytes a member occupies in the archive, header and padding included."""
    return BLOCK + len(data) + (-len(data) % BLOCK)


def split_key(name: str) -> tuple[str, str] | None:
    """webdataset's rule: key = path up to the first dot of the basename, field = the rest."""
    match = _KEY_EXT.match(name)
    if not match:
        return None
    return match.group(1), match.group(2)


# ------------------------------------------------------------------------------------------ read
def _read_exact_into(stream: BinaryIO, buffer: bytearray | memoryview, url: str, what: str) -> None:
    view = memoryview(buffer)
    filled = 0
    while filled < len(view):
        n = stream.readinto(view[filled:])
        if not n:
            raise ShardError(url, f"truncated shard: {what} ends after {filled} of {len(view)} bytes")
        filled += n


def _parse_number(field: bytes, url: str) -> int:
    if field[:1] == b"\x80":  # GNU base-256
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise ShardError(url, f"corrupt tar header (number field {field!r})") from None


def _seekable(stream: BinaryIO) -> bool:
    try:
        return stream.seekable()
    except (AttributeError, ValueError):
        return False


def iter_members(
    stream: BinaryIO, url: str = "<stream>", skip_data: Callable[[str], bool] | None = None
) -> Iterator[tuple[str, bytearray | None]]:
    """Yield (name, data) for every regular file, in archive order.

    `skip_data(name)` true means the member's data is not needed: it is seeked over when the stream
    allows (local files) and yielded as None.
    """
    block = bytearray(BLOCK)
    can_seek = skip_data is not None and _seekable(stream)
    if can_seek:  # the stream's length, once: seeking to the end on every skip drops read-ahead
        here = stream.tell()
        length = stream.seek(0, 2)
        stream.seek(here)
    long_name: str | None = None
    pax_path: str | None = None
    while True:
        n = stream.readinto(block)
        if n == 0:
            return  # no end-of-archive blocks: tolerated like tar does, but only at a boundary
        if n < BLOCK:
            rest = memoryview(block)[n:]
            _read_exact_into(stream, rest, url, "a tar header")
        if not any(block):
            return
        checksum = _parse_number(bytes(block[148:156]), url)
        computed = sum(block[:148]) + 8 * 32 + sum(block[156:])
        if checksum != computed:
            raise ShardError(url, "corrupt tar header (checksum mismatch)")
        size = _parse_number(bytes(block[124:136]), url)
        typeflag = block[156:157]
        name = block[0:100].split(b"\0", 1)[0]
        if block[257:262] == b"ustar":
            prefix = block[345:500].split(b"\0", 1)[0]
            if prefix:
                name = prefix + b"/" + name
        pad = -size % BLOCK
        if can_seek and typeflag in (b"0", b"\0", b"7") and skip_data(name.decode("utf-8")):
            end = stream.tell() + size + pad
            if end > length:
                raise ShardError(url, "truncated shard: a member's data is missing")
            stream.seek(end)
            yield name.decode("utf-8"), None
            continue
        data = bytearray(size)
        _read_exact_into(stream, data, url, f"member {name.decode('utf-8', 'replace')!r}")
        if pad:
            skipped = stream.read(pad)
            if len(skipped) != pad:
                raise ShardError(url, "truncated shard: padding after the last member is missing")
        if typeflag == b"L":  # GNU long name for the next member
            long_name = bytes(data).rstrip(b"\0").decode("utf-8")
            continue
        if typeflag == b"x":  # PAX extended header for the next member
            for record in re.finditer(rb"\d+ ([^=]+)=(.*?)\n", bytes(data), re.S):
                if record.group(1) == b"path":
                    pax_path = record.group(2).decode("utf-8")
            continue
        if typeflag == b"g":
            continue
        text = name.decode("utf-8")
        if long_name is not None:
            text, long_name = long_name, None
        if pax_path is not None:
            text, pax_path = pax_path, None
        if typeflag in (b"0", b"\0", b"7"):
            yield text, data


def iter_samples(stream: BinaryIO, url: str = "<stream>", skip: int = 0) -> Iterator[dict]:
    """Group consecutive members by key into samples (`__key__`, `__url__`, field -> bytearray).

    The first `skip` samples are passed over without reading their data where the stream can seek.
    """
    current: dict | None = None
    state = {"seen": 0, "key": None}

    def skipping(name: str) -> bool:
        parts = split_key(name)
        if parts is None:
            return True
        if parts[0] != state["key"]:
            state["key"] = parts[0]
            state["seen"] += 1
        return state["seen"] <= skip

    index = -1
    for name, data in iter_members(stream, url, skipping if skip else None):
        parts = split_key(name)
        if parts is None:
            continue
        key, field = parts
        if current is None or current["__key__"] != key:
            if current is not None and index >= skip:
                yield current
            index += 1
            current = {"__key__": key, "__url__": url}
        field = field.lower()
        if field in current:
            raise ShardError(url, f"duplicate member {name!r} in sample {key!r}")
        current[field] = data
    if current is not None and index >= skip:
        yield current


def index_samples(path: str) -> list[tuple[str, dict[str, tuple[int, int]]]]:
    """[(sample key, {field: (data offset, size)})] of a local shard, from its headers only.

    For random access (map-style datasets): reading one member is then a seek and a read.
    """
    samples: list[tuple[str, dict[str, tuple[int, int]]]] = []
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        offset = 0
        long_name: str | None = None
        while offset + BLOCK <= size:
            handle.seek(offset)
            block = handle.read(BLOCK)
            if not any(block):
                break
            if _parse_number(block[148:156], path) != sum(block[:148]) + 8 * 32 + sum(block[156:]):
                raise ShardError(path, f"corrupt tar header at byte {offset} (checksum mismatch)")
            length = _parse_number(block[124:136], path)
            typeflag = block[156:157]
            data = offset + BLOCK
            offset = data + length + (-length % BLOCK)
            if typeflag == b"L":
                handle.seek(data)
                long_name = handle.read(length).split(b"\0", 1)[0].decode("utf-8")
                continue
            if typeflag not in (b"0", b"\0", b"7"):
                continue
            name = block[0:100].split(b"\0", 1)[0]
            if block[257:262] == b"ustar" and block[345:500].strip(b"\0"):
                name = block[345:500].split(b"\0", 1)[0] + b"/" + name
            text = name.decode("utf-8")
            if long_name is not None:
                text, long_name = long_name, None
            parts = split_key(text)
            if parts is None:
                continue
            key, field = parts
            if not samples or samples[-1][0] != key:
                samples.append((key, {}))
            samples[-1][1][field.lower()] = (data, length)
        if offset > size:
            raise ShardError(path, "truncated shard: a member runs past the end of the file")
    return samples
