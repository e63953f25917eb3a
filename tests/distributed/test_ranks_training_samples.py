"""Expanding reader stages under 3 ranks x 2 workers: with `outputs_per_sample` from the manifest
(Minecraft pairs per episode window, voxel ray chunks per subvolume), every rank makes the same
number of batches without `Join`, and together the ranks yield every training sample. The expected
training samples come from a plain webdataset pass over all shards with the same stage."""
import collections

import pytest
import webdataset as wds

import wdsprep
from wdsprep.conversion import convert
from wdsprep.sources.minecraft import SOURCE as MINECRAFT
from wdsprep.sources.voxels import SOURCE as VOXELS
from wdsprep.testing import RangeHTTPServer

from .test_distributed_ddp import torchrun
from tests.core.test_plan_oracle import simulated_worker

WORLD, WORKERS, BATCH = 3, 2, 4


@pytest.fixture(scope="module")
def minecraft_manifest(tmp_path_factory):
    root = tmp_path_factory.mktemp("mc")
    MINECRAFT.synth(str(root / "in"), 0, "small")
    convert("minecraft", str(root / "in"), str(root / "out"), shard_bytes="20KB", window_frames=12, window_overlap=4)
    return str(root / "out" / "manifest.json")


@pytest.fixture(scope="module")
def voxels_manifest(tmp_path_factory):
    root = tmp_path_factory.mktemp("vx")
    VOXELS.synth(str(root / "in"), 0, "small")
    convert("voxels", str(root / "in"), str(root / "out"), shard_bytes="100KB")
    return str(root / "out" / "manifest.json")


def _batches_per_worker(manifest, split, stage, counts, identity, equalize):
    """[rank][worker] -> list of batches of training-sample identities."""
    table = []
    for rank in range(WORLD):
        row = []
        for worker in range(WORKERS):
            dataset = wdsprep.dataset(manifest, split, rank=rank, world_size=WORLD, seed=1, epoch=0,
                                      equalize=equalize, outputs_per_sample=counts).compose(stage)
            with simulated_worker(worker, WORKERS):  # what a DataLoader worker sees
                items = [identity(s) for s in dataset]
            row.append([items[i : i + BATCH] for i in range(0, len(items), BATCH)])
        table.append(row)
    return table


def _check(table, everything, equalize):
    for worker in range(WORKERS):  # each worker batches its own stream: equal per worker, equal per rank
        assert len({len(row[worker]) for row in table}) == 1, [[len(w) for w in row] for row in table]
    got = collections.Counter(i for row in table for worker in row for batch in worker for i in batch)
    if equalize == "pad":
        assert set(got) == set(everything)
    else:
        assert all(c == 1 for c in got.values()) and set(got) <= set(everything)


@pytest.mark.parametrize("equalize", ["pad", "drop"])
@pytest.mark.parametrize("history_length", [1, 4])
def test_minecraft_pairs_balanced_over_three_ranks(minecraft_manifest, history_length, equalize):
    stage = wdsprep.minecraft.pairs(history_length=history_length)
    urls = wdsprep.urls(minecraft_manifest, "train")
    assert len(urls) >= 3
    everything = [p["__key__"] for p in wds.WebDataset(urls, shardshuffle=False).compose(stage)]
    assert len(everything) == len(set(everything)) > 0
    counts = wdsprep.minecraft.pair_counts(history_length=history_length)
    table = _batches_per_worker(minecraft_manifest, "train", stage, counts, lambda p: p["__key__"], equalize)
    _check(table, everything, equalize)
    whole = wdsprep.dataset(minecraft_manifest, "train", outputs_per_sample=counts)
    assert sum(whole.shard_weights[s].sum() for s in range(len(urls))) == len(everything)


@pytest.mark.parametrize("equalize", ["pad", "drop"])
def test_voxel_ray_chunks_balanced_over_three_ranks(voxels_manifest, equalize):
    stage = wdsprep.voxels.samples(rays_per_chunk=7)
    urls = wdsprep.urls(voxels_manifest, "val")
    assert len(urls) >= 3

    def identity(sample):
        return (sample["level"], sample["hash"], sample["chunk_idx"])

    everything = [identity(s) for s in wds.WebDataset(urls, shardshuffle=False).compose(stage)]
    assert len(everything) == len(set(everything)) > 0
    counts = wdsprep.voxels.chunk_counts(rays_per_chunk=7)
    table = _batches_per_worker(voxels_manifest, "val", stage, counts, identity, equalize)
    _check(table, everything, equalize)


def test_torchrun_three_ranks_train_on_minecraft_pairs_without_join(minecraft_manifest, tmp_path):
    """Real DDP (gloo) over HTTP: every step all-reduces gradients, so a rank with one batch more
    would hang the run (the loader's 60 s timeout and torchrun's limit turn that into a failure)."""
    history = 4
    stage = wdsprep.minecraft.pairs(history_length=history)
    everything = {p["__key__"] for p in wds.WebDataset(wdsprep.urls(minecraft_manifest, "train"), shardshuffle=False).compose(stage)}
    root = minecraft_manifest.rsplit("/", 1)[0]
    with RangeHTTPServer(root) as server:
        ranks = torchrun(f"{server.url}/manifest.json", tmp_path / "run", {}, "--pairs", str(history),
                         "--seed", "3", "--epoch", "0", "--workers", "2", nproc=WORLD)
    assert [r["violations"] for r in ranks] == [[]] * WORLD
    assert len({len(r["epoch"]) for r in ranks}) == 1  # equal batch counts, no Join
    assert ranks[0]["all_counts"] == ranks[1]["all_counts"] == ranks[2]["all_counts"]
    keys = [k for r in ranks for batch in r["epoch"] for k in batch]
    assert set(keys) == everything
    assert len(keys) - len(everything) <= WORLD * 2 * (12 - history)  # repeats: at most a window's pairs per worker
