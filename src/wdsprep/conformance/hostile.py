"""Hostile shard members, made as a stranger makes them: bombs, lying headers, deep nesting.

Each kind of `MEMBERS` is a member (its extension and bytes) that a careless reader pays gigabytes or
a traceback for, built here by the format's published rules alone (the zstd frame format of RFC 8878,
the zip and .npy layouts, JSON and msgpack), never by wdsprep's writer: a zstd frame of RLE blocks
(4 bytes each, 128 KiB of zeros each: a 48 KB frame of 1.5 GiB), a raw deflate stream of repeated
full-flush blocks (1.5 MB of deflate for 1.5 GiB), headers declaring what the bytes do not hold, and
containers nested 10^5 deep. `plant` puts one into a copy of a converted dataset: the dataset cut to
the shard of one sample (its members as the conversion wrote them, the hostile one added), indexed by
the format's rules (docs/format.md) with `struct`, `xxhash` and `msgpack`, its manifest written with
`json`; `plant_tar_header` writes that sample's shard without an index instead, one of its tar
headers declaring 7 GiB. The suite (`SourceTests`) reads each through every reader, in a child
process that measures them (`measured.run_readers`).
"""
from __future__ import annotations

import hashlib
import json
import pathlib
import shutil
import struct
import tarfile
import zlib
from dataclasses import dataclass
from typing import Callable

import msgpack
import numpy as np
import xxhash

GIB = 1 << 30
BOMB_BYTES = 3 * GIB // 2  # what a bomb inflates to: above any cap a reader may have, far above 256 MB
LIE_BYTES = 1 << 40  # what a lying header declares
DEPTH = 100_000  # containers nested in a nesting bomb
TAR_LIE_BYTES = 7 * GIB  # what a lying tar header declares

_ZSTD_MAGIC = struct.pack("<I", 0xFD2FB528)
_BLOCK = 128 << 10  # the largest zstd block


def _npy_header(dtype: str, shape: tuple) -> bytes:
    import io

    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def zstd_frame(parts: list, declared: int | None) -> bytes:
    """A zstd frame (RFC 8878) of `parts`: bytes (raw blocks) or ints (that many zero bytes, as RLE
    blocks), with a 128 KiB window and, unless None, `declared` as its content size (true or not)."""
    header = _ZSTD_MAGIC + (bytes([0xC0, 7 << 3]) + struct.pack("<Q", declared) if declared is not None else bytes([0x00, 7 << 3]))
    blocks = []
    for part in parts:
        if isinstance(part, int):
            while part:
                size = min(part, _BLOCK)
                blocks.append((1, size, b"\0"))
                part -= size
        else:
            for at in range(0, len(part), _BLOCK):
                piece = part[at : at + _BLOCK]
                blocks.append((0, len(piece), piece))
    out = bytearray(header)
    for number, (kind, size, body) in enumerate(blocks):
        last = number == len(blocks) - 1
        out += (int(last) | kind << 1 | size << 3).to_bytes(3, "little") + body
    return bytes(out)


def _deflated_zeros(prefix: bytes, zeros: int) -> bytes:
    """A raw deflate stream of `prefix` then `zeros` zero bytes: one compressed MiB of zeros after a
    full flush is the same bytes every time, so the stream is that block repeated (no GiB is made)."""
    mib = 1 << 20
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = compressor.compress(prefix) + compressor.flush(zlib.Z_FULL_FLUSH)
    block = compressor.compress(bytes(mib)) + compressor.flush(zlib.Z_FULL_FLUSH)
    rest = compressor.compress(bytes(zeros % mib)) + compressor.flush()
    return head + block * (zeros // mib) + rest


def _zip_parts(name: str, method: int, stored: int, size: int, crc: int = 0) -> tuple[bytes, bytes]:
    """(local header, central directory and end record) of a one-entry zip archive whose entry's data,
    `stored` bytes compressed by `method`, follow the local header, declaring `size` bytes and the CRC
    `crc` (a bomb's reader pays before any CRC is checked)."""
    raw = name.encode()
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0x21, crc, stored, size, len(raw), 0) + raw
    central = struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0x21, crc, stored, size,
                          len(raw), 0, 0, 0, 0, 0, 0) + raw
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, len(central), len(local) + stored, 0)
    return local, central + end


