"""Bad native input: every rule of the issue gives an error naming the file; skip mode records it."""
from __future__ import annotations

import os
import re
import zipfile

import numpy as np
import pytest
import webdataset as wds

import wdsprep
from wdsprep.conversion import convert
from wdsprep.errors import InputError
from wdsprep.sources.base import PlanContext
from wdsprep.sources.minecraft import SOURCE
from wdsprep.sources.minecraft.synth import write_frame

from .minecraft_testdata import make_episode_dir

OPTIONS = {"shard_bytes": 1 << 20, "codec": "zstd", "on_error": "raise"}
GOOD_VOXEL = np.full((5, 5, 5), "stone", dtype="<U5")
GOOD_ACTION = np.array([1, 0, 0], dtype=np.int64)


def plan_error(root) -> str:
    with pytest.raises(InputError) as error:
        SOURCE.plan(str(root), PlanContext(dict(OPTIONS)))
    return str(error.value)


def save_object(path, value) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.save(path, value, allow_pickle=True)


@pytest.fixture
def episode(tmp_path):
    """data/creative:3 with frames 000000..000003 valid; tests add or replace one."""
    make_episode_dir(tmp_path / "data", "creative:3", 4)
    return tmp_path


BAD_FRAMES = [
    ("missing action", {"voxel": GOOD_VOXEL}, r"000002\.npy: missing 'action'"),
    ("missing voxel", {"action": GOOD_ACTION}, r"000002\.npy: missing 'voxel'"),
    ("missing both", {"other": 1}, r"000002\.npy: missing 'action' and 'voxel'"),
    ("action shape", {"action": np.zeros(4, np.int64), "voxel": GOOD_VOXEL},
     r"000002\.npy: action has shape \(4,\), expected \(3,\)"),
    ("action 2-d", {"action": np.zeros((1, 3), np.int64), "voxel": GOOD_VOXEL},
     r"action has shape \(1, 3\), expected \(3,\)"),
    ("action float", {"action": np.zeros(3, np.float32), "voxel": GOOD_VOXEL},
     r"000002\.npy: action has dtype float32, expected integers"),
    ("straight out of range", {"action": np.array([3, 0, 0]), "voxel": GOOD_VOXEL},
     r"000002\.npy: action \[3, 0, 0\] out of range: straight must be one of 0, 1, 2"),
    ("pan negative", {"action": np.array([0, -1, 0]), "voxel": GOOD_VOXEL}, r"out of range: pan must be one of 0, 1, 2"),
    ("jump out of range", {"action": np.array([0, 0, 2]), "voxel": GOOD_VOXEL}, r"out of range: jump must be one of 0, 1"),
    ("voxel not cubic", {"action": GOOD_ACTION, "voxel": np.full((5, 5, 4), "air")},
     r"creative:3/000002\.npy: voxel has shape \(5, 5, 4\), expected a cube"),
    ("voxel 2-d", {"action": GOOD_ACTION, "voxel": np.full((5, 5), "air")}, r"voxel has shape \(5, 5\), expected a cube"),
    ("voxel numbers", {"action": GOOD_ACTION, "voxel": np.zeros((5, 5, 5), np.int64)},
     r"000002\.npy: voxel has dtype int64, expected block-name strings"),
    ("voxel list", {"action": GOOD_ACTION, "voxel": [["air"]]}, r"voxel is a list, expected a numpy array"),
    ("object array", np.array(["a", 1], dtype=object), r"000002\.npy: holds a ndarray, expected a dict"),
    ("not a dict", np.array("text", dtype=object), r"000002\.npy: holds a str, expected a dict"),
]


@pytest.mark.parametrize("content, pattern", [case[1:] for case in BAD_FRAMES], ids=[case[0] for case in BAD_FRAMES])
def test_bad_frame_content_names_the_file(episode, content, pattern):
    save_object(episode / "data" / "creative:3" / "000002.npy", content)
    message = plan_error(episode)
    assert message.startswith("data/creative:3/000002.npy: ")
    assert re.search(pattern, message), message


