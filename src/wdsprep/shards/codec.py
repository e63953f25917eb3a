"""Member codecs of the wdsprep/1 format: `.mp`, `.npy`, `.npy.zst`, `.json`. Never pickle.

A member name is `<key>.<field>.<ext>`; the field's extension says how its bytes decode, so the
format describes itself. Decoding returns writable numpy arrays (reading straight into them where
possible) because training code may modify a sample in place.
"""
from __future__ import annotations

import ast
import io
import json
import re
import threading
from typing import Any, Callable

import msgpack
import numpy as np
import zstandard

from ..errors import FormatError

NPY_MAGIC = b"\x93NUMPY"
EXTENSIONS = ("npy.zst", "npy", "mp", "json")
_header_cache: dict[bytes, tuple] = {}
_header_lock = threading.Lock()
_FIELD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]*(\.(npy\.zst|npy|mp|json))?$")


# ----------------------------------------------------------------------------------------- encode
def encode_npy(array: np.ndarray) -> bytes:
    """Standard .npy bytes (format 1.0/2.0 as numpy picks); refuses object arrays."""
    array = np.asarray(array)
    if array.dtype.hasobject:
        raise TypeError(f"object arrays cannot be stored without pickle (dtype {array.dtype})")
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _msgpack_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    raise TypeError(f"value of type {type(value).__name__} is not msgpack-serializable")


def encode_msgpack(value: Any) -> bytes:
    return msgpack.packb(value, default=_msgpack_default, use_bin_type=True, strict_types=False)


class Encoder:
    """Turns a source's fields into (member suffix, bytes) pairs."""

    def __init__(self, codec: str = "zstd", zstd_level: int = 3):
        if codec not in ("zstd", "none"):
            raise ValueError(f"unknown codec {codec!r} (expected 'zstd' or 'none')")
        self.codec = codec
        self.zstd_level = zstd_level
        self._compressor = zstandard.ZstdCompressor(level=zstd_level) if codec == "zstd" else None

    def field_name(self, name: str, value: Any) -> str:
        if not _FIELD.match(name):
            raise ValueError("field names are letters, digits, '_' and '-', not starting with '_' (webdataset drops those)")
        if "." in name:
            return name
        if isinstance(value, np.ndarray):
            return f"{name}.npy.zst" if self.codec == "zstd" else f"{name}.npy"
        return f"{name}.mp"

    def encode_value(self, member: str, value: Any) -> bytes:
        if isinstance(value, (bytes, bytearray, memoryview)) and not member.endswith(".mp"):
            return bytes(value)
        if member.endswith(".npy.zst"):
            compressor = self._compressor or zstandard.ZstdCompressor(level=self.zstd_level)
            return compressor.compress(encode_npy(value))
        if member.endswith(".npy"):
            return encode_npy(value)
        if member.endswith(".mp"):
            return encode_msgpack(value)
        if member.endswith(".json"):
            return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
        raise TypeError(f"unknown member extension in {member!r} (known: {', '.join(EXTENSIONS)})")

    def encode_fields(self, key: str, fields: dict) -> list[tuple[str, bytes]]:
        """Encoded members of one sample, in sorted member-name order; errors name key and field."""
        members = []
        for name, value in fields.items():
            try:
                member = self.field_name(name, value)
                data = self.encode_value(member, value)
            except (TypeError, ValueError, OverflowError) as error:
                raise FormatError(f"sample {key!r}, field {name!r}: {error}") from None
            members.append((member, data))
        members.sort()
        return members


# ----------------------------------------------------------------------------------------- decode
def _parse_npy_header(data: bytes | memoryview) -> tuple[np.dtype, tuple, bool, int]:
    """(dtype, shape, fortran_order, offset of the array bytes) of .npy bytes."""
    if bytes(data[:6]) != NPY_MAGIC:
        raise FormatError("not .npy data (bad magic)")
    major = data[6]
    if major == 1:
        header_len = int.from_bytes(data[8:10], "little")
        start = 10
    else:
        header_len = int.from_bytes(data[8:12], "little")
        start = 12
    header = bytes(data[start : start + header_len])
    parsed = _header_cache.get(header)
    if parsed is None:
        with _header_lock:  # ast.literal_eval is not safe from several threads on CPython 3.11
            meta = ast.literal_eval(header.decode("latin1"))
        dtype = np.dtype(meta["descr"])
        if dtype.hasobject:
            raise FormatError("object arrays are refused (they would need pickle)")
        parsed = (dtype, tuple(meta["shape"]), bool(meta["fortran_order"]))
        if len(_header_cache) < 4096:
            _header_cache[header] = parsed
    return (*parsed, start + header_len)


