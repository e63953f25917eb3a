"""Member codecs of the wdsprep format: `.mp`, `.npy`, `.npy.zst`, `.npz`, `.npz.zst`, `.json`. Never pickle.

A `.npy.zst` member is one zstd frame with its content checksum (xxh64 of the .npy bytes, checked
by the decoder at the frame's end), so a flipped byte is refused on every read path, including
plain webdataset + `wdsprep.decode()`, which has no shard index to check against.

A member name is `<key>.<field>.<ext>`; the field's extension says how its bytes decode, so the
format describes itself. Decoding returns writable numpy arrays (reading straight into them where
possible) because training code may modify a sample in place.

Every extension is one that plain readers decode themselves (webdataset, Hugging Face datasets and
Ray Data: `.npy`, `.npz`, `.mp`, `.json`, with HF datasets undoing `.zst` first; `wdsprep.shards.interop`
adds `.zst` to webdataset's and gives Ray a decoder). A value of class `Columns` (named arrays that
belong together, e.g. the per-ray arrays of a voxels sample) is written as one standard `.npz`: a
dict of plain arrays to every reader, never a structured record dtype, which Arrow cannot hold.

`CODECS` (extension -> `MemberCodec`) is the one table of member extensions: the writer's field
names, the reader's extension split, the decoders and the `--codec` choices (`ARRAY_CODECS`) all
derive from it. A new member codec is one encode function, one decode function and one entry.

What a member may hold (docs/format.md#what-a-reader-refuses), written and read alike: at most
`MAX_MEMBER_BYTES` once decoded (an array, the arrays of an `.npz` together, a zstd frame's content),
an `.npz` of at most `MAX_NPZ_ENTRIES` arrays, values nested at most `MAX_DEPTH` deep. A decoder
refuses a member before it allocates or inflates more than that: a zstd frame declaring more is
refused unread, one that does not declare its size is inflated in pieces and refused as soon as it
passes the cap (`inflate`); a `.npy` header must declare exactly the bytes that follow it (in the
member, or in the frame's declared content) and no more than the cap (`npy_size_problem`); an
`.npz`'s entry count (read from its end record, before the zip's directory is parsed), each entry's
header against the entry's declared size and the sum of those sizes are checked before an entry is
inflated (zipfile never inflates past an entry's declared size). JSON, in members as in manifests and
JSON inputs, is read by one rule (`parse_json_text`): standard JSON only (NaN and Infinity are not
JSON), no key twice in one object, nested at most `MAX_DEPTH` deep; msgpack members nest as deep at
most. The writer refuses (one line naming the sample and field) a value it could not read back.
Each refusal is a `FormatError` whose sentence is written once, here (`beyond`, `NESTED`,
`npy_size_problem`); the readers add the shard and member to it.
"""
from __future__ import annotations

import ast
import io
import json
import math
import re
import threading
import zipfile
import zlib
from dataclasses import dataclass
from typing import Any, Callable

import msgpack
import numpy as np
import zstandard

from ..errors import ConfigError, FormatError, ShardError

NPY_MAGIC = b"\x93NUMPY"

# -- the caps (module docstring); `beyond` and `NESTED` are their one wording
MAX_MEMBER_BYTES = 1 << 30  # a member's data once decoded: an array, an .npz's arrays, a zstd frame's content
MAX_NPZ_ENTRIES = 1024  # the arrays of one .npz member
MAX_DEPTH = 100  # containers within containers: a .json or .mp member, a manifest, a JSON input, a selection
MEMBER = "a member"  # what MAX_MEMBER_BYTES bounds, as `beyond` says it
NESTED = f"nested deeper than {MAX_DEPTH} levels"


def beyond(amount: str, what: str, limit: int) -> str:
    """The one sentence of a size above its cap: "<amount>, more than <what> may hold (<limit> bytes)"
    (members here; sample tables, shard table extras and native inputs alike)."""
    return f"{amount}, more than {what} may hold ({limit} bytes)"


def too_many_arrays(count: int) -> str:
    """The one sentence of an .npz of more than `MAX_NPZ_ENTRIES` arrays (written or read)."""
    return f"{count} arrays, more than an .npz member may hold ({MAX_NPZ_ENTRIES})"


