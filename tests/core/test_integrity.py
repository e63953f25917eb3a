"""Integrity while streaming: a corrupted byte anywhere in a shard is a ShardError naming the shard
(and the member), raised before any sample holding it is yielded, locally, over HTTP and over S3.

Byte positions are found with Python's `tarfile` (independent of wdsprep's reader), and every
sample that does get yielded is compared with the original shard as `tarfile` reads it.
"""
import io
import os
import pathlib
import tarfile

import numpy as np
import pytest
import webdataset as wds
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wdsprep
from wdsprep.errors import ShardError
from wdsprep.shards.codec import Encoder
from wdsprep.shards.index import INDEX_MEMBER, ROW_FIELDS
from wdsprep.shards.manifest import Manifest
from wdsprep.shards.writer import ShardWriter
from wdsprep.testing import RangeHTTPServer, S3Server
from wdsprep.conformance import run_cli

from .shardsets import keys_until_error

SHARD = "train-00000-00.tar"


def _write(directory: pathlib.Path, codec: str) -> pathlib.Path:
    directory.mkdir(parents=True)
    rng = np.random.default_rng(1)
    writer = ShardWriter(str(directory), "train-00000", shard_bytes=1 << 30, encoder=Encoder(codec))
    with writer:
        for i in range(3):  # 300 floats: the .npy data ends mid-block, so members have padding
            writer.write(f"k{i}", {"array": rng.standard_normal(300).astype(np.float32), "meta": {"i": i}})
    (directory / "manifest.json").write_bytes(Manifest("t", {}, "fp", {"train": [r.as_dict() for r in writer.rows]}).dumps())
    return directory / SHARD


def _reference(path) -> list[dict]:
    """The shard's samples as tarfile and webdataset's key rule see them: [{key, field: bytes}]."""
    samples: list[dict] = []
    with tarfile.open(path) as tar:
        for info in tar.getmembers():
            if info.name.startswith("__"):
                continue
            key, field = info.name.split(".", 1)
            if not samples or samples[-1]["__key__"] != key:
                samples.append({"__key__": key})
            samples[-1][field] = tar.extractfile(info).read()
    return samples


