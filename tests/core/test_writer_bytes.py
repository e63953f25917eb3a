"""The writer's bytes, pinned byte for byte against a reference writer built here from independent
parts: Python's `tarfile` for the ustar headers (`TarInfo.tobuf`, USTAR format, the documented
fields: mode 0644, uid/gid 0, empty user/group names, mtime 0), numpy's `np.save` for `.npy`,
`zstandard` at the encoder's level, with the frame's content checksum, for `.npy.zst`, `msgpack` for `.mp` and the index, `json` for
`.json`, `hashlib`/`xxhash` for the manifest row -- and the layout of ARCHITECTURE.md and
`shards/index.py`: a sample's members in sorted name order, data padded to 512 bytes, the index
member last, two zero blocks, nothing after. Speed work on the writer must keep every byte."""
import hashlib
import io
import json
import struct
import tarfile

import msgpack
import numpy as np
import xxhash
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from wdsprep.shards.codec import Encoder
from wdsprep.shards.writer import ShardWriter

BLOCK = 512


def ustar_member(name: str, data: bytes) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = len(data), 0o644, 0, 0, 0, "", ""
    head = bytearray(info.tobuf(format=tarfile.USTAR_FORMAT, encoding="utf-8", errors="strict"))
    # wdsprep writes devmajor/devminor as octal zeros (like GNU tar); tarfile leaves them empty for files
    head[329:345] = b"0000000\0" * 2
    head[148:156] = b" " * 8  # POSIX: the checksum is the byte sum with its own field read as spaces
    head[148:156] = b"%06o\0 " % sum(head)
    return bytes(head) + data + bytes(-len(data) % BLOCK)


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def member(name: str, value, codec: str) -> tuple[str, bytes]:
    """(member suffix, bytes) of one field, by the format's rules."""
    if name.endswith(".json"):
        return name, value if isinstance(value, bytes) else json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    if isinstance(value, np.ndarray):
        return (f"{name}.npy", npy(value)) if codec == "none" else (f"{name}.npy.zst", zstandard.ZstdCompressor(level=3, write_checksum=True).compress(npy(value)))
    return f"{name}.mp", msgpack.packb(value, use_bin_type=True)


def reference_shard(samples: list[tuple[str, dict]], codec: str) -> tuple[bytes, dict]:
    """(shard bytes, manifest row without its name) of these samples, written by the rules alone."""
    body, layouts, layout, offsets, sizes, digests = bytearray(), [], [], [], [], []
    for key, fields in samples:
        offsets.append(len(body))
        members = sorted(member(name, value, codec) for name, value in fields.items())
        names = [suffix for suffix, _ in members]
        if names not in layouts:
            layouts.append(names)
        layout.append(layouts.index(names))
        for suffix, data in members:
            part = ustar_member(f"{key}.{suffix}", data)
            sizes.append(len(data))
            digests.append(xxhash.xxh3_64_intdigest(part))
            body += part
    index = ustar_member("__wdsprep_index__", msgpack.packb({  # wdsprep-index/2 (shards/index.py): columns little-endian
        "format": "wdsprep-index/2", "digest": "xxh3_64", "keys": [key for key, _ in samples], "layouts": layouts,
        "layout": struct.pack(f"<{len(layout)}I", *layout), "offsets": struct.pack(f"<{len(offsets)}Q", *offsets),
        "sizes": struct.pack(f"<{len(sizes)}Q", *sizes), "digests": struct.pack(f"<{len(digests)}Q", *digests)}))
    shard = bytes(body + index + bytes(2 * BLOCK))
    row = {"samples": len(samples), "bytes": len(shard), "sha256": hashlib.sha256(shard).hexdigest(), "index_offset": len(body),
           "index_bytes": len(index), "index_digest": f"xxh3_64:{xxhash.xxh3_64_intdigest(index):016x}"}
    return shard, row


def assert_written_like_reference(directory, samples: list[tuple[str, dict]], codec: str, shard_bytes: int) -> list[dict]:
    writer = ShardWriter(str(directory), "train-00000", shard_bytes=shard_bytes, encoder=Encoder(codec))
    with writer:
        for key, fields in samples:
            writer.write(key, fields)
    rows = [row.as_dict() for row in writer.rows]
    assert sum(row["samples"] for row in rows) == len(samples)
    start = 0
    for part, row in enumerate(rows):
        shard, expected = reference_shard(samples[start : start + row["samples"]], codec)
        assert row["name"] == f"train-00000-{part:02d}.tar"
        assert (directory / row["name"]).read_bytes() == shard
        assert row == {"name": row["name"], **expected}
        start += row["samples"]
    return rows


