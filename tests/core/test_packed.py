"""Packed members (`wdsprep convert --pack`, issue 48): small samples stored as blocks, one member
each, and every reader still sees samples.

The references are independent of the code under test: the input files themselves (values of every
key), `tarfile` (what the shards hold: blocks, and the huge sample as members of its own), plain
webdataset, and the reference model of test_plan_oracle.py / test_loader_oracle.py (which samples
each rank and worker delivers, and from where a state resumes), driven over packed shards whose
blocks hold three samples each, so most positions lie inside a block.
"""
import collections
import json
import pathlib
import tarfile

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wdsprep
from wdsprep.conformance import run_cli
from wdsprep.errors import FormatError, ShardError
from wdsprep.shards.codec import MAX_MEMBER_BYTES
from wdsprep.shards.manifest import Manifest
from wdsprep.shards.packed import PACK_MEMBER, Block, encode_block
from wdsprep.shards.writer import ShardFile

from .shardsets import keys_until_error, write_counted_shards
from .test_loader_oracle import COUNTS as LOADER_COUNTS
from .test_loader_oracle import check_every_batch_resumes
from .test_plan_oracle import model_global, model_worker_stream, real_worker_stream

SMALL = 300  # tiny samples: 256 uint8 values and an int label
HUGE = 150  # the key number of the one huge sample among them
HUGE_ELEMENTS = 40_000  # 160 KB of float32: never packed


