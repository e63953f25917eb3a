"""The reader side: pairing rules, windows, crop, text renderings, vocabulary and collate."""
from __future__ import annotations

import pickle
import tarfile

import numpy as np
import pytest
import torch
import webdataset as wds
from hypothesis import given, settings
from hypothesis import strategies as st

import wdsprep
from wdsprep.conversion import convert
from wdsprep.errors import ConfigError
from wdsprep.shards.codec import Encoder
from wdsprep.sources.minecraft import (
    Vocabulary,
    action_to_text,
    collate,
    collate_fn,
    pairs,
    vocabulary,
    voxel_to_text,
)
from wdsprep.sources.minecraft.convert import windows

from .minecraft_testdata import make_episode_dir, upstream_pairs

NAMES = ["air", "dirt", "grass block", "stone", "water"]


# ------------------------------------------------------------------- upstream text, restated
def reference_voxel2word(voxel, size=5):
    voxel_size = voxel.shape[0]
    assert voxel_size >= size
    n = int((size - 1) / 2)
    origin = int((voxel_size - 1) / 2)
    voxel = voxel[origin - n:origin + n + 1, origin - n:origin + n + 1, origin - n:origin + n + 1]
    word = ""
    for y in range(voxel.shape[1]):
        for x in range(voxel.shape[0]):
            for z in range(voxel.shape[2]):
                word += f"|{voxel[x, y, z]}"
            word += "|\n"
    return word


def reference_action2word(action):
    word = "straight: " + {0: "noop\n", 1: "forward\n", 2: "backward\n"}[action[0]]
    word += "pan: " + {0: "noop\n", 1: "left\n", 2: "right\n"}[action[1]]
    word += "jump: " + {0: "noop\n", 1: "jump\n"}[action[2]]
    return word


def random_names(side, seed=0):
    rng = np.random.default_rng(seed)
    return np.asfortranarray(np.array(NAMES)[rng.integers(len(NAMES), size=(side,) * 3)])


@pytest.mark.parametrize("size", [1, 3, 4, 5, 7, 9])
def test_voxel_to_text_matches_voxel2word_on_names_and_ids(size):
    names = random_names(9, seed=size)
    vocab = Vocabulary(NAMES)
    ids = torch.from_numpy(vocab.encode(names).astype(np.uint8))
    expected = reference_voxel2word(names, size)
    assert voxel_to_text(names, size=size) == expected
    assert voxel_to_text(ids, vocab, size=size) == expected
    assert voxel_to_text(ids.numpy(), NAMES, size=size) == expected
    assert expected.count("\n") == (2 * int((size - 1) / 2) + 1) ** 2


def test_voxel_to_text_errors():
    with pytest.raises(ValueError, match="pass the vocabulary"):
        voxel_to_text(np.zeros((5, 5, 5), np.uint8))
    with pytest.raises(ValueError, match="smaller than the text window"):
        voxel_to_text(random_names(3), size=5)


def test_action_to_text_matches_action2word_for_every_action():
    for straight in range(3):
        for pan in range(3):
            for jump in range(2):
                action = [straight, pan, jump]
                assert action_to_text(torch.tensor(action)) == reference_action2word(action)
                assert action_to_text(np.array(action, np.int32)) == reference_action2word(action)
    with pytest.raises(ValueError, match="out of range"):
        action_to_text([3, 0, 0])


# ------------------------------------------------------------------- in-memory samples
def raw_sample(key, voxels, actions, first_frame=0, new_from=0, episode="creative:1", episode_index=0):
    fields = {
        "voxels": voxels,
        "actions": actions.astype(np.int8),
        "meta": {"episode": episode, "episode_index": episode_index, "segment": 0, "window": 0,
                 "first_frame": first_frame, "new_from": new_from},
    }
    return {"__key__": key, **dict(Encoder().encode_fields(key, fields))}


