"""Synthetic episodes: realistic blocks, actions that agree with the block shifts, both layouts."""
from __future__ import annotations

import glob
import os

import numpy as np

import wdsprep
from wdsprep.cli import main as cli
from wdsprep.conversion import convert
from wdsprep.sources.minecraft.synth import synth

REAL_BLOCKS = {"air", "stone", "dirt", "grass block", "leaves", "sand", "water", "sandstone", "grass", "wood",
               "gravel", "coal ore", "vines", "iron ore", "plant", "mushroom", "flower", "clay", "cactus",
               "dead bush", "cocoa"}
MOVE = {0: 0, 1: 1, 2: -1}


def frames_of(folder):
    return [np.load(p, allow_pickle=True).item() for p in sorted(glob.glob(os.path.join(folder, "*.npy")))]


def shifted_equal(a, b, dx, dy, dz):
    """b is a moved by (dx, dy, dz): b[i, j, k] == a[i + dx, j + dy, k + dz] where both exist."""
    s = a.shape[0]
    part = lambda d: slice(max(d, 0), s + min(d, 0))
    back = lambda d: slice(max(-d, 0), s + min(-d, 0))
    return np.array_equal(a[part(dx), part(dy), part(dz)], b[back(dx), back(dy), back(dz)])


def test_synth_frames_look_like_the_real_dump(tmp_path):
    folders = synth(str(tmp_path), seed=3, size="small", layout="flat")
    assert len(folders) == 6 and all(os.path.basename(f).startswith("creative:") for f in folders)
    blocks = set()
    for folder in folders:
        frames = frames_of(folder)
        assert 8 <= len(frames) <= 24
        for t, frame in enumerate(frames):
            assert set(frame) == {"action", "voxel"}
            voxel = frame["voxel"]
            assert voxel.shape == (21, 21, 21) and voxel.dtype.kind == "U" and voxel.flags.f_contiguous
            assert voxel[10, 10, 10] in ("air", "water", "grass", "flower", "plant", "mushroom", "wood", "leaves", "vines")
            assert voxel[10, 0, 10] != "air" and voxel[10, 20, 10] == "air"  # ground below, sky above (axis 1 is y)
            assert frame["action"].dtype == (np.int32 if t == len(frames) - 1 else np.int64)
            blocks.update(np.unique(voxel).tolist())
        moves = [tuple(f["action"].tolist()) for f in frames[:-1]]
        assert all(not (a == (0, 0, 0) and b == (0, 0, 0)) for a, b in zip(moves, moves[1:]))
        for a, b in zip(frames, frames[1:]):
            straight, pan, jump = a["action"].tolist()
            # the next frame is this one moved by the action's x/z step and some vertical step dy;
            # jump is set exactly when the agent went up
            steps = [dy for dy in range(-6, 7)
                     if shifted_equal(a["voxel"], b["voxel"], MOVE[straight], dy, MOVE[pan])]
            assert steps, f"{folder}: frames do not differ by the action's move"
            assert (jump == 1) == (steps[0] > 0)
    assert blocks <= REAL_BLOCKS and len(blocks) >= 12
    assert {"air", "stone", "dirt", "grass block", "coal ore"} <= blocks


def test_synth_is_deterministic_and_layouts_give_identical_shards(tmp_path):
    flat = synth(str(tmp_path / "flat"), seed=1, layout="flat", side=9)
    buckets = synth(str(tmp_path / "buckets"), seed=1, layout="buckets", side=9)
    again = synth(str(tmp_path / "again"), seed=1, layout="flat", side=9)
    assert [os.path.basename(f) for f in flat] == [os.path.basename(f) for f in buckets]
    assert any(os.path.basename(os.path.dirname(f)) != "seq0-49" for f in buckets)  # several buckets
    assert len(flat) == len(again) > 0
    for a, b in zip(flat, again):
        for name in sorted(os.listdir(a)):
            assert open(os.path.join(a, name), "rb").read() == open(os.path.join(b, name), "rb").read()
    manifests = [convert("minecraft", str(tmp_path / name), str(tmp_path / f"out-{name}"), shard_bytes=20_000)
                 for name in ("flat", "buckets")]
    rows = [[(r["name"], r["sha256"]) for r in m.splits["train"]] for m in manifests]
    assert rows[0] == rows[1] and len(rows[0]) > 1  # --workers 2 gives the same: the conformance suite
    assert manifests[0].tables == manifests[1].tables and manifests[0].fingerprint == manifests[1].fingerprint
    frames = sum(len(os.listdir(f)) for f in flat)
    pairs = list(wdsprep.dataset(manifests[1].url, shuffle_shards=False).compose(wdsprep.minecraft.pairs()))
    assert len(pairs) == frames - len(flat)


def test_cli_synth_and_pipeline_spec(tmp_path, repo_root, capsys):
    assert cli(["synth", "minecraft", str(tmp_path / "native"), "--seed", "2", "--quiet"]) == 0
    assert glob.glob(str(tmp_path / "native" / "data" / "seq*-*" / "creative:*" / "000000.npy"))
    spec = repo_root / "pipelines" / "minecraft.toml"
    assert cli(["pipeline", str(spec), "--input", str(tmp_path / "native"), "--output", str(tmp_path / "shards"),
                "--quiet"]) == 0
    manifest = wdsprep.stream.load_manifest(str(tmp_path / "shards"))
    assert manifest.config["window_frames"] == 1024 and manifest.config["window_overlap"] == 16
    assert manifest.tables["blocks"][0] == "air"


def test_cli_convert_takes_the_window_options(tmp_path):
    synth(str(tmp_path / "native"), seed=4, layout="flat", side=5, episodes=2, frames=(12, 12))
    assert cli(["convert", "minecraft", str(tmp_path / "native"), str(tmp_path / "out"), "--window-frames", "5",
                "--window-overlap", "2", "--quiet"]) == 0
    manifest = wdsprep.stream.load_manifest(str(tmp_path / "out"))
    assert manifest.config["window_frames"] == 5 and manifest.config["window_overlap"] == 2
    assert sum(row["samples"] for row in manifest.splits["train"]) == 2 * 4  # windows 0-4, 3-7, 6-10, 9-11
    got = list(wdsprep.dataset(manifest.url, shuffle_shards=False).compose(wdsprep.minecraft.pairs(history_length=2)))
    assert sorted((p["episode"], p["t"]) for p in got) == sorted(
        (episode, t) for episode in {p["episode"] for p in got} for t in range(1, 11))
    assert cli(["convert", "minecraft", str(tmp_path / "native"), str(tmp_path / "bad"), "--window-frames", "5",
                "--window-overlap", "5", "--quiet"]) != 0