_header_cache: dict[bytes, tuple] = {}
_header_lock = threading.Lock()


# ----------------------------------------------------------------------------------------- encode
_npy_headers: dict[tuple, bytes] = {}  # (dtype, shape, fortran) -> the header numpy writes for them


def encode_npy(array: np.ndarray) -> bytes:
    """Standard .npy bytes (format 1.0/2.0 as numpy picks); refuses object arrays.

    numpy's own writer makes the header once per (dtype, shape, order); the data is then the
    array's bytes in that order, exactly what `np.lib.format.write_array` would write.
    """
    if array.__class__ is not np.ndarray:
        array = np.asarray(array)
    if array.nbytes > MAX_MEMBER_BYTES:
        raise ValueError(npy_size_problem(array.dtype, array.shape, None))
    flags = array.flags
    fortran = not flags.c_contiguous and flags.f_contiguous
    signature = (array.dtype, array.shape, fortran)
    head = _npy_headers.get(signature)
    if head is None:  # a cached signature's dtype was checked when it was cached
        if array.dtype.hasobject:
            raise TypeError(f"object arrays cannot be stored without pickle (dtype {array.dtype})")
        buffer = io.BytesIO()
        np.lib.format.write_array(buffer, array, allow_pickle=False)
        encoded = buffer.getvalue()
        if len(_npy_headers) < 4096:
            _npy_headers[signature] = encoded[: len(encoded) - array.nbytes]
        return encoded
    return head + array.tobytes(order="F" if fortran else "C")


def _msgpack_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    raise TypeError(f"value of type {type(value).__name__} is not msgpack-serializable")


_packers = threading.local()  # one msgpack Packer per thread (a Packer holds a buffer); packb makes one per call


def encode_msgpack(value: Any) -> bytes:
    """msgpack.packb's bytes (a Packer resets its buffer after a value that fails to pack); a value
    nested deeper than `MAX_DEPTH` is a ValueError (readers refuse it)."""
    packer = getattr(_packers, "packer", None)
    if packer is None:
        packer = _packers.packer = msgpack.Packer(default=_msgpack_default, use_bin_type=True, strict_types=False)
    data = packer.pack(value)
    if isinstance(value, (dict, list, tuple)):
        check_nesting(value, _msgpack_containers(data))
    return data


def encode_json(value: Any) -> bytes:
    """Standard JSON (NaN and Infinity are a ValueError: readers refuse them), nested at most `MAX_DEPTH` deep."""
    try:
        data = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    except RecursionError:
        raise ValueError(NESTED) from None
    if isinstance(value, (dict, list, tuple)):
        check_nesting(value, _json_containers(data))
    return data


class Columns(dict):
    """Named arrays written together as one `.npz` member (`name -> array`, in insertion order).

    For arrays that always travel together (one member instead of one per array: a tar member costs
    512 bytes of header and up to 511 of padding); every reader gets a dict of plain arrays back.
    """


_NPZ_DATE = (1980, 1, 1, 0, 0, 0)  # the zip epoch: no clock in the bytes
_COLUMN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-]*")


def encode_npz(columns: dict) -> bytes:
    """A standard `.npz` (`np.load` reads it): one stored (uncompressed) `<name>.npy` entry per
    column in the dict's order, dated 1980-01-01, made on "Unix": equal columns, equal bytes."""
    if len(columns) > MAX_NPZ_ENTRIES:
        raise ValueError(too_many_arrays(len(columns)))
    total = sum(np.asarray(array).nbytes for array in columns.values())
    if total > MAX_MEMBER_BYTES:
        raise ValueError(beyond(f"its columns hold {total} bytes", MEMBER, MAX_MEMBER_BYTES))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, array in columns.items():
            if not isinstance(name, str) or not _COLUMN.fullmatch(name):
                raise ValueError(f"column name {name!r} is not letters, digits, '_' and '-'")
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_NPZ_DATE)
            info.create_system = 3
            info.external_attr = 0o644 << 16
            archive.writestr(info, encode_npy(array))
    return buffer.getvalue()


