"""The wdsprep/1 shard format: codec round trips, deterministic ustar bytes, writer rules."""
import io
import os
import subprocess
import tarfile

import msgpack
import numpy as np
import pytest
import webdataset as wds
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import wdsprep
from wdsprep.errors import FormatError
from wdsprep.shards import tarformat
from wdsprep.shards.codec import Encoder, decode_npy, decode_npy_zst, decode_sample
from wdsprep.shards.manifest import Manifest
from wdsprep.shards.writer import ShardWriter

dtypes = st.sampled_from([np.uint8, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64, np.bool_, np.complex64])
arrays = dtypes.flatmap(lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)))
json_like = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=10,
)
field_names = st.from_regex(r"[a-z][a-z0-9_]{0,7}", fullmatch=True)
samples = st.lists(st.tuples(st.dictionaries(field_names, arrays, max_size=3), st.dictionaries(field_names, json_like, max_size=2)), min_size=1, max_size=6)


def _write(directory, items, codec):
    encoder = Encoder(codec)
    writer = ShardWriter(str(directory), "train-00000", shard_bytes=1 << 40, encoder=encoder)
    expected = []
    with writer:
        for index, (array_fields, meta_fields) in enumerate(items):
            fields = dict(array_fields)
            fields["meta"] = meta_fields  # a dict: webdataset returns a bare msgpack nil as raw bytes
            fields.setdefault("idx", index)
            key = f"k{index:04d}"
            writer.write(key, fields)
            expected.append((key, fields))
    manifest = Manifest("test", {}, "fp", {"train": [r.as_dict() for r in writer.rows]})
    (directory / "manifest.json").write_bytes(manifest.dumps())
    return str(directory / "manifest.json"), expected


def _assert_equal(value, expected):
    if isinstance(expected, np.ndarray):
        assert isinstance(value, np.ndarray)
        assert value.dtype == expected.dtype and value.shape == expected.shape
        np.testing.assert_array_equal(value, expected)
        assert value.flags.writeable
    else:
        assert value == expected


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=samples)
def test_round_trip_through_webdataset_and_wdsprep(tmp_path_factory, items):
    for codec in ("none", "zstd"):
        directory = tmp_path_factory.mktemp(codec)
        manifest_url, expected = _write(directory, items, codec)
        got = list(wdsprep.dataset(manifest_url, "train", shuffle_shards=False).compose(wdsprep.decode(strip=True)))
        assert [s["__key__"] for s in got] == [k for k, _ in expected]
        for sample, (key, fields) in zip(got, expected):
            assert {name for name in sample if not name.startswith("__")} == set(fields)
            for name, value in fields.items():
                _assert_equal(sample[name], value)
        if codec == "none":  # plain webdataset decodes .mp and .npy members itself
            plain = list(wds.WebDataset(wdsprep.urls(manifest_url, "train"), shardshuffle=False).decode())
            assert len(plain) == len(expected)
            for sample, (key, fields) in zip(plain, expected):
                assert sample["__key__"] == key
                for name, value in fields.items():
                    ext = "npy" if isinstance(value, np.ndarray) else "mp"
                    _assert_equal(sample[f"{name}.{ext}"], value) if ext == "mp" else np.testing.assert_array_equal(sample[f"{name}.{ext}"], value)


def test_member_bytes_are_standard():
    array = np.arange(12, dtype=np.int16).reshape(3, 4)
    encoder = Encoder("zstd")
    members = dict(encoder.encode_fields("k", {"a": array, "m": {"x": 1}}))
    raw_npy = zstandard.ZstdDecompressor().decompress(members["a.npy.zst"])
    np.testing.assert_array_equal(np.load(io.BytesIO(raw_npy), allow_pickle=False), array)
    assert msgpack.unpackb(members["m.mp"]) == {"x": 1}
    np.testing.assert_array_equal(decode_npy_zst(members["a.npy.zst"]), array)
    np.testing.assert_array_equal(decode_npy(raw_npy), array)
    fortran = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(decode_npy_zst(Encoder("zstd").encode_value("f.npy.zst", fortran)), fortran)