def _byte_classes(path) -> dict[str, tuple[int, str]]:
    """name -> (byte offset, text the error must contain), one position per byte class."""
    with tarfile.open(path) as tar:
        members = {info.name: info for info in tar.getmembers()}
    size = os.path.getsize(path)
    classes = {}
    for name in ("k1.array.npy" if "k1.array.npy" in members else "k1.array.npy.zst", "k1.meta.mp", "k2.meta.mp"):
        info = members[name]
        head, data, pad_end = info.offset, info.offset_data, info.offset_data + info.size + (-info.size % 512)
        for what, at in [("name", head + 1), ("size", head + 124 + 8), ("mtime", head + 136 + 5), ("checksum", head + 150),
                         ("magic", head + 258), ("tail", head + 500), ("data0", data), ("data-mid", data + info.size // 2),
                         ("data-last", data + info.size - 1), ("padding", pad_end - 1)]:
            if at < pad_end and not (what == "padding" and info.size % 512 == 0):
                classes[f"{name}:{what}"] = (at, name)
    if "k1.array.npy" in members:  # a .npy header byte of a raw array (used to be a bare SyntaxError)
        classes["k1.array.npy:npy-header"] = (members["k1.array.npy"].offset_data + 30, "k1.array.npy")
    index = members[INDEX_MEMBER]
    classes["index:header"] = (index.offset + 3, INDEX_MEMBER)
    classes["index:data"] = (index.offset_data + 7, INDEX_MEMBER)
    classes["index:padding"] = (index.offset_data + index.size, INDEX_MEMBER)
    classes["end-of-archive:first"] = (size - 1024, "end-of-archive")
    classes["end-of-archive:last"] = (size - 1, "end-of-archive")
    return classes


def _corrupt(original: pathlib.Path, target: pathlib.Path, at: int) -> None:
    target.mkdir(parents=True)
    data = bytearray(original.read_bytes())
    data[at] ^= 0x01
    (target / SHARD).write_bytes(bytes(data))
    (target / "manifest.json").write_bytes((original.parent / "manifest.json").read_bytes())


def _read_until_error(manifest, shuffle_buffer: int = 0) -> tuple[list[dict], ShardError | None]:
    got: list[dict] = []
    try:
        for sample in wdsprep.dataset(manifest, "train", shuffle_shards=False, shuffle_buffer=shuffle_buffer).compose(wdsprep.decode()):
            got.append(sample)
    except ShardError as error:
        return got, error
    return got, None


def _same_as_original(yielded: list[dict], original: list[dict]) -> None:
    assert len(yielded) <= len(original)
    for sample, reference in zip(yielded, original):
        assert sample["__key__"] == reference["__key__"]
        decoded = wdsprep.decode_sample({**reference, "__url__": "x"}, strip=False)
        fields = sorted(k for k in reference if not k.startswith("__"))
        assert sorted(k for k in sample if not k.startswith("__")) == fields
        for field in fields:
            if isinstance(decoded[field], np.ndarray):
                np.testing.assert_array_equal(sample[field], decoded[field])
            else:
                assert sample[field] == decoded[field]


@pytest.fixture(scope="module")
def corrupted(tmp_path_factory):
    """For codec zstd and none: the original shard and one corrupted copy per byte class."""
    root = tmp_path_factory.mktemp("integrity")
    cases = []
    for codec in ("zstd", "none"):
        original = _write(root / f"orig-{codec}", codec)
        for name, (at, member) in sorted(_byte_classes(original).items()):
            variant = f"{codec}-{name.replace(':', '-').replace('.', '_')}"
            _corrupt(original, root / variant, at)
            cases.append((codec, name, variant, member, _reference(original)))
    return root, cases


def _check(cases, manifest_of):
    assert len(cases) >= 30
    for codec, name, variant, member, original in cases:
        yielded, error = _read_until_error(manifest_of(variant))
        assert error is not None, f"{codec} {name}: no error"
        assert SHARD in str(error), (name, str(error))
        assert member in str(error), (name, str(error))
        _same_as_original(yielded, original)
        if member.startswith("k"):  # inside a sample: nothing from that sample on was yielded
            assert len(yielded) <= int(member[1]), (name, len(yielded))


def test_every_corrupted_byte_class_is_a_shard_error_locally(corrupted):
    root, cases = corrupted
    _check(cases, lambda variant: str(root / variant / "manifest.json"))


def test_every_corrupted_byte_class_is_a_shard_error_through_the_shuffle_buffer(corrupted):
    """The shuffle buffer holds samples of local shards as numbers and copies them out later: they
    are checked on entering it, so a corrupt sample still stops the stream before it is yielded."""
    root, cases = corrupted
    assert len(cases) >= 30
    for codec, name, variant, member, original in cases:
        yielded, error = _read_until_error(str(root / variant / "manifest.json"), shuffle_buffer=2)
        assert error is not None and SHARD in str(error) and member in str(error), (codec, name, error)
        by_key = {sample["__key__"]: sample for sample in original}
        for sample in yielded:  # in shuffled order: each one compared with its own original
            _same_as_original([sample], [by_key[sample["__key__"]]])
        if member.startswith("k"):  # a block of 2 is yielded only once both of its samples were checked
            assert all(int(sample["__key__"][1]) < int(member[1]) for sample in yielded), (name, [s["__key__"] for s in yielded])


def test_every_corrupted_byte_class_is_a_shard_error_over_http(corrupted):
    root, cases = corrupted
    with RangeHTTPServer(root) as server:
        _check(cases, lambda variant: server.url_of(f"{variant}/manifest.json"))


def test_every_corrupted_byte_class_is_a_shard_error_over_s3(corrupted, monkeypatch):
    root, cases = corrupted
    with S3Server() as server:
        for name, value in server.env.items():
            monkeypatch.setenv(name, value)
        client = server.client()
        server.create_bucket("integrity")
        for _, _, variant, _, _ in cases:
            for name in ("manifest.json", SHARD):
                client.put_object(Bucket="integrity", Key=f"{variant}/{name}", Body=(root / variant / name).read_bytes())
        _check(cases, lambda variant: f"s3://integrity/{variant}/manifest.json")


def test_intact_shards_read_like_tarfile_and_plain_webdataset(tmp_path):
    for codec in ("zstd", "none"):
        path = _write(tmp_path / codec, codec)
        original = _reference(path)
        yielded = list(wdsprep.dataset(str(path.parent / "manifest.json"), "train", shuffle_shards=False).compose(wdsprep.decode()))
        assert len(yielded) == len(original) == 3
        _same_as_original(yielded, original)
        plain = list(wds.WebDataset(str(path), shardshuffle=False))  # the index member is skipped as metadata
        assert [s["__key__"] for s in plain] == ["k0", "k1", "k2"]
        with tarfile.open(path) as tar:  # and plain tar lists it as one more regular file
            assert tar.getnames()[-1] == INDEX_MEMBER


def _without_index(manifest_path: pathlib.Path) -> None:
    manifest = Manifest.loads(manifest_path.read_bytes())
    for row in manifest.splits["train"]:
        for name in ROW_FIELDS:
            row.pop(name)
    manifest_path.write_bytes(manifest.dumps())


def test_local_shards_without_an_index_yield_nothing_before_the_whole_shard_matched_its_row(tmp_path):
    """An older manifest (rows without index fields): a local shard is hashed whole (size and
    sha256 against its row) before its first sample, so a flipped byte anywhere in it -- in the
    first sample, the last, or after the samples -- is a ShardError before anything is yielded,
    through `wdsprep.dataset` and `wdsprep.Loader`."""
    for codec in ("none", "zstd"):
        path = _write(tmp_path / f"orig-{codec}", codec)
        original = _reference(path)
        _without_index(path.parent / "manifest.json")
        intact = list(wdsprep.dataset(str(path.parent / "manifest.json"), "train", shuffle_shards=False).compose(wdsprep.decode()))
        assert len(intact) == 3
        _same_as_original(intact, original)
        positions = {name: at for name, (at, _) in _byte_classes(path).items()}
        assert len(positions) >= 20
        for name, at in sorted(positions.items()):
            variant = tmp_path / f"bad-{codec}-{at}"
            _corrupt(path, variant, at)
            yielded, error = _read_until_error(str(variant / "manifest.json"))
            assert error is not None and SHARD in str(error) and "sha256" in str(error), (codec, name, error)
            assert yielded == [], (codec, name, [s["__key__"] for s in yielded])
        loader = wdsprep.Loader(wdsprep.dataset(str(variant / "manifest.json"), "train", shuffle_shards=False).compose(wdsprep.decode()),
                                batch_size=None)
        keys, error = keys_until_error(loader)
        assert error is not None and SHARD in str(error) and keys == []


def test_remote_shards_without_an_index_are_refused_in_one_line_naming_reindex(tmp_path):
    """Over HTTP an unindexed shard cannot be hashed before it is streamed: it is refused, naming
    the command that gives it an index, and nothing of it is yielded."""
    path = _write(tmp_path / "s", "none")
    _without_index(path.parent / "manifest.json")
    with RangeHTTPServer(tmp_path) as server:
        yielded, error = _read_until_error(server.url_of("s/manifest.json"))
    assert yielded == [] and error is not None
    assert SHARD in str(error) and "wdsprep reindex" in str(error) and "\n" not in str(error)


@pytest.mark.parametrize("with_index", [True, False])
@pytest.mark.parametrize("delta", [-1, 1])
def test_a_row_with_the_wrong_sample_count_is_a_shard_error(tmp_path, with_index, delta):
    path = _write(tmp_path / "s", "zstd")
    manifest_path = path.parent / "manifest.json"
    if not with_index:
        _without_index(manifest_path)
    manifest = Manifest.loads(manifest_path.read_bytes())
    manifest.splits["train"][0]["samples"] += delta
    manifest_path.write_bytes(manifest.dumps())
    yielded, error = _read_until_error(str(manifest_path))
    assert error is not None and "manifest says" in str(error) and SHARD in str(error)
    assert len(yielded) < 3
    # the one-shard reader (inspect's), which hands over each sample as it is made: the shard's 3
    # samples never all come out of a row that says 4 (nor 2)
    from wdsprep.stream.reading.read import checked_samples

    taken = []
    with pytest.raises(ShardError, match="manifest says"):
        for sample in checked_samples(str(path), manifest.splits["train"][0]):
            taken.append(sample)
    assert len(taken) < 3


def test_a_corrupt_npy_header_is_a_shard_error_that_handlers_catch(tmp_path):
    path = _write(tmp_path / "s", "none")
    with tarfile.open(path) as tar:
        at = tar.getmember("k1.array.npy").offset_data + 30
    data = bytearray(path.read_bytes())
    data[at] = ord("(")  # inside the header dict: Python's literal parser fails on it
    path.write_bytes(bytes(data))
    # read without the integrity check (plain webdataset), the decoder names the shard and member
    with pytest.raises(ShardError, match=rf"{SHARD}: member k1\.array\.npy: unreadable \.npy header"):
        list(wds.WebDataset(str(path), shardshuffle=False).compose(wdsprep.decode()))
    kept = list(wds.WebDataset(str(path), shardshuffle=False).compose(wdsprep.decode(handler=wds.ignore_and_continue)))
    assert [s["__key__"] for s in kept] == ["k0", "k2"]
    # through wdsprep.dataset the digest catches it first, and the dataset's handler applies
    kept = list(wdsprep.dataset(str(path.parent / "manifest.json"), "train", shuffle_shards=False, handler=wds.ignore_and_continue))
    assert [s["__key__"] for s in kept] == ["k0"]


def _tar_view(path) -> tuple[list, list]:
    """(samples, infos) as tarfile sees the shard: samples = [[key, offset, [member, size, xxh3_64, ...]]]."""
    import xxhash

    data = path.read_bytes()
    with tarfile.open(path) as tar:
        infos = tar.getmembers()
    samples = []
    for info in infos[:-1]:
        key, member = info.name.split(".", 1)
        end = info.offset_data + info.size + (-info.size % 512)
        if not samples or samples[-1][0] != key:
            samples.append([key, info.offset, []])
        samples[-1][2] += [member, info.size, xxhash.xxh3_64_intdigest(data[info.offset : end])]
    return samples, infos


def test_the_index_matches_the_archive_as_tarfile_sees_it(tmp_path):
    """Offsets, sizes and digests in `__wdsprep_index__` (`wdsprep-index/2` columns), recomputed from
    tarfile's view of the shard and packed with `struct`."""
    import struct

    import msgpack

    path = _write(tmp_path / "s", "zstd")
    data = path.read_bytes()
    row = Manifest.loads((path.parent / "manifest.json").read_bytes()).splits["train"][0]
    samples, infos = _tar_view(path)
    with tarfile.open(path) as tar:
        index = msgpack.unpackb(tar.extractfile(INDEX_MEMBER).read())
    assert infos[-1].name == INDEX_MEMBER and row["index_offset"] == infos[-1].offset
    assert row["index_bytes"] == infos[-1].offset_data + infos[-1].size + (-infos[-1].size % 512) - infos[-1].offset
    assert row["bytes"] == len(data) == row["index_offset"] + row["index_bytes"] + 1024
    layouts = [["array.npy.zst", "meta.mp"]]
    assert [s[2][0::3] for s in samples] == layouts * 3
    sizes = [v for s in samples for v in s[2][1::3]]
    digests = [v for s in samples for v in s[2][2::3]]
    assert index == {"format": "wdsprep-index/2", "digest": "xxh3_64", "keys": ["k0", "k1", "k2"], "layouts": layouts,
                     "layout": struct.pack("<3I", 0, 0, 0), "offsets": struct.pack("<3Q", *(s[1] for s in samples)),
                     "sizes": struct.pack(f"<{len(sizes)}Q", *sizes), "digests": struct.pack(f"<{len(digests)}Q", *digests)}


def _replace_index(path: pathlib.Path, content: dict) -> None:
    """Rewrite the shard's index member with `content` (msgpack) and fix its manifest row, as a
    writer of that content would have written it (headers and row computed with tarfile/hashlib)."""
    import hashlib

    import msgpack
    import xxhash

    manifest_path = path.parent / "manifest.json"
    manifest = Manifest.loads(manifest_path.read_bytes())
    row = manifest.splits["train"][0]
    body = msgpack.packb(content)
    info = tarfile.TarInfo(INDEX_MEMBER)
    info.size, info.mtime, info.mode = len(body), 0, 0o644
    member = info.tobuf(format=tarfile.USTAR_FORMAT) + body + b"\0" * (-len(body) % 512)
    data = path.read_bytes()[: row["index_offset"]] + member + b"\0" * 1024
    path.write_bytes(data)
    row.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest(), index_bytes=len(member),
               index_digest=f"xxh3_64:{xxhash.xxh3_64_intdigest(member):016x}")
    manifest_path.write_bytes(manifest.dumps())