class Encoder:
    """Turns a source's fields into (member suffix, bytes) pairs.

    A field's member suffix and encoder depend on its name and its value's class only, so they are
    worked out once per (name, class) and kept (`_plan`); per sample only the encoding runs.
    """

    def __init__(self, codec: str = "zstd", zstd_level: int = 3):
        if codec not in ARRAY_CODECS:
            raise ConfigError(f"unknown codec {codec!r} (expected one of: {', '.join(ARRAY_CODECS)})")
        self.codec = codec
        self.zstd_level = zstd_level
        self._array_extension = ARRAY_CODECS[codec]
        self._columns_extension = COLUMN_CODECS[codec]
        self._compressor: zstandard.ZstdCompressor | None = None
        self._plans: dict[tuple[str, type], tuple[str, Callable[[Any], bytes]]] = {}

    def compress(self, data: bytes) -> bytes:
        """One zstd frame at this encoder's level, with its content checksum (`decode_npy_zst` checks
        it, so a reader without the shard index, e.g. plain webdataset, still refuses a changed
        byte); the compressor is made on first use and kept."""
        if self._compressor is None:
            self._compressor = zstandard.ZstdCompressor(level=self.zstd_level, write_checksum=True)
        return self._compressor.compress(data)

    def field_name(self, name: str, value: Any) -> str:
        return self._plan(name, value.__class__)[0]

    def encode_value(self, member: str, value: Any) -> bytes:
        return self._value_encoder(member, value.__class__)(value)

    def _value_encoder(self, member: str, kind: type) -> Callable[[Any], bytes]:
        """What turns a value of class `kind` into the bytes of `member` (decided by the class alone)."""
        codec = CODECS.get(_field(member)[1])
        if codec is None:
            raise TypeError(f"unknown member extension in {member!r} (known: {', '.join(EXTENSIONS)})")
        if issubclass(kind, (bytes, bytearray, memoryview)) and codec.bytes_are_encoded:
            return bytes
        if codec.zstd:
            return lambda value: self.compress(codec.encode(value))
        return codec.encode

    def _plan(self, name: str, kind: type) -> tuple[str, Callable[[Any], bytes]]:
        """(member suffix, encoder) of field `name` holding a value of class `kind`. Fields repeat in
        every sample with values of the same class: the checks and lookups run once (cached)."""
        plan = self._plans.get((name, kind))
        if plan is None:
            if not _FIELD.match(name):
                raise ValueError("field names are letters, digits, '_' and '-', not starting with '_' (webdataset drops those)")
            if "." in name:
                member = name
            elif issubclass(kind, np.ndarray):
                member = f"{name}.{self._array_extension}"
            elif issubclass(kind, Columns):
                member = f"{name}.{self._columns_extension}"
            else:
                member = f"{name}.mp"
            plan = (member, self._value_encoder(member, kind))
            if len(self._plans) < 1024:
                self._plans[name, kind] = plan
        return plan

    def encode_fields(self, key: str, fields: dict) -> list[tuple[str, bytes]]:
        """Encoded members of one sample, in sorted member-name order; errors name key and field."""
        members = []
        plans = self._plans
        name = None
        try:
            for name, value in fields.items():
                member, encode = plans.get((name, value.__class__)) or self._plan(name, value.__class__)
                members.append((member, encode(value)))
        except (TypeError, ValueError, OverflowError) as error:
            raise FormatError(f"sample {key!r}, field {name!r}: {error}") from None
        members.sort()
        return members


# ----------------------------------------------------------------------------------------- decode
def npy_header_span(prefix: bytes | bytearray | memoryview) -> tuple[int, int]:
    """(offset, length) of the header dict in .npy bytes, from their first 10 (v1) or 12 bytes."""
    if bytes(prefix[:6]) != NPY_MAGIC:
        raise FormatError("not .npy data (bad magic)")
    major = prefix[6] if len(prefix) > 6 else None
    start = {1: 10, 2: 12, 3: 12}.get(major)
    if start is None:
        raise FormatError(f"unknown .npy format version {major}" if major is not None else "truncated .npy header")
    if len(prefix) < start:
        raise FormatError(f"truncated .npy header ({len(prefix)} bytes)")
    if prefix[7]:  # numpy writes and reads versions 1.0, 2.0 and 3.0 only
        raise FormatError(f"unknown .npy format version {major}.{prefix[7]}")
    return start, int.from_bytes(prefix[8:start], "little")