def test_shards_are_plain_deterministic_ustar(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    items = [({"x": np.arange(100, dtype=np.float32)}, {"label": 3})] * 3
    _write(a, items, "zstd")
    _write(b, items, "zstd")
    data = (a / "train-00000-00.tar").read_bytes()
    assert data == (b / "train-00000-00.tar").read_bytes()
    with tarfile.open(a / "train-00000-00.tar") as archive:
        members = archive.getmembers()
        names = [m.name for m in members]
        assert names[-1] == "__wdsprep_index__"  # the sample index (shards/index.py) comes last
        assert names[:-1] == sorted(names[:-1])
        for member in members:
            assert member.mtime == 0 and member.uid == 0 and member.gid == 0
            assert member.uname == "" and member.gname == "" and member.pax_headers == {}
    assert b"ustar\x0000" in data[:512] and b"PaxHeader" not in data
    listing = subprocess.run(["tar", "tf", str(a / "train-00000-00.tar")], capture_output=True, text=True, check=True)
    assert listing.stdout.split() == [m.name for m in members]


def test_writer_rejects_bad_keys_and_values(tmp_path):
    writer = ShardWriter(str(tmp_path), "train-00000", shard_bytes=1 << 20, encoder=Encoder())
    with pytest.raises(FormatError, match="contains a dot"):
        writer.write("a.b", {"x": 1})
    with pytest.raises(FormatError, match="too long for ustar"):
        writer.write("k" * 300, {"x": 1})
    with pytest.raises(FormatError, match=r"sample 'bad', field 'obj'"):
        writer.write("bad", {"obj": object()})
    with pytest.raises(FormatError, match=r"sample 'k', field '_hidden'"):
        writer.write("k", {"_hidden": 1})
    with pytest.raises(FormatError, match=r"sample 'arr', field 'o'"):
        writer.write("arr", {"o": np.array([object()])})
    writer.write("dup", {"x": 1})
    with pytest.raises(FormatError, match="duplicate sample key 'dup'"):
        writer.write("dup", {"x": 2})
    writer.close()


def test_shard_size_bound_counts_written_bytes(tmp_path):
    writer = ShardWriter(str(tmp_path), "train-00000", shard_bytes=40_000, encoder=Encoder("none"))
    with writer:
        for i in range(50):
            writer.write(f"k{i}", {"x": np.zeros(1000, dtype=np.float32)})
    assert len(writer.rows) > 1
    for row in writer.rows:
        size = os.path.getsize(tmp_path / row.name)
        assert size == row.bytes <= 40_000
    assert sum(r.samples for r in writer.rows) == 50
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_oversized_sample_gets_its_own_shard(tmp_path):
    writer = ShardWriter(str(tmp_path), "train-00000", shard_bytes=1000, encoder=Encoder("none"))
    with writer:
        writer.write("big", {"x": np.zeros(5000, dtype=np.uint8)})
        writer.write("small", {"x": 1})
    assert [r.samples for r in writer.rows] == [1, 1]


def test_unknown_manifest_version_is_a_clear_error(tmp_path):
    manifest = Manifest("test", {}, "fp", {"train": []}).to_dict()
    manifest["manifest_version"] = 99
    (tmp_path / "manifest.json").write_text(__import__("json").dumps(manifest))
    with pytest.raises(wdsprep.ManifestError, match="manifest version 99 is not supported"):
        wdsprep.urls(str(tmp_path), "train")
    (tmp_path / "manifest.json").write_bytes(Manifest("test", {}, "fp", {"train": []}).dumps())
    with pytest.raises(wdsprep.ManifestError, match="no split 'test'"):
        wdsprep.urls(str(tmp_path), "test")


def test_decode_sample_accepts_raw_and_decoded(tmp_path):
    raw = {"__key__": "k", "x.npy": Encoder("none").encode_value("x.npy", np.arange(3)), "m.mp": msgpack.packb({"a": 1})}
    once = decode_sample(raw)
    assert decode_sample(once)["m"] == {"a": 1}
    np.testing.assert_array_equal(decode_sample(once)["x"], np.arange(3))
