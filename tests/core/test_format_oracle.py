"""The shard format against independent oracles: numpy's own `.npy` reader, `zstandard`, `msgpack`,
Python's `tarfile`, and the ustar rules written out here (header checksum, 512-byte padding, two end
blocks). Shards are written with the public ShardWriter and read back through `wdsprep.dataset` /
`wdsprep.decode_sample`, never through the format's private helpers."""
import io
import json
import tarfile

import msgpack
import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import wdsprep
from wdsprep.shards.codec import Encoder
from wdsprep.shards.manifest import Manifest
from wdsprep.shards.writer import ShardWriter
from wdsprep.stream import iter_shard

BLOCK = 512
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
dtypes = st.sampled_from([np.uint8, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64, np.bool_, np.complex64])
arrays = dtypes.flatmap(lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)))


def npy_bytes(array) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)  # Fortran-ordered input gives a fortran_order: True header
    return buffer.getvalue()


def numpy_reads(data: bytes):
    return np.load(io.BytesIO(data), allow_pickle=False)


def same_array(got, expected):
    assert isinstance(got, np.ndarray)
    assert (got.dtype, got.shape) == (expected.dtype, expected.shape)
    np.testing.assert_array_equal(got, expected)


# ------------------------------------------------------------------------------ member codecs
@SETTINGS
@given(array=arrays, fortran=st.booleans())
def test_npy_and_npy_zst_decode_like_numpy_in_either_memory_order(array, fortran):
    array = np.asfortranarray(array) if fortran else np.ascontiguousarray(array)
    data = npy_bytes(array)
    reference = numpy_reads(data)
    compressed = zstandard.ZstdCompressor(level=3).compress(data)
    decoded = wdsprep.decode_sample({"__key__": "k", "a.npy": data, "b.npy.zst": compressed})
    same_array(decoded["a"], reference)
    same_array(decoded["b"], reference)


def test_fortran_order_is_read_as_fortran_order():
    """A 2x3 Fortran array read in C order would come back [[0, 2, 4], [1, 3, 5]]."""
    array = np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3))
    data = npy_bytes(array)
    assert b"'fortran_order': True" in data
    decoded = wdsprep.decode_sample({"a.npy": data, "b.npy.zst": zstandard.ZstdCompressor().compress(data)})
    assert decoded["a"].tolist() == decoded["b"].tolist() == [[0, 1, 2], [3, 4, 5]]


@SETTINGS
@given(value=st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=10),
                          lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3), max_leaves=8),
       )
def test_mp_and_json_members_decode_like_their_libraries(value):
    members = {"m.mp": msgpack.packb(value), "j.json": json.dumps(value).encode()}
    decoded = wdsprep.decode_sample(dict(members))
    assert decoded["m"] == msgpack.unpackb(members["m.mp"], raw=False, strict_map_key=False)
    assert decoded["j"] == json.loads(members["j.json"])


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_every_codec_writes_members_the_libraries_read_back(tmp_path, codec):
    """What the writer stores is read by numpy/zstandard/msgpack on the bytes `tarfile` extracts."""
    arrays_in = {"c": np.arange(24, dtype=np.float32).reshape(2, 3, 4), "f": np.asfortranarray(np.arange(6, dtype=np.int16).reshape(2, 3))}
    writer = ShardWriter(str(tmp_path), "train-00000", shard_bytes=1 << 30, encoder=Encoder(codec))
    with writer:
        writer.write("k0", {**arrays_in, "meta": {"a": [1, 2]}})
    with tarfile.open(tmp_path / writer.rows[0].name) as archive:
        members = {m.name: archive.extractfile(m).read() for m in archive.getmembers() if not m.name.startswith("__")}
    suffix = ".npy.zst" if codec == "zstd" else ".npy"
    assert sorted(members) == sorted(["k0.c" + suffix, "k0.f" + suffix, "k0.meta.mp"])
    for name, expected in arrays_in.items():
        data = members[f"k0.{name}{suffix}"]
        if codec == "zstd":
            data = zstandard.ZstdDecompressor().decompress(data)
        same_array(numpy_reads(data), expected)
    assert msgpack.unpackb(members["k0.meta.mp"]) == {"a": [1, 2]}


