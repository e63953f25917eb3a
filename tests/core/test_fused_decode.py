"""`wdsprep.decode()` placed right after `wdsprep.dataset(...)` runs fused into the reader
(`LocalShard.decode_members`): it must give exactly what the stage gives when it runs on its own
(the reference: the same stage behind an identity stage, which is never fused), checked here
sample by sample and position by position, plus against `tarfile` + `numpy.load` + msgpack."""
import io
import json
import tarfile

import msgpack
import numpy as np
import pytest
import torch
import webdataset as wds
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wdsprep
from wdsprep.errors import ShardError
from wdsprep.shards.codec import Encoder
from wdsprep.shards.manifest import Manifest
from wdsprep.shards.writer import ShardWriter
from wdsprep.stream.reading.read import LocalShard


def _identity(source):
    yield from source  # a stage before decode: decode then runs as a stage of its own (not fused)


def _pair(manifest, decode_args, **dataset_args):
    fused = wdsprep.dataset(manifest, "train", **dataset_args).compose(wdsprep.decode(**decode_args))
    staged = wdsprep.dataset(manifest, "train", **dataset_args).compose(_identity, wdsprep.decode(**decode_args))
    return fused, staged


def _same_sample(a: dict, b: dict) -> None:
    assert list(a) == list(b)  # same fields in the same order
    for name in a:
        x, y = a[name], b[name]
        assert type(x) is type(y), name
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape and x.flags.writeable and y.flags.writeable
            np.testing.assert_array_equal(x, y)
        elif isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and torch.equal(x, y)
        else:
            assert x == y, name


def _stream_and_states(pipeline) -> list:
    """Each sample (every field: an array as its type, dtype, shape, writability and bytes) and the
    state saved after it."""
    out = []
    for sample in pipeline:
        fields = [(name, (type(value), value.dtype, value.shape, value.flags.writeable, value.tobytes())
                   if isinstance(value, np.ndarray) else (type(value), value)) for name, value in sample.items()]
        out.append((fields, pipeline.state_dict()))
    return out


def _same_stream(fused, staged) -> int:
    """Both pipelines in lockstep: the same samples, and the same saved position after each."""
    left, right = iter(fused), iter(staged)
    count = 0
    while True:
        a, b = next(left, None), next(right, None)
        assert (a is None) == (b is None), f"one stream ended first, after {count} samples"
        if a is None:
            return count
        _same_sample(a, b)
        assert fused.state_dict() == staged.state_dict()
        count += 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    counts=st.lists(st.integers(0, 9), min_size=1, max_size=5),
    shuffle_buffer=st.sampled_from([0, 1, 3, 7]),
    equalize=st.sampled_from([None, "pad", "drop"]),
    world=st.integers(1, 3),
    strip=st.booleans(),
    codec=st.sampled_from(["none", "zstd"]),
    epoch=st.integers(0, 2),
)
def test_the_fused_decode_gives_what_the_stage_gives(counted_shards, counts, shuffle_buffer, equalize, world, strip, codec, epoch):
    manifest = counted_shards(counts, codec=codec)
    for rank in range(world):
        fused, staged = _pair(manifest, {"strip": strip}, seed=3, epoch=epoch, shuffle_buffer=shuffle_buffer,
                              equalize=equalize, rank=rank, world_size=world)
        _same_stream(fused, staged)


def test_the_fused_decode_is_the_path_taken(counted_shards, monkeypatch):
    """A spy on `decode_members`: every sample of the fused pipeline comes from it, none of the staged one's."""
    manifest = counted_shards([5, 4, 6])
    calls = []
    original = LocalShard.decode_members
    monkeypatch.setattr(LocalShard, "decode_members", lambda self, *args: calls.append(args[0]) or original(self, *args))
    for shuffle_buffer in (0, 4):
        fused, staged = _pair(manifest, {"strip": True}, shuffle_buffer=shuffle_buffer, equalize=None)
        calls.clear()
        assert len(list(staged)) == 15 and calls == []
        assert len(list(fused)) == 15 and sorted(calls) == sorted(list(range(5)) + list(range(4)) + list(range(6)))


