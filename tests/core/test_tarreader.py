"""The one tar reader (`tarformat.TarCursor`) against Python's `tarfile` as the reference: GNU long
names, PAX names, base-256 numbers, typeflag 7, directories and links, partial reads, and a
`ShardError` for corrupt or truncated headers on every path that reads shards."""
import io
import tarfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wdsprep.errors import ShardError
from wdsprep.shards.codec import Encoder
from wdsprep.shards.tarformat import TarCursor, index_samples, iter_members, iter_samples
from wdsprep.shards.writer import ShardWriter
from wdsprep.sources.noisebase._shardread import SequenceReader


class _Unseekable(io.RawIOBase):
    """A forward-only stream (like a pipe) over bytes, returning short reads."""

    def __init__(self, data: bytes):
        self.inner = io.BytesIO(data)

    def readable(self):
        return True

    def readinto(self, buffer):
        view = memoryview(buffer)[:700]  # short reads exercise the refill loops
        return self.inner.readinto(view)


def _tar(members, fmt=tarfile.GNU_FORMAT) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for name, data, kind in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind in (tarfile.REGTYPE, tarfile.CONTTYPE):
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                if kind == tarfile.SYMTYPE:
                    info.linkname = "elsewhere"
                tar.addfile(info)
    return out.getvalue()


def _reference(data: bytes) -> list[tuple[str, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers() if m.isreg()]


def _ours(data: bytes, seekable: bool) -> list[tuple[str, bytes]]:
    stream = io.BytesIO(data) if seekable else _Unseekable(data)
    return [(name, bytes(body)) for name, body in iter_members(stream, "mem.tar")]


_segment = st.text(alphabet="abcdefghij0123456789_-", min_size=1, max_size=40)
_names = st.lists(_segment, min_size=1, max_size=8).map("/".join)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    members=st.lists(st.tuples(_names, st.binary(max_size=1500)), min_size=1, max_size=6, unique_by=lambda m: m[0]),
    fmt=st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]),
    seekable=st.booleans(),
)
def test_members_match_tarfile_in_every_format(members, fmt, seekable):
    try:
        data = _tar([(name, body, tarfile.REGTYPE) for name, body in members], fmt)
    except ValueError:  # a name ustar cannot hold
        return
    reference = _reference(data)
    assert len(reference) == len(members)
    assert _ours(data, seekable) == reference


def test_gnu_long_names_pax_names_links_dirs_and_typeflag_7():
    long = "d/" + "x" * 150 + "/leaf.field.npy"
    members = [("dir", b"", tarfile.DIRTYPE), (long, b"abc" * 300, tarfile.REGTYPE), ("link", b"", tarfile.SYMTYPE),
               ("c.cont.mp", b"contiguous", tarfile.CONTTYPE), ("z.last.mp", b"", tarfile.REGTYPE)]
    for fmt in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        data = _tar(members, fmt)
        reference = _reference(data)
        assert [name for name, _ in reference] == [long, "c.cont.mp", "z.last.mp"]
        assert _ours(data, True) == _ours(data, False) == reference
    assert b"././@LongLink" in _tar(members, tarfile.GNU_FORMAT)  # the GNU `L` record really is used


def _base256(field_width: int, value: int) -> bytes:
    return b"\x80" + value.to_bytes(field_width - 1, "big")


def _rechecksum(block: bytearray) -> None:
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)


def test_base256_size_field_is_read_like_tarfile():
    data = bytearray(_tar([("a.x.npy", bytes(range(256)) * 3, tarfile.REGTYPE), ("b.y.mp", b"\x01", tarfile.REGTYPE)]))
    block = data[:512]
    block[124:136] = _base256(12, 768)
    _rechecksum(block)
    data[:512] = block
    reference = _reference(bytes(data))
    assert reference[0][1] == bytes(range(256)) * 3  # tarfile decodes base-256 too
    assert _ours(bytes(data), True) == _ours(bytes(data), False) == reference


