"""`.npy` and `.npy.zst` members against numpy's own reader (`np.load`), read where users read them:
`wdsprep.dataset(...)` with `wdsprep.decode()` composed first (fused into the reader) and as a
stage of its own, in order and through a shuffle buffer.

- Arrays in both byte orders and both memory orders, written by numpy into `.npy` files and
  converted by `wdsprep convert generic` (both codecs), decode to numpy's array: same dtype (byte
  order included), shape, memory order and values, writable.
- Every byte of a member's `.npy` header malformed, each in several ways (members written raw into
  a shard, plain and zstd-framed): where numpy refuses the bytes, or where its header declares other
  than the bytes after it (numpy reads a shorter array and ignores the rest; the format refuses it:
  docs/format.md), the reader refuses the sample with a ShardError naming the shard and the member;
  where numpy reads them, the reader gives numpy's array. Nothing is decoded differently, and nothing
  numpy refuses is yielded.
"""
import io
import os

import numpy as np
import pytest
import zstandard

import wdsprep
from wdsprep import cli
from wdsprep.shards.codec import Encoder
from wdsprep.shards.manifest import Manifest
from wdsprep.shards.writer import ShardWriter

DTYPES = ["<i2", ">i2", "<u4", ">u4", "<f4", ">f4", "<f8", ">f8", "<c8", ">c16", "|u1", "|b1", "<m8[s]", ">M8[D]"]
SHAPES = [(3, 4), (2, 3, 2), (0, 3), (), (5,), (1, 1)]


def _identity(source):
    yield from source  # a stage before decode: decode then runs as a stage of its own (not fused)


def _reads(manifest, *, fused, shuffle_buffer, handler=None):
    """key -> decoded sample, through wdsprep.dataset + wdsprep.decode (fused or as a stage)."""
    dataset = wdsprep.dataset(manifest, "train", shuffle_buffer=shuffle_buffer, equalize=None, seed=2)
    decode = wdsprep.decode(strip=True, handler=handler)
    pipeline = dataset.compose(decode) if fused else dataset.compose(_identity, decode)
    return {sample["__key__"]: sample for sample in pipeline}


def _same_as_numpy(got, expected, what):
    assert isinstance(got, np.ndarray), what
    assert (got.dtype, got.shape) == (expected.dtype, expected.shape), what
    assert got.dtype.byteorder == expected.dtype.byteorder, what
    assert (got.flags.c_contiguous, got.flags.f_contiguous) == (expected.flags.c_contiguous, expected.flags.f_contiguous), what
    assert got.flags.writeable, what
    np.testing.assert_array_equal(got, expected, err_msg=what)


@pytest.fixture(scope="module")
def orders(tmp_path_factory):
    """Input `.npy` files numpy wrote (every dtype x shape x memory order), converted with each codec."""
    root = tmp_path_factory.mktemp("orders")
    split = root / "in" / "train"
    split.mkdir(parents=True)
    rng = np.random.default_rng(5)
    expected = {}
    for n, (dtype, shape, fortran) in enumerate((d, s, f) for d in DTYPES for s in SHAPES for f in (False, True)):
        values = rng.integers(0, 100, size=shape).astype(np.dtype(dtype).newbyteorder("="))
        array = (np.asfortranarray(values) if fortran else np.ascontiguousarray(values)).astype(dtype, order="K")
        key = f"sample{n:04d}"
        np.save(split / f"{key}.array.npy", array, allow_pickle=False)
        expected[key] = np.load(split / f"{key}.array.npy")  # the reference: numpy reading its own file
    assert any(a.dtype.byteorder == ">" for a in expected.values())
    assert any(a.flags.f_contiguous and not a.flags.c_contiguous for a in expected.values())
    manifests = {}
    for codec in ("none", "zstd"):
        out = root / f"out-{codec}"
        assert cli.main(["convert", "generic", str(root / "in"), str(out), "--codec", codec, "--quiet",
                         "--shard-bytes", "40KB"]) == 0
        manifests[codec] = str(out / "manifest.json")
    return manifests, expected


@pytest.mark.parametrize("shuffle_buffer", [0, 5])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "stage"])
@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_both_byte_orders_and_both_memory_orders_decode_to_what_numpy_reads(orders, codec, fused, shuffle_buffer):
    manifests, expected = orders
    got = _reads(manifests[codec], fused=fused, shuffle_buffer=shuffle_buffer)
    assert sorted(got) == sorted(expected)
    for key, array in expected.items():
        _same_as_numpy(got[key]["array"], array, f"{key} {array.dtype.str} {array.shape}")