TRUNCATIONS = {  # member name -> member bytes for the first `length` bytes of a .npy
    "cut .npy": lambda npy, length: ("a.npy", npy[:length]),
    "cut zstd frame": lambda npy, length: ("a.npy.zst", zstandard.ZstdCompressor().compress(npy)[:length]),
    "whole zstd frame of a cut .npy": lambda npy, length: ("a.npy.zst", zstandard.ZstdCompressor().compress(npy[:length])),
}
ARRAY_NPY = npy_bytes(np.arange(300, dtype=np.int16).reshape(10, 30))
HEADER_END = ARRAY_NPY.index(b"\n") + 1  # the .npy header ends with a newline (numpy pads it to 64 bytes)


@pytest.mark.parametrize("how", sorted(TRUNCATIONS))
def test_an_array_member_cut_in_its_data_is_an_error_at_every_length(how):
    ends = range(HEADER_END, len(ARRAY_NPY)) if how != "cut zstd frame" else range(len(zstandard.ZstdCompressor().compress(ARRAY_NPY)))
    for length in ends:
        name, data = TRUNCATIONS[how](ARRAY_NPY, length)
        with pytest.raises(wdsprep.FormatError):
            wdsprep.decode_sample({name: data})


@pytest.mark.parametrize("how", ["cut .npy", "whole zstd frame of a cut .npy"])
def test_an_array_member_cut_in_its_header_is_a_format_error(how):
    """Not an IndexError or a SyntaxError from deep inside the parser: a FormatError naming the member."""
    for length in range(HEADER_END):
        name, data = TRUNCATIONS[how](ARRAY_NPY, length)
        with pytest.raises(wdsprep.FormatError, match=name):
            wdsprep.decode_sample({name: data})


# ------------------------------------------------------------------------------ tar layout
def ustar_checksum(header: bytes) -> int:
    """POSIX: the unsigned byte sum of the header with its checksum field (148..155) read as spaces."""
    return sum(header[:148]) + 8 * ord(" ") + sum(header[156:BLOCK])


def stored_checksum(header: bytes) -> int:
    return int(header[148:156].strip(b"\0 "), 8)