def test_shards_with_a_version_1_index_still_read(tmp_path):
    """Shards written before the columnar index (`wdsprep-index/1`: per-sample entries) read as before,
    corruption included."""
    for codec in ("zstd", "none"):
        path = _write(tmp_path / codec, codec)
        original = _reference(path)
        samples, _ = _tar_view(path)
        _replace_index(path, {"format": "wdsprep-index/1", "digest": "xxh3_64", "samples": samples})
        for shuffle_buffer in (0, 2):
            yielded = list(wdsprep.dataset(str(path.parent / "manifest.json"), "train", shuffle_shards=False,
                                           shuffle_buffer=shuffle_buffer).compose(wdsprep.decode()))
            assert len(yielded) == len(original) == 3
            _same_as_original(sorted(yielded, key=lambda s: s["__key__"]), original)
        data = bytearray(path.read_bytes())
        data[samples[1][1] + 512 + 5] ^= 0xFF  # a data byte of k1's first member
        path.write_bytes(bytes(data))
        with pytest.raises(ShardError, match=r"member k1\.array"):
            list(wdsprep.dataset(str(path.parent / "manifest.json"), "train", shuffle_shards=False))


@pytest.mark.parametrize("damage", ["layout out of range", "short sizes", "short offsets", "extra key", "int key", "unknown format"])
def test_an_index_whose_columns_disagree_is_a_shard_error(tmp_path, damage):
    """An index that matches its row's digest but is malformed (a writer bug) is refused on load."""
    import struct

    import msgpack

    path = _write(tmp_path / "s", "none")
    with tarfile.open(path) as tar:
        index = msgpack.unpackb(tar.extractfile(INDEX_MEMBER).read())
    if damage == "layout out of range":
        index["layout"] = struct.pack("<3I", 0, 1, 0)
    elif damage == "short sizes":
        index["sizes"] = index["sizes"][:-8]
    elif damage == "short offsets":
        index["offsets"] = index["offsets"][:-8]
    elif damage == "extra key":
        index["keys"].append("k3")
    elif damage == "int key":
        index["keys"][1] = 1
    else:
        index["format"] = "wdsprep-index/9"
    _replace_index(path, index)
    with pytest.raises(ShardError, match=f"{INDEX_MEMBER}.*unreadable"):
        list(wdsprep.dataset(str(path.parent / "manifest.json"), "train", shuffle_shards=False))


