"""The user's story on the real data.zip: convert, stream pairs, compare with the upstream loader."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import webdataset as wds

import wdsprep
from wdsprep.conversion import convert

from .minecraft_testdata import upstream_pairs

REAL_LENGTHS = {"creative:0": 30, "creative:1": 84, "creative:2": 58, "creative:3": 83, "creative:4": 56,
                "creative:5": 68, "creative:6": 88, "creative:7": 10, "creative:8": 52, "creative:9": 78}


def stream(manifest, **options):
    urls = wdsprep.urls(manifest.url, "train")
    return list(wds.WebDataset(urls, shardshuffle=False).compose(wdsprep.minecraft.pairs(**options)))


def test_real_counts_episodes_frames_and_vocabulary(real_converted):
    manifest, _ = real_converted
    episodes = manifest.tables["episodes"]
    assert {row["episode"]: row["frames"] for row in episodes} == REAL_LENGTHS
    assert sum(row["frames"] for row in episodes) == 607
    assert [row["key"] for row in episodes] == [f"creative_{n}" for n in range(10)]
    assert manifest.tables["gaps"] == [] and manifest.problems == []
    assert sum(row["samples"] for row in manifest.splits["train"]) == 10
    assert len(manifest.tables["blocks"]) == 21 and manifest.tables["blocks"][0] == "air"


@pytest.mark.parametrize("history_length, expected", [(1, 597), (10, 507)])
def test_real_pairs_equal_upstream_loader(real_converted, real_flat_dir, history_length, expected):
    manifest, _ = real_converted
    vocab = wdsprep.minecraft.vocabulary(manifest)
    ours = stream(manifest, task="frame_prediction", history_length=history_length)
    theirs = upstream_pairs(real_flat_dir / "data", history_length=history_length)
    assert len(ours) == len(theirs) == expected
    for pair, item in zip(ours, theirs):
        assert pair["episode"] == item["episode"]
        assert pair["t"] - history_length + 1 == item["history_start_index"]
        # names round-trip exactly: decoding the ids gives the source '<U11' arrays
        assert np.array_equal(vocab.decode(pair["voxel"]), item["x_raw"])
        assert np.array_equal(vocab.decode(pair["target"]), item["z_raw"])
        assert pair["action"].dtype == torch.int64 and pair["action"].tolist() == item["y_raw"].tolist()
        if history_length > 1:
            assert len(pair["history_voxels"]) == len(item["history_raw"]) == history_length - 1
            for ours_frame, raw in zip(pair["history_voxels"], item["history_raw"]):
                assert np.array_equal(vocab.decode(ours_frame), raw)
            assert pair["history_actions"].tolist() == [a.tolist() for a in item["history_actions_raw"]]


def test_real_action_recognition_and_no_pair_across_episodes(real_converted):
    manifest, _ = real_converted
    pairs = stream(manifest, task="action_recognition")
    assert len(pairs) == 597
    keys = [p["__key__"] for p in pairs]
    assert len(set(keys)) == len(keys)
    per_episode: dict[str, list[int]] = {}
    for pair in pairs:
        assert set(pair) >= {"voxel", "next_voxel", "target", "episode", "t"}
        per_episode.setdefault(pair["episode"], []).append(pair["t"])
    # every episode gives exactly its own T-1 transitions 0..T-2: none reaches into another episode
    assert per_episode == {name: list(range(length - 1)) for name, length in REAL_LENGTHS.items()}


def test_real_max_episodes_matches_upstream_cap(real_converted, real_flat_dir):
    manifest, _ = real_converted
    ours = stream(manifest, history_length=10, max_episodes=8)
    theirs = upstream_pairs(real_flat_dir / "data", history_length=10, max_creative_scenes=8)
    assert len(ours) == len(theirs) == 507 - (52 - 10) - (78 - 10)
    assert [p["episode"] for p in ours] == [i["episode"] for i in theirs]


def test_real_flat_zip_flat_dir_and_bucketed_dir_give_identical_shards(real_converted, real_flat_dir,
                                                                       real_bucketed_dir, tmp_path):
    manifest, output = real_converted
    reference = {row["name"]: row["sha256"] for row in manifest.splits["train"]}
    for name, native in (("flat", real_flat_dir), ("buckets", real_bucketed_dir)):
        other = convert("minecraft", str(native), str(tmp_path / name))
        assert {row["name"]: row["sha256"] for row in other.splits["train"]} == reference
        assert other.fingerprint == manifest.fingerprint
        assert other.tables == manifest.tables
        for shard in reference:
            assert (tmp_path / name / shard).read_bytes() == (output / shard).read_bytes()


def test_real_windows_overlapping_by_one_frame_keep_every_pair(real_zip, real_converted, tmp_path):
    manifest, _ = real_converted
    windowed = convert("minecraft", str(real_zip), str(tmp_path / "w"), window_frames=20, window_overlap=1,
                       shard_bytes=40_000)
    assert len(windowed.splits["train"]) > 1
    assert sum(row["samples"] for row in windowed.splits["train"]) > 10
    whole = stream(manifest)
    cut = stream(windowed)
    assert [p["__key__"] for p in cut] == [p["__key__"] for p in whole]
    for a, b in zip(cut, whole):
        assert torch.equal(a["voxel"], b["voxel"]) and torch.equal(a["target"], b["target"])
        assert torch.equal(a["action"], b["action"])
    with pytest.raises(wdsprep.ConfigError, match="overlap"):
        stream(windowed, history_length=2)


def test_real_shards_far_smaller_than_native(real_converted, real_zip):
    manifest, _ = real_converted
    shard_bytes = sum(row["bytes"] for row in manifest.splits["train"])
    # 407,943 bytes a frame; each episode's last frame holds an int32 action, 12 bytes less
    assert manifest.input_bytes == 607 * 407_943 - 10 * 12
    assert manifest.input_bytes / shard_bytes >= 50
    assert shard_bytes < real_zip.stat().st_size  # smaller than the deflated zip as well


def test_real_map_style_dataset_is_a_drop_in(real_converted, real_flat_dir):
    manifest, output = real_converted
    dataset = wdsprep.minecraft.MinecraftPairs(str(output), history_length=10)
    theirs = upstream_pairs(real_flat_dir / "data", history_length=10)
    assert len(dataset) == len(theirs) == 507
    for index in (0, 1, 250, 506):
        assert dataset[index]["episode"] == theirs[index]["episode"]
        assert np.array_equal(dataset.vocabulary.decode(dataset[index]["target"]), theirs[index]["z_raw"])
    loader = torch.utils.data.DataLoader(dataset, batch_size=16, shuffle=True, collate_fn=wdsprep.minecraft.collate,
                                         generator=torch.Generator().manual_seed(0))
    batch = next(iter(loader))
    assert batch["voxel"].shape == (16, 21, 21, 21) and batch["history_voxels"].shape == (16, 9, 21, 21, 21)
    assert sum(len(b["t"]) for b in loader) == 507