def npy_zst_bomb() -> bytes:
    """A 48 KB `.npy.zst`: an honest frame of a 1.5 GiB array of zeros."""
    header = _npy_header("|u1", (BOMB_BYTES,))
    return zstd_frame([header, BOMB_BYTES], len(header) + BOMB_BYTES)


def npy_zst_lying_header() -> bytes:
    """A ~100-byte `.npy.zst`: an honest frame whose .npy header declares a 1 TiB array it does not hold."""
    header = _npy_header("<f8", (LIE_BYTES // 8,))
    return zstd_frame([header], len(header))


def zstd_lying_frame() -> bytes:
    """A 25-byte zstd frame declaring 1 TiB of content and holding 8 bytes (an `.npz.zst`)."""
    return zstd_frame([b"PK\x05\x06\0\0\0\0"], LIE_BYTES)


def npz_zst_bomb() -> bytes:
    """A 48 KB `.npz.zst`: an honest frame of an .npz holding one stored 1.5 GiB array of zeros."""
    header = _npy_header("|u1", (BOMB_BYTES,))
    size = len(header) + BOMB_BYTES
    local, tail = _zip_parts("a.npy", 0, size, size)
    return zstd_frame([local + header, BOMB_BYTES, tail], len(local) + size + len(tail))


def npz_deflate_bomb() -> bytes:
    """A 1.5 MB `.npz`: one deflated entry inflating to a 1.5 GiB array of zeros, as it declares."""
    header = _npy_header("|u1", (BOMB_BYTES,))
    stored = _deflated_zeros(header, BOMB_BYTES)
    local, tail = _zip_parts("a.npy", 8, len(stored), len(header) + BOMB_BYTES)
    return local + stored + tail


def npy_lying_header() -> bytes:
    """A plain `.npy` whose header declares a 1 TiB array, followed by 16 bytes."""
    return _npy_header("<f8", (LIE_BYTES // 8,)) + bytes(16)


@dataclass(frozen=True)
class HostileMember:
    """A hostile member: its extension, its bytes, and words the reader's one-line refusal holds."""

    extension: str
    make: Callable[[], bytes]
    refusal: str  # a regular expression the refusal matches


MEMBERS: dict[str, HostileMember] = {
    "npy.zst bomb": HostileMember("npy.zst", npy_zst_bomb, r"more than a member may hold"),
    "npy.zst lying header": HostileMember("npy.zst", npy_zst_lying_header, r"header declares .* bytes"),
    "zstd lying frame": HostileMember("npz.zst", zstd_lying_frame, r"more than a member may hold"),
    "npz.zst bomb": HostileMember("npz.zst", npz_zst_bomb, r"more than a member may hold"),
    "npz deflate bomb": HostileMember("npz", npz_deflate_bomb, r"more than a member may hold"),
    "npy lying header": HostileMember("npy", npy_lying_header, r"header declares .* bytes"),
    "json nested": HostileMember("json", lambda: b"[" * DEPTH + b"]" * DEPTH, r"nested deeper than"),
    "msgpack nested": HostileMember("mp", lambda: b"\x91" * DEPTH + b"\xc0", r"nested deeper than"),
    "json NaN": HostileMember("json", lambda: b'{"loss": NaN, "best": -Infinity}', r"NaN"),
    "json duplicate key": HostileMember("json", lambda: b'{"label": 1, "label": 7}', r"duplicate key 'label'"),
}
TAR_HEADER = "tar header declaring 7 GiB"  # the kind `plant_tar_header` makes
TAR_REFUSAL = r"truncated shard: .*(declares \d+ bytes, the shard holds \d+ after it|ends after \d+ of \d+ bytes)"  # a file; a stream
KINDS = (*MEMBERS, TAR_HEADER)
HOSTILE_FIELD = "hostile"  # the planted member's field name


# ------------------------------------------------------------------ a dataset of one hostile sample
def _tar_member(name: str, data: bytes, size: int | None = None) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    block = bytearray(info.tobuf(format=tarfile.USTAR_FORMAT))
    if size is not None:  # a header declaring `size` bytes, its checksum made anew
        block[124:136] = b"%011o\0" % size
        block[148:156] = b" " * 8
        block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block) + data + bytes(-len(data) % 512)


def _first_sample(output: pathlib.Path) -> tuple[str, str, list[tuple[str, bytes]]]:
    """(split, key, [(member name, data)]) of the first sample of the first shard of the first split,
    read with tarfile (the shard's `__...__` index member left out)."""
    manifest = json.loads((output / "manifest.json").read_text())
    split = sorted(manifest["splits"])[0]
    row = manifest["splits"][split]["shards"][0]
    members: list[tuple[str, bytes]] = []
    key = None
    with tarfile.open(output / row["name"]) as archive:
        for info in archive.getmembers():
            base = info.name.rsplit("/", 1)[-1]
            if base.startswith("__"):
                continue
            stem = base.split(".", 1)[0]
            if key is not None and stem != key:
                break
            key = stem
            members.append((info.name, archive.extractfile(info).read()))
    return split, key, members


def _write_dataset(output: pathlib.Path, target: pathlib.Path, split: str, body: bytes, row: dict) -> str:
    """`target` as a dataset of one shard: the converted manifest, its split `split` only, that one
    row, no shard or sample tables (they describe the converted shards). Returns the shard's path."""
    manifest = json.loads((output / "manifest.json").read_text())
    data = body + bytes(1024)
    row = {"name": f"{split}-00000-00.tar", "samples": 1, **row, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest["splits"] = {split: {"shards": [row], "samples": 1, "bytes": len(data)}}
    manifest["totals"] = {"shards": 1, "samples": 1, "bytes": len(data)}
    manifest["manifest_version"] = 1
    tables = manifest.get("tables", {})
    for name in ("shard_tables", "sample_tables"):
        tables.pop(name, None)
    if "fields" in tables:
        tables["fields"] = {split: tables["fields"][split]} if split in tables["fields"] else {}
    target.mkdir(parents=True)
    (target / row["name"]).write_bytes(data)
    (target / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return str(target / row["name"])


@dataclass(frozen=True)
class Planted:
    """A dataset of one hostile sample: its folder, split, shard (path) and hostile member (name)."""

    folder: str
    split: str
    shard: str
    member: str


def plant(output: pathlib.Path, target: pathlib.Path, kind: str) -> Planted:
    """`target`: the converted dataset at `output` cut to its first sample, with the hostile member
    `MEMBERS[kind]` added to it, indexed."""
    hostile = MEMBERS[kind]
    split, key, members = _first_sample(output)
    name = f"{key}.{HOSTILE_FIELD}.{hostile.extension}"
    members = sorted([*members, (name, hostile.make())])
    body, sizes, digests = bytearray(), [], []
    for member, data in members:
        part = _tar_member(member, data)
        sizes.append(len(data))
        digests.append(xxhash.xxh3_64_intdigest(part))
        body += part
    names = [member.split(".", 1)[1] for member, _ in members]
    index = _tar_member("__wdsprep_index__", msgpack.packb({
        "format": "wdsprep-index/2", "digest": "xxh3_64", "keys": [key], "layouts": [names],
        "layout": struct.pack("<I", 0), "offsets": struct.pack("<Q", 0),
        "sizes": struct.pack(f"<{len(sizes)}Q", *sizes), "digests": struct.pack(f"<{len(digests)}Q", *digests)}))
    row = {"index_offset": len(body), "index_bytes": len(index), "index_digest": f"xxh3_64:{xxhash.xxh3_64_intdigest(index):016x}"}
    return Planted(str(target), split, _write_dataset(output, target, split, bytes(body + index), row), name)


def plant_tar_header(output: pathlib.Path, target: pathlib.Path) -> Planted:
    """`target`: the converted dataset at `output` cut to its first sample, in a shard without an
    index (a row without index fields), its last member's tar header declaring `TAR_LIE_BYTES`."""
    split, _, members = _first_sample(output)
    body = bytearray()
    for number, (member, data) in enumerate(members):
        body += _tar_member(member, data, TAR_LIE_BYTES if number == len(members) - 1 else None)
    return Planted(str(target), split, _write_dataset(output, target, split, bytes(body), {}), members[-1][0])


def plant_all(output: pathlib.Path, root: pathlib.Path) -> dict[str, Planted]:
    """Every kind of `KINDS` planted in a folder of its own under `root`."""
    planted = {}
    for number, kind in enumerate(KINDS):
        target = root / f"hostile{number:02d}"
        if target.exists():
            shutil.rmtree(target)
        planted[kind] = plant_tar_header(output, target) if kind == TAR_HEADER else plant(output, target, kind)
    return planted