def _reads(url, row, start, stop, stream):
    from wdsprep.stream.reading.read import read_samples

    return [{k: (bytes(v) if isinstance(v, bytearray) else v) for k, v in s.items() if k != "__url__"}
            for s in read_samples(url, row, start, stop, stream)]


class _NoFileno(io.RawIOBase):
    """A seekable stream without a file descriptor (the remote/teed-stream path)."""

    def __init__(self, path):
        self.inner = open(path, "rb")

    def readable(self):
        return True

    def seekable(self):
        return True

    def seek(self, offset, whence=0):
        return self.inner.seek(offset, whence)

    def readinto(self, buffer):
        return self.inner.readinto(buffer)

    def close(self):
        self.inner.close()
        super().close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(0, 1500), min_size=1, max_size=8), data=st.data())
def test_any_run_of_samples_reads_like_tarfile_on_every_path(tmp_path_factory, sizes, data):
    directory = tmp_path_factory.mktemp("runs")
    writer = ShardWriter(str(directory), "t", shard_bytes=1 << 30, encoder=Encoder("none"))
    with writer:
        for i, size in enumerate(sizes):
            writer.write(f"k{i}", {"x": np.full(size, i, dtype=np.uint8), "m": {"i": i}})
    path = str(directory / writer.rows[0].name)
    row = writer.rows[0].as_dict()
    reference = [{"__key__": s["__key__"], **{k: v for k, v in s.items() if k != "__key__"}} for s in _reference(path)]
    start = data.draw(st.integers(0, len(sizes) - 1))
    stop = data.draw(st.integers(start, len(sizes)))
    plain = {k: v for k, v in row.items() if k not in ROW_FIELDS}  # the sha256 fallback
    with open(path, "rb") as local, _NoFileno(path) as remote, open(path, "rb") as fallback:
        for got in (_reads(path, row, start, stop, local), _reads(path, row, start, stop, remote),
                    _reads(path, plain, start, stop, fallback)):
            assert len(got) == stop - start
            assert got == reference[start:stop]