def npy_meta(header: bytes) -> tuple[np.dtype, tuple, bool, int]:
    """(dtype, shape, fortran_order, element count) of a .npy header dict; cached (headers repeat)."""
    parsed = _header_cache.get(header)
    if parsed is None:
        try:
            with _header_lock:  # ast.literal_eval is not safe from several threads on CPython 3.11
                meta = ast.literal_eval(header.decode("latin1"))
            dtype = np.dtype(meta["descr"])
            shape = tuple(int(n) for n in meta["shape"])
            fortran = bool(meta["fortran_order"])
        except (ValueError, SyntaxError, KeyError, TypeError, MemoryError, RecursionError) as error:
            raise FormatError(f"unreadable .npy header ({type(error).__name__}: {error})") from None
        if dtype.hasobject:
            raise FormatError("object arrays are refused (they would need pickle)")
        if any(n < 0 for n in shape):
            raise FormatError(f"negative .npy shape {shape}")
        parsed = (dtype, shape, fortran, math.prod(shape))
        if len(_header_cache) < 4096:
            _header_cache[header] = parsed
    return parsed


def npy_size_problem(dtype: np.dtype, shape: tuple, present: int | None) -> str | None:
    """What is wrong with a .npy header declaring a `dtype` array of `shape` over `present` bytes of
    data (None: not known yet), or None: more than a member may hold, or other than the bytes that
    follow it. The one rule of .npy members and .npy inputs (`sources.base.check_npy_bytes`)."""
    declared = math.prod(shape) * dtype.itemsize
    what = f"its header declares a {dtype} array of shape {tuple(shape)}, {declared} bytes"
    if present is not None and present != declared:
        return f"truncated or malformed .npy ({what}, but {present} bytes follow it)"
    if declared > MAX_MEMBER_BYTES:
        return beyond(what, MEMBER, MAX_MEMBER_BYTES)
    return None


_recent_prefixes: list[tuple[bytes, tuple]] = []  # (.npy bytes up to the array data, parsed): a shard repeats a few


def _npy_prefix(data: bytearray) -> tuple:
    """(shape, dtype, data offset, fortran, data bytes) of .npy bytes; equal prefixes mean equal headers."""
    start, length = npy_header_span(data[:12])
    offset = start + length
    if len(data) < offset:
        raise FormatError(f"truncated .npy header ({len(data)} of {offset} bytes)")
    dtype, shape, fortran, count = npy_meta(bytes(data[start:offset]))
    parsed = (shape, dtype, offset, fortran, count * dtype.itemsize)
    _recent_prefixes.insert(0, (bytes(data[:offset]), parsed))
    del _recent_prefixes[8:]
    return parsed


def decode_npy(data: bytes | bytearray | memoryview) -> np.ndarray:
    """A writable array over `data` itself when it is a bytearray (else over one copy of it); its
    header must declare exactly the bytes after it (`npy_size_problem`)."""
    if data.__class__ is not bytearray:
        data = bytearray(data)  # writable arrays; one copy
    for prefix, parsed in _recent_prefixes:
        if data.startswith(prefix):
            break
    else:
        parsed = _npy_prefix(data)
    shape, dtype, offset, fortran, nbytes = parsed
    if len(data) - offset != nbytes or nbytes > MAX_MEMBER_BYTES:
        raise FormatError(npy_size_problem(dtype, shape, len(data) - offset))
    if fortran:
        return np.ndarray(shape, dtype, data, offset, None, "F")
    return np.ndarray(shape, dtype, data, offset)  # shaped at once, no reshape


def _read_exact(readinto: Callable, view: memoryview, what: str) -> None:
    filled = 0
    while filled < len(view):
        n = readinto(view[filled:])
        if not n:
            raise FormatError(f"truncated {what} ({filled} of {len(view)} bytes)")
        filled += n


