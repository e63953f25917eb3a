"""The reader stage and collate: every chunk equals the spec's formulas applied to the npz files."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import webdataset as wds

import wdsprep
from wdsprep.errors import ConfigError
from wdsprep.shards.codec import Encoder
from wdsprep.sources.voxels import collate_ray_batch, graph_edges, samples
from wdsprep.sources.voxels.convert import build_fields

from .voxels_testdata import (
    SPEC_KEYS,
    brute_force_edges,
    chunk_count,
    convert_tiny,
    expected_splits,
    native_samples,
    spec_chunk,
)

RPC = 50


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    native, shards, manifest = convert_tiny(tmp_path_factory.mktemp("voxels_read"))
    return native, shards, manifest, native_samples(native)


def _stream(shards, split, **options):
    urls = wdsprep.urls(str(shards / "manifest.json"), split)
    return list(wds.WebDataset(urls, shardshuffle=False).compose(samples(**options)))


def _assert_matches_spec(sample, natives, mode, rays_per_chunk):
    level, name, chunk = sample["level"], sample["hash"], sample["chunk_idx"]
    native = natives[(level, name)]
    n = len(native["rays"]["origins"])
    start = chunk * rays_per_chunk if rays_per_chunk else 0
    end = min(start + rays_per_chunk, n) if rays_per_chunk else n
    want = spec_chunk(native, level, name, start, end, mode)
    assert set(sample) == SPEC_KEYS[mode]
    assert type(sample["level"]) is int and type(sample["hash"]) is str and type(sample["chunk_idx"]) is int
    for key, value in want.items():
        got = sample[key]
        if isinstance(value, np.ndarray):
            assert isinstance(got, torch.Tensor), key
            assert got.dtype == torch.from_numpy(value).dtype, (key, got.dtype, value.dtype)
            assert tuple(got.shape) == value.shape, (key, tuple(got.shape), value.shape)
            assert np.array_equal(got.numpy(), value), key
        else:
            assert got == value, key
    assert sample["origins"].shape == (end - start, 3)
    if mode == "graph":  # default connectivity 6, against a k-d tree neighbour search
        pairs = [tuple(e) for e in sample["voxel_edge_index"].T.tolist()]
        assert sample["voxel_edge_index"].dtype == torch.int64 and len(pairs) == len(set(pairs))
        assert set(pairs) == brute_force_edges(want["voxel_pos"], 6)


@pytest.mark.parametrize("mode", ["dense", "coo", "graph"])
def test_every_chunk_equals_the_spec_formulas(converted, mode):
    native, shards, manifest, natives = converted
    membership = expected_splits(native)
    for split in manifest.splits:
        out = _stream(shards, split, mode=mode, rays_per_chunk=RPC)
        for sample in out:
            _assert_matches_spec(sample, natives, mode, RPC)
        got = sorted((s["level"], s["hash"], s["chunk_idx"]) for s in out)
        want = sorted(
            (level, name, k)
            for level, name in membership[split]
            for k in range(chunk_count(len(natives[(level, name)]["rays"]["origins"]), RPC))
        )
        assert got == want


@pytest.mark.parametrize("connectivity", [6, 18, 26])
def test_graph_edges_equal_a_brute_force_neighbour_search(converted, connectivity):
    native, shards, manifest, natives = converted
    checked = 0
    for split in manifest.splits:
        for sample in _stream(shards, split, mode="graph", connectivity=connectivity):
            edges = sample["voxel_edge_index"]
            assert edges.dtype == torch.int64 and edges.shape[0] == 2
            pairs = [tuple(e) for e in edges.T.tolist()]
            assert len(pairs) == len(set(pairs)), "duplicate edges"
            assert all(a != b for a, b in pairs), "self-loops"
            assert set(pairs) == brute_force_edges(sample["voxel_pos"].numpy(), connectivity)
            checked += int(edges.shape[1] > 0)
    assert checked > 10


def test_graph_edges_on_random_grids():
    rng = np.random.default_rng(0)
    for trial in range(20):
        grid = rng.random((5, 6, 7)) < rng.uniform(0.05, 0.9)
        coords = np.argwhere(grid)
        pos = coords[:, ::-1].astype(np.float32)
        for connectivity in (6, 18, 26):
            edges = graph_edges(grid, coords, connectivity)
            pairs = [tuple(e) for e in edges.T.tolist()]
            assert len(pairs) == len(set(pairs))
            assert set(pairs) == brute_force_edges(pos, connectivity)
    assert graph_edges(np.zeros((3, 3, 3), bool), np.zeros((0, 3), np.int64), 26).shape == (2, 0)


def test_whole_subvolume_per_chunk_when_rays_per_chunk_is_none(converted):
    native, shards, manifest, natives = converted
    out = _stream(shards, "val", mode="coo")
    assert len(out) == manifest.samples("val")
    for sample in out:
        assert sample["chunk_idx"] == 0
        _assert_matches_spec(sample, natives, "coo", None)


def test_levels_filter_and_transform(converted):
    native, shards, manifest, natives = converted
    seen = []
    out = _stream(shards, "train", levels=[0, 2], rays_per_chunk=100, transform=lambda s: {**s, "tag": len(seen.append(1) or seen)})
    assert {s["level"] for s in out} == {0, 2}
    assert [s["tag"] for s in out] == list(range(1, len(out) + 1))


def _trivial_raw_sample(native, natives):
    """A shard sample for an all-empty (trivial) subvolume, which upstream never ray-traces."""
    import json

    doc = json.loads((native / "dataset" / "splits.json").read_text())
    empty = next(h for h in doc["trivial_hashes"] if len(h) == 64)
    level = next(int(p.parent.parent.name.split("_")[1]) for p in (native / "dataset" / "subvolumes").glob(f"level_*/*/{empty}.npz"))
    donor = next(v for (lvl, _), v in natives.items() if lvl == level)
    ray_file = native.parent / f"{empty}_rays.npz"
    np.savez(ray_file, **{k: v for k, v in donor["rays"].items() if k not in ("hash",)})
    voxel_file = native / "dataset" / "subvolumes" / f"level_{level}" / empty[:2] / f"{empty}.npz"
    fields = build_fields(level, empty, ray_file, voxel_file, True, ["train", "val", "test"], 16)
    members = Encoder().encode_fields(f"l{level}_{empty}", fields)
    return {"__key__": f"l{level}_{empty}", **dict(members)}, empty


def test_include_empty_keeps_trivial_subvolumes(converted):
    native, shards, manifest, natives = converted
    raw, empty = _trivial_raw_sample(native, natives)
    assert list(samples()([raw])) == []
    out = list(samples(include_empty=True, rays_per_chunk=RPC)([raw]))
    assert len(out) == chunk_count(176, RPC) and all(s["hash"] == empty for s in out)
    assert all(float(s["voxels"].sum()) == 0.0 for s in out)


def test_stage_accepts_decoded_samples_and_rejects_bad_options(converted):
    native, shards, manifest, natives = converted
    urls = wdsprep.urls(str(shards / "manifest.json"), "val")
    decoded = list(wds.WebDataset(urls, shardshuffle=False).compose(wdsprep.decode(), samples(mode="coo")))
    raw = _stream(shards, "val", mode="coo")
    assert [(s["hash"], s["chunk_idx"]) for s in decoded] == [(s["hash"], s["chunk_idx"]) for s in raw]
    for bad in (dict(mode="sparse"), dict(connectivity=8), dict(rays_per_chunk=0)):
        with pytest.raises(ConfigError):
            samples(**bad)


# ---------------------------------------------------------------------------------- collate
def _mixed_levels(shards, mode):
    out = _stream(shards, "train", mode=mode, rays_per_chunk=RPC)
    by_level = {}
    for sample in out:
        by_level.setdefault(sample["level"], []).append(sample)
    return [by_level[0][0], by_level[2][1], by_level[1][0], by_level[2][3]]


def test_collate_dense_pads_with_zeros_at_the_high_end(converted):
    native, shards, manifest, natives = converted
    batch = _mixed_levels(shards, "dense")
    out = collate_ray_batch(batch)
    total = sum(len(s["origins"]) for s in batch)
    assert set(out) == {"origins", "directions", "distances", "hits", "voxels", "ray_to_voxel", "levels", "hashes",
                        "view_ids", "face_ids", "view_positions"}
    for name, width in (("origins", 3), ("directions", 3), ("view_positions", 3)):
        assert out[name].shape == (total, width)
    for name in ("distances", "hits", "view_ids", "face_ids"):
        assert out[name].shape == (total,)
    assert out["voxels"].shape == (4, 1, 16, 16, 16) and out["voxels"].dtype == torch.float32
    assert out["ray_to_voxel"].dtype == torch.int64
    assert out["ray_to_voxel"].tolist() == sum(([b] * len(s["origins"]) for b, s in enumerate(batch)), [])
    assert out["levels"].dtype == torch.int64 and out["levels"].tolist() == [s["level"] for s in batch]
    assert out["hashes"] == [s["hash"] for s in batch]
    for b, sample in enumerate(batch):
        d = sample["voxels"].shape[1]
        assert torch.equal(out["voxels"][b, :, :d, :d, :d], sample["voxels"])
        assert float(out["voxels"][b].sum()) == float(sample["voxels"].sum())  # the rest is zero
        rows = out["ray_to_voxel"] == b
        assert torch.equal(out["distances"][rows], sample["distances"])


@pytest.mark.parametrize("mode", ["coo", "graph"])
def test_collate_sparse_concatenates_nodes_and_offsets_edges(converted, mode):
    native, shards, manifest, natives = converted
    batch = _mixed_levels(shards, mode)
    out = collate_ray_batch(batch)
    nodes = [len(s["voxel_pos"]) for s in batch]
    assert out["voxel_pos"].shape == (sum(nodes), 3) and out["voxel_features"].shape == (sum(nodes), 1)
    assert out["voxel_batch"].tolist() == sum(([b] * n for b, n in enumerate(nodes)), [])
    assert torch.equal(out["voxel_shapes"], torch.stack([s["voxel_shape"] for s in batch]))
    assert "voxels" not in out
    if mode == "graph":
        offset = 0
        edges = out["voxel_edge_index"]
        assert edges.shape[1] == sum(s["voxel_edge_index"].shape[1] for s in batch)
        for b, sample in enumerate(batch):
            mine = edges[:, out["voxel_batch"][edges[0]] == b]
            assert torch.equal(mine - offset, sample["voxel_edge_index"])
            assert bool((out["voxel_batch"][mine[1]] == b).all())
            offset += nodes[b]


def test_streaming_batches_with_collate(converted):
    native, shards, manifest, natives = converted
    urls = wdsprep.urls(str(shards / "manifest.json"), "train")
    pipeline = wds.WebDataset(urls, shardshuffle=False).compose(samples(mode="graph", rays_per_chunk=RPC))
    batches = list(pipeline.batched(8, collation_fn=collate_ray_batch))
    chunks = _stream(shards, "train", mode="graph", rays_per_chunk=RPC)
    assert all(len(b["hashes"]) == 8 for b in batches[:-1])
    assert sum(len(b["hashes"]) for b in batches) == len(chunks)
    first = collate_ray_batch(chunks[:8])  # 176 rays -> chunks of 50, 50, 50, 26
    assert batches[0]["origins"].shape[0] == batches[0]["ray_to_voxel"].shape[0] == sum(len(c["origins"]) for c in chunks[:8])
    for name in ("origins", "distances", "voxel_pos", "voxel_edge_index", "voxel_batch", "ray_to_voxel"):
        assert torch.equal(batches[0][name], first[name])


def test_wdsprep_dataset_streams_the_same_chunks(converted):
    native, shards, manifest, natives = converted
    plain = {(s["hash"], s["chunk_idx"]) for s in _stream(shards, "train", rays_per_chunk=RPC)}
    pipeline = wdsprep.dataset(str(shards / "manifest.json"), "train", seed=3, epoch=0)
    streamed = [(s["hash"], s["chunk_idx"]) for s in pipeline.compose(samples(rays_per_chunk=RPC))]
    assert len(streamed) == len(plain) and set(streamed) == plain
