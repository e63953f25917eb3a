"""Edits of native inputs for tests of the input-fingerprint rule: in place, at equal size, and
optionally with the modification time put back, the way a careless tool (or `cp -p` of a
regenerated file) would leave them; which shards a re-run rewrote, seen from the file system; and a
zip member replaced by a stream of gigabytes (a decompression bomb, for the hostile-input tests).
(The bad-input contract of `wdsprep convert` as one check, `failing_convert`, runs the command line:
it is the conformance suite's, `wdsprep.conformance`.)
"""
from __future__ import annotations

import os
import zipfile


def overwrite_keeping_size(path: str, data: bytes, *, restore_mtime: bool = False) -> None:
    """Write `data` over the file at `path` in place (same inode); `data` must be its size."""
    before = os.stat(path)
    if len(data) != before.st_size:
        raise ValueError(f"{path}: the edit must keep the size ({len(data)} != {before.st_size} bytes)")
    if data == open(path, "rb").read():
        raise ValueError(f"{path}: the edit changes nothing")
    with open(path, "r+b") as handle:
        handle.write(data)
    if restore_mtime:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def zip_with_member_replaced(path: str, member: str, data: bytes) -> bytes:
    """The bytes of the zip at `path` with `member` holding `data`, padded to the original size
    with an archive comment (the new archive must not be larger: replace with data that compresses
    at least as well)."""
    import io

    original = os.path.getsize(path)
    buffer = io.BytesIO()
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(buffer, "w") as target:
        names = [info.filename for info in source.infolist()]
        if member not in names:
            raise KeyError(f"{path}: no member {member}")
        for info in source.infolist():
            target.writestr(info, data if info.filename == member else source.read(info))
        target.comment = b""
    size = len(buffer.getvalue())
    if size > original:
        raise ValueError(f"{path}: the edited archive is {size - original} bytes larger; pick data that compresses better")
    buffer = io.BytesIO(buffer.getvalue())
    with zipfile.ZipFile(buffer, "a") as target:
        target.comment = b" " * (original - size)
    result = buffer.getvalue()
    if len(result) != original:
        raise AssertionError("padding the archive comment did not restore the size")
    return result


def corrupt_zip_member(path: str, member: str) -> None:
    """Flip bytes inside `member`'s deflate stream of the zip at `path` (its local header and the
    central directory stay intact, so the archive opens and only reading that member fails)."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(member)
    if info.compress_type != zipfile.ZIP_DEFLATED:
        raise ValueError(f"{path}: member {member} is not deflated")
    data = bytearray(open(path, "rb").read())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)  # 30: local header
    for offset in range(8, 40):
        data[start + offset] ^= 0x5A
    with open(path, "wb") as handle:
        handle.write(bytes(data))


def shard_identities(directory: str) -> dict[str, tuple[int, int]]:
    """(inode, mtime_ns) of every shard: a rebuilt shard is a new file, a reused one is untouched."""
    found = {}
    for name in os.listdir(directory):
        if name.endswith(".tar"):
            info = os.stat(os.path.join(directory, name))
            found[name] = (info.st_ino, info.st_mtime_ns)
    return found


def rewritten_shards(before: dict[str, tuple[int, int]], directory: str) -> list[str]:
    """Shards of `directory` that are new or were rewritten since `before` (shard_identities)."""
    after = shard_identities(directory)
    return sorted(name for name, identity in after.items() if before.get(name) != identity)


def zip_with_member_streamed(path: str, member: str, chunks) -> None:
    """Rewrite the zip at `path` with `member` holding the concatenation of `chunks` (an iterable of
    bytes, streamed: gigabytes of it never sit in memory), deflated at level 9 as a zip tool makes a
    bomb; every other member is copied as it was (name, date, compression)."""
    temporary = f"{path}.rewrite"
    with zipfile.ZipFile(path) as source, \
            zipfile.ZipFile(temporary, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as target:
        names = [info.filename for info in source.infolist()]
        if member not in names:
            raise KeyError(f"{path}: no member {member}")
        for info in source.infolist():
            if info.filename != member:
                target.writestr(info, source.read(info))
                continue
            with target.open(info.filename, "w", force_zip64=True) as handle:
                for chunk in chunks:
                    handle.write(chunk)
    os.replace(temporary, path)


def zeros(total: int, chunk: int = 16 << 20):
    """`total` zero bytes as chunks of at most `chunk` bytes (for `zip_with_member_streamed`)."""
    block = bytes(min(chunk, total))
    while total > 0:
        yield block[: min(len(block), total)]
        total -= len(block)