def read_npy(readinto: Callable, leading: int | None = None, size: int | None = None) -> np.ndarray:
    """An array read from a stream of .npy bytes (`readinto(view) -> count`), straight into its buffer.

    `size`: the stream's length, when known (an .npz entry's, a zstd frame's declared content): the
    header must declare exactly the bytes after it, and never more than a member may hold
    (`npy_size_problem`), checked before the array is allocated. With `leading`, only the first
    `leading` rows along axis 0 are read (C order only); the rest of the stream is left unread.
    """
    prefix = bytearray(12)
    _read_exact(readinto, memoryview(prefix)[:10], ".npy header")
    if prefix[6:7] != b"\x01" and prefix[:6] == NPY_MAGIC:
        _read_exact(readinto, memoryview(prefix)[10:], ".npy header")
    start, length = npy_header_span(prefix)
    header = bytearray(length)
    _read_exact(readinto, memoryview(header), ".npy header")
    dtype, shape, fortran, count = npy_meta(bytes(header))
    present = None if size is None else size - start - length
    if count * dtype.itemsize > MAX_MEMBER_BYTES or (present is not None and present != count * dtype.itemsize):
        raise FormatError(npy_size_problem(dtype, shape, present))
    if leading is not None and shape:
        if fortran:
            raise FormatError("a partial read of a Fortran-ordered array")
        shape = (min(leading, shape[0]), *shape[1:])
    array = np.empty(shape, dtype=dtype, order="F" if fortran else "C")
    if array.size:  # its bytes in memory order, as uint8 (a memoryview refuses datetime dtypes)
        _read_exact(readinto, memoryview(array.reshape(-1, order="A").view(np.uint8)), ".npy data")
    return array


_local = threading.local()


def decompressor() -> zstandard.ZstdDecompressor:
    """One decompressor per thread: zstandard's objects must not be shared across threads."""
    dctx = getattr(_local, "dctx", None)
    if dctx is None:
        dctx = _local.dctx = zstandard.ZstdDecompressor()
    return dctx


def frame_size(data: bytes | bytearray | memoryview, limit: int = MAX_MEMBER_BYTES, what: str = MEMBER) -> int | None:
    """The content size the zstd frame `data` declares (None when it does not), refused (`FormatError`)
    above `limit` before anything is inflated; raises `zstandard.ZstdError` for what is no frame."""
    size = zstandard.get_frame_parameters(data).content_size
    if size == zstandard.CONTENTSIZE_UNKNOWN:
        return None
    if size > limit:
        raise FormatError(beyond(f"its zstd frame declares {size} bytes", what, limit))
    return size


def inflate(data: bytes | bytearray | memoryview, limit: int = MAX_MEMBER_BYTES, what: str = MEMBER) -> bytes:
    """The content of the zstd frame `data`, never more than `limit` bytes inflated: a frame declaring
    more is refused unread; one declaring its size is inflated into exactly that (zstd refuses a frame
    that holds other than it declares; bytes after it are refused); one that does not is read in pieces,
    refused as soon as it passes `limit`. `FormatError` for the cap, `zstandard.ZstdError` for bad data."""
    if frame_size(data, limit, what) is not None:
        return decompressor().decompress(data, allow_extra_data=False)
    reader = decompressor().stream_reader(data)
    out = bytearray()
    while chunk := reader.read(1 << 20):
        out += chunk
        if len(out) > limit:
            raise FormatError(beyond(f"its zstd frame holds more than {len(out) - len(chunk)} bytes", what, limit))
    return bytes(out)


def decode_npy_zst(data: bytes | memoryview) -> np.ndarray:
    """Decompress straight into the array's own buffer (no intermediate copy of the payload).

    The .npy header must declare exactly the content the frame declares (or, for a frame that does not
    declare its size, no content may follow the array), never more than a member may hold: checked
    before the array is allocated. The frame is read to its end, so its content checksum (written by
    `Encoder.compress`) is checked before the array is returned; frames written without one (older
    shards) read as before. Bytes after the frame are refused (garbage fails to decode, a second frame
    is content after the array).
    """
    try:
        reader = decompressor().stream_reader(data)
        array = read_npy(reader.readinto, size=frame_size(data))
        if reader.read(1):  # to the frame's end (its checksum): nothing may follow the array
            raise FormatError("content after its .npy array (the zstd frame holds more than the .npy header declares)")
        return array
    except zstandard.ZstdError as error:
        raise FormatError(f"corrupt zstd data: {error}") from None