def decode_npy(data: bytes | bytearray | memoryview) -> np.ndarray:
    dtype, shape, fortran, offset = _parse_npy_header(data)
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if not isinstance(data, bytearray):
        data = bytearray(data)  # writable arrays; one copy
    if len(data) - offset < count * dtype.itemsize:
        raise FormatError(f"truncated .npy data ({len(data) - offset} bytes for {shape} {dtype})")
    array = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    return array.reshape(shape, order="F" if fortran else "C")


_local = threading.local()


def _decompressor() -> zstandard.ZstdDecompressor:
    """One decompressor per thread: zstandard's objects must not be shared across threads."""
    dctx = getattr(_local, "dctx", None)
    if dctx is None:
        dctx = _local.dctx = zstandard.ZstdDecompressor()
    return dctx


def decode_npy_zst(data: bytes | memoryview) -> np.ndarray:
    """Decompress straight into the array's own buffer (no intermediate copy of the payload)."""
    reader = _decompressor().stream_reader(data)
    try:
        prefix = reader.read(12)
        if prefix[:6] != NPY_MAGIC:
            raise FormatError("not zstd-compressed .npy data (bad magic)")
        header_len = int.from_bytes(prefix[8:10], "little") if prefix[6] == 1 else int.from_bytes(prefix[8:12], "little")
        start = 10 if prefix[6] == 1 else 12
        need = start + header_len - len(prefix)
        head = prefix + (reader.read(need) if need > 0 else b"")
        dtype, shape, fortran, offset = _parse_npy_header(head)
        extra = head[offset:]
        array = np.empty(shape, dtype=dtype, order="F" if fortran else "C")
        if not array.size:
            return array
        view = memoryview(array.reshape(-1, order="A")).cast("B")
        view[: len(extra)] = extra
        filled = len(extra)
        while filled < len(view):
            n = reader.readinto(view[filled:])
            if not n:
                raise FormatError(f"truncated .npy.zst data ({filled} of {len(view)} bytes)")
            filled += n
        return array
    except zstandard.ZstdError as error:
        raise FormatError(f"corrupt zstd data: {error}") from None


def decode_msgpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def decode_json(data: bytes) -> Any:
    return json.loads(data)


DECODERS: dict[str, Callable[[Any], Any]] = {
    "npy.zst": decode_npy_zst,
    "npy": decode_npy,
    "mp": decode_msgpack,
    "json": decode_json,
    "zst": lambda data: _decompressor().decompress(data),
}


def split_field(name: str) -> tuple[str, str]:
    """`voxels.npy.zst` -> ("voxels", "npy.zst"); a name without a known extension -> (name, "")."""
    for ext in EXTENSIONS:
        if name.endswith("." + ext):
            return name[: -len(ext) - 1], ext
        if name == ext:
            return "", ext
    return name, ""


def decode_value(name: str, value: Any) -> Any:
    """Decode one member's bytes by its extension; values that are not bytes pass unchanged."""
    if not isinstance(value, (bytes, bytearray, memoryview)):
        return value
    _, ext = split_field(name)
    decoder = DECODERS.get(ext)
    if decoder is None:
        return value
    try:
        return decoder(value)
    except FormatError as error:
        raise FormatError(f"member {name!r}: {error}") from None
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, json.JSONDecodeError) as error:
        raise FormatError(f"member {name!r}: {error}") from None


def _to_torch(value: Any) -> Any:
    import torch

    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    return value


def decode_sample(sample: dict, *, strip: bool = True, torch: bool = False) -> dict:
    """Decode every member of a raw (or partly decoded) shard sample.

    With `strip`, field names lose their extension (`voxels.npy.zst` -> `voxels`), which is what
    reader stages use; `__key__`, `__url__` and other `__meta__` entries are kept as they are.
    """
    out = {}
    for name, value in sample.items():
        if name.startswith("__"):
            out[name] = value.decode() if isinstance(value, (bytes, bytearray)) else value
            continue
        decoded = decode_value(name, value)
        if torch:
            decoded = _to_torch(decoded)
        out[split_field(name)[0] if strip else name] = decoded
    return out


def decode(*, strip: bool = False, torch: bool = False):
    """A pipeline stage for `.compose(wdsprep.decode())`: decodes `.mp`, `.npy`, `.npy.zst`, `.json`.

    Keys keep their extensions like webdataset's `.decode()` unless `strip=True`; `torch=True`
    turns arrays into tensors.
    """

    def stage(source):
        for sample in source:
            yield decode_sample(sample, strip=strip, torch=torch)

    return stage