def test_the_fused_decode_matches_tarfile_numpy_and_msgpack(counted_shards):
    manifest = counted_shards([3, 5], codec="none")
    root = manifest.rsplit("/", 1)[0]
    expected = {}
    for row in Manifest.loads(open(manifest, "rb").read()).splits["train"]:
        with tarfile.open(f"{root}/{row['name']}") as archive:
            for member in archive.getmembers():
                if member.name.startswith("__"):
                    continue
                key, field = member.name.split(".", 1)
                data = archive.extractfile(member).read()
                value = np.load(io.BytesIO(data)) if field == "value.npy" else msgpack.unpackb(data, strict_map_key=False)
                expected.setdefault(key, {})[field.split(".")[0]] = value
    got = list(wdsprep.dataset(manifest, "train", shuffle_buffer=4, equalize=None).compose(wdsprep.decode(strip=True)))
    assert len(got) == len(expected) == 8
    for sample in got:
        reference = expected[sample["__key__"]]
        np.testing.assert_array_equal(sample["value"], reference["value"])
        assert sample["value"].flags.writeable and sample["meta"] == reference["meta"]
        sample["value"][0] = 1.0  # writable, and the shard is unchanged (the next read agrees with tarfile)
    again = {s["__key__"]: s for s in wdsprep.dataset(manifest, "train", equalize=None).compose(wdsprep.decode(strip=True))}
    assert len(again) == 8
    for key, reference in expected.items():
        np.testing.assert_array_equal(again[key]["value"], reference["value"])


READ_PATHS = {  # stream/reading/read.py's read paths for local shards, forced on small shards (2 KiB window)
    "windows": {"WINDOW": 2048},
    "windows dropped before the take": {"WINDOW": 2048, "KEEP": 0},
}


@pytest.fixture(scope="module")
def mixed_sizes(tmp_path_factory):
    """Two shards whose samples alternate between smaller and larger than a 2 KiB window."""
    directory = tmp_path_factory.mktemp("mixed")
    rows = []
    for shard in range(2):
        writer = ShardWriter(str(directory), f"train-{shard:05d}", shard_bytes=1 << 40, encoder=Encoder("none"))
        with writer:
            for i in range(11):
                size = 3000 if (i + shard) % 3 == 0 else 40
                writer.write(f"s{shard}x{i:02d}", {"value": np.arange(size, dtype=np.int16) * (i + 1), "meta": {"i": i}})
        rows += [r.as_dict() for r in writer.rows]
    (directory / "manifest.json").write_bytes(Manifest("t", {}, "fp", {"train": rows}).dumps())
    expected = {}
    for row in rows:
        with tarfile.open(directory / row["name"]) as archive:
            for member in archive.getmembers():
                if member.name.endswith(".npy"):
                    expected[member.name.split(".")[0]] = np.load(io.BytesIO(archive.extractfile(member).read()))
    return str(directory / "manifest.json"), expected


@pytest.mark.parametrize("path", sorted(READ_PATHS))
@pytest.mark.parametrize("shuffle_buffer", [0, 4, 30])
def test_every_local_read_path_gives_what_tarfile_and_numpy_read(mixed_sizes, monkeypatch, path, shuffle_buffer):
    """Samples inside read windows, samples read alone (larger than a window) between them, and
    samples read again because their window was dropped: fused, staged and raw, the values tarfile
    and numpy read."""
    import wdsprep.stream.reading.read as read

    for name, value in READ_PATHS[path].items():
        monkeypatch.setattr(read, name, value)
    manifest, expected = mixed_sizes
    assert {len(v) > 1000 for v in expected.values()} == {True, False}
    fused, staged = _pair(manifest, {"strip": True}, shuffle_buffer=shuffle_buffer, equalize=None, seed=1)
    for pipeline in (fused, staged):
        got = {s["__key__"]: s["value"] for s in pipeline}
        assert sorted(got) == sorted(expected)
        for key, value in got.items():
            np.testing.assert_array_equal(value, expected[key], err_msg=key)
    raw = {s["__key__"]: s for s in wdsprep.dataset(manifest, "train", shuffle_buffer=shuffle_buffer, equalize=None)}
    assert {key: np.load(io.BytesIO(bytes(s["value.npy"]))).tolist() for key, s in raw.items()} == {
        key: value.tolist() for key, value in expected.items()}