def header_offsets(data: bytes) -> list[int]:
    """Walk the archive by the ustar rules: a header, its data padded to 512, until a zero block."""
    offsets, offset = [], 0
    while data[offset : offset + BLOCK] != bytes(BLOCK):
        offsets.append(offset)
        size = int(data[offset + 124 : offset + 136].rstrip(b"\0 ") or b"0", 8)
        offset += BLOCK + -(-size // BLOCK) * BLOCK
    return offsets


def one_shard(directory, sizes, codec="none"):
    """One shard whose i-th sample has a uint8 array of sizes[i] elements; returns (manifest, shard path)."""
    writer = ShardWriter(str(directory), "train-00000", shard_bytes=1 << 40, encoder=Encoder(codec))
    with writer:
        for i, size in enumerate(sizes):
            writer.write(f"k{i:03d}", {"x": np.full(size, i % 251, dtype=np.uint8)})
    (directory / "manifest.json").write_bytes(Manifest("test", {}, "fp", {"train": [r.as_dict() for r in writer.rows]}).dumps())
    return str(directory / "manifest.json"), directory / writer.rows[0].name, writer.rows[0]


@SETTINGS
@given(sizes=st.lists(st.integers(0, 1300), min_size=1, max_size=6))
def test_layout_padding_and_checksums_follow_ustar(tmp_path_factory, sizes):
    manifest, path, row = one_shard(tmp_path_factory.mktemp("layout"), sizes)
    data = path.read_bytes()
    with tarfile.open(path) as archive:
        members = archive.getmembers()  # with any members of the format's own ("__" names), checked too
        payloads = [archive.extractfile(m).read() for m in members if not m.name.startswith("__")]
    assert [m.name for m in members if not m.name.startswith("__")] == [f"k{i:03d}.x.npy" for i in range(len(sizes))]
    offsets = header_offsets(data)
    assert [m.offset for m in members] == offsets
    expected_offset = 0
    for member in members:  # each header on a block boundary, data padded with zeros to the next one
        assert member.offset == expected_offset
        assert stored_checksum(data[member.offset : member.offset + BLOCK]) == ustar_checksum(data[member.offset : member.offset + BLOCK])
        end = member.offset_data + member.size
        padded = member.offset_data + -(-member.size // BLOCK) * BLOCK
        assert data[end:padded] == bytes(padded - end)
        expected_offset = padded
    assert len(data) == expected_offset + 2 * BLOCK and data[expected_offset:] == bytes(2 * BLOCK)
    assert row.bytes == len(data)
    got = list(wdsprep.dataset(manifest, "train", shuffle_shards=False, equalize=None))
    assert len(got) == len(payloads) == len(sizes)
    for i, (sample, payload, size) in enumerate(zip(got, payloads, sizes)):
        assert sample["x.npy"] == payload
        same_array(numpy_reads(payload), np.full(size, i % 251, dtype=np.uint8))


@pytest.mark.parametrize("field", [(100, "mode"), (136, "mtime"), (265, "uname"), (345, "prefix")])
@pytest.mark.parametrize("which", [0, 1, 2])
def test_a_header_with_a_wrong_checksum_is_refused_naming_the_shard(tmp_path, field, which):
    manifest, path, _ = one_shard(tmp_path, [10, 700, 3])
    data = bytearray(path.read_bytes())
    offset = header_offsets(bytes(data))[which] + field[0]
    data[offset] = (data[offset] + 1) % 256 or 1  # the stored checksum no longer matches
    path.write_bytes(bytes(data))
    header = bytes(data[offset - field[0] : offset - field[0] + BLOCK])
    assert stored_checksum(header) != ustar_checksum(header)
    with pytest.raises(wdsprep.ShardError, match=path.name):
        list(wdsprep.dataset(manifest, "train", shuffle_shards=False, equalize=None))


def _cut_and_read(manifest, path, whole, cuts):
    for cut in cuts:
        path.write_bytes(whole[:cut])
        with pytest.raises(wdsprep.ShardError, match=path.name):
            list(wdsprep.dataset(manifest, "train", shuffle_shards=False, equalize=None))


def test_a_shard_cut_anywhere_before_its_end_blocks_is_an_error_naming_it(tmp_path):
    """Every prefix that loses sample bytes: ShardError with the shard's name; never fewer samples in
    silence, never a sample read past the cut."""
    manifest, path, _ = one_shard(tmp_path, [5, 600])
    whole = path.read_bytes()
    _cut_and_read(manifest, path, whole, range(len(whole) - 2 * BLOCK))


def test_a_shard_cut_inside_its_end_blocks_is_an_error_naming_it(tmp_path):
    """Every sample is intact but the archive is shorter than its manifest row says."""
    manifest, path, _ = one_shard(tmp_path, [5, 600])
    whole = path.read_bytes()
    _cut_and_read(manifest, path, whole, range(len(whole) - 2 * BLOCK, len(whole)))


@pytest.mark.parametrize("extra", [1, 511, 512, 1024, 4096])
def test_a_shard_longer_than_its_row_is_an_error_naming_it(tmp_path, extra):
    """Bytes after the end blocks (a shard appended to, or a longer file copied over it): every sample
    is intact but the file is not the one its row describes; refused before the first sample, locally
    and over HTTP, also where the read starts inside the shard."""
    from wdsprep.testing import RangeHTTPServer

    manifest, path, row = one_shard(tmp_path, [5, 600, 7])
    with open(path, "ab") as handle:
        handle.write(b"\0" * (extra - 1) + b"x")
    assert path.stat().st_size == row.bytes + extra
    for shuffle_buffer in (0, 2):
        with pytest.raises(wdsprep.ShardError, match=path.name):
            list(wdsprep.dataset(manifest, "train", shuffle_shards=False, equalize=None, shuffle_buffer=shuffle_buffer))
    second = wdsprep.dataset(manifest, "train", shuffle_shards=False, equalize=None, rank=1, world_size=2)
    with pytest.raises(wdsprep.ShardError, match=path.name):
        list(second)
    with RangeHTTPServer(tmp_path) as server:
        with pytest.raises(wdsprep.ShardError, match=path.name):
            list(wdsprep.dataset(server.url_of("manifest.json"), "train", shuffle_shards=False, equalize=None))


def test_a_shard_cut_inside_a_member_is_an_error_also_where_reading_seeks_over_it(tmp_path):
    """A resumed reader (or a worker starting mid-shard) passes over the first samples without reading
    their data; a cut inside any member, skipped or read, is still an error naming the shard.
    (A cut exactly between members reads like a shorter archive: the manifest count catches that.)"""
    _, path, _ = one_shard(tmp_path, [600, 30])
    whole = path.read_bytes()
    offsets = header_offsets(whole)
    boundaries = set(offsets) | {len(whole) - 2 * BLOCK}
    for cut in range(offsets[0] + 1, len(whole) - 2 * BLOCK):
        if cut in boundaries:
            continue
        path.write_bytes(whole[:cut])
        with pytest.raises(wdsprep.ShardError, match=path.name):
            list(iter_shard(str(path), skip=1))


def test_a_complete_shard_with_fewer_samples_than_its_row_is_an_error_naming_it(tmp_path):
    manifest, path, row = one_shard(tmp_path, [5, 6, 7])
    rows = [dict(row.as_dict(), samples=4)]  # the manifest promises one sample more than the shard holds
    (tmp_path / "manifest.json").write_bytes(Manifest("test", {}, "fp", {"train": rows}).dumps())
    with pytest.raises(wdsprep.ShardError, match=path.name):
        list(wdsprep.dataset(manifest, "train", shuffle_shards=False, equalize=None))


# ------------------------------------------------------------------------------ the size bound
def _shard_sizes(directory, sample_sizes, shard_bytes):
    directory.mkdir(parents=True, exist_ok=True)
    writer = ShardWriter(str(directory), "train-00000", shard_bytes=shard_bytes, encoder=Encoder("none"))
    with writer:
        for i, size in enumerate(sample_sizes):
            writer.write(f"k{i:03d}", {"x": np.zeros(size, dtype=np.uint8)})
    return [(row.samples, (directory / row.name).stat().st_size, row.bytes) for row in writer.rows]


def test_the_size_bound_counts_the_end_blocks(tmp_path):
    """The bound is on the whole file, end blocks included: one byte less than a two-sample shard's
    size (measured on the file) cannot hold two samples."""
    ((samples, two, _),) = _shard_sizes(tmp_path / "two", [1000, 1000], 1 << 30)
    assert samples == 2 and tarfile.open(tmp_path / "two" / "train-00000-00.tar").getmembers()  # a readable tar
    assert all(size <= two for _, size, _ in _shard_sizes(tmp_path / "fits", [1000] * 4, two))
    assert [n for n, _, _ in _shard_sizes(tmp_path / "tight", [1000] * 4, two - 1)] == [1, 1, 1, 1]


@SETTINGS
@given(sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=12), target=st.integers(1024, 9000))
def test_every_shard_with_more_than_one_sample_is_within_the_bound(tmp_path_factory, sizes, target):
    rows = _shard_sizes(tmp_path_factory.mktemp("bound"), sizes, target)
    assert sum(n for n, _, _ in rows) == len(sizes)
    for samples, size, recorded in rows:
        assert size == recorded
        assert samples == 1 or size <= target, (samples, size, target)