_ZIP_END = b"PK\x05\x06"  # the zip's end of central directory record: 22 bytes and a comment of at most 65535


def _npz_entries(data: bytes | bytearray | memoryview) -> None:
    """Refuse an .npz whose end record counts more than `MAX_NPZ_ENTRIES` entries, before zipfile
    makes an object of every entry of its directory (a zip64 archive counts 65535 there)."""
    tail = bytes(data[max(0, len(data) - 22 - 65535):])
    at = tail.rfind(_ZIP_END)
    if at >= 0 and at + 22 <= len(tail):
        count = int.from_bytes(tail[at + 10 : at + 12], "little")
        if count > MAX_NPZ_ENTRIES:
            raise FormatError(too_many_arrays(count))


def decode_npz(data: bytes | bytearray | memoryview) -> dict[str, np.ndarray]:
    """`{name: writable array}` of an `.npz` (stored or deflated entries, CRC-checked; never pickle).

    Its entry count, each entry's size against its .npy header and the entries' sizes together are
    checked before an entry is inflated or its array allocated (module docstring); each array is read
    straight into its own buffer."""
    _npz_entries(data)
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            entries = archive.infolist()
            total = sum(info.file_size for info in entries)
            if total > MAX_MEMBER_BYTES:
                raise FormatError(beyond(f"its .npz entries declare {total} bytes", MEMBER, MAX_MEMBER_BYTES))
            columns = {}
            for info in entries:
                if not info.filename.endswith(".npy"):
                    raise FormatError(f".npz entry {info.filename!r} is not an .npy array")
                with archive.open(info) as entry:
                    try:
                        columns[info.filename[:-4]] = read_npy(entry.readinto, size=info.file_size)
                    except FormatError as error:
                        raise FormatError(f".npz entry {info.filename!r}: {error}") from None
                    entry.read(1)  # at the entry's end: its CRC checked
            return columns
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError, OSError, zlib.error) as error:
        raise FormatError(f"not a readable .npz ({error})") from None


def decode_npz_zst(data: bytes | memoryview) -> dict[str, np.ndarray]:
    try:
        return decode_npz(inflate(data))
    except zstandard.ZstdError as error:
        raise FormatError(f"corrupt zstd data: {error}") from None


# -- values: msgpack and JSON, nested at most MAX_DEPTH deep
_MSGPACK_CONTAINERS = bytes([*range(0x80, 0xA0), 0xDC, 0xDD, 0xDE, 0xDF])  # fixmap, fixarray, array/map 16/32


def _msgpack_containers(data: bytes | bytearray | memoryview) -> int:
    """At least the number of arrays and maps in msgpack `data` (each starts with one of these bytes)."""
    if len(data) <= MAX_DEPTH:
        return len(data)
    raw = data if data.__class__ is bytes else bytes(data)
    return len(raw) - len(raw.translate(None, _MSGPACK_CONTAINERS))


def _json_containers(data: bytes | bytearray | str) -> int:
    """At least the number of arrays and objects in JSON text `data`."""
    if isinstance(data, str):
        return data.count("[") + data.count("{")
    return data.count(b"[") + data.count(b"{")


def check_nesting(value: Any, containers: int) -> None:
    """ValueError(NESTED) when `value` (decoded JSON or msgpack: dicts, lists and tuples) nests deeper
    than `MAX_DEPTH`; `containers`, at least how many it holds, spares the walk when there are too few
    (what nearly every value has). The walk is iterative: no recursion limit, whatever the nesting."""
    if containers <= MAX_DEPTH:
        return
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        for child in (node.values() if isinstance(node, dict) else node):
            if isinstance(child, (dict, list, tuple)):
                if depth >= MAX_DEPTH:
                    raise ValueError(NESTED)
                stack.append((child, depth + 1))


def decode_msgpack(data: bytes | bytearray | memoryview) -> Any:
    try:
        value = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except msgpack.StackError:  # msgpack's own limit (1024 levels), met before ours
        raise FormatError(NESTED) from None
    if isinstance(value, (dict, list)):
        check_nesting(value, _msgpack_containers(data))
    return value