@pytest.fixture(scope="module")
def small_samples(tmp_path_factory):
    """Two shards of 60 samples of about 700 bytes each (several per 2 KiB window)."""
    directory = tmp_path_factory.mktemp("small")
    rows = []
    for shard in range(2):
        with ShardWriter(str(directory), f"train-{shard:05d}", shard_bytes=1 << 40, encoder=Encoder("none")) as writer:
            for i in range(60):
                writer.write(f"s{shard}x{i:02d}", {"value": np.full(40 + i, i, dtype=np.int16), "meta": {"i": i}})
        rows += [r.as_dict() for r in writer.rows]
    (directory / "manifest.json").write_bytes(Manifest("t", {}, "fp", {"train": rows}).dumps())
    return str(directory / "manifest.json"), rows


@pytest.mark.parametrize("shuffle_buffer", [5, 16])
def test_a_shuffle_buffer_reads_each_byte_once_and_holds_one_block(small_samples, monkeypatch, shuffle_buffer):
    """Through a shuffle buffer, the read windows of a block go back to the pool once the block was
    delivered: the buffers in use stay within one block's bytes (and a window), though the cap
    (`KEEP`) would allow the whole split, and every byte of the samples is read exactly once."""
    import wdsprep.stream.reading.read as read

    monkeypatch.setattr(read, "WINDOW", 2048)
    monkeypatch.setattr(read, "KEEP", 1 << 20)
    monkeypatch.setattr(read, "_buffers", read._Buffers())
    used, read_bytes = {}, []
    get, preadv = read._Buffers.get, read.os.preadv

    def counted_get(self):
        buffer = get(self)
        used[id(buffer)] = buffer  # kept alive: ids stay distinct
        return buffer

    def counted_preadv(fd, buffers, offset):
        done = preadv(fd, buffers, offset)
        read_bytes.append(done)
        return done

    monkeypatch.setattr(read._Buffers, "get", counted_get)
    monkeypatch.setattr(read.os, "preadv", counted_preadv)
    manifest, rows = small_samples
    got = list(wdsprep.dataset(manifest, "train", shuffle_buffer=shuffle_buffer, equalize=None, seed=3)
               .compose(wdsprep.decode(strip=True)))
    assert sorted(s["__key__"] for s in got) == sorted(f"s{k}x{i:02d}" for k in range(2) for i in range(60))
    assert all((s["value"] == s["meta"]["i"]).all() and len(s["value"]) == 40 + s["meta"]["i"] for s in got)
    assert sum(read_bytes) == sum(row["index_offset"] for row in rows)  # the samples' bytes (the index: os.pread)
    largest_block = max(shuffle_buffer * (512 + 2 * (40 + i) + 128 + 1024 + 512) for i in range(60))
    assert 2 <= len(used) <= largest_block // 2048 + 3


def test_torch_and_kept_extensions_fuse_the_same(counted_shards):
    manifest = counted_shards([4, 3], codec="zstd")
    for decode_args in ({"torch": True, "strip": True}, {"torch": True}, {}):
        fused, staged = _pair(manifest, decode_args, shuffle_buffer=3, equalize="pad", rank=1, world_size=2)
        assert _same_stream(fused, staged) == 4