def test_pairs_on_raw_in_memory_samples_follow_upstream_indices():
    rng = np.random.default_rng(1)
    voxels = rng.integers(5, size=(12, 5, 5, 5)).astype(np.uint8)
    actions = rng.integers(2, size=(12, 3))
    sample = raw_sample("creative_1-000000", voxels, actions)
    for history in (1, 3, 11, 12):
        out = list(pairs(history_length=history)([sample]))
        assert [p["t"] for p in out] == list(range(history - 1, 11))  # targets H-1 .. T-2 like upstream
        for p in out:
            t = p["t"]
            assert torch.equal(p["voxel"], torch.from_numpy(voxels[t]))
            assert torch.equal(p["target"], torch.from_numpy(voxels[t + 1]))
            assert p["action"].tolist() == actions[t].tolist()
            assert p["__key__"] == f"creative_1-{t:06d}"
            if history > 1:
                assert p["history_start"] == t - history + 1
                assert torch.equal(p["history_voxels"], torch.from_numpy(voxels[t - history + 1:t]))
                assert p["history_actions"].tolist() == actions[t - history + 1:t].tolist()
            else:
                assert "history_voxels" not in p


def test_pairs_accepts_decoded_samples_and_action_recognition():
    voxels = np.arange(4 * 27, dtype=np.uint8).reshape(4, 3, 3, 3)
    actions = np.array([[1, 0, 0], [0, 1, 0], [2, 2, 1], [0, 0, 0]])
    decoded = wdsprep.decode_sample(raw_sample("creative_1-000005", voxels, actions, first_frame=5))
    out = list(pairs(task="action_recognition")([decoded]))
    assert [p["t"] for p in out] == [5, 6, 7]
    assert [p["target"].tolist() for p in out] == actions[:3].tolist()
    assert torch.equal(out[2]["next_voxel"], torch.from_numpy(voxels[3]))
    assert "action" not in out[0]


def test_continuation_window_starts_after_its_overlap():
    voxels = np.zeros((6, 3, 3, 3), np.uint8)
    sample = raw_sample("creative_1-000010", voxels, np.zeros((6, 3)), first_frame=10, new_from=2)
    assert [p["t"] for p in pairs()([sample])] == [11, 12, 13, 14]  # 10->11 belongs to the previous window
    assert [p["t"] for p in pairs(history_length=2)([sample])] == [11, 12, 13, 14]
    with pytest.raises(ConfigError, match="overlap by at least 3"):
        list(pairs(history_length=3)([sample]))


def test_crop_centre_like_voxel2word():
    names = random_names(9, seed=4)
    vocab = Vocabulary(NAMES)
    ids = np.stack([vocab.encode(names)] * 2).astype(np.uint8)
    sample = raw_sample("creative_1-000000", ids, np.zeros((2, 3)))
    for crop, side in ((5, 5), (4, 3), (9, 9), (1, 1)):
        (pair,) = pairs(crop=crop)([sample])
        assert tuple(pair["voxel"].shape) == (side,) * 3
        assert voxel_to_text(pair["voxel"], vocab, size=side) == reference_voxel2word(names, crop)
    with pytest.raises(ConfigError, match="larger than the stored voxel side 9"):
        list(pairs(crop=11)([sample]))


def test_stage_options_are_checked():
    with pytest.raises(ConfigError, match="unknown task"):
        pairs(task="frame_reconstruction")
    with pytest.raises(ConfigError, match="history_length"):
        pairs(history_length=0)
    with pytest.raises(ConfigError, match="crop"):
        pairs(crop=0)


def test_windows_spans():
    assert windows(10, 0, 1) == [(0, 10)]
    assert windows(10, 10, 1) == [(0, 10)]
    assert windows(10, 4, 1) == [(0, 4), (3, 7), (6, 10)]
    assert windows(11, 5, 3) == [(0, 5), (2, 7), (4, 9), (6, 11)]


