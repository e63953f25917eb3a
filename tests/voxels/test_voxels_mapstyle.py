"""The map-style drop-in: chunk counts, level distribution, random access through the tar index,
LRU cache, RayBatchSampler + DataLoader, and the same samples as the streaming stage."""
from __future__ import annotations

import collections
import tarfile

import numpy as np
import pytest
import torch
import webdataset as wds
from torch.utils.data import DataLoader

import wdsprep
from wdsprep.errors import ConfigError, WdsprepError
from wdsprep.shards.tarformat import index_samples
from wdsprep.sources.voxels import (
    HierarchicalVoxelRayDataset,
    RayBatchSampler,
    collate_ray_batch,
    mapstyle,
    samples,
)

from .voxels_testdata import chunk_count, convert_tiny, expected_splits, native_samples


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    native, shards, manifest = convert_tiny(tmp_path_factory.mktemp("voxels_map"))
    return native, shards, manifest, native_samples(native), expected_splits(native)


@pytest.mark.parametrize("rays_per_chunk", [None, 50, 7])
def test_len_is_the_number_of_chunks(converted, rays_per_chunk):
    native, shards, manifest, natives, membership = converted
    for split in ("train", "test"):
        ds = HierarchicalVoxelRayDataset(shards, split=split, rays_per_chunk=rays_per_chunk)
        want = sum(chunk_count(len(natives[m]["rays"]["origins"]), rays_per_chunk) for m in membership[split])
        assert len(ds) == want
        assert ds.get_level_distribution() == dict(collections.Counter(level for level, _ in membership[split]))


def test_levels_select_subvolumes(converted):
    native, shards, manifest, natives, membership = converted
    ds = HierarchicalVoxelRayDataset(shards / "manifest.json", split="train", levels=[1, 2], rays_per_chunk=50)
    assert set(ds.get_level_distribution()) == {1, 2}
    assert len(ds) == sum(chunk_count(len(natives[m]["rays"]["origins"]), 50) for m in membership["train"] if m[0] in (1, 2))
    with pytest.raises(ConfigError, match="no samples found"):
        HierarchicalVoxelRayDataset(shards, split="train", levels=[9])
    with pytest.raises(WdsprepError, match="no split 'holdout'"):
        HierarchicalVoxelRayDataset(shards, split="holdout")


@pytest.mark.parametrize(
    "options, mode",
    [({}, "dense"), ({"sparse_voxels": True, "sparse_mode": "coo"}, "coo"),
     ({"sparse_voxels": True, "sparse_mode": "graph", "sparse_connectivity": 18}, "graph")],
)
def test_map_style_and_streaming_give_the_same_samples(converted, options, mode):
    native, shards, manifest, natives, membership = converted
    ds = HierarchicalVoxelRayDataset(shards, split="val", rays_per_chunk=50, **options)
    urls = wdsprep.urls(str(shards / "manifest.json"), "val")
    stage = samples(mode=mode, rays_per_chunk=50, connectivity=options.get("sparse_connectivity", 6))
    streamed = {(s["hash"], s["chunk_idx"]): s for s in wds.WebDataset(urls, shardshuffle=False).compose(stage)}
    order = np.random.default_rng(0).permutation(len(ds))  # random access, not a scan
    got = {}
    for index in order:
        sample = ds[int(index)]
        got[(sample["hash"], sample["chunk_idx"])] = sample
    assert set(got) == set(streamed) and len(got) == len(ds)
    for key, sample in got.items():
        other = streamed[key]
        assert set(sample) == set(other)
        for name, value in sample.items():
            if isinstance(value, torch.Tensor):
                assert value.dtype == other[name].dtype and torch.equal(value, other[name]), name
            else:
                assert value == other[name], name


def test_tar_index_matches_tarfile(converted):
    native, shards, manifest, natives, membership = converted
    path = str(shards / manifest.shards("train")[0]["name"])
    index = index_samples(path)
    with tarfile.open(path) as archive:
        members = [m for m in archive.getmembers() if m.isfile() and not m.name.startswith("__")]  # not the sample index
    flat = [(f"{key}.{field}", offset, size) for key, fields in index for field, (offset, size) in fields.items()]
    assert flat == [(m.name, m.offset_data, m.size) for m in members]
    assert len(index) == manifest.shards("train")[0]["samples"]