def _key(i: int) -> str:
    return f"s{i:04d}"


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A generic input of tiny samples with one huge one among them, converted with `--pack` by the
    command line at a shard size that makes several shards of several blocks each."""
    root = tmp_path_factory.mktemp("packed")
    train = root / "in" / "train"
    train.mkdir(parents=True)
    rng = np.random.default_rng(5)
    for i in range(SMALL):
        data = rng.standard_normal(HUGE_ELEMENTS).astype(np.float32) if i == HUGE else rng.integers(0, 256, 256, dtype=np.uint8)
        np.save(train / f"{_key(i)}.data.npy", data)
        (train / f"{_key(i)}.label.json").write_text(json.dumps(int(i % 7)))
    status, _, err = run_cli("convert", "generic", root / "in", root / "out", "--quiet", "--pack", "--codec", "none",
                             "--shard-bytes", "40KB", "--index-fields", "label")
    assert status == 0, err
    return root


def _expected(root: pathlib.Path, key: str) -> tuple:
    train = root / "in" / "train"
    return np.load(train / f"{key}.data.npy"), json.loads((train / f"{key}.label.json").read_text())


def _same(root, sample) -> None:
    data, label = _expected(root, sample["__key__"])
    np.testing.assert_array_equal(sample.get("data", sample.get("data.npy")), data)
    assert sample.get("label", sample.get("label.mp")) == label


def _manifest(root) -> str:
    return str(root / "out" / "manifest.json")


def _tar_members(root) -> list[tuple[str, str, int]]:
    """(shard, member name, size) of every member, as tarfile lists them."""
    out = []
    for path in sorted((root / "out").glob("*.tar")):
        with tarfile.open(path) as archive:
            out += [(path.name, m.name, m.size) for m in archive.getmembers() if not m.name.startswith("__")]
    return out


def test_the_small_samples_are_blocks_and_the_huge_one_is_members_of_its_own(converted):
    members = _tar_members(converted)
    blocks = [name for _, name, _ in members if name.endswith("." + PACK_MEMBER)]
    assert len(blocks) >= 6 and len(members) < SMALL // 10  # blocks of many samples, a few shards of several blocks
    assert len({shard for shard, _, _ in members}) >= 3
    huge = [(name, size) for _, name, size in members if name.startswith(_key(HUGE) + ".")]
    assert huge == [(f"{_key(HUGE)}.data.npy", 128 + 4 * HUGE_ELEMENTS), (f"{_key(HUGE)}.label.mp", 1)]


def test_every_value_equals_its_input(converted):
    dataset = wdsprep.dataset(_manifest(converted), "train", shuffle_shards=False, shuffle_buffer=0)
    samples = list(dataset.compose(wdsprep.decode(strip=True)))
    assert [s["__key__"] for s in samples] == [_key(i) for i in range(SMALL)]
    for sample in samples:
        _same(converted, sample)


def test_shuffled_reads_and_the_loader_deliver_every_sample_once_with_its_value(converted):
    dataset = wdsprep.dataset(_manifest(converted), "train", seed=3, shuffle_buffer=50).compose(wdsprep.decode(strip=True))
    loader = wdsprep.Loader(dataset, batch_size=8, num_workers=2, collate_fn=list)
    seen = collections.Counter()
    for batch in loader:
        for sample in batch:
            _same(converted, sample)
            seen[sample["__key__"]] += 1
    assert seen == collections.Counter(_key(i) for i in range(SMALL))


def test_mapdataset_reads_random_samples_with_one_read_each(converted):
    data = wdsprep.MapDataset(_manifest(converted), "train")
    data.access.indexes(range(len(data.access.rows)))  # the shards' indexes loaded first (a read each)
    rng = np.random.default_rng(1)
    for i in [*rng.integers(0, SMALL, 25).tolist(), HUGE, 0, SMALL - 1]:
        before = data.stats["reads"]
        sample = data[i]
        assert sample["__key__"] == _key(i)
        _same(converted, sample)
        assert data.stats["reads"] - before == 1  # the whole block in one pread
    assert data.member_names(3) == ("data.npy", "label.mp")
    many = data[10:40]
    assert [s["__key__"] for s in many] == [_key(i) for i in range(10, 40)]


def test_plain_webdataset_with_wdsprep_decode_or_unpack_gives_the_same_samples(converted):
    import webdataset as wds

    urls = wdsprep.urls(_manifest(converted), "train")
    ours = list(wdsprep.dataset(_manifest(converted), "train", shuffle_shards=False, shuffle_buffer=0)
                .compose(wdsprep.decode(strip=True)))
    plain = list(wds.WebDataset(urls, shardshuffle=False).compose(wdsprep.decode(strip=True)))
    unpacked = list(wds.WebDataset(urls, shardshuffle=False).compose(wdsprep.unpack()).decode())
    assert [s["__key__"] for s in plain] == [s["__key__"] for s in ours] == [s["__key__"] for s in unpacked]
    for mine, theirs, raw in zip(ours, plain, unpacked):
        _same(converted, theirs)
        np.testing.assert_array_equal(raw["data.npy"], mine["data"])
        assert raw["label.mp"] == mine["label"]


def test_show_inspect_and_verify_see_samples(converted):
    status, out, err = run_cli("verify", converted / "out")
    assert status == 0, err
    assert f"{SMALL} samples checked: 0 bad" in out
    status, out, err = run_cli("inspect", converted / "out")
    assert status == 0, err
    assert f"train/{_key(0)}: data.npy: uint8[256], label.mp: int" in out and PACK_MEMBER not in out


# ------------------------------------------------------------------ the model, over packed shards
ROWS = 3  # samples per block in the counted shards below


@pytest.fixture(scope="module")
def packed_counted(tmp_path_factory):
    made = {}

    def make(counts):
        if tuple(counts) not in made:
            made[tuple(counts)] = write_counted_shards(tmp_path_factory.mktemp("counted"), counts, codec="none", pack_rows=ROWS)
        return made[tuple(counts)]

    return make


def test_the_counted_shards_hold_blocks_of_three(packed_counted):
    manifest = pathlib.Path(packed_counted([5, 1, 4]))
    with tarfile.open(manifest.parent / "train-00000-00.tar") as archive:
        names = [m.name for m in archive.getmembers()]
    assert names == [f"s00x00.{PACK_MEMBER}", f"s00x03.{PACK_MEMBER}", "__wdsprep_index__"]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("buffer", [0, 4])
def test_ranks_and_workers_deliver_the_model(packed_counted, world, buffer):
    counts = [7, 1, 9, 0, 4, 5]
    manifest = packed_counted(counts)
    items = model_global(counts, 4, 1, True)
    lengths = set()
    for rank in range(world):
        for workers in (1, 2):
            for worker in range(workers):
                plan = dict(world=world, rank=rank, equalize="pad", buffer=buffer, seed=4, epoch=1)
                expected = model_worker_stream(items, workers=workers, worker=worker, **plan)
                assert real_worker_stream(manifest, workers=workers, worker=worker, **plan) == expected
        lengths.add(len(wdsprep.dataset(manifest, "train", rank=rank, world_size=world, equalize="pad")))
    assert len(lengths) == 1  # every rank the same number of samples


@pytest.mark.parametrize("buffer", [0, 3])
@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_resumes_from_every_batch_inside_blocks(packed_counted, workers, buffer):
    check_every_batch_resumes(packed_counted(LOADER_COUNTS), workers, buffer)


@pytest.mark.parametrize("buffer", [0, 5])
def test_the_dataset_resumes_at_every_sample_inside_a_block(packed_counted, buffer):
    counts = [8, 13]
    manifest = packed_counted(counts)

    def dataset():
        return wdsprep.dataset(manifest, "train", seed=2, epoch=0, shuffle_buffer=buffer)

    whole = [s["__key__"] for s in dataset()]
    assert sorted(whole) == sorted(model_global(counts, 2, 0, False))
    for done in range(len(whole)):
        first = dataset()
        iterator = iter(first)
        head = [next(iterator)["__key__"] for _ in range(done)]
        state = json.loads(json.dumps(first.state_dict()))
        resumed = dataset()
        resumed.load_state_dict(state)
        assert head + [s["__key__"] for s in resumed] == whole, done


def test_states_of_three_ranks_resume_elastically_on_two(packed_counted):
    counts = [7, 7, 7, 1, 23, 2]
    manifest = packed_counted(counts)
    every = set(model_global(counts, 0, 0, False))

    def dataset(rank, world):
        return wdsprep.dataset(manifest, "train", seed=4, epoch=2, equalize=None, rank=rank, world_size=world, shuffle_buffer=4)

    delivered, states = [], []
    for rank, stop in enumerate([5, 11, 0]):
        first = dataset(rank, 3)
        iterator = iter(first)
        delivered += [next(iterator)["__key__"] for _ in range(stop)]
        states.append(json.loads(json.dumps(first.state_dict())))
    rest = []
    for rank in range(2):
        resumed = dataset(rank, 2)
        resumed.load_state_dict(states)
        rest += [s["__key__"] for s in resumed]
    outputs = collections.Counter(delivered + rest)
    assert set(outputs) == every and max(outputs.values()) == 1


# ------------------------------------------------------------------ integrity and hostile blocks
def _flip(path: pathlib.Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("reader", ["dataset", "plain-order", "mapdataset"])
def test_a_flipped_byte_in_a_block_fails_before_any_sample_of_that_block(tmp_path, converted, reader):
    import shutil

    out = tmp_path / "out"
    shutil.copytree(converted / "out", out)
    shard = sorted(out.glob("*.tar"))[1]
    with tarfile.open(shard) as archive:
        blocks = [m for m in archive.getmembers() if m.name.endswith(PACK_MEMBER)]
    member = blocks[1]
    with tarfile.open(shard) as archive:
        rows = Block.parse(archive.extractfile(member).read()).keys
    _flip(shard, member.offset_data + member.size // 2)
    if reader == "mapdataset":
        data = wdsprep.MapDataset(str(out / "manifest.json"), "train")
        with pytest.raises(ShardError, match=rf"{shard.name}.*member {member.name.split('.')[0]}\.{PACK_MEMBER}: corrupt"):
            data[int(rows[1][1:])]
        return
    dataset = wdsprep.dataset(str(out / "manifest.json"), "train", shuffle_shards=False,
                              shuffle_buffer=0 if reader == "plain-order" else 40, seed=1)
    keys, error = keys_until_error(dataset.compose(wdsprep.decode(strip=True)))
    assert isinstance(error, ShardError)
    assert shard.name in str(error) and f"{rows[0]}.{PACK_MEMBER}: corrupt" in str(error)
    assert not set(keys) & set(rows)  # no sample of the damaged block came out


def _hostile_block(rows_keys, columns) -> bytes:
    return msgpack.packb({"format": "wdsprep-pack/1", "keys": list(rows_keys), "columns": columns}, use_bin_type=True)


def _good_columns(n: int) -> dict:
    return {"data.npy": {"head": b"H", "size": 2, "ends": b"", "data": bytes(2 * n)},
            "label.mp": {"head": b"", "size": -1, "ends": np.arange(1, n + 1, dtype="<u4").tobytes(), "data": bytes(n)}}


def _broken(kind: str, n: int) -> bytes:
    keys = [f"k{i}" for i in range(n)]
    columns = _good_columns(n)
    if kind == "ends-past-data":
        columns["label.mp"]["ends"] = np.array([1] * (n - 1) + [10**6], "<u4").tobytes()
    elif kind == "ends-decreasing":
        columns["label.mp"]["ends"] = np.array([3, 1, *range(3, n + 1)][:n], "<u4").tobytes()
    elif kind == "ends-short":
        columns["label.mp"]["ends"] = columns["label.mp"]["ends"][:-4]
    elif kind == "fixed-size-lies":
        columns["data.npy"]["size"] = 3
    elif kind == "rows-beyond-the-cap":  # a head repeated per row: more than a member may hold, once unpacked
        columns["data.npy"] = {"head": bytes(1 << 20), "size": 0, "ends": b"", "data": b""}
        keys = [f"k{i}" for i in range(MAX_MEMBER_BYTES // (1 << 20) + 1)]
        columns["label.mp"] = {"head": b"", "size": 0, "ends": b"", "data": b""}
    elif kind == "negative-size":
        columns["data.npy"]["size"] = -7
    elif kind == "a-path-as-member":
        columns["../x.npy"] = columns.pop("data.npy")
    elif kind == "a-path-as-key":
        keys[1] = "../k1"
    elif kind == "not-msgpack":
        return b"\xc1" * 40
    return _hostile_block(keys, columns)


HOSTILE = ["ends-past-data", "ends-decreasing", "ends-short", "fixed-size-lies", "rows-beyond-the-cap", "negative-size",
           "a-path-as-member", "a-path-as-key", "not-msgpack"]


def _stranger_shard(directory: pathlib.Path, block: bytes, keys: list[str]) -> str:
    """A shard a stranger wrote by the format's rules (its index and manifest match its bytes): one
    block member holding `keys`, then one sample stored whole."""
    from wdsprep.shards import tarformat

    directory.mkdir()
    shard = ShardFile(str(directory), "train-00000-00.tar", packing=True)
    member = tarformat.header(f"{keys[0]}.{PACK_MEMBER}", len(block)) + block + tarformat.padding(len(block))
    shard.append(keys[0], member, [(PACK_MEMBER, len(block), 0, len(member))], keys)
    row = shard.finish()
    shard.publish()
    manifest = Manifest("generic", {}, "fp", {"train": [dict(row.as_dict(), unit=0)]})
    (directory / "manifest.json").write_bytes(manifest.dumps())
    return str(directory / "manifest.json")


def _plain_key(key) -> bool:
    """A sample key by the format's rule, written out here: a non-empty str, not starting with "__",
    without '.', '/', '\\' or NUL."""
    return (isinstance(key, str) and key != "" and not key.startswith("__")
            and not any(c in key for c in "./\\\0"))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.text(alphabet="ab_-", max_size=3), st.text(alphabet="ab_-/", max_size=4),
                          st.text(alphabet="ab_/.\\\0-", max_size=4), st.integers(0, 3)),
                min_size=1, max_size=6, unique_by=lambda key: (type(key), key)))
def test_a_block_is_accepted_exactly_when_every_key_is_a_plain_name(keys):
    """The block's key check (one match over the keys joined) against the rule key by key."""
    block = _hostile_block(keys, _good_columns(len(keys)))
    if all(map(_plain_key, keys)):
        assert Block.parse(block).keys == keys
    else:
        with pytest.raises(FormatError, match="is not a plain name"):
            Block.parse(block)


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_strangers_hostile_block_is_one_line_naming_shard_and_member(tmp_path, kind):
    block = _broken(kind, 4)
    keys = msgpack.unpackb(block)["keys"] if kind == "rows-beyond-the-cap" else [f"k{i}" for i in range(4)]
    with pytest.raises(FormatError, match=r"wdsprep-pack\.mp: not a packed block"):
        Block.parse(block)
    manifest = _stranger_shard(tmp_path / "s", block, keys)
    expected = rf"train-00000-00\.tar.*member k0\.{PACK_MEMBER}: not a packed block \(.+\)"
    with pytest.raises(ShardError, match=expected) as caught:
        list(wdsprep.dataset(manifest, "train", shuffle_shards=False, shuffle_buffer=0))
    assert "\n" not in str(caught.value)
    with pytest.raises(ShardError, match=expected):
        wdsprep.MapDataset(manifest, "train")[1]
    import webdataset as wds

    with pytest.raises(FormatError, match=rf"member k0\.{PACK_MEMBER}: not a packed block"):
        list(wds.WebDataset([manifest.replace("manifest.json", "train-00000-00.tar")], shardshuffle=False)
             .compose(wdsprep.decode()))