# ------------------------------------------------------------------- vocabulary and collate
def test_vocabulary_from_every_kind_of_manifest_handle(tmp_path):
    make_episode_dir(tmp_path / "data", "creative:1", 3, names=("stone", "air", "zinc", "Dirt"))
    manifest = convert("minecraft", str(tmp_path / "data"), str(tmp_path / "out"))
    assert manifest.tables["blocks"] == ["air", "Dirt", "stone", "zinc"]  # air first, then sorted
    for handle in (manifest, manifest.url, str(tmp_path / "out"), manifest.tables):
        vocab = vocabulary(handle)
        assert vocab.names == ("air", "Dirt", "stone", "zinc")
    assert vocab.id("zinc") == 3 and vocab[1] == "Dirt" and len(vocab) == 4
    assert vocab.decode(np.array([[0, 3]])).tolist() == [["air", "zinc"]]
    with pytest.raises(KeyError, match="'lava' is not in the vocabulary"):
        vocab.id("lava")
    with pytest.raises(wdsprep.FormatError, match="no 'blocks' table"):
        vocabulary({"tables": {}})


def test_collate_stacks_and_moves_batches(tmp_path):
    make_episode_dir(tmp_path / "data", "creative:1", 6)
    manifest = convert("minecraft", str(tmp_path / "data"), str(tmp_path / "out"))
    urls = wdsprep.urls(manifest.url, "train")
    loader = wds.WebDataset(urls, shardshuffle=False).compose(pairs(history_length=2)).batched(
        4, collation_fn=collate_fn(device="cpu"), partial=True)
    batches = list(torch.utils.data.DataLoader(loader, batch_size=None, num_workers=0))
    assert [len(b["episode"]) for b in batches] == [4]
    batch = batches[0]
    assert batch["voxel"].shape == (4, 5, 5, 5) and batch["voxel"].dtype == torch.uint8
    assert batch["action"].shape == (4, 3) and batch["action"].dtype == torch.int64
    assert batch["history_voxels"].shape == (4, 1, 5, 5, 5)
    assert batch["t"].tolist() == [1, 2, 3, 4] and batch["episode"] == ["creative:1"] * 4
    assert isinstance(batch["__key__"], list)
    pickle.dumps(collate_fn(device="auto"))  # usable as a DataLoader collate_fn in workers
    auto = collate(list(pairs()(wds.WebDataset(urls, shardshuffle=False)))[:2], device="auto")
    assert auto["voxel"].device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="empty batch"):
        collate([])


def test_stage_through_wdsprep_dataset_and_windows_equal_whole_episodes(tmp_path):
    make_episode_dir(tmp_path / "data", "creative:1", 23, seed=1)
    make_episode_dir(tmp_path / "data", "creative:2", 9, seed=2)
    whole = convert("minecraft", str(tmp_path / "data"), str(tmp_path / "whole"))
    cut = convert("minecraft", str(tmp_path / "data"), str(tmp_path / "cut"), window_frames=7, window_overlap=4,
                  shard_bytes=3000)
    assert len(cut.splits["train"]) > 1
    for history in (1, 4):
        expected = upstream_pairs(tmp_path / "data", history_length=history)
        for manifest in (whole, cut):
            got = list(wdsprep.dataset(manifest.url, shuffle_shards=False).compose(pairs(history_length=history)))
            got.sort(key=lambda p: p["__key__"])
            assert len(got) == len(expected)
            vocab = vocabulary(manifest)
            for pair, item in zip(got, expected):
                assert not {"__url__", "__index__", "__piece_start__", "__epoch__"} & pair.keys()  # no bookkeeping
                assert pair["episode"] == item["episode"]
                assert np.array_equal(vocab.decode(pair["voxel"]), item["x_raw"])
                assert np.array_equal(vocab.decode(pair["target"]), item["z_raw"])
                assert pair["action"].tolist() == item["y_raw"].tolist()