def test_random_access_reads_only_that_sample(converted, monkeypatch):
    native, shards, manifest, natives, membership = converted
    ds = HierarchicalVoxelRayDataset(shards, split="train", rays_per_chunk=50)
    reads = []
    real_pread = mapstyle.os.pread

    def counting_pread(fd, size, offset):
        reads.append((fd, size, offset))
        return real_pread(fd, size, offset)

    monkeypatch.setattr(mapstyle.os, "pread", counting_pread)
    index = len(ds) // 2
    ds[index]
    number = int(ds._chunk_sample[index])
    sample = ds.samples[number]
    with tarfile.open(ds.shard_paths[sample["shard"]]) as archive:  # the sample's bytes: its members' headers to padding
        members = [m for m in archive.getmembers() if m.name.split(".", 1)[0] == sample["key"]]
    low, high = min(m.offset for m in members), max(m.offset_data + -(-m.size // 512) * 512 for m in members)
    assert reads and all(low <= offset and offset + size <= high for _, size, offset in reads)
    assert sum(size for _, size, _ in reads) < 0.2 * sum(s["bytes"] for s in manifest.shards("train"))


def test_voxel_cache_is_lru(converted):
    native, shards, manifest, natives, membership = converted
    ds = HierarchicalVoxelRayDataset(shards, split="train", rays_per_chunk=None, cache_size=2)
    a, b, c = 0, 1, 2  # rays_per_chunk=None: chunk i is subvolume i
    for index in (a, b, a, c):
        ds[index]
    assert list(ds._voxel_cache) == [a, c]  # the hit on a refreshed it, so b was evicted (FIFO would evict a)
    assert (ds.cache_hits, ds.cache_misses) == (1, 3)
    ds[a]
    assert ds.cache_hits == 2
    uncached = HierarchicalVoxelRayDataset(shards, split="train", cache_size=0)
    uncached[0], uncached[0]
    assert len(uncached._voxel_cache) == 0 and uncached.cache_misses == 2


def test_ray_batch_sampler(converted):
    native, shards, manifest, natives, membership = converted
    ds = HierarchicalVoxelRayDataset(shards, split="val", rays_per_chunk=50)
    batches = list(RayBatchSampler(ds, batch_size=8, shuffle=False, drop_last=False))
    assert [i for batch in batches for i in batch] == list(range(len(ds)))
    assert len(list(RayBatchSampler(ds, batch_size=8, shuffle=True, drop_last=True))) == len(ds) // 8
    first = list(RayBatchSampler(ds, 4, True, generator=torch.Generator().manual_seed(1)))
    again = list(RayBatchSampler(ds, 4, True, generator=torch.Generator().manual_seed(1)))
    assert first == again and sorted(i for b in first for i in b) == list(range(len(ds)))


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_with_sampler_and_collate(converted, workers):
    native, shards, manifest, natives, membership = converted
    ds = HierarchicalVoxelRayDataset(shards, split="train", levels=[1, 2], rays_per_chunk=64,
                                     sparse_voxels=True, sparse_mode="graph", sparse_connectivity=6)
    sampler = RayBatchSampler(ds, batch_size=6, shuffle=True, drop_last=True, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(ds, batch_sampler=sampler, collate_fn=collate_ray_batch, num_workers=workers)
    seen = 0
    for batch, indices in zip(loader, RayBatchSampler(ds, 6, True, True, generator=torch.Generator().manual_seed(0))):
        want = collate_ray_batch([ds[i] for i in indices])
        assert batch["hashes"] == want["hashes"]
        for name in ("origins", "distances", "ray_to_voxel", "levels", "voxel_pos", "voxel_batch", "voxel_edge_index"):
            assert torch.equal(batch[name], want[name]), name
        seen += 1
    assert seen == len(ds) // 6


def test_dense_batch_from_dataloader(converted):
    native, shards, manifest, natives, membership = converted
    ds = HierarchicalVoxelRayDataset(shards, split="test", rays_per_chunk=100)
    loader = DataLoader(ds, batch_size=4, shuffle=False, collate_fn=collate_ray_batch)
    batch = next(iter(loader))
    sizes = [ds[i]["voxels"].shape[-1] for i in range(4)]
    assert batch["voxels"].shape == (4, 1, max(sizes), max(sizes), max(sizes))
    assert batch["origins"].shape[0] == sum(len(ds[i]["origins"]) for i in range(4))


def test_explicit_shard_list(converted):
    native, shards, manifest, natives, membership = converted
    paths = [shards / row["name"] for row in manifest.shards("test")]
    by_list = HierarchicalVoxelRayDataset(paths, rays_per_chunk=50)
    by_manifest = HierarchicalVoxelRayDataset(shards, split="test", rays_per_chunk=50)
    assert len(by_list) == len(by_manifest)
    assert [by_list[i]["hash"] for i in range(len(by_list))] == [by_manifest[i]["hash"] for i in range(len(by_list))]


def _same_chunk(got: dict, expected: dict) -> None:
    assert set(got) == set(expected)
    for name, value in got.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, expected[name]), name
        else:
            assert value == expected[name], name


def test_a_flipped_byte_in_any_member_is_a_shard_error_before_its_sample(tmp_path):
    """Converted by the CLI without compression (a changed byte decodes as well as the right one):
    one byte flipped in each member of each sample in turn, the map-style dataset raises a
    ShardError naming that shard, and every chunk it gave before is the intact shards' own."""
    from wdsprep.conformance import run_cli, tar_samples

    from tests.core.shardsets import each_member_flipped, same_until_error

    from .voxels_testdata import make_tiny

    native = make_tiny(tmp_path / "native", seed=1)
    status, _, err = run_cli("convert", "voxels", native, tmp_path / "out", "--codec", "none", "--shard-bytes", "150KB", "--quiet")
    assert status == 0, err
    options = dict(split="val", rays_per_chunk=None, include_empty=True)  # every sample, one chunk each
    expected = [sample for sample in HierarchicalVoxelRayDataset(tmp_path / "out", **options)]
    order = [key for path in sorted((tmp_path / "out").glob("val-*.tar")) for key, _ in tar_samples(path)]
    assert len(order) == len(expected) == 23  # one chunk per sample, in shard order
    cases = 0
    for path, key, member in each_member_flipped(tmp_path / "out", "val-*.tar"):
        cases += 1
        try:
            dataset = HierarchicalVoxelRayDataset(tmp_path / "out", **options)
        except wdsprep.ShardError as error:  # meta.mp is read when the dataset opens
            assert member == "meta.mp" and path.name in str(error), (key, member, error)
            continue
        count, error = same_until_error((dataset[i] for i in range(len(dataset))), expected, _same_chunk)
        assert error is not None and path.name in str(error), (key, member)
        assert count == order.index(key), (key, member)  # every chunk before that sample's, and not its own
        dataset.close()
    assert cases == 3 * 23


def test_older_shards_without_an_index_are_hashed_whole_when_the_dataset_opens(tmp_path):
    """An older conversion (shards without their index): the map-style dataset hashes each shard
    against its row when it opens, then gives what it gives on the indexed shards, from the manifest
    or from a list of the tar files (their rows from the manifest beside them); a flipped byte is a
    ShardError naming the shard before any sample."""
    import shutil

    from wdsprep.conformance import run_cli

    from tests.core.shardsets import each_member_flipped, make_older

    from .voxels_testdata import make_tiny

    current, older = tmp_path / "current", tmp_path / "older"
    status, _, err = run_cli("convert", "voxels", make_tiny(tmp_path / "native", seed=1), current, "--quiet")
    assert status == 0, err
    shutil.copytree(current, older)
    make_older(older)
    options = dict(split="val", rays_per_chunk=50, include_empty=True)
    expected = [sample for sample in HierarchicalVoxelRayDataset(current, **options)]
    for location in (older, sorted(older.glob("val-*.tar"))):
        got = HierarchicalVoxelRayDataset(location, **options)
        assert len(got) == len(expected)
        for i, want in enumerate(expected):
            _same_chunk(got[i], want)
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(current / "val-00000-00.tar", alone)  # no manifest beside it: nothing to check it against
    with pytest.raises(wdsprep.ShardError, match="val-00000-00.tar: no manifest beside it lists it"):
        HierarchicalVoxelRayDataset([alone / "val-00000-00.tar"], **options)
    flips = each_member_flipped(older, "val-*.tar", keep=lambda key, member: member.startswith("rays."))
    path, _, _ = next(flips)
    with pytest.raises(wdsprep.ShardError, match=rf"{path.name}: sha256 differs"):
        HierarchicalVoxelRayDataset(older, **options)
    flips.close()


def test_map_style_over_http(converted):
    """The same chunks from the shards served over HTTP (read by Range requests through
    wdsprep.MapDataset) as from the local directory, and over a list of shard URLs."""
    from wdsprep.testing import RangeHTTPServer

    native, shards, manifest, natives, membership = converted
    local = HierarchicalVoxelRayDataset(shards, split="val", rays_per_chunk=50)
    with RangeHTTPServer(shards) as server:
        remote = HierarchicalVoxelRayDataset(server.url_of("manifest.json"), split="val", rays_per_chunk=50)
        assert len(remote) == len(local)
        for index in np.random.default_rng(1).permutation(len(local))[:40]:
            _same_chunk(remote[int(index)], local[int(index)])
        listed = HierarchicalVoxelRayDataset([server.url_of(row["name"]) for row in manifest.shards("val")], rays_per_chunk=50)
        _same_chunk(listed[len(local) - 1], local[len(local) - 1])
        assert all(r["range"] for r in server.requests if r["name"].endswith(".tar"))