def test_plain_webdataset_with_wdsprep_decode_refuses_every_flipped_byte_of_a_npy_zst_member(tmp_path):
    """Without the shard index (plain `wds.WebDataset` over the shard URLs), the zstd frame's own
    content checksum is what catches a changed byte: each byte of a converted `.npy.zst` member
    flipped in turn gives either a ShardError naming the member or the very same array, never a
    different one (found with tarfile; the array compared with numpy's reading of the original)."""
    native = tmp_path / "in" / "train"
    native.mkdir(parents=True)
    array = np.random.default_rng(3).standard_normal(100).astype(np.float32)
    np.save(native / "k0.array.npy", array)
    status, _, err = run_cli("convert", "generic", tmp_path / "in", tmp_path / "out", "--quiet")  # the default codec: zstd
    assert status == 0, err
    path = tmp_path / "out" / "train-00000-00.tar"
    with tarfile.open(path) as tar:
        info = tar.getmember("k0.array.npy.zst")
    original = path.read_bytes()
    refused = 0
    for at in range(info.offset_data, info.offset_data + info.size):
        data = bytearray(original)
        data[at] ^= 0x10
        path.write_bytes(bytes(data))
        try:
            (sample,) = list(wds.WebDataset(str(path), shardshuffle=False).compose(wdsprep.decode()))
        except ShardError as error:
            assert "k0.array.npy.zst" in str(error) and str(path) in str(error)
            refused += 1
            continue
        np.testing.assert_array_equal(sample["array.npy.zst"], array)
    assert refused >= info.size - 4, (refused, info.size)  # all but the odd frame-header bit zstd does not use