def test_a_block_whose_rows_are_not_the_indexed_samples_is_refused(tmp_path):
    block = _hostile_block(["a", "b"], _good_columns(2))  # a good block, but the index lists three samples
    manifest = _stranger_shard(tmp_path / "s", block, ["a", "b", "c"])
    with pytest.raises(ShardError, match=rf"member a\.{PACK_MEMBER}: its 2 rows are not the 3 samples the index lists"):
        list(wdsprep.dataset(manifest, "train", shuffle_shards=False, shuffle_buffer=0))


def test_an_index_whose_rows_do_not_add_up_is_refused(tmp_path, monkeypatch):
    block = _hostile_block(["a", "b"], _good_columns(2))
    finish = ShardFile.finish

    def lying_finish(shard, *arguments):  # the index lists a third sample that no entry holds
        shard.index.sample_keys.append("c")
        return finish(shard, *arguments)

    monkeypatch.setattr(ShardFile, "finish", lying_finish)
    manifest = _stranger_shard(tmp_path / "s", block, ["a", "b"])
    monkeypatch.undo()
    with pytest.raises(ShardError, match="index.* is unreadable \\(its entries hold 2 samples, it lists 3 keys\\)"):
        list(wdsprep.dataset(manifest, "train", shuffle_shards=False, shuffle_buffer=0))


