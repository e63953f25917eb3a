"""Noisebase sampleset_v1 on disk: one zarr v2 group in a ZipStore per sequence.

Array names, dtypes and layouts (frames first, samples last) follow the format's documentation
and the reference loader (noisebase 1.1.1). Per-sequence constants that are not stored in the
files (rendering resolution) come from the dataset config, as in noisebase.
"""
from __future__ import annotations

import math
import os
import re
import struct
from collections.abc import MutableMapping

import numpy as np

from ...errors import InputError
from ..base import check_input_size, parse_json

RENDERING_HEIGHT = 1080
RENDERING_WIDTH = 1920
FILE_PATTERN = "sampleset_v1/train/scene{index:04d}.zip"
_SCENE_NAME = re.compile(r"^scene(\d+)\.zip$")

# name -> (dtype, rank); per-sample arrays are [F, C, H, W, S], `reference` [F, 3, H, W]
SAMPLE_ARRAYS = {
    "color": (np.uint8, 4),
    "position": (np.float32, 3),
    "motion": (np.float32, 3),
    "normal": (np.float16, 3),
    "diffuse": (np.float16, 3),
}
FRAME_ARRAYS = {"reference": (np.float32, 3)}
CAMERA_ARRAYS = {
    "exposure": (np.float32, (2,)),
    "camera_position": (np.float32, (3,)),
    "camera_target": (np.float32, (3,)),
    "camera_up": (np.float32, (3,)),
    "proj_mat": (np.float32, (4, 4)),
    "view_proj_mat": (np.float32, (4, 4)),
    "crop_offset": (np.int32, (2,)),
}
BUFFERS = ("normal", "motion", "depth", "w_normal", "w_motion", "w_position", "diffuse", "color", "reference")
# What a sequence's zip may hold, checked before zarr reads a byte of it: a chunk of the format is one
# frame of a few samples (crop 256, 4 samples of float32 colour: 4 MiB); metadata is a few hundred bytes.
MAX_CHUNK_BYTES = 256 << 20
MAX_METADATA_BYTES = 1 << 20
_BLOSC_OVERHEAD = 16  # a blosc chunk: a 16-byte header, then at most nbytes of data
_METADATA = (".zarray", ".zgroup", ".zattrs", ".zmetadata")


def zip_store(path: str, mode: str = "r"):
    """A zarr ZipStore for zarr 2 (`zarr.ZipStore`) or zarr 3 (`zarr.storage.ZipStore`)."""
    import zarr

    store_class = getattr(zarr, "ZipStore", None) or zarr.storage.ZipStore
    return store_class(path, mode=mode)


class CheckedStore(MutableMapping):
    """A read-only view of a sequence's ZipStore that hands zarr nothing the format does not allow,
    each refusal an InputError naming the file and the member: metadata above MAX_METADATA_BYTES or
    naming a key twice; an array whose compressor is not blosc (or none), with filters, or whose
    chunk is above MAX_CHUNK_BYTES; a chunk member larger than its chunk can compress to, or whose
    blosc header declares other than the chunk's bytes (what blosc would allocate and inflate)."""

    def __init__(self, store, path: str):
        self._store, self._path = store, path
        self._zip = store.zf
        self.names = set(self._zip.namelist())
        self._chunk_bytes: dict[str, tuple[int, bool]] = {}  # array -> (chunk bytes, blosc)

    def __getitem__(self, key: str) -> bytes:
        where = f"{self._path}: member {key}"
        info = self._zip.getinfo(key)  # KeyError: zarr's "absent"
        array, _, name = key.rpartition("/")
        if name in _METADATA:
            check_input_size(where, info.file_size, MAX_METADATA_BYTES, "zarr metadata")
            data = self._store[key]
            meta = parse_json(data, where, "zarr metadata")  # zarr's own parser keeps the last of two equal keys
            if name == ".zarray":
                self._array_meta(array, meta, where)
            return data
        chunk_bytes, blosc = self.chunk_bytes(array)
        check_input_size(where, info.file_size, chunk_bytes + (_BLOSC_OVERHEAD if blosc else 0), "a chunk of its array")
        data = self._store[key]
        if blosc:
            if len(data) < _BLOSC_OVERHEAD:
                raise InputError(f"{where}: a blosc chunk of {len(data)} bytes (its header alone is 16)")
            nbytes, cbytes = struct.unpack_from("<I", data, 4)[0], struct.unpack_from("<I", data, 12)[0]
            if nbytes != chunk_bytes or cbytes != len(data):
                raise InputError(f"{where}: its blosc header declares {nbytes} bytes compressed to {cbytes}, "
                                 f"the chunk is {chunk_bytes} bytes and the member {len(data)}")
        elif len(data) != chunk_bytes:
            raise InputError(f"{where}: {len(data)} bytes, the uncompressed chunk is {chunk_bytes}")
        return data

    def chunk_bytes(self, array: str) -> tuple[int, bool]:
        """(bytes of one chunk, blosc-compressed) of `array`, from its checked `.zarray`."""
        if array not in self._chunk_bytes:
            self[f"{array}/.zarray"]  # checks it (KeyError if absent)
        return self._chunk_bytes[array]

    def _array_meta(self, array: str, meta, where: str) -> None:
        """Check an array's `.zarray` against the format and note its chunk size."""
        if array not in self._chunk_bytes:
            if not isinstance(meta, dict):
                raise InputError(f"{where}: not zarr v2 array metadata")
            compressor, filters = meta.get("compressor"), meta.get("filters")
            if compressor is not None and (not isinstance(compressor, dict) or compressor.get("id") != "blosc"):
                raise InputError(f"{where}: compressor {compressor!r} (sampleset_v1 chunks are blosc or uncompressed)"[:300])
            if filters:
                raise InputError(f"{where}: filters {filters!r} (sampleset_v1 has none)"[:300])
            try:
                chunks = [int(n) for n in meta["chunks"]]
                itemsize = np.dtype(meta["dtype"]).itemsize
            except (KeyError, TypeError, ValueError) as error:
                raise InputError(f"{where}: not zarr v2 array metadata ({error})") from None
            if any(n < 1 for n in chunks):
                raise InputError(f"{where}: chunks {chunks}")
            chunk_bytes = math.prod(chunks) * itemsize
            check_input_size(where, chunk_bytes, MAX_CHUNK_BYTES, "a chunk of sampleset_v1")
            self._chunk_bytes[array] = (chunk_bytes, compressor is not None)

    def __contains__(self, key) -> bool:
        return key in self.names

    def __iter__(self):
        return iter(sorted(self.names))

    def __len__(self) -> int:
        return len(self.names)

    def __setitem__(self, key, value):
        raise InputError(f"{self._path}: opened read-only")

    def __delitem__(self, key):
        raise InputError(f"{self._path}: opened read-only")


