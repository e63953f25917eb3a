"""`wdsprep.MapDataset` on local shards, judged against an independent reader (`tarfile` over the
manifest's shard list, tests/core/mapsources.py): every position of every source, batches in any
order, a flipped byte, selections, bad requests, a plain DataLoader with DistributedSampler and
workers. Remote reads and request counts: tests/objectstore/test_mapdataset_remote.py."""
import collections
import io
import json
import pickle
import shutil

import msgpack
import numpy as np
import pytest
import torch
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, DistributedSampler

import wdsprep
from wdsprep.errors import ConfigError, ShardError

from .mapsources import SOURCES, convert_source, flip_last_byte, same_raw, tar_reference


@pytest.fixture(scope="module", params=sorted(SOURCES))
def converted(request, tmp_path_factory):
    out, split = convert_source(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, out, split, tar_reference(out, split)


@pytest.fixture(scope="module")
def generic(tmp_path_factory):
    """Generic shards (200 samples of ~17 KB, about 5 a shard) and their reference samples."""
    out, split = convert_source("generic", tmp_path_factory.mktemp("generic"))
    return out, split, tar_reference(out, split)


def test_every_position_is_the_unshuffled_streams_sample(converted):
    """Position i is the i-th sample of the split in manifest order, for every source; negative
    positions count from the end; a batch in any order gives each of its samples in that order."""
    source, out, split, reference = converted
    assert len({sample["__shard__"] for sample in reference}) > 1, "several shards, so positions cross shards"
    ds = wdsprep.MapDataset(out, split, decode=False)
    assert len(ds) == len(reference)
    for i, expected in enumerate(reference):
        same_raw(ds[i], expected)
    same_raw(ds[-1], reference[-1])
    same_raw(ds[-len(reference)], reference[0])
    order = np.random.default_rng(0).permutation(len(reference)).tolist()
    for start in range(0, len(order), 7):
        batch = order[start : start + 7]
        got = ds.__getitems__(batch)
        assert len(got) == len(batch)
        for sample, i in zip(got, batch):
            same_raw(sample, reference[i])
    assert ds.keys() == [sample["__key__"] for sample in reference]
    key = reference[len(reference) // 2]["__key__"]
    assert ds.position(key) == len(reference) // 2
    same_raw(wdsprep.MapDataset(out, split, decode=False).get(key), reference[len(reference) // 2])


def test_items_decode_like_numpy_and_msgpack_read_the_members(generic):
    out, split, reference = generic
    decoded = wdsprep.MapDataset(out, split)  # wdsprep.decode(): field names keep their extensions
    stripped = wdsprep.MapDataset(out, split, decode=wdsprep.decode(strip=True, torch=True))
    for i in (0, 13, len(reference) - 1):
        expected = reference[i]
        array = np.load(io.BytesIO(zstandard.ZstdDecompressor().decompress(expected["array.npy.zst"])))
        meta = msgpack.unpackb(expected["meta.mp"], raw=False)
        item = decoded[i]
        assert set(item) == {"__key__", "array.npy.zst", "meta.mp"}  # no bookkeeping unless asked for
        assert np.array_equal(item["array.npy.zst"], array) and item["meta.mp"] == meta
        asked = wdsprep.MapDataset(out, split, decode=wdsprep.decode(bookkeeping=("__url__",)))[i]
        assert set(asked) == {"__key__", "__url__", "array.npy.zst", "meta.mp"}
        assert asked["__url__"].endswith("/" + expected["__shard__"])
        item = stripped[i]
        assert isinstance(item["array"], torch.Tensor) and torch.equal(item["array"], torch.from_numpy(array))
        assert item["meta"] == meta


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_index_list_gives_the_reference_samples_in_its_order(generic, data):
    """Property: a random list of positions (negative ones, repeats, any order) and any gap setting
    give exactly the reference's samples, in the list's order."""
    out, split, reference = generic
    n = len(reference)
    indices = data.draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=40), label="indices")
    gap = data.draw(st.sampled_from([0, 1, 20_000, 1 << 20]), label="gap_bytes")
    ds = wdsprep.MapDataset(out, split, decode=False, gap_bytes=gap)
    got = ds.__getitems__(indices)
    assert len(got) == len(indices)
    for sample, i in zip(got, indices):
        same_raw(sample, reference[i])


def test_a_read_of_some_members_gives_exactly_those_members(converted):
    """`read(indices, members)` (what the map-style classes read with) for every subset of a sample's
    member names, plus a name no sample holds: each sample asked for has exactly the asked members it
    holds, byte for byte as `tarfile` reads them (none cut short or left out, none added), alone, in a
    batch of neighbours (their spans merge into one read) and from `by_shard`; every source."""
    source, out, split, reference = converted
    ds = wdsprep.MapDataset(out, split, decode=False)
    names = sorted({name for sample in reference for name in sample if not name.startswith("__")})
    assert len(names) >= 2, names
    subsets = [[name for bit, name in enumerate(names) if mask >> bit & 1] for mask in range(1, 1 << len(names))]
    if len(subsets) > 63:  # many members: each alone, each run of neighbours, each leaving one out
        subsets = [names[a:b] for a in range(len(names)) for b in range(a + 1, len(names) + 1)]
        subsets += [names[:i] + names[i + 1 :] for i in range(len(names))]
    shard = reference[len(reference) // 2]["__shard__"]
    batch = [i for i, sample in enumerate(reference) if sample["__shard__"] == shard]  # one shard's neighbours

    def check(i: int, sample: dict, subset: list[str]) -> None:
        assert sample["__key__"] == reference[i]["__key__"], (source, subset, i)
        got = {name: bytes(value) for name, value in sample.items() if not name.startswith("__")}
        assert got == {name: reference[i][name] for name in subset if name in reference[i]}, (source, subset, i)

    for subset in [*subsets, ["no-such-member.npy"], [*names, "no-such-member.npy"]]:
        for i, sample in zip(batch, ds.read(batch, subset), strict=True):
            check(i, sample, subset)
        for i in (0, batch[0], len(reference) - 1):
            check(i, ds.read([i], subset)[0], subset)
    for positions, samples in ds.by_shard(names[:-1]):  # the last member left out: each sample's up to it
        for i, sample in zip(positions, samples, strict=True):
            check(i, sample, names[:-1])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_slice_is_the_list_of_its_positions_samples(generic, data):
    """Property: `ds[a:b:c]` is the list Python's own slicing takes of the reference (any bounds,
    negative ones, past the end, any step), read together: the samples of one shard that touch are
    one read, as in a batch."""
    out, split, reference = generic
    n = len(reference)
    bound = st.none() | st.integers(-n - 5, n + 5)
    part = slice(data.draw(bound, label="start"), data.draw(bound, label="stop"),
                 data.draw(st.none() | st.integers(-7, 7).filter(bool), label="step"))
    ds = wdsprep.MapDataset(out, split, decode=False)
    got = ds[part]
    expected = reference[part]
    assert isinstance(got, list) and len(got) == len(expected)
    for sample, reference_sample in zip(got, expected):
        same_raw(sample, reference_sample)


def test_a_slice_of_one_shard_is_one_read_and_a_key_is_get(generic):
    out, split, reference = generic
    first = [i for i, sample in enumerate(reference) if sample["__shard__"] == reference[0]["__shard__"]]
    assert len(first) > 2
    ds = wdsprep.MapDataset(out, split, decode=False)
    ds.access.index(0)  # the first shard's index read beforehand
    before = ds.stats["reads"]
    assert [sample["__key__"] for sample in ds[: len(first)]] == [reference[i]["__key__"] for i in first]
    assert ds.stats["reads"] - before == 1
    assert ds[len(reference):] == [] and ds[5:5] == [] and ds.stats["reads"] - before == 1  # nothing to read
    decoded = wdsprep.MapDataset(out, split)
    assert [item["__key__"] for item in decoded[1:4]] == [sample["__key__"] for sample in reference[1:4]]
    key = reference[5]["__key__"]
    with pytest.raises(TypeError, match=rf"^MapDataset indices are positions \(integers\) or slices, not the string "
                                        rf"'{key}' \(a sample by key is ds.get\(key\)\)$"):
        decoded[key]
    assert decoded.get(key)["__key__"] == key
    with pytest.raises(TypeError, match=r"^MapDataset indices are positions \(integers\) or slices, not float$"):
        decoded[1.5]


def test_a_flipped_byte_fails_that_sample_only(generic, tmp_path):
    """A flipped byte in one member of sample k: reading k (alone or in a batch) is a ShardError naming
    the shard and the member; its neighbours in the same shard, alone or together, read as before."""
    out, split, reference = generic
    shards = tmp_path / "shards"
    shutil.copytree(out, shards)
    k = next(i for i in range(20, len(reference) - 1)  # mid-shard: samples k - 1 and k + 1 share its shard
             if reference[i - 1]["__shard__"] == reference[i]["__shard__"] == reference[i + 1]["__shard__"])
    flip_last_byte(shards / reference[k]["__shard__"], reference[k]["__key__"], "meta.mp")
    ds = wdsprep.MapDataset(shards, split, decode=False)
    message = rf"{reference[k]['__shard__']}: member {reference[k]['__key__']}\.meta\.mp: corrupt"
    with pytest.raises(ShardError, match=message):
        ds[k]
    with pytest.raises(ShardError, match=message):
        ds.__getitems__([k - 1, k, k + 1])
    for i in (k - 1, k + 1):
        same_raw(ds[i], reference[i])
    for sample, i in zip(ds.__getitems__([k - 1, k + 1]), (k - 1, k + 1)):
        same_raw(sample, reference[i])
    with pytest.raises(ShardError, match=message):
        wdsprep.MapDataset(shards, split).get(reference[k]["__key__"])


def test_bad_positions_and_keys_are_one_clear_line(generic):
    out, split, reference = generic
    ds = wdsprep.MapDataset(out, split)
    n = len(reference)
    for bad in (n, n + 5, -n - 1):
        with pytest.raises(IndexError, match=rf"index {bad} out of range: split 'train' of .*manifest.json has {n} samples$"):
            ds[bad]
    with pytest.raises(IndexError, match=rf"index {n} out of range"):
        ds.__getitems__([0, n])
    with pytest.raises(TypeError):
        ds[1.5]
    with pytest.raises(KeyError, match=r"'no-such-key' is not in split 'train' of .*manifest\.json"):
        ds.get("no-such-key")
    with pytest.raises(ConfigError, match=r"decode='yes': must be True, False or a wdsprep\.decode"):
        wdsprep.MapDataset(out, split, decode="yes")
    with pytest.raises(ConfigError, match="a MapDataset item cannot be skipped"):
        wdsprep.MapDataset(out, split, decode=wdsprep.decode(handler=lambda error: True))
    with pytest.raises(ConfigError, match="max_connections=0: must be a whole number >= 1"):
        wdsprep.MapDataset(out, split, max_connections=0)
    with pytest.raises(wdsprep.ManifestError, match="no split 'holdout'"):
        wdsprep.MapDataset(out, "holdout")


def test_a_selection_narrows_len_positions_and_keys(generic):
    """keys=, limit=, fraction=: the kept samples against a model in the test (the reference filtered),
    and a fraction against the streaming dataset's own selection (the same samples, by the same seed)."""
    out, split, reference = generic
    keys = [reference[i]["__key__"] for i in (150, 3, 77, 10, 11, 199)]
    ds = wdsprep.MapDataset(out, split, keys=keys, decode=False)
    kept = [sample for sample in reference if sample["__key__"] in keys]  # manifest order
    assert len(ds) == len(kept) == 6
    for i, expected in enumerate(kept):
        same_raw(ds[i], expected)
    assert ds.keys() == [sample["__key__"] for sample in kept]
    assert ds.position(reference[77]["__key__"]) == 3
    with pytest.raises(KeyError, match=rf"{reference[5]['__key__']!r} is in split 'train' of .* but not in the selection \(6 keys\)"):
        ds.get(reference[5]["__key__"])
    with pytest.raises(IndexError, match="has 6 samples selected"):
        ds[6]

    limited = wdsprep.MapDataset(out, split, limit=13, decode=False)
    assert [limited[i]["__key__"] for i in range(len(limited))] == [s["__key__"] for s in reference[:13]]
    both = wdsprep.MapDataset(out, split, keys=keys, limit=4, decode=False)
    assert both.keys() == [sample["__key__"] for sample in kept[:4]]

    fraction = wdsprep.MapDataset(out, split, fraction=0.3, seed=5, decode=False)
    assert len(fraction) == round(0.3 * len(reference))
    chosen = fraction.keys()
    positions = [next(i for i, s in enumerate(reference) if s["__key__"] == key) for key in chosen]
    assert positions == sorted(positions)  # manifest order
    for i, position in enumerate(positions):
        same_raw(fraction[i], reference[position])
    streamed = [s["__key__"] for s in wdsprep.dataset(str(out), split, fraction=0.3, seed=5, shuffle_shards=False,
                                                       equalize=None)]
    assert sorted(streamed) == sorted(chosen)
    assert wdsprep.MapDataset(out, split, fraction=0.3, seed=6).keys() != chosen  # another seed, another subset


def test_a_shard_list_reads_like_its_manifest(generic):
    out, split, reference = generic
    names = sorted({sample["__shard__"] for sample in reference})[:3]
    ds = wdsprep.MapDataset([out / name for name in names], decode=False)
    expected = [sample for sample in reference if sample["__shard__"] in names]
    assert len(ds) == len(expected)
    for i, sample in enumerate(expected):
        same_raw(ds[i], sample)
    same_raw(wdsprep.MapDataset(str(out / names[1]), decode=False)[0], expected[len(ds) // 3])
    with pytest.raises(ConfigError, match="select on a split's manifest"):
        wdsprep.MapDataset([out / name for name in names], limit=2)


def test_stage_and_transform_make_the_item(tmp_path):
    """A source's reader stage runs on the one sample (noisebase's frames: one frame per sample), a
    transform after it; a stage that makes several samples of one is refused, naming the sample."""
    out, split = convert_source("noisebase", tmp_path)
    reference = tar_reference(out, split)
    stage = wdsprep.noisebase.frames(samples=2)
    ds = wdsprep.MapDataset(out, split, decode=False, stage=stage, transform=lambda frame: frame["color"])
    for i in (0, 5, len(reference) - 1):
        raw = {"__key__": reference[i]["__key__"], "__url__": str(out / reference[i]["__shard__"]),
               **{name: value for name, value in reference[i].items() if not name.startswith("__")}}
        assert np.array_equal(ds[i], next(iter(stage(iter([raw]))))["color"])

    def twice(samples):
        for sample in samples:
            yield sample
            yield sample

    with pytest.raises(ConfigError, match=rf"the stage made 2 samples of sample {reference[3]['__key__']!r}"):
        wdsprep.MapDataset(out, split, stage=twice)[3]


def _keys(batch):
    return [sample["__key__"] for sample in batch]


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_dataloader_with_distributed_sampler_over_two_ranks_covers_every_index_once(generic, workers):
    out, split, reference = generic
    ds = wdsprep.MapDataset(out, split, decode=False)
    seen = []
    for rank in (0, 1):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=3)
        loader = DataLoader(ds, batch_size=8, sampler=sampler, num_workers=workers, collate_fn=_keys)
        seen += [key for batch in loader for key in batch]
    assert collections.Counter(seen) == collections.Counter(sample["__key__"] for sample in reference)


def test_dataloader_batches_are_read_by_getitems(generic):
    """torch's fetcher calls `__getitems__` with a batch: the samples of one shard are one read
    (they touch), not one each (counted in the main process: no workers)."""
    out, split, reference = generic
    first = [sample["__key__"] for sample in reference if sample["__shard__"] == reference[0]["__shard__"]]
    assert len(first) > 2
    ds = wdsprep.MapDataset(out, split, decode=False)
    ds.access.index(0)  # the first shard's index read beforehand
    before = ds.stats["reads"]
    batch = next(iter(DataLoader(ds, batch_size=len(first), collate_fn=_keys)))
    assert batch == first
    assert ds.stats["reads"] - before == 1


def test_spawned_workers_get_a_dataset_with_nothing_open(generic):
    """Pickled after it read (descriptors, threads and indexes of its own), the dataset carries
    none of them, and spawned DataLoader workers read every sample."""
    out, split, reference = generic
    ds = wdsprep.MapDataset(out, split, decode=False)
    ds.__getitems__([0, 50, 150])
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.stats["reads"] == 0
    same_raw(copy[50], reference[50])
    loader = DataLoader(ds, batch_size=16, num_workers=2, collate_fn=_keys, multiprocessing_context="spawn")
    assert [key for batch in loader for key in batch] == [sample["__key__"] for sample in reference]


def test_shards_without_an_index_are_hashed_whole_first(generic, tmp_path):
    """An older manifest (rows without index fields): a local shard is hashed against its row before
    its first sample, then read like an indexed one; a changed byte anywhere in it fails its reads."""
    out, split, reference = generic
    shards = tmp_path / "old"
    shutil.copytree(out, shards)
    manifest = json.loads((shards / "manifest.json").read_text())
    for row in manifest["splits"][split]["shards"]:
        for field in ("index_offset", "index_bytes", "index_digest"):
            del row[field]
    (shards / "manifest.json").write_text(json.dumps(manifest))
    ds = wdsprep.MapDataset(shards, split, decode=False)
    for i in (0, 11, 199):
        same_raw(ds[i], reference[i])
    path = shards / reference[35]["__shard__"]
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # in the end-of-archive blocks: no sample's bytes
    path.write_bytes(bytes(data))
    with pytest.raises(ShardError, match=rf"{reference[35]['__shard__']}: sha256 differs from the manifest row"):
        wdsprep.MapDataset(shards, split, decode=False)[35]