def test_encoded_blocks_give_back_every_row_byte_for_byte():
    rng = np.random.default_rng(0)
    rows = [[bytes(rng.integers(0, 256, 20, dtype=np.uint8)), bytes(rng.integers(0, 256, int(n), dtype=np.uint8))]
            for n in rng.integers(0, 9, 12)]
    keys = [f"r{i}" for i in range(len(rows))]
    block = Block.parse(encode_block(keys, ["a.npy", "b.mp"], rows))
    assert block.keys == keys
    assert [[bytes(block.member(r, m)) for m in range(2)] for r in range(len(rows))] == rows


@pytest.mark.parametrize("torch", [False, True])
def test_decoded_rows_equal_each_member_decoded_alone(torch):
    """A block's columns decoded at once (one array per .npy column, one pass per .mp column) give
    what `wdsprep.decode_sample` gives for each row's members alone: values, dtypes, shapes, types."""
    from wdsprep.shards.codec import Encoder, decode_sample

    encoder = Encoder("none")
    rows, keys = [], []
    for i in range(9):
        fields = {"image": np.full((2, 3), i, np.int16), "scalar": np.float64(i), "meta": {"i": i, "deep": [[i]] * (i % 3)},
                  "label": i % 4, "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3) + i)}
        members = encoder.encode_fields(f"k{i}", {k: (np.asarray(v) if k == "scalar" else v) for k, v in fields.items()})
        rows.append(members)
        keys.append(f"k{i}")
    names = [name for name, _ in rows[0]]
    block = Block.parse(encode_block(keys, names, [[data for _, data in members] for members in rows]))
    for r, members in enumerate(rows):
        alone = decode_sample({"__key__": keys[r], "__url__": "u", **dict(members)}, strip=True, torch=torch)
        together = block.decoded(r, "u", True, torch)
        assert together.keys() == alone.keys()
        for name, value in alone.items():
            other = together[name]
            assert type(other) is type(value), name
            if hasattr(value, "shape"):
                assert other.dtype == value.dtype and tuple(other.shape) == tuple(value.shape), name
                np.testing.assert_array_equal(np.asarray(other), np.asarray(value))
            else:
                assert other == value, name


@pytest.mark.parametrize("pad", [0, 120])  # the other rows shorter than MAX_DEPTH bytes, and longer
def test_a_row_nested_deeper_than_the_format_allows_fails_alone_in_a_column_unpacked_at_once(pad):
    """A `.mp` column of enough rows to be unpacked in one pass, one row nested one level deeper than
    the format allows (written here by the format's rules: the writer never writes it), another
    exactly as deep as allowed: the deep row is its shard's error naming its member, every other
    row decodes to its value."""
    from wdsprep.shards.codec import MAX_DEPTH
    from wdsprep.shards.packed import ONE_PASS_ROWS

    n = ONE_PASS_ROWS + 6
    keys = [f"k{i}" for i in range(n)]
    rows = [[msgpack.packb({"i": i, "pad": "x" * pad})] for i in range(n)]
    rows[3] = [b"\x91" * MAX_DEPTH + b"\x01"]  # lists MAX_DEPTH deep
    rows[7] = [b"\x91" * (MAX_DEPTH + 1) + b"\x01"]
    block = Block.parse(encode_block(keys, ["meta.mp"], rows))
    for r in range(n):
        if r == 7:
            with pytest.raises(ShardError, match=f"member k7.meta.mp: nested deeper than {MAX_DEPTH} levels"):
                block.decoded(r, "u", True, False)
            continue
        assert block.decoded(r, "u", True, False)["meta"] == msgpack.unpackb(rows[r][0])


def test_hugging_face_datasets_unpacks_a_packed_split_with_one_map(converted, tmp_path):
    datasets = pytest.importorskip("datasets")
    urls = [url for url in wdsprep.urls(_manifest(converted), "train")]
    blocks = datasets.load_dataset("webdataset", data_files={"train": urls}, split="train", cache_dir=str(tmp_path))
    rows = blocks.map(wdsprep.unpack_rows, batched=True, remove_columns=blocks.column_names)
    assert sorted(rows["__key__"]) == [_key(i) for i in range(SMALL)]
    for row in rows.select(range(0, SMALL, 37)):
        if row["__key__"] != _key(HUGE):  # stored whole: Hugging Face keeps only the first shard's columns (docs/format.md)
            _same(converted, {"__key__": row["__key__"], "data": np.asarray(row["data.npy"], np.uint8), "label": row["label.mp"]})


# ------------------------------------------------------------------ conversion: bytes, balance, resume, workers
def _shard_bytes(directory: pathlib.Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(directory.glob("*.tar"))}


def test_packed_conversions_are_byte_identical_across_workers_and_a_resumed_run(converted, tmp_path):
    first = _shard_bytes(converted / "out")
    status, _, err = run_cli("convert", "generic", converted / "in", tmp_path / "two", "--quiet", "--pack", "--codec", "none",
                             "--shard-bytes", "40KB", "--workers", "2")
    assert status == 0, err
    assert _shard_bytes(tmp_path / "two") == first
    victim = sorted((tmp_path / "two").glob("*.tar"))[1]
    victim.unlink()
    status, _, err = run_cli("convert", "generic", converted / "in", tmp_path / "two", "--quiet", "--pack", "--codec", "none",
                             "--shard-bytes", "40KB")
    assert status == 0, err
    assert _shard_bytes(tmp_path / "two") == first
    manifest = json.loads((tmp_path / "two" / "manifest.json").read_text())
    assert manifest["config"]["pack"] is True


def test_a_unit_that_rolls_over_balances_whole_blocks_within_the_target(tmp_path):
    from wdsprep.shards.codec import Encoder
    from wdsprep.shards.writer import ShardWriter

    rng = np.random.default_rng(3)
    values = {f"k{i:04d}": rng.integers(0, 256, 200, dtype=np.uint8) for i in range(400)}
    rows = []
    for attempt in range(2):  # twice: the same bytes
        directory = tmp_path / str(attempt)
        directory.mkdir()
        with ShardWriter(str(directory), "train-00000", shard_bytes=30_000, encoder=Encoder("none"), pack=True) as writer:
            for key, value in values.items():
                writer.write(key, {"data": value, "label": int(value[0])})
        rows.append([row.as_dict() for row in writer.rows])
    assert rows[0] == rows[1] and _shard_bytes(tmp_path / "0") == _shard_bytes(tmp_path / "1")
    assert len(rows[0]) >= 3 and all(row["bytes"] <= 30_000 for row in rows[0])
    assert abs(rows[0][-1]["bytes"] - rows[0][-2]["bytes"]) < 30_000 / 2  # the last two balanced
    assert sum(row["samples"] for row in rows[0]) == len(values)
    manifest = Manifest("generic", {}, "fp", {"train": [dict(row, unit=0) for row in rows[0]]})
    (tmp_path / "0" / "manifest.json").write_bytes(manifest.dumps())
    got = list(wdsprep.dataset(str(tmp_path / "0" / "manifest.json"), "train", shuffle_shards=False, shuffle_buffer=0)
               .compose(wdsprep.decode(strip=True)))
    assert [s["__key__"] for s in got] == list(values)
    for sample in got:
        np.testing.assert_array_equal(sample["data"], values[sample["__key__"]])


@pytest.mark.parametrize("prefetch", [0, None])  # one sequential stream per piece, and the read-ahead
def test_remote_reads_see_the_same_samples(converted, prefetch):
    from wdsprep.testing.httpserver import RangeHTTPServer

    options = {} if prefetch is None else {"prefetch_bytes": prefetch}
    with RangeHTTPServer(converted / "out") as server:
        url = server.url_of("manifest.json")
        for rank in range(2):  # a rank starts inside a block
            args = dict(seed=6, epoch=1, shuffle_buffer=7, rank=rank, world_size=2)
            local = list(wdsprep.dataset(_manifest(converted), "train", **args).compose(wdsprep.decode(strip=True)))
            remote = list(wdsprep.dataset(url, "train", **args, **options).compose(wdsprep.decode(strip=True)))
            assert [s["__key__"] for s in remote] == [s["__key__"] for s in local]
            for sample in remote[::17]:
                _same(converted, sample)
        data = wdsprep.MapDataset(url, "train")
        data.access.indexes(range(len(data.access.rows)))
        before = data.stats["requests"]
        for i in (5, 123, HUGE, SMALL - 1):
            _same(converted, data[i])
        assert data.stats["requests"] - before == 4  # one Range request each: the sample's whole block


def test_every_reader_refuses_a_hostile_block_in_one_line_with_bounded_memory(tmp_path):
    """dataset, MapDataset, inspect, verify and show on each hostile block, in one child process that
    measures each read's peak memory (conformance/measured.py, after a clean baseline)."""
    from wdsprep.conformance.measured import run_readers

    from wdsprep.shards.codec import Encoder

    keys = [f"k{i}" for i in range(4)]
    members = [Encoder("none").encode_fields(key, {"data": np.arange(3, dtype=np.int16) + i, "label": i}) for i, key in enumerate(keys)]
    real = encode_block(keys, [name for name, _ in members[0]], [[data for _, data in row] for row in members])
    clean = _stranger_shard(tmp_path / "clean", real, keys)
    datasets = {}
    for kind in HOSTILE:
        block = _broken(kind, 4)
        keys = msgpack.unpackb(block)["keys"] if kind == "rows-beyond-the-cap" else [f"k{i}" for i in range(4)]
        datasets[kind] = (str(pathlib.Path(_stranger_shard(tmp_path / kind, block, keys)).parent), "train")
    found, status, err = run_readers((str(pathlib.Path(clean).parent), "train"), datasets)
    assert status == 0 and found, err
    assert all(read["status"] == 0 for read in found["baseline"].values()), found["baseline"]
    for kind, reads in found["results"].items():
        for reader, read in reads.items():
            assert read["status"] == 1, (kind, reader, read)
            assert f"k0.{PACK_MEMBER}: not a packed block" in read["error"], (kind, reader, read["error"])
            assert read["rss_growth"] < 64 << 20, (kind, reader, read["rss_growth"])


def test_a_selection_reads_the_selected_samples_out_of_their_blocks(converted):
    wanted = [_key(i) for i in range(SMALL) if i % 7 == 3]
    dataset = wdsprep.dataset(_manifest(converted), "train", select="label == 3", shuffle_shards=False, shuffle_buffer=0)
    samples = list(dataset.compose(wdsprep.decode(strip=True)))
    assert [s["__key__"] for s in samples] == wanted
    for sample in samples:
        _same(converted, sample)
    chosen = wdsprep.MapDataset(_manifest(converted), "train", keys=wanted[::5])
    assert [chosen[i]["__key__"] for i in range(len(chosen))] == wanted[::5]


def test_a_blocks_rows_are_writable_and_no_two_decodes_of_it_share_a_row():
    """A `.npy` column's rows are views of the block's own copy of their bytes (its first decode
    copies nothing more): each writable, a write to one changes no other row, and a second decode of
    the same block (torch, or members kept as named; no reader makes one) gets rows of its own."""
    import torch

    from wdsprep.shards.codec import Encoder

    keys = [f"k{i}" for i in range(5)]
    members = [Encoder("none").encode_fields(key, {"data": np.arange(4, dtype=np.int32) + 10 * i}) for i, key in enumerate(keys)]
    block = Block.parse(encode_block(keys, [name for name, _ in members[0]], [[data for _, data in row] for row in members]))
    first = block.decoded(0, "u", True, False)["data"]
    assert first.flags.writeable
    first[:] = -1
    assert block.decoded(1, "u", True, False)["data"].tolist() == [10, 11, 12, 13]
    named = block.decoded(2, "u", False, False)["data.npy"]
    tensor = block.decoded(2, "u", True, True)["data"]
    assert isinstance(tensor, torch.Tensor) and named.tolist() == tensor.tolist() == [20, 21, 22, 23]
    named[:] = 7
    tensor[:] = 8
    assert block.decoded(2, "u", True, False)["data"].tolist() == [20, 21, 22, 23]
    assert named.tolist() == [7] * 4 and tensor.tolist() == [8] * 4


def _bytes_converted(root: pathlib.Path, sizes: list[int], shard_bytes: str) -> list[pathlib.Path]:
    """Samples of random uint8 values of `sizes` bytes converted with `--pack` by the command line
    (into root/out): its shards."""
    train = root / "in" / "train"
    train.mkdir(parents=True)
    rng = np.random.default_rng(2)
    for i, size in enumerate(sizes):
        np.save(train / f"{_key(i)}.data.npy", rng.integers(0, 256, size, dtype=np.uint8))
    status, _, err = run_cli("convert", "generic", root / "in", root / "out", "--quiet", "--pack", "--codec", "none",
                             "--shard-bytes", shard_bytes)
    assert status == 0, err
    return sorted((root / "out").glob("*.tar"))


def test_a_shuffled_read_of_packed_shards_holds_no_read_window_past_the_one_it_checks(tmp_path, monkeypatch):
    """Blocks hold their own bytes once parsed, so a shuffle buffer over packed shards holds its
    blocks, not the read windows they were parsed from (samples stored whole are copied out of their
    windows when taken, which are kept for that, up to `KEEP` bytes a shard). Counted at the window
    pool: windows taken and not yet given back, at most one per shard held."""
    from wdsprep.stream.reading import read

    count = 3000
    shards = _bytes_converted(tmp_path, [1024] * count, "1MB")
    assert len(shards) >= 3 and all(path.stat().st_size > 3 * read.WINDOW for path in shards[:-1])

    class Counting:
        def __init__(self, pool):
            self.pool, self.out, self.most = pool, 0, 0

        def get(self):
            self.out += 1
            self.most = max(self.most, self.out)
            return self.pool.get()

        def put(self, buffers):
            buffers = list(buffers)
            self.out -= len(buffers)
            self.pool.put(buffers)

    pool = Counting(read._buffers)
    monkeypatch.setattr(read, "_buffers", pool)
    dataset = wdsprep.dataset(str(tmp_path / "out" / "manifest.json"), "train", seed=1, shuffle_buffer=1500)
    keys = [sample["__key__"] for sample in dataset.compose(wdsprep.decode(strip=True))]
    assert sorted(keys) == [_key(i) for i in range(count)]
    per_shard = -(-count // len(shards))  # samples of a shard (the last one's fewer)
    assert 1 <= pool.most <= -(-1500 // per_shard) + 1, pool.most  # the shards a shuffle block spans, one window each


def test_a_shuffled_read_of_a_packed_shard_with_a_sample_stored_whole_reads_each_byte_once(tmp_path, monkeypatch):
    """A packed shard that holds a sample stored whole (too large for a block, small enough for a read
    window) keeps its windows, as an unpacked one does: the sample is copied out of its window when
    the shuffle buffer delivers it, not read again. Counted at the reader's one read call."""
    from wdsprep.stream.reading import read

    sizes = [1024] * 1000
    sizes[200] = 100_000
    shards = _bytes_converted(tmp_path, sizes, "2MB")
    assert len(shards) == 1 and shards[0].stat().st_size > 4 * read.WINDOW
    done = []
    preadv = read._preadv
    monkeypatch.setattr(read, "_preadv", lambda url, fd, buffers, offset: done.append(sum(map(len, buffers))) or preadv(url, fd, buffers, offset))
    dataset = wdsprep.dataset(str(tmp_path / "out" / "manifest.json"), "train", seed=3, shuffle_buffer=1500)
    samples = {sample["__key__"]: sample["data"] for sample in dataset.compose(wdsprep.decode(strip=True))}
    assert sorted(samples) == [_key(i) for i in range(1000)] and samples[_key(200)].shape == (100_000,)
    assert sum(done) <= shards[0].stat().st_size


_HELD = """
import os, sys
import wdsprep
from wdsprep.conformance.measured import _reset_peak, _status_bytes

def read(buffer):
    dataset = wdsprep.dataset(os.path.join(sys.argv[1], "manifest.json"), "train", seed=0, shuffle_buffer=buffer,
                              equalize=None)
    return sum(1 for _ in dataset.compose(wdsprep.decode(strip=True)))

read(0)  # imports, caches and a pass's own memory
_reset_peak()
before = _status_bytes("VmRSS")
count = read(int(sys.argv[2]))
print(count, _status_bytes("VmHWM") - before)
"""


def test_a_shuffle_buffer_of_packed_samples_holds_their_bytes_about_once(tmp_path):
    """A packed block keeps one copy of its rows' bytes (the arrays handed out are views of it) and no
    read window once parsed: a buffer of 2,000 samples of 4 KiB grows a reader's peak memory over an
    unbuffered pass's by less than 1.6x their 8 MB (it held three copies: 24 MB and more). Measured in
    a child process (its peak RSS, reset before the pass)."""
    import subprocess
    import sys

    count, size, buffer = 4000, 4096, 2000
    _bytes_converted(tmp_path, [size] * count, "4MB")
    result = subprocess.run([sys.executable, "-c", _HELD, str(tmp_path / "out"), str(buffer)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    read, growth = map(int, result.stdout.split())
    assert read == count
    assert growth < 1.6 * buffer * size, growth