def test_map_style_pairs_equal_the_stage_and_refuse_a_corrupted_shard(tmp_path):
    """`MinecraftPairs` reads every shard through the checked read path: the stage's pairs on the
    unshuffled shard list, and a flipped byte in any shard is a ShardError naming it, not pairs."""
    from wdsprep.sources.minecraft import MinecraftPairs

    make_episode_dir(tmp_path / "in" / "data", "creative:1", 23, seed=1)
    make_episode_dir(tmp_path / "in" / "data", "creative:2", 9, seed=2)
    manifest = convert("minecraft", str(tmp_path / "in"), str(tmp_path / "out"), window_frames=7, window_overlap=4, shard_bytes=3000,
                       codec="none")  # raw .npy members: a changed block id decodes as well as the right one
    rows = manifest.splits["train"]
    assert len(rows) > 2
    expected = list(wds.WebDataset(wdsprep.urls(manifest.url, "train"), shardshuffle=False).compose(pairs(history_length=2)))
    got = MinecraftPairs(manifest.url, history_length=2)
    assert len(got) == len(expected)
    for i, pair in enumerate(expected):
        assert got[i]["__key__"] == pair["__key__"] and got[i]["t"] == pair["t"]
        assert np.array_equal(got[i]["voxel"], pair["voxel"])
    path = tmp_path / "out" / rows[-1]["name"]
    with tarfile.open(path) as archive:
        member = next(info for info in archive.getmembers() if info.name.endswith(".npy"))
    data = bytearray(path.read_bytes())
    data[member.offset_data + member.size - 1] ^= 0x01  # the last element of an array
    path.write_bytes(bytes(data))
    with pytest.raises(wdsprep.ShardError, match=rows[-1]["name"]):
        MinecraftPairs(manifest.url, history_length=2)


@settings(max_examples=60, deadline=None)
@given(length=st.integers(1, 40), window_frames=st.integers(0, 12), overlap=st.integers(1, 11),
       history=st.integers(1, 11), first_frame=st.integers(0, 5))
def test_windows_give_exactly_the_whole_segment_pairs(length, window_frames, overlap, history, first_frame):
    """Property: cutting a segment into windows never loses, repeats or alters a pair (H <= overlap)."""
    if window_frames and overlap >= window_frames:
        window_frames = overlap + 1
    history = min(history, overlap)
    rng = np.random.default_rng(length)
    voxels = rng.integers(4, size=(length, 2, 2, 2)).astype(np.uint8)
    actions = rng.integers(2, size=(length, 3))
    whole = [raw_sample(f"creative_1-{first_frame:06d}", voxels, actions, first_frame=first_frame)]
    cut = [raw_sample(f"creative_1-{first_frame + start:06d}", voxels[start:stop], actions[start:stop],
                      first_frame=first_frame + start, new_from=0 if index == 0 else overlap)
           for index, (start, stop) in enumerate(windows(length, window_frames, overlap))]
    expected = list(pairs(history_length=history)(whole))
    got = list(pairs(history_length=history)(cut))
    assert [p["__key__"] for p in got] == [p["__key__"] for p in expected]
    assert len(expected) == max(0, length - history)
    for a, b in zip(got, expected):
        assert torch.equal(a["voxel"], b["voxel"]) and torch.equal(a["target"], b["target"])
        assert torch.equal(a["action"], b["action"])
        if history > 1:
            assert torch.equal(a["history_voxels"], b["history_voxels"])


def test_map_style_pairs_over_http(tmp_path):
    """`MinecraftPairs` on shards served over HTTP (read through wdsprep.MapDataset by Range
    requests) gives the pairs it gives on the local directory."""
    from wdsprep.sources.minecraft import MinecraftPairs
    from wdsprep.testing import RangeHTTPServer

    make_episode_dir(tmp_path / "in" / "data", "creative:1", 23, seed=1)
    make_episode_dir(tmp_path / "in" / "data", "creative:2", 9, seed=2)
    manifest = convert("minecraft", str(tmp_path / "in"), str(tmp_path / "out"), window_frames=7, window_overlap=4,
                       shard_bytes=3000)
    assert len(manifest.splits["train"]) > 2
    local = MinecraftPairs(manifest.url, history_length=2)
    with RangeHTTPServer(tmp_path / "out") as server:
        remote = MinecraftPairs(server.url_of("manifest.json"), history_length=2)
        assert all(r["range"] for r in server.requests if r["name"].endswith(".tar"))
    assert len(remote) == len(local) > 0
    for i in range(len(local)):
        assert remote[i].keys() == local[i].keys()
        for name, value in local[i].items():
            same = torch.equal(remote[i][name], value) if isinstance(value, torch.Tensor) else remote[i][name] == value
            assert same, (i, name)  # no `__url__` (local path or URL) rides in a pair