def bench_w3_samples(count: int) -> list[tuple[str, dict]]:
    """The peers bench's W3 workload: a 256-byte float32 array and a small dict per sample."""
    rng = np.random.default_rng(0)
    return [(f"s{i:07d}", {"array": rng.standard_normal(64).astype(np.float32), "meta": {"index": i, "label": i % 10, "name": f"s{i}"}})
            for i in range(count)]


def test_w3_samples_are_written_byte_for_byte_like_the_reference(tmp_path):
    rows = assert_written_like_reference(tmp_path, bench_w3_samples(400), "none", shard_bytes=300_000)
    assert len(rows) >= 2  # the rollover is crossed, so every shard's own index and row are pinned


def test_every_field_kind_and_codec_is_written_like_the_reference(tmp_path_factory):
    fortran = np.asfortranarray(np.arange(12, dtype=np.int16).reshape(3, 4))
    fields = {"c": np.arange(24, dtype=np.float64).reshape(2, 3, 4), "f": fortran, "empty": np.zeros((0, 3), np.uint8),
              "scalar": np.array(7, np.int32), "meta": {"a": [1, 2], "b": b"\x00raw", "t": "é"}, "n": 5,
              "j.json": {"z": 1, "a": [True, None]}, "raw.json": b'{"given": 1}'}
    for codec in ("none", "zstd"):
        samples = [(f"k{i}", {**fields, "n": i}) for i in range(5)]
        assert_written_like_reference(tmp_path_factory.mktemp(codec), samples, codec, shard_bytes=1 << 30)


def test_a_name_of_100_bytes_the_longest_ustar_holds_without_its_prefix_is_written_like_tarfile(tmp_path):
    key = "k" * (100 - len(".x.npy"))  # keys are plain names: ustar's prefix (a path's directories) is never used
    assert_written_like_reference(tmp_path, [(key, {"x": np.arange(3)})], "none", shard_bytes=1 << 30)


def test_a_refused_sample_leaves_no_trace_in_the_bytes_of_the_samples_after_it(tmp_path):
    """A value msgpack cannot pack, a key with a dot, a bad field name: each is refused with a
    FormatError, and the shard is what the reference writes for the accepted samples alone."""
    import pytest

    from wdsprep.errors import FormatError

    accepted = bench_w3_samples(3)
    writer = ShardWriter(str(tmp_path), "train-00000", shard_bytes=1 << 30, encoder=Encoder("none"))
    with writer:
        writer.write(*accepted[0])
        for key, fields in [("bad", {"meta": {"deep": [1, {"x": object()}]}}), ("bad", {"meta": {"big": 2**70}}),
                            ("a.b", {"meta": {}}), ("bad", {"_hidden": 1}), ("bad", {"array": np.array([object()])})]:
            with pytest.raises(FormatError):
                writer.write(key, fields)
        for key, fields in accepted[1:]:
            writer.write(key, fields)
    shard, expected = reference_shard(accepted, "none")
    assert (tmp_path / writer.rows[0].name).read_bytes() == shard
    assert writer.rows[0].as_dict() == {"name": writer.rows[0].name, **expected}


field_values = st.one_of(
    hnp.arrays(st.sampled_from([np.uint8, np.int16, np.float32, np.float64, np.bool_]),
               hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=40)),
    st.dictionaries(st.text(max_size=6), st.integers(-(2**40), 2**40) | st.text(max_size=30) | st.binary(max_size=30), max_size=4),
    st.integers(0, 2**64 - 1),
    st.binary(max_size=50),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(samples=st.lists(st.dictionaries(st.sampled_from(["a", "b-1", "meta", "Z9"]), field_values, min_size=1, max_size=3),
                        min_size=1, max_size=12),
       fortran=st.booleans(), codec=st.sampled_from(["none", "zstd"]), shard_bytes=st.integers(2_000, 40_000))
def test_any_samples_are_written_byte_for_byte_like_the_reference(tmp_path_factory, samples, fortran, codec, shard_bytes):
    if fortran:
        samples = [{name: np.asfortranarray(v) if isinstance(v, np.ndarray) else v for name, v in fields.items()} for fields in samples]
    keyed = [(f"key_{i:04d}", fields) for i, fields in enumerate(samples)]
    assert_written_like_reference(tmp_path_factory.mktemp("any"), keyed, codec, shard_bytes)