@pytest.fixture
def bad_member_manifest(tmp_path):
    """Samples 2 and 5 of 8 hold a `.npy` member whose bytes are not .npy (the index digests match:
    only decoding finds it)."""
    writer = ShardWriter(str(tmp_path), "train-00000", shard_bytes=1 << 40, encoder=Encoder("none"))
    with writer:
        for i in range(8):
            array = b"not an npy member" if i in (2, 5) else np.full(3, i, np.int16)
            writer.write(f"k{i}", {"a.npy": array, "meta": {"i": i}})
    (tmp_path / "manifest.json").write_bytes(Manifest("t", {}, "fp", {"train": [r.as_dict() for r in writer.rows]}).dumps())
    return str(tmp_path / "manifest.json")


@pytest.mark.parametrize("shuffle_buffer", [0, 3])
def test_a_member_that_does_not_decode_goes_to_the_handler_on_both_paths(bad_member_manifest, shuffle_buffer):
    args = {"shuffle_buffer": shuffle_buffer, "equalize": None, "shuffle_shards": False}
    order = [s["__key__"] for s in wdsprep.dataset(bad_member_manifest, "train", **args)]  # raw: nothing decoded
    assert sorted(order) == [f"k{i}" for i in range(8)]
    first_bad = min(order.index("k2"), order.index("k5"))
    for handler, expected in ((wds.ignore_and_continue, 6), (lambda error: False, first_bad)):
        fused, staged = _pair(bad_member_manifest, {"strip": True, "handler": handler}, **args)
        assert _same_stream(fused, staged) == expected
        assert fused.state_dict() == staged.state_dict()
    fused, staged = _pair(bad_member_manifest, {"strip": True}, **args)
    with pytest.raises(ShardError, match=r"member k[25]\.a\.npy: .*npy"):
        list(fused)
    with pytest.raises(ShardError, match=r"member k[25]\.a\.npy: .*npy"):
        list(staged)


def test_resume_through_the_fused_decode_is_exact(bad_member_manifest):
    def make():
        return wdsprep.dataset(bad_member_manifest, "train", shuffle_buffer=3, equalize=None, seed=4).compose(
            wdsprep.decode(strip=True, handler=wds.ignore_and_continue))

    full = [s["__key__"] for s in make()]
    assert len(full) == 6
    for stop_after in range(len(full) + 1):
        run = make()
        iterator = iter(run)
        head = [next(iterator)["__key__"] for _ in range(stop_after)]
        resumed = make()
        resumed.load_state_dict(run.state_dict())
        assert head + [s["__key__"] for s in resumed] == full


@pytest.mark.parametrize("buffer", [0, 3])
@pytest.mark.parametrize("handler", ["skips", "ends"])
def test_a_mix_taking_its_parts_samples_itself_gives_what_its_parts_streams_give(bad_member_manifest, counted_shards,
                                                                                 monkeypatch, buffer, handler):
    """A mix whose parts decode in their readers takes each part's samples itself (stream/mix.py
    `_taken_in_turn`); the same mix iterating its parts' streams (`WorkerStream.takeable` switched off)
    is the reference: the same samples, field for field (bookkeeping kept), and the same state after
    each, through a part whose members do not decode (its handler skips them, or ends its stream) and
    a packed part; with the handler that skips, a state saved after any sample resumes to exactly the rest."""
    from wdsprep.stream import worker

    handle = wds.ignore_and_continue if handler == "skips" else (lambda error: False)
    packed = counted_shards([3, 4, 2], tag="g", pack_rows=2)

    def make(decoded=True):
        def stages(**args):
            return (wdsprep.decode(bookkeeping=True, **args),) if decoded else ()

        parts = [wdsprep.Part(bad_member_manifest, repeat=1, name="bad", stages=stages(strip=True, handler=handle)),
                 wdsprep.Part(packed, repeat=1, name="packed", stages=stages())]
        return wdsprep.mix(parts, mode="epochized", seed=3, epoch=1, shuffle_buffer=buffer, equalize=None)

    # the bad part's order, raw (nothing decoded, nothing fails): it delivers up to its first bad member
    order = [s["__key__"] for s in make(decoded=False) if s["__part__"] == "bad"]
    assert sorted(order) == [f"k{i}" for i in range(8)]
    expected = 9 + (6 if handler == "skips" else min(order.index("k2"), order.index("k5")))
    takers = []
    made = worker.WorkerStream.taker
    with monkeypatch.context() as counted:
        counted.setattr(worker.WorkerStream, "taker", lambda self: takers.append(made(self)) or takers[-1])
        taken = _stream_and_states(make())
    assert takers and all(takers)  # the mix took its parts' samples itself
    with monkeypatch.context() as off:
        off.setattr(worker.WorkerStream, "takeable", property(lambda self: False))
        pulled = _stream_and_states(make())
    assert len(taken) == expected
    assert taken == pulled
    whole = [s["__key__"] for s in make()]
    assert len(whole) == expected
    if handler == "ends":  # (a state saved after a part's stream ended resumes that part past the sample that ended it)
        return
    for stop in range(len(whole) + 1):
        run = make()
        iterator = iter(run)
        head = [next(iterator)["__key__"] for _ in range(stop)]
        resumed = make()
        resumed.load_state_dict(json.loads(json.dumps(run.state_dict())))
        assert head + [s["__key__"] for s in resumed] == whole, stop


