"""The native MineDojo-style layout: `[data/][seq{n}-{m}/]creative:{id}/{t:06d}.npy`, one pickled dict a frame.

Frames are the only pickles wdsprep reads, through the checked unpickler of `_unpickle` (no code
runs, no object dtype from raw bytes, shared structures counted before they are built, nothing after
the pickle), and only up to MAX_FRAME_BYTES a file or zip member (checked before it is read), so a
hostile frame is one InputError naming it, in bounded time and memory.
The input is a directory or a `.zip` of that tree; both are read through `NativeTree`.
"""
from __future__ import annotations

import io
import os
import re
import zipfile
import zlib
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ...errors import InputError
from ._unpickle import PickleLimits, load_pickle

EPISODE_PREFIX = "creative:"
FRAME_NAME = re.compile(r"^(\d+)\.npy$")
# action[0] straight, action[1] pan, action[2] jump: the number of values each may take
ACTION_LIMITS = (3, 3, 2)
ACTION_NAMES = (("noop", "forward", "backward"), ("noop", "left", "right"), ("noop", "jump"))
ACTION_FIELDS = ("straight", "pan", "jump")
# A frame is a (S, S, S) grid of block names and 3 integers: the real frames are 21**3 names of up to
# 11 characters, 407,943 bytes. The caps leave 160x room (a 64**3 grid of 60-character names) and
# stop a bomb before it is read: a frame file or zip member above MAX_FRAME_BYTES (as declared, or
# as read) is refused, and so is a pickle holding more than these, shared references counted as copies.
MAX_FRAME_BYTES = 64 << 20
FRAME_PICKLE_LIMITS = PickleLimits(objects=300_000, payload_bytes=MAX_FRAME_BYTES, depth=32)


# ------------------------------------------------------------------------------------ input tree
class NativeTree:
    """Read-only access to the files of a directory or a `.zip`, by POSIX path relative to its root."""

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        if os.path.isdir(self.path):
            self.kind = "dir"
        elif os.path.isfile(self.path) and zipfile.is_zipfile(self.path):
            self.kind = "zip"
        elif os.path.exists(self.path):
            raise InputError(f"{path}: not a directory or a .zip of creative:* episode folders")
        else:
            raise InputError(f"{path}: no such file or directory")
        self._zip: zipfile.ZipFile | None = None

    def files(self) -> list[tuple[str, int]]:
        """(relative path, size) of every file, in sorted order; a zip may repeat a name."""
        if self.kind == "dir":
            found = []
            for root, dirs, names in os.walk(self.path):
                dirs.sort()
                for name in names:
                    full = os.path.join(root, name)
                    if os.path.isfile(full):
                        found.append((os.path.relpath(full, self.path).replace(os.sep, "/"), os.path.getsize(full)))
            return sorted(found)
        return sorted((info.filename, info.file_size) for info in self._archive().infolist() if not info.is_dir())

    def read(self, relpath: str, limit: int = MAX_FRAME_BYTES) -> bytes:
        """The bytes of one file, refused (naming it) above `limit` bytes: by its size or a zip member's
        declared size before anything is read, and by reading at most `limit + 1` bytes."""
        try:
            if self.kind == "dir":
                with open(os.path.join(self.path, relpath), "rb") as handle:
                    self._check_size(relpath, os.fstat(handle.fileno()).st_size, limit)
                    data = handle.read(limit + 1)
            else:
                info = self._archive().getinfo(relpath)
                self._check_size(relpath, info.file_size, limit)
                with self._archive().open(info) as member:
                    data = member.read(limit + 1)
        except (OSError, KeyError, zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError) as error:
            # RuntimeError: an encrypted member; NotImplementedError: a compression zipfile lacks
            if self.kind == "zip":  # a bad CRC or deflate stream: name the archive and the member
                raise InputError(f"{self.path}: member {relpath}: corrupt or unreadable ({error})") from None
            raise InputError(f"{relpath}: cannot read: {error}") from None
        self._check_size(relpath, len(data), limit, read=True)
        return data

    def _check_size(self, relpath: str, size: int, limit: int, read: bool = False) -> None:
        if size > limit:
            where = f"{self.path}: member {relpath}" if self.kind == "zip" else relpath
            size = f"more than {limit} bytes read" if read else f"{size} bytes"
            raise InputError(f"{where}: {size}, more than a frame may hold ({limit} bytes; "
                             f"a real 21**3 frame is 408 KB)")

    def _archive(self) -> zipfile.ZipFile:
        if self._zip is None:
            try:
                self._zip = zipfile.ZipFile(self.path)
            except (OSError, zipfile.BadZipFile) as error:
                raise InputError(f"{self.path}: cannot open zip: {error}") from None
        return self._zip

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()
            self._zip = None


# ------------------------------------------------------------------------------------ listing
@dataclass
class EpisodeListing:
    """One `creative:*` folder: its frames by number, before their contents are checked."""

    name: str  # "creative:12", as upstream reports it
    directory: str  # relative path of the folder, e.g. "data/seq0-49/creative:12"
    frames: list[tuple[int, str, int]] = field(default_factory=list)  # (t, relative path, size), by t