def unique_keys(pairs: list) -> dict:
    """`json.loads`' `object_pairs_hook` that refuses a field given twice in one object (plain
    `json` keeps the last silently)."""
    data = dict(pairs)
    if len(data) != len(pairs):
        seen: set = set()
        duplicate = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise ValueError(f"duplicate key {duplicate!r} in one object")
    return data


def _not_json(name: str) -> None:
    raise ValueError(f"{name} is not JSON (a number must be finite)")


def parse_json_text(data: bytes | bytearray | str) -> Any:
    """The one JSON rule of the format and its inputs (`.json` members, manifests, `sources.base.
    parse_json`): standard JSON only (NaN and Infinity are not JSON), no key given twice in one object
    (plain `json` keeps the last silently), nested at most `MAX_DEPTH` deep. Anything else is a
    ValueError (JSONDecodeError, UnicodeDecodeError alike) naming the problem."""
    try:
        value = json.loads(data, object_pairs_hook=unique_keys, parse_constant=_not_json)
    except RecursionError:  # json's own limit (the interpreter's), met before ours
        raise ValueError(NESTED) from None
    if isinstance(value, (dict, list)):
        check_nesting(value, _json_containers(data))
    return value


def decode_json(data: bytes | bytearray | memoryview) -> Any:
    return parse_json_text(bytes(data) if data.__class__ is memoryview else data)


# ------------------------------------------------------------------------------------- the table
@dataclass(frozen=True)
class MemberCodec:
    """How the members of one extension are written and read."""

    extension: str  # what follows the field name: `voxels.npy.zst` -> "npy.zst"
    encode: Callable[[Any], bytes]
    decode: Callable[[Any], Any]  # bytes -> value, undoing `zstd` too
    zstd: bool = False  # `encode`'s bytes are then zstd-compressed at the Encoder's level
    codec: str | None = None  # the `--codec` name that writes arrays with this extension
    columns: str | None = None  # the `--codec` name that writes `Columns` with this extension
    bytes_are_encoded: bool = True  # a bytes value is already member data (else it is encoded as a value)


CODECS: dict[str, MemberCodec] = {  # extension -> codec: every member extension the format knows
    "npy.zst": MemberCodec("npy.zst", encode_npy, decode_npy_zst, zstd=True, codec="zstd"),
    "npy": MemberCodec("npy", encode_npy, decode_npy, codec="none"),
    "npz.zst": MemberCodec("npz.zst", encode_npz, decode_npz_zst, zstd=True, columns="zstd"),
    "npz": MemberCodec("npz", encode_npz, decode_npz, columns="none"),
    "mp": MemberCodec("mp", encode_msgpack, decode_msgpack, bytes_are_encoded=False),
    "json": MemberCodec("json", encode_json, decode_json),
}
EXTENSIONS = tuple(CODECS)
ARRAY_CODECS = {codec.codec: extension for extension, codec in CODECS.items() if codec.codec}  # --codec name -> extension
COLUMN_CODECS = {codec.columns: extension for extension, codec in CODECS.items() if codec.columns}  # the same, for Columns
DECODERS: dict[str, Callable[[Any], Any]] = {extension: codec.decode for extension, codec in CODECS.items()}
_LONGEST_FIRST = sorted(EXTENSIONS, key=len, reverse=True)  # `npy.zst` before any `zst` that may come
_FIELD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]*(\.(" + "|".join(map(re.escape, _LONGEST_FIRST)) + "))?$")


_FIELDS: dict[str, tuple[str, str, Callable | None]] = {}  # member field -> (stripped, ext, decoder)


def _field(name: str) -> tuple[str, str, Callable | None]:
    """`voxels.npy.zst` -> ("voxels", "npy.zst", decoder); names repeat in every sample: cached."""
    found = _FIELDS.get(name)
    if found is None:
        stripped, ext = name, ""
        for known in _LONGEST_FIRST:
            if name.endswith("." + known):
                stripped, ext = name[: -len(known) - 1], known
                break
            if name == known:
                stripped, ext = "", known
                break
        found = (name, "", _META) if name.startswith("__") else (stripped, ext, DECODERS.get(ext))
        if len(_FIELDS) < 4096:
            _FIELDS[name] = found
    return found