def test_errors_from_a_parallel_plan_scan_are_the_same(episode):
    make_episode_dir(episode / "data", "creative:4", 3)
    save_object(episode / "data" / "creative:4" / "000001.npy", {"action": GOOD_ACTION})
    save_object(episode / "data" / "creative:3" / "000001.npy", {"voxel": GOOD_VOXEL})
    with pytest.raises(InputError) as error:
        SOURCE.plan(str(episode), PlanContext(dict(OPTIONS, workers=2)))
    assert str(error.value) == plan_error(episode) == "data/creative:3/000001.npy: missing 'action' (keys: ['voxel'])"


def test_mixed_voxel_sizes_within_an_episode(episode):
    write_frame(str(episode / "data" / "creative:3" / "000001.npy"), GOOD_ACTION, np.full((7, 7, 7), "air"))
    message = plan_error(episode)
    assert message.startswith("data/creative:3/000001.npy: voxel has shape (7, 7, 7), but the episode")
    assert "(5, 5, 5)" in message and "mixed sizes" in message


def test_different_sizes_in_different_episodes_are_fine(episode):
    make_episode_dir(episode / "data", "creative:4", 3, side=7)
    plan = SOURCE.plan(str(episode), PlanContext(dict(OPTIONS)))
    sides = {item["episode"]: item["side"] for unit in plan.units for item in unit.items}
    assert sides == {"creative:3": 5, "creative:4": 7}