def test_partial_reads_then_skip_land_on_the_next_member():
    first = np.arange(1000, dtype=np.int32).tobytes()
    data = _tar([("a.x.npy", first, tarfile.REGTYPE), ("b.y.npy", b"second" * 100, tarfile.REGTYPE)])
    for stream in (io.BytesIO(data), _Unseekable(data)):
        cursor = TarCursor(stream, "mem.tar")
        member = cursor.next()
        assert (member.name, member.size) == ("a.x.npy", len(first))
        head = bytearray(10)
        assert cursor.readinto(head) == 10 and bytes(head) == first[:10]
        assert bytes(cursor.read(6)) == first[10:16]
        member = cursor.next()  # the rest of a.x.npy is skipped
        assert member.name == "b.y.npy" and bytes(cursor.read()) == b"second" * 100
        assert cursor.next() is None


def test_index_samples_offsets_match_tarfile(tmp_path):
    writer = ShardWriter(str(tmp_path), "t", shard_bytes=1 << 30, encoder=Encoder("none"))
    with writer:
        for i in range(4):
            writer.write(f"k{i}", {"a": np.arange(i * 50, dtype=np.float64), "m": {"i": i}})
    path = str(tmp_path / writer.rows[0].name)
    with tarfile.open(path) as tar:
        expected = {}
        for m in tar.getmembers():
            if "." in m.name:
                key, field = m.name.split(".", 1)
                expected.setdefault(key, {})[field] = (m.offset_data, m.size)
    assert dict(index_samples(path)) == expected


def _shard(tmp_path, samples=3, rows=None):
    writer = ShardWriter(str(tmp_path), "t", shard_bytes=1 << 30, encoder=Encoder("zstd"))
    with writer:
        for i in range(samples):
            writer.write(f"f{i}", {"color": np.full((4, 3), i, dtype=np.float32), "meta": {"i": i}})
    if rows is not None:
        rows.append(writer.rows[0].as_dict())
    return tmp_path / writer.rows[0].name


def _corrupt_header(path, member: str, at: int) -> None:
    with tarfile.open(path) as tar:
        offset = tar.getmember(member).offset
    data = bytearray(path.read_bytes())
    data[offset + at] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("at", [1, 124 + 3, 150, 300])  # name, size, checksum, an unused byte
def test_a_corrupt_header_is_a_shard_error_on_every_path(tmp_path, at):
    rows = []
    path = _shard(tmp_path, rows=rows)
    _corrupt_header(path, "f1.color.npy.zst", at)
    url = str(path)
    with pytest.raises(ShardError, match=r"t-00\.tar: corrupt tar header at byte \d+"):
        list(iter_samples(open(path, "rb"), url))
    with pytest.raises(ShardError, match="corrupt tar header"):
        list(iter_samples(_Unseekable(path.read_bytes()), url, skip=2))
    with pytest.raises(ShardError, match="corrupt tar header"):
        index_samples(url)
    reader = SequenceReader([(url, rows[0], 0, 3)], "seq", ["f0", "f1", "f2"])  # checked against the index
    with pytest.raises(ShardError, match=r"t-00\.tar: member f1\.color\.npy\.zst: corrupt"):
        reader.read(1, {"color": None})
    reader.close()


def test_a_non_octal_size_is_a_shard_error(tmp_path):
    path = _shard(tmp_path)
    data = bytearray(path.read_bytes())
    data[124:136] = b"0000000z000\0"
    block = data[:512]
    _rechecksum(block)
    data[:512] = block
    with pytest.raises(ShardError, match="number field"):
        list(iter_members(io.BytesIO(bytes(data)), "x.tar"))


def test_truncated_shards_are_shard_errors(tmp_path):
    path = _shard(tmp_path)
    data = path.read_bytes()
    with tarfile.open(path) as tar:
        cut = tar.getmember("f2.color.npy.zst").offset_data + 5
    for stream in (io.BytesIO(data[:cut]), _Unseekable(data[:cut]), io.BytesIO(data[: cut - 300])):
        with pytest.raises(ShardError, match="truncated shard"):
            list(iter_members(stream, "x.tar"))
    path.write_bytes(data[:cut])
    with pytest.raises(ShardError, match="truncated shard"):
        index_samples(str(path))