def split_field(name: str) -> tuple[str, str]:
    """`voxels.npy.zst` -> ("voxels", "npy.zst"); a name without a known extension -> (name, "")."""
    stripped, ext, _ = _field(name)
    return stripped, ext


DECODE_ERRORS = (FormatError, ValueError, msgpack.ExtraData, msgpack.FormatError, json.JSONDecodeError)


def decode_value(name: str, value: Any) -> Any:
    """Decode one member's bytes by its extension; values that are not bytes pass unchanged."""
    if not isinstance(value, (bytes, bytearray, memoryview)):
        return value
    decoder = _field(name)[2]
    if decoder is None or decoder is _META:
        return value
    try:
        return decoder(value)
    except DECODE_ERRORS as error:
        raise FormatError(f"member {name!r}: {error}") from None


def _to_torch(value: Any) -> Any:
    import torch

    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    if value.__class__ is dict:  # an .npz member's columns
        return {name: _to_torch(column) for name, column in value.items()}
    return value


_BYTES_TYPES = (bytes, bytearray, memoryview)


_META = object()  # the "decoder" of `__key__`, `__url__`, ... entries


def _text(data: bytes | bytearray | memoryview) -> str:
    return str(data, "utf-8")  # a `__meta__` member: text


def _undecoded(data: Any) -> Any:
    return bytearray(data) if data.__class__ is memoryview else data  # a view into a shard is never kept


def _then_torch(decode: Callable) -> Callable:
    def decode_to_torch(data):
        return _to_torch(decode(data))

    return decode_to_torch


_MEMBER_DECODERS: dict[tuple, tuple[str, Callable]] = {}  # (member, strip, torch) -> (field, decode)


def member_decoder(name: str, strip: bool = True, torch: bool = False) -> tuple[str, Callable]:
    """(field name, raw bytes -> value) for members named `name`; names repeat in every sample: cached.
    The function takes bytes, a bytearray or a memoryview (e.g. into a shard's read buffer) and returns a
    value that does not keep a memoryview (decoders copy what they keep; undecoded bytes are copied
    into a bytearray); it raises one of `DECODE_ERRORS` on bytes that do not decode."""
    found = _MEMBER_DECODERS.get((name, strip, torch))
    if found is None:
        stripped, _, decoder = _FIELDS.get(name) or _field(name)
        if decoder is _META:
            found = (name, _text)
        else:
            decode = decoder or _undecoded
            found = ((stripped if strip else name), _then_torch(decode) if torch else decode)
        if len(_MEMBER_DECODERS) < 4096:
            _MEMBER_DECODERS[name, strip, torch] = found
    return found


def decode_member(url: str, key: Any, name: str, data: Any, strip: bool = True, torch: bool = False) -> tuple[str, Any]:
    """(field name, value) of the member `name` whose raw bytes are `data` (of sample `key` of the
    shard `url`), by `member_decoder`; a member that does not decode raises `ShardError`."""
    field, decode = member_decoder(name, strip, torch)
    try:
        return field, decode(data)
    except DECODE_ERRORS as error:
        raise ShardError(url, f"member {key}.{name}: {error}") from None


def decode_sample(sample: dict, *, strip: bool = True, torch: bool = False) -> dict:
    """Decode every member of a raw (or partly decoded) shard sample.

    With `strip`, field names lose their extension (`voxels.npy.zst` -> `voxels`), which is what
    reader stages use; `__key__`, `__url__` and other `__meta__` entries are kept as they are.
    A member that does not decode raises `ShardError` naming the shard (`__url__`) and the member.
    """
    url, key = str(sample.get("__url__", "<sample>")), sample.get("__key__")
    out = {}
    for name, value in sample.items():
        if isinstance(value, _BYTES_TYPES):
            name, value = decode_member(url, key, name, value, strip, torch)
        else:  # decoded already (or an int the dataset stamped): only renamed
            stripped, _, decoder = _FIELDS.get(name) or _field(name)
            if decoder is not _META:
                name = stripped if strip else name
                if torch:
                    value = _to_torch(value)
        out[name] = value
    return out