def list_episodes(tree: NativeTree, report, ignore) -> list[EpisodeListing]:
    """Find every `creative:*` folder and its `*.npy` frames, ordered by folder name.

    Ordered by the folder's own name (like upstream on the flat layout) so the bucket folders never
    change the result. `report(item, message)` is called for a bad item; it raises in raise mode.
    `ignore(path, reason)` is called for every other file found (see `PlanContext.ignore`).
    """
    episodes: dict[str, EpisodeListing] = {}
    directories: dict[str, str] = {}  # folder path -> episode name, to catch the same name twice
    for relpath, size in tree.files():
        parts = relpath.split("/")
        path = os.path.join(tree.path, relpath)
        if any(part.startswith(".") or part == "__MACOSX" for part in parts):
            ignore(path, "hidden, or a macOS resource fork")  # never frames (._000001.npy)
            continue
        parent, _, filename = relpath.rpartition("/")
        folder = parent.rpartition("/")[2]
        if not folder.startswith(EPISODE_PREFIX):
            ignore(path, f"not in a {EPISODE_PREFIX}* episode folder")
            continue
        if parent not in directories:
            if folder in episodes:
                report(parent, f"episode {folder} appears twice: {episodes[folder].directory} and {parent}")
                directories[parent] = ""  # skipped duplicate folder
                continue
            directories[parent] = folder
            episodes[folder] = EpisodeListing(folder, parent)
        if not directories[parent]:
            continue  # a duplicate folder, reported above
        if not filename.endswith(".npy"):
            ignore(path, "not a frame .npy (upstream reads *.npy only)")
            continue
        match = FRAME_NAME.match(filename)
        if match is None:
            report(relpath, f"frame name {filename!r} is not a number (expected e.g. 000007.npy)")
            continue
        episodes[folder].frames.append((int(match.group(1)), relpath, size))
    if not episodes:
        raise InputError(f"{tree.path}: no creative:* episode folders found (expected data/creative:0/000000.npy ...)")
    for episode in episodes.values():
        counts = Counter(t for t, _, _ in episode.frames)
        duplicated = {t for t, n in counts.items() if n > 1}
        for t in sorted(duplicated):
            paths = [p for u, p, _ in episode.frames if u == t]
            report(paths[-1], f"duplicate frame {t} in {episode.directory}: {', '.join(paths)}")
        episode.frames = sorted((f for f in episode.frames if f[0] not in duplicated), key=lambda f: f[0])
    return [episodes[name] for name in sorted(episodes)]


# ------------------------------------------------------------------------------------ frames
def _unpickle_npy(data: bytes) -> object:
    """The object stored by `np.save(path, obj)` with a pickled (object) header, read by the checked
    unpickler (`_unpickle`): no code runs, no object dtype from bytes, nothing larger than the limits."""
    buffer = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(buffer)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _fortran, dtype = read_header(buffer)
    except Exception as error:  # numpy's header parser raises ValueError, EOFError, SyntaxError, TokenError...
        raise ValueError(f"not a .npy file ({error})") from None
    if not dtype.hasobject:
        raise ValueError(f"holds a plain {dtype} array of shape {shape}, expected a pickled dict")
    array = load_pickle(data[buffer.tell():], FRAME_PICKLE_LIMITS)  # ValueError "cannot unpickle: ..."
    if isinstance(array, np.ndarray) and array.shape == () and array.dtype.hasobject:
        return array.item()
    return array


@dataclass
class Frame:
    action: np.ndarray  # int64 (3,)
    voxel: np.ndarray  # str ('<U..') (S, S, S)


def load_frame(relpath: str, data: bytes) -> Frame:
    """Decode and check one frame file; InputError names the file and the rule broken."""
    if not data:
        raise InputError(f"{relpath}: empty file (0 bytes), expected a frame .npy")
    try:
        content = _unpickle_npy(data)
    except ValueError as error:
        raise InputError(f"{relpath}: {error}") from None
    if not isinstance(content, dict):
        raise InputError(f"{relpath}: holds a {type(content).__name__}, expected a dict with 'action' and 'voxel'")
    missing = [name for name in ("action", "voxel") if name not in content]
    if missing:
        raise InputError(f"{relpath}: missing {' and '.join(repr(m) for m in missing)} (keys: {sorted(map(str, content))})")
    return Frame(check_action(relpath, content["action"]), check_voxel(relpath, content["voxel"]))


def check_action(relpath: str, action) -> np.ndarray:
    try:
        action = np.asarray(action)
    except (ValueError, TypeError) as error:  # a ragged or odd pickled value numpy cannot make one array of
        raise InputError(f"{relpath}: action is not an array of 3 integers ({error})") from None
    if action.shape != (3,):
        raise InputError(f"{relpath}: action has shape {action.shape}, expected (3,)")
    if action.dtype.kind not in "iu":
        raise InputError(f"{relpath}: action has dtype {action.dtype}, expected integers")
    for value, limit, name in zip(action.tolist(), ACTION_LIMITS, ACTION_FIELDS):
        if not 0 <= value < limit:
            allowed = ", ".join(str(v) for v in range(limit))
            raise InputError(f"{relpath}: action {action.tolist()} out of range: {name} must be one of {allowed}")
    return action.astype(np.int64)


def check_voxel(relpath: str, voxel) -> np.ndarray:
    if not isinstance(voxel, np.ndarray):
        raise InputError(f"{relpath}: voxel is a {type(voxel).__name__}, expected a numpy array of block names")
    if voxel.ndim != 3 or len(set(voxel.shape)) != 1 or voxel.shape[0] == 0:
        raise InputError(f"{relpath}: voxel has shape {voxel.shape}, expected a cube")
    if voxel.dtype.kind == "U":
        return voxel
    if voxel.dtype.kind == "O" and all(isinstance(v, str) for v in voxel.flat):
        return voxel.astype(str)
    raise InputError(f"{relpath}: voxel has dtype {voxel.dtype}, expected block-name strings")


def block_names(voxel: np.ndarray) -> list[str]:
    """The distinct block names of one voxel grid, sorted."""
    return np.unique(voxel).tolist()