def test_npy_zst_members_of_older_shards_without_a_checksum_still_read(tmp_path):
    """Frames written without the content checksum (older shards) decode on every path: fused into
    `wdsprep.dataset`, staged, and through plain webdataset."""
    import zstandard

    array = np.arange(500, dtype=np.float32).reshape(20, 25)
    npy = io.BytesIO()
    np.save(npy, array)
    frame = zstandard.ZstdCompressor(level=3).compress(npy.getvalue())
    assert not zstandard.get_frame_parameters(frame).has_checksum
    directory = tmp_path / "older"
    directory.mkdir()
    writer = ShardWriter(str(directory), "train-00000", shard_bytes=1 << 30, encoder=Encoder("zstd"))
    with writer:
        writer.write("k0", {"a.npy.zst": frame})  # encoded bytes are stored as they are
    (directory / "manifest.json").write_bytes(Manifest("t", {}, "fp", {"train": [r.as_dict() for r in writer.rows]}).dumps())
    manifest = str(directory / "manifest.json")
    for samples in (list(wdsprep.dataset(manifest, "train").compose(wdsprep.decode())),
                    list(wdsprep.dataset(manifest, "train").compose(lambda source: map(wdsprep.decode_sample, source))),
                    list(wds.WebDataset(str(directory / writer.rows[0].name), shardshuffle=False).compose(wdsprep.decode()))):
        (sample,) = samples
        np.testing.assert_array_equal(sample["a.npy.zst"] if "a.npy.zst" in sample else sample["a"], array)


def test_a_npy_zst_member_with_bytes_after_its_frame_is_refused():
    """The decoder reads the frame to its end (where its checksum is) and a byte more: a member
    longer than its frame is no silent truncation."""
    member = Encoder("zstd").encode_fields("k", {"a": np.arange(10, dtype=np.int64)})[0][1]
    assert wdsprep.decode_sample({"__key__": "k", "a.npy.zst": member})["a"].tolist() == list(range(10))
    for extra in (b"\0", member):
        with pytest.raises(ShardError, match=r"k\.a\.npy\.zst"):
            wdsprep.decode_sample({"__key__": "k", "__url__": "x.tar", "a.npy.zst": member + extra})