def open_sequence(path: str):
    """(group, store) of a sampleset_v1 sequence, read through a `CheckedStore`; InputError naming
    the file if it is not one."""
    import zarr

    try:
        store = zip_store(path, "r")
    except Exception as error:  # zipfile.BadZipFile, OSError, ...
        raise InputError(f"{path}: not a readable zip file ({error})") from None
    try:
        group = zarr.open_group(store=CheckedStore(store, path), mode="r")
    except InputError:
        store.close()
        raise
    except Exception as error:
        store.close()
        raise InputError(f"{path}: not a zarr group in a ZipStore ({error})") from None
    return group, store


def check_sequence(path: str, group) -> dict:
    """Validate one sequence's arrays against the format; returns its shape facts. Any error of zarr
    on the sequence's metadata is an InputError naming the file, like a broken rule."""
    try:
        return _check_sequence(path, group)
    except InputError:
        raise
    except Exception as error:  # zarr, zipfile and json raise many types for damaged metadata
        raise InputError(f"{path}: not a readable sampleset_v1 sequence ({type(error).__name__}: {error})") from None


def _check_chunks_present(path: str, group, name: str) -> None:
    """Every chunk an array's shape declares is a member of the zip: zarr reads an absent one as
    its fill value, so a header declaring more frames than the file holds would convert to zeros."""
    array = group[name]
    grid = [math.ceil(size / chunk) for size, chunk in zip(array.shape, array.chunks)]
    declared = math.prod(grid)
    names = set(group.store.keys())  # the zip's member names
    held = sum(1 for member in names if member.startswith(f"{name}/") and member.rpartition("/")[2] not in _METADATA)
    separator = getattr(array, "_dimension_separator", None) or "."
    if declared > held or any(f"{name}/{separator.join(map(str, index))}" not in names for index in np.ndindex(*grid)):
        raise InputError(f"{path}: {name} declares {declared} chunks of shape {tuple(array.chunks)} for "
                         f"{tuple(array.shape)}; the file holds {held} (an absent chunk would read as zeros)")