def _marked(samples):
    for sample in samples:
        sample["marked"] = sample["__key__"]
        yield sample


@pytest.mark.parametrize("buffer", [0, 3])
def test_a_mix_runs_a_parts_own_stages_after_its_decode(counted_shards, buffer):
    """A part that decodes in its reader and has a stage of its own after it: every one of its
    samples went through that stage (the mix does not take such a part's samples itself)."""
    plain, staged = counted_shards([3, 2], tag="p"), counted_shards([4], tag="s")
    parts = [wdsprep.Part(plain, repeat=1, name="plain", stages=(wdsprep.decode(),)),
             wdsprep.Part(staged, repeat=1, name="staged", stages=(wdsprep.decode(), _marked))]
    samples = list(wdsprep.mix(parts, mode="epochized", seed=1, shuffle_buffer=buffer, equalize=None))
    assert sorted((s["__part__"], s.get("marked")) for s in samples) == sorted(
        [("plain", None)] * 5 + [("staged", f"ss00x{i:02d}") for i in range(4)])


@pytest.mark.parametrize("shuffle_buffer", [0, 3])
def test_streamed_shards_give_the_samples_mapped_shards_give(counted_shards, shuffle_buffer):
    """Over HTTP the samples are read into dicts, not mapped: fused or staged, they must equal the
    local (mapped) ones field for field, `__index__`, `__piece_start__` and `__epoch__` included
    (only `__url__` differs)."""
    import os

    from wdsprep.testing import RangeHTTPServer

    manifest = counted_shards([4, 6, 3], codec="zstd")
    root = os.path.dirname(manifest)
    args = {"shuffle_buffer": shuffle_buffer, "equalize": "pad", "rank": 1, "world_size": 2, "seed": 2, "epoch": 3}
    local = list(wdsprep.dataset(manifest, "train", **args).compose(wdsprep.decode(strip=True, bookkeeping=True)))
    assert len(local) == 7 and {s["__epoch__"] for s in local} == {3}
    plain = list(wdsprep.dataset(manifest, "train", **args).compose(wdsprep.decode(strip=True)))
    with RangeHTTPServer(root) as server:
        url = server.url_of("manifest.json")
        fused, staged = _pair(url, {"strip": True, "bookkeeping": True}, **args)
        for remote in (list(fused), list(staged)):
            assert len(remote) == len(local)
            for a, b in zip(remote, local):
                assert a["__url__"].startswith("http://") and not b["__url__"].startswith("http://")
                _same_sample({**a, "__url__": ""}, {**b, "__url__": ""})
        # without bookkeeping asked for, a decoded sample is its key and fields, read either way
        fused, staged = _pair(url, {"strip": True}, **args)
        for remote in (list(fused), list(staged)):
            for a, b in zip(remote, plain):
                assert not {name for name in a if name.startswith("__")} - {"__key__"}
                _same_sample(a, b)