def test_plain_array_and_garbage_files(episode):
    np.save(episode / "data" / "creative:3" / "000002.npy", np.zeros(3))
    assert "expected a pickled dict" in plan_error(episode)
    (episode / "data" / "creative:3" / "000002.npy").write_bytes(b"not numpy at all")
    assert plan_error(episode).startswith("data/creative:3/000002.npy: not a .npy file")
    data = (episode / "data" / "creative:3" / "000001.npy").read_bytes()
    (episode / "data" / "creative:3" / "000002.npy").write_bytes(data[: len(data) // 2])
    assert plan_error(episode).startswith("data/creative:3/000002.npy: cannot unpickle")


def test_pickle_that_would_run_code_is_refused(episode, tmp_path):
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    save_object(episode / "data" / "creative:3" / "000002.npy", {"action": Exploit(), "voxel": GOOD_VOXEL})
    message = plan_error(episode)
    assert "000002.npy: cannot unpickle" in message and "refusing to load" in message
    assert not marker.exists()


def test_non_numeric_frame_name(episode):
    make_episode_dir(episode / "data", "creative:3", 1, start=4)
    os.rename(episode / "data" / "creative:3" / "000004.npy", episode / "data" / "creative:3" / "frame_a.npy")
    assert plan_error(episode) == (
        "data/creative:3/frame_a.npy: frame name 'frame_a.npy' is not a number (expected e.g. 000007.npy)"
    )


def test_duplicate_frame_names(episode):
    make_episode_dir(episode / "data", "creative:3", 1, start=2)
    os.rename(episode / "data" / "creative:3" / "000002.npy", episode / "data" / "creative:3" / "2.npy")
    make_episode_dir(episode / "data", "creative:3", 1, start=2, seed=1)
    message = plan_error(episode)
    assert message.startswith("data/creative:3/2.npy: duplicate frame 2 in data/creative:3")
    assert "000002.npy" in message


def test_duplicate_member_in_a_zip(episode, tmp_path):
    archive = tmp_path / "dup.zip"
    with zipfile.ZipFile(archive, "w") as out, pytest.warns(UserWarning):
        for t in range(4):
            out.write(episode / "data" / "creative:3" / f"{t:06d}.npy", f"data/creative:3/{t:06d}.npy")
        out.write(episode / "data" / "creative:3" / "000000.npy", "data/creative:3/000001.npy")
    assert plan_error(archive).startswith("data/creative:3/000001.npy: duplicate frame 1")


def test_hidden_files_and_macos_forks_are_not_frames(episode, tmp_path):
    archive = tmp_path / "mac.zip"
    with zipfile.ZipFile(archive, "w") as out:
        for t in range(4):
            frame = episode / "data" / "creative:3" / f"{t:06d}.npy"
            out.write(frame, f"data/creative:3/{t:06d}.npy")
            out.writestr(f"__MACOSX/data/creative:3/._{t:06d}.npy", b"resource fork")
        out.writestr("data/creative:3/.DS_Store", b"finder")
    plan = SOURCE.plan(str(archive), PlanContext(dict(OPTIONS)))
    assert [len(item["paths"]) for unit in plan.units for item in unit.items] == [4]


def test_same_episode_in_two_buckets(tmp_path):
    make_episode_dir(tmp_path / "data" / "seq0-49", "creative:3", 2)
    make_episode_dir(tmp_path / "data" / "seq50-99", "creative:3", 2)
    assert plan_error(tmp_path) == (
        "data/seq50-99/creative:3: episode creative:3 appears twice: data/seq0-49/creative:3 and data/seq50-99/creative:3"
    )


def test_no_episodes_and_missing_input(tmp_path):
    (tmp_path / "data").mkdir()
    assert "no creative:* episode folders" in plan_error(tmp_path)
    assert "no such file or directory" in plan_error(tmp_path / "absent")
    (tmp_path / "file.txt").write_text("x")
    assert "not a directory or a .zip" in plan_error(tmp_path / "file.txt")


# ------------------------------------------------------------------------------- gaps and skip
def _pairs(manifest, **options):
    urls = wdsprep.urls(manifest.url, "train")
    return list(wds.WebDataset(urls, shardshuffle=False).compose(wdsprep.minecraft.pairs(**options)))


def test_gap_splits_the_episode_into_segments_and_is_reported(tmp_path):
    make_episode_dir(tmp_path / "data", "creative:5", 5)  # 0..4
    make_episode_dir(tmp_path / "data", "creative:5", 3, start=7, seed=2)  # 7..9
    manifest = convert("minecraft", str(tmp_path / "data"), str(tmp_path / "out"))
    assert manifest.tables["gaps"] == [{"episode": "creative:5", "after": 4, "before": 7}]
    assert manifest.tables["episodes"][0]["segments"] == [[0, 4], [7, 9]]
    assert sum(row["samples"] for row in manifest.splits["train"]) == 2
    pairs = _pairs(manifest)
    assert [p["t"] for p in pairs] == [0, 1, 2, 3, 7, 8]  # nothing pairs 4 with 7
    assert [p["t"] for p in _pairs(manifest, history_length=3)] == [2, 3]  # the 3-frame segment is too short for H=3


def test_skip_mode_records_bad_frames_and_converts_the_rest(tmp_path):
    make_episode_dir(tmp_path / "data", "creative:1", 6)
    make_episode_dir(tmp_path / "data", "creative:2", 3, seed=3)
    save_object(tmp_path / "data" / "creative:1" / "000003.npy", {"action": np.array([0, 5, 0]), "voxel": GOOD_VOXEL})
    save_object(tmp_path / "data" / "creative:2" / "notes.npy", {"action": GOOD_ACTION, "voxel": GOOD_VOXEL})
    with pytest.raises(InputError, match=r"creative:2/notes\.npy: frame name"):
        convert("minecraft", str(tmp_path / "data"), str(tmp_path / "strict"))
    manifest = convert("minecraft", str(tmp_path / "data"), str(tmp_path / "out"), on_error="skip")
    assert manifest.problems == [
        {"item": "creative:2/notes.npy", "message": "frame name 'notes.npy' is not a number (expected e.g. 000007.npy)"},
        {"item": "creative:1/000003.npy", "message": "action [0, 5, 0] out of range: pan must be one of 0, 1, 2"},
    ]
    assert manifest.tables["episodes"][0]["segments"] == [[0, 2], [4, 5]]
    assert manifest.tables["gaps"] == [{"episode": "creative:1", "after": 2, "before": 4}]
    assert [(p["episode"], p["t"]) for p in _pairs(manifest)] == [
        ("creative:1", 0), ("creative:1", 1), ("creative:1", 4), ("creative:2", 0), ("creative:2", 1)
    ]


def test_skip_mode_mixed_sizes_keeps_the_majority(tmp_path):
    make_episode_dir(tmp_path / "data", "creative:1", 4)
    write_frame(str(tmp_path / "data" / "creative:1" / "000000.npy"), GOOD_ACTION, np.full((3, 3, 3), "air"))
    manifest = convert("minecraft", str(tmp_path / "data"), str(tmp_path / "out"), on_error="skip")
    assert [p["item"] for p in manifest.problems] == ["creative:1/000000.npy"]
    assert [p["t"] for p in _pairs(manifest)] == [1, 2]
    assert tuple(_pairs(manifest)[0]["voxel"].shape) == (5, 5, 5)