def _check_sequence(path: str, group) -> dict:
    names = set(group.array_keys())
    missing = [name for name in (*SAMPLE_ARRAYS, *FRAME_ARRAYS, *CAMERA_ARRAYS) if name not in names]
    if missing:
        raise InputError(f"{path}: missing array(s) {', '.join(missing)} (sampleset_v1 needs them all)")
    color = group["color"]
    if color.ndim != 5 or color.shape[1] != 4:
        raise InputError(f"{path}: color has shape {color.shape}, expected [F, 4, H, W, S]")
    frames, _, height, width, samples = color.shape
    if height != width:
        raise InputError(f"{path}: crop is {height}x{width}, expected a square crop")
    for name, (dtype, channels) in SAMPLE_ARRAYS.items():
        array = group[name]
        if array.dtype != dtype:
            raise InputError(f"{path}: {name} has dtype {array.dtype}, expected {np.dtype(dtype)}")
        if tuple(array.shape) != (frames, channels, height, width, samples):
            raise InputError(
                f"{path}: {name} has shape {tuple(array.shape)}, expected {(frames, channels, height, width, samples)}"
            )
    reference = group["reference"]
    if reference.dtype != np.float32 or tuple(reference.shape) != (frames, 3, height, width):
        raise InputError(f"{path}: reference has {reference.dtype} {tuple(reference.shape)}, expected float32 {(frames, 3, height, width)}")
    for name, (dtype, shape) in CAMERA_ARRAYS.items():
        array = group[name]
        if array.dtype != dtype or tuple(array.shape) != (frames, *shape):
            raise InputError(
                f"{path}: {name} has {array.dtype} {tuple(array.shape)}, expected {np.dtype(dtype)} {(frames, *shape)}"
            )
    for name in (*SAMPLE_ARRAYS, *FRAME_ARRAYS, *CAMERA_ARRAYS):
        _check_chunks_present(path, group, name)
    return {"frames": int(frames), "crop": int(height), "samples": int(samples)}


def find_sequences(root: str, ignore) -> list[tuple[int, str]]:
    """(index, path relative to root) of every `scene{index}.zip`, sorted by index.

    Accepts the noisebase data folder (holding `sampleset_v1/train/`) or the folder of zips itself;
    every other entry of the folder the sequences are in goes to `ignore(path, reason)`.
    """
    if not os.path.isdir(root):
        raise InputError(f"{root}: input is not a directory")
    candidates = []
    for base in (os.path.join(root, "sampleset_v1", "train"), root):
        if os.path.isdir(base):
            others = []
            for name in sorted(os.listdir(base)):
                match = _SCENE_NAME.match(name)
                if match:
                    candidates.append((int(match.group(1)), os.path.relpath(os.path.join(base, name), root)))
                else:
                    others.append(os.path.join(base, name) + "/" * os.path.isdir(os.path.join(base, name)))
            if candidates:
                for path in others:
                    ignore(path, "not a sequence file scene<index>.zip")
                break
    if not candidates:
        raise InputError(f"{root}: no sampleset_v1 sequences (scene<index>.zip) in it or in sampleset_v1/train/")
    seen: dict[int, str] = {}
    for index, rel in candidates:
        if index in seen:
            raise InputError(f"{root}: {rel} and {seen[index]} have the same sequence index {index}")
        seen[index] = rel
    return sorted(candidates)


# ----------------------------------------------------------------------------------------- RGBE
def encode_rgbe(color: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, list]:
    """Radiance [3, H, W, S] -> (uint8 RGBE [4, H, W, S], [min_log, max_log]), dithered.

    The format's rule: a shared exponent index quantises log(max channel) over the frame's range
    of log radiance into 256 steps (rounded up), mantissas are radiance / 2^E * 255 with a random
    dither bit so the decoded value is unbiased. A black frame gives zeros and [0, 0].
    """
    positive = color[color > 0]
    if positive.size == 0:
        return np.zeros((4, *color.shape[1:]), np.uint8), [0.0, 0.0]
    low = float(np.log(positive.min()))
    high = float(np.log(positive.max()))
    span = max(high - low, 1e-6)
    brightest = color.max(axis=0)
    with np.errstate(divide="ignore"):
        log_brightest = np.where(brightest > 0, np.log(np.maximum(brightest, 1e-30)), -np.inf)
    index = np.clip(np.floor((log_brightest - low) / span * 256), 0, 255).astype(np.uint8)
    scale = decode_exponent(index, np.array([low, low + span], np.float32))
    scaled = color / scale[None] * 255
    mantissa = np.floor(scaled)
    mantissa += (scaled - mantissa) > rng.random(scaled.shape)
    rgbe = np.concatenate([np.clip(mantissa, 0, 255).astype(np.uint8), index[None]])
    return rgbe, [low, low + span]


def decode_exponent(index: np.ndarray, exposure: np.ndarray) -> np.ndarray:
    """The scale an RGBE exponent index stands for (float32, as the reference computes it)."""
    step = (index.astype(np.float32) + 1) / 256
    return np.exp(step * (exposure[1] - exposure[0]) + exposure[0])


def decode_rgbe(rgbe: np.ndarray, exposure: np.ndarray) -> np.ndarray:
    """uint8 RGBE [4, ...] -> float32 radiance [3, ...], bit-identical to noisebase's decoder."""
    scale = decode_exponent(rgbe[3], exposure)
    return rgbe[:3].astype(np.float32) / 255 * scale[np.newaxis]