# ------------------------------------------------------------------------------ malformed headers
BASES = {  # two members whose headers differ in every field numpy writes
    "c": np.arange(6, dtype="<i2").reshape(2, 3),
    "f": np.asfortranarray(np.linspace(0, 1, 6, dtype=">f4").reshape(3, 2)),
}


def _numpy_bytes(array) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _malformed():
    """name -> .npy bytes with one header byte changed; every header byte, each several ways."""
    variants = {}
    for base, array in BASES.items():
        data = _numpy_bytes(array)
        header_end = len(data) - array.nbytes
        for at in range(header_end):
            original = data[at]
            for value in sorted({original ^ 0x01, original ^ 0x02, original ^ 0x80, 0x00, 0x20, 0x7F} - {original}):
                variants[f"{base}{at:03d}v{value:03d}"] = data[:at] + bytes([value]) + data[at + 1 :]
    return variants


def _numpy_reads(data):
    """numpy's array of `data`, or None where numpy refuses it or its header declares other than the
    bytes after the header (numpy's own header reader says where the header ends)."""
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except Exception:  # noqa: BLE001 -- any refusal by numpy is a refusal
        return None
    stream = io.BytesIO(data)
    version = np.lib.format.read_magic(stream)
    (np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0)(stream)
    return array if len(data) - stream.tell() == array.nbytes else None


@pytest.fixture(scope="module")
def malformed(tmp_path_factory):
    root = tmp_path_factory.mktemp("malformed")
    variants = _malformed()
    manifests = {}
    for codec, member, wrap in (("none", "a.npy", bytes), ("zstd", "a.npy.zst", zstandard.ZstdCompressor().compress)):
        directory = root / codec
        directory.mkdir()
        writer = ShardWriter(str(directory), "train-00000", shard_bytes=1 << 40, encoder=Encoder(codec))
        with writer:  # member bytes given as bytes are stored as they are
            for key, data in variants.items():
                writer.write(key, {member: wrap(data)})
        (directory / "manifest.json").write_bytes(Manifest("t", {}, "fp", {"train": [r.as_dict() for r in writer.rows]}).dumps())
        manifests[codec] = (str(directory / "manifest.json"), writer.rows[0].name, member)
    return manifests, {key: _numpy_reads(data) for key, data in variants.items()}


@pytest.mark.parametrize("shuffle_buffer", [0, 7])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "stage"])
@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_every_malformed_header_byte_is_refused_where_numpy_refuses_it(malformed, codec, fused, shuffle_buffer):
    manifests, reference = malformed
    manifest, shard, member = manifests[codec]
    refused = {}

    def handler(error):  # skip the sample, after noting which one and why
        assert isinstance(error, wdsprep.ShardError) and shard in str(error), error
        key = str(error).split(": member ", 1)[1].split(".", 1)[0]
        refused[key] = str(error)
        return True

    got = _reads(manifest, fused=fused, shuffle_buffer=shuffle_buffer, handler=handler)
    assert not set(got) & set(refused) and set(got) | set(refused) == set(reference)
    accepted = {key for key, array in reference.items() if array is not None}
    assert accepted and len(accepted) < len(reference)  # both kinds occur
    assert sorted(refused) == sorted(set(reference) - accepted), "refused by one reader only"
    for key in refused:
        assert f"member {key}.{member}:" in refused[key]
    for key in accepted:
        _same_as_numpy(got[key]["a"], reference[key], key)


def test_the_magic_string_is_checked_byte_by_byte():
    """Each of the six magic bytes changed alone: numpy refuses the bytes, so must the decoder."""
    data = _numpy_bytes(BASES["c"])
    for at in range(6):
        bad = data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]
        assert _numpy_reads(bad) is None
        for name, member in (("a.npy", bad), ("a.npy.zst", zstandard.ZstdCompressor().compress(bad))):
            with pytest.raises(wdsprep.FormatError, match="magic"):
                wdsprep.decode_sample({"__key__": "k", name: member})


def test_the_fixture_files_are_what_numpy_wrote(orders):
    """The reference side: numpy's files hold the byte orders and memory orders this file claims."""
    manifests, expected = orders
    root = os.path.dirname(os.path.dirname(manifests["none"]))
    header = open(os.path.join(root, "in", "train", "sample0001.array.npy"), "rb").read(128)
    assert b"'fortran_order': True" in header and b"'<i2'" in header
