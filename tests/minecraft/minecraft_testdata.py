"""Helpers shared by the minecraft tests: synthetic episode folders and an upstream-style loader.

`upstream_pairs` restates upstream `MinecraftDataset.load_data` (rglob the creative:* folders, sort
the paths, cut to max_creative_scenes, np.load every frame, pair idx with idx+1 for idx in
range(H-1, T-1)) so the tests compare against what the original loader gives.
"""
from __future__ import annotations

import os
import pathlib

import numpy as np

from wdsprep.sources.minecraft.synth import write_frame


def upstream_pairs(data_dir, history_length: int = 1, max_creative_scenes: int | None = None) -> list[dict]:
    data_dir = pathlib.Path(data_dir)
    creative_dirs = sorted(p for p in data_dir.rglob("*") if p.is_dir() and p.name.startswith("creative:"))
    if max_creative_scenes is not None:
        creative_dirs = creative_dirs[:max_creative_scenes]
    items = []
    for creative_dir in creative_dirs:
        files = sorted(creative_dir.glob("*.npy"))
        if len(files) < 2:
            continue
        frames = [np.load(path, allow_pickle=True).item() for path in files]
        if len(frames) <= history_length:
            continue
        for idx in range(history_length - 1, len(frames) - 1):
            items.append({
                "x_raw": frames[idx]["voxel"],
                "y_raw": frames[idx]["action"],
                "z_raw": frames[idx + 1]["voxel"],
                "episode": creative_dir.name,
                "history_start_index": idx - history_length + 1,
                "history_raw": [frames[k]["voxel"] for k in range(idx - history_length + 1, idx)],
                "history_actions_raw": [frames[k]["action"] for k in range(idx - history_length + 1, idx)],
            })
    return items


def make_episode_dir(root, name: str, frames: int, side: int = 5, start: int = 0, seed: int = 0,
                     names=("air", "stone", "dirt", "grass block", "water")) -> list[str]:
    """Write `frames` valid random frames into root/name/ (numbered from `start`)."""
    rng = np.random.default_rng(seed)
    paths = []
    for t in range(start, start + frames):
        voxel = np.array(names)[rng.integers(len(names), size=(side, side, side))]
        action = np.array([rng.integers(3), rng.integers(3), rng.integers(2)], dtype=np.int64)
        path = os.path.join(root, name, f"{t:06d}.npy")
        write_frame(path, action, voxel)
        paths.append(path)
    return paths


def zip_folder(folder, archive) -> pathlib.Path:
    """`folder`'s files as a deflated zip like the real data.zip, byte-identical on every run
    (sorted names, a fixed timestamp)."""
    import zipfile

    folder, archive = pathlib.Path(folder), pathlib.Path(archive)
    with zipfile.ZipFile(archive, "w") as handle:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            info = zipfile.ZipInfo(path.relative_to(folder).as_posix(), date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            handle.writestr(info, path.read_bytes())
    return archive


def edited_frame(data: bytes) -> tuple[bytes, np.ndarray]:
    """The same pickled frame with another `straight` action (same dtype, so the same size)."""
    import io

    frame = np.load(io.BytesIO(data), allow_pickle=True).item()
    action = frame["action"].copy()
    action[0] = (action[0] + 1) % 3
    buffer = io.BytesIO()
    np.save(buffer, {"action": action, "voxel": frame["voxel"]}, allow_pickle=True)
    return buffer.getvalue(), action


# ------------------------------------------------------------------ hostile frames, as a stranger writes them
def frame_bytes(frame: dict) -> bytes:
    """`np.save` of a frame dict, as upstream writes one."""
    import io

    buffer = io.BytesIO()
    np.save(buffer, frame, allow_pickle=True)
    return buffer.getvalue()


class _Reduced:
    """Pickles as `function(*arguments)` with an optional BUILD `state`: how anyone forges a pickle."""

    def __init__(self, function, arguments, state=None):
        self.reduced = (function, arguments) if state is None else (function, arguments, state)

    def __reduce__(self):
        return self.reduced


def _object_npy_header() -> bytes:
    import io

    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "|O", "fortran_order": False, "shape": ()})
    return buffer.getvalue()


def forged_array(shape, dtype_args, dtype_state, data):
    """What numpy pickles for an array, with the dtype's arguments and BUILD state chosen freely."""
    from numpy._core.multiarray import _reconstruct

    dtype = _Reduced(np.dtype, dtype_args, dtype_state)
    return _Reduced(_reconstruct, (np.ndarray, (0,), b"b"), (1, shape, dtype, False, data))


def forged_frame(frame: dict, protocol: int = 4) -> bytes:
    """A frame file holding `frame` (which may hold forged parts) behind an object .npy header."""
    import pickle

    outer = np.empty((), dtype=object)
    outer[()] = frame
    return _object_npy_header() + pickle.dumps(outer, protocol=protocol)


def object_dtype_from_bytes_frame() -> bytes:
    """The 300-byte frame that segfaulted `wdsprep convert`: an object-dtype voxel whose pickled dtype
    state says "holds no objects" (flags 0), so its 8 raw bytes would be taken as an object pointer."""
    voxel = forged_array((1, 1, 1), ("O8", False, True), (3, "|", None, None, None, -1, -1, 0), b"\x41" * 8)
    return forged_frame({"action": np.array([0, 1, 0]), "voxel": voxel})


def nested_action_frame(depth: int) -> bytes:
    """A frame whose `action` is a list nested `depth` deep, each level the one below twice (the
    pickle memoizes it: a few hundred bytes for 2**depth leaves)."""
    action = [0]
    for _ in range(depth):
        action = [action, action]
    return frame_bytes({"action": action, "voxel": np.full((3, 3, 3), "air")})
