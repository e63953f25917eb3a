"""The per-shard sample index: where every sample's bytes lie, and a digest of every member.

Where it lives. `ShardWriter` appends it to each shard as the LAST tar member, named
`__wdsprep_index__` (webdataset's meta convention: `wds.WebDataset` skips `__...__` names, and
wdsprep's own readers skip names without a key/extension split, so no reader sees an extra
sample), just before the end-of-archive blocks. Its position, size and digest go in the shard's
manifest row (`index_offset`, `index_bytes`, `index_digest`), so a reader fetches it first (one
read locally, one Range request over HTTP/S3) and then streams the samples. Being inside the tar
means nothing new to upload, publish, cache, verify or resume: a shard stays one self-contained
file that `tar`, webdataset, HF datasets and Ray read as before. (A sidecar file would have doubled
every object-store code path for the same information.)

What it holds (msgpack; `wdsprep-index/2`, written since the columnar read path): a map with
`format`, `digest` ("xxh3_64"), `keys` (the sample keys, in shard order), `layouts` (the distinct
member-name lists, e.g. `[["array.npy", "meta.mp"]]`), and four little-endian columns as bin
fields: `layout` (uint32 per sample: its member names are `layouts[layout[i]]`), `offsets` (uint64
per sample: the archive offset of its first header), `sizes` and `digests` (uint64 per member, all
samples' members back to back in shard order); in a shard `wdsprep reindex` rebuilt without keeping
every byte of the one it replaced (metadata members or extension headers left out: reindex.py), also
`reindexed_from`: the sha256 of that shard (readers ignore it). Each member occupies a 512-byte
header, its data and zero padding to 512 bytes, members back to back; `digest` is xxh3_64 of those
header+data+padding bytes. Keys and member names are plain names, never paths (`tarformat`'s rule,
checked on load: `plain_names`). Loading it makes one str per key and nothing per member: the columns
are read in place (memoryviews), so a 20,000-sample index loads in about a millisecond instead of
the ~15 ms that per-sample lists cost (`wdsprep-index/1`: `{"format", "digest", "samples":
[[key, offset, [member, size, digest, ...]], ...]}`, still read). So every byte of the shard is
covered: the samples tile `[0, index_offset)` exactly (checked when the index is loaded: each
sample's members, a header, data and padding each, end where the next sample starts, the last where
the index member does), the index member is covered by the row's `index_digest`, and the
end-of-archive blocks must be the 1024 zero bytes that end the file at the row's `bytes`. So no
size an index gives exceeds the shard's bytes before it, and no reader allocates more for a member
or a sample than the shard holds (the index member itself was read at `index_offset`).

Packed shards (`wdsprep convert --pack`, shards/packed.py): a shard holding a packed block (one member
for a run of small samples) has a `wdsprep-index/3` index: `keys` lists every SAMPLE, the other columns
are per entry (a tar member group: a sample stored whole, or a block), and `rows` (uint32 per entry)
says how many samples each holds (0: a sample stored whole). In memory `keys` are then the entries'
(each its first sample's) and `pack` (a `PackMap`) numbers the samples; a shard without a block keeps
`/2`, byte for byte.

Adopted shards (`wdsprep index`, wdsprep/adopt.py: WebDataset tars other tools wrote, left as they
are). Their index cannot live in the shard: it is the same msgpack map, kept in the split's index
file beside the manifest (`<split>.index`, the indexes back to back), and the shard's row says where
(`index_offset`, `index_bytes`: in that file; `index_digest`: of those bytes; `index_file`: the
file; `data_end`: where the shard's samples end, what `index_offset` is in a converted shard). It
has two more fields. `names: "webdataset"`: keys and fields follow webdataset's grouping
(`tarformat.webdataset_member`: a key may hold subdirectories), checked on load by
`webdataset_names`. `heads` (uint32 per member): the bytes from where the member starts to its
data, when some member's is not one 512-byte header: other writers put PAX or GNU long-name records
before a member's own header, and entries that are not sample members (directories, links,
metadata members) lie between members. A member starts where the one before it ends (a sample, where
the sample before it ends; the first at byte 0), so those bytes belong to the member after them and
are covered by its digest: the samples still tile `[0, data_end)`. Without `heads` every member's
head is one 512-byte header (every converted shard).

Why xxh3_64: it is a corruption check, read on every sample (not a defence against tampering:
`wdsprep verify` checks sha256). Measured on 16 KiB: zlib.crc32 ~16 us, zlib.adler32 ~9 us,
xxh3_64 ~1 us (`benchmarks/bench_core.py` prints the read-time cost of the check).
"""
from __future__ import annotations

import gc
import re
import sys
from typing import Any, Iterator, Sequence

import msgpack
import numpy as np
import xxhash

from ..errors import ShardError
from .packed import PACK_MEMBER, PackMap
from .tarformat import BLOCK, END_OF_ARCHIVE, FIELD, KEY, NAME_RULE, parse_header

INDEX_MEMBER = "__wdsprep_index__"
WEBDATASET_NAMES = "webdataset"  # an adopted shard's index: keys and fields as webdataset groups them
FORMAT = "wdsprep-index/2"
FORMAT_1 = "wdsprep-index/1"  # per-sample entries: still read
FORMAT_PACKED = "wdsprep-index/3"  # a shard holding packed blocks (shards/packed.py): `keys` per sample, `rows` per entry
DIGEST = "xxh3_64"
ROW_FIELDS = ("index_offset", "index_bytes", "index_digest")

digest_of = xxhash.xxh3_64_intdigest
xxh3_64 = xxhash.xxh3_64  # the same digest, fed in parts


def digest_text(data: bytes) -> str:
    return f"{DIGEST}:{digest_of(data):016x}"


def _str_bytes(text: str) -> int:
    """Bytes msgpack packs a str into (header + UTF-8)."""
    n = len(text) if text.isascii() else len(text.encode("utf-8"))
    return n + (1 if n < 32 else 2 if n < 256 else 3 if n < 65536 else 5)


FRAMING_BOUND = BLOCK + 256 + BLOCK  # the index member's header, msgpack framing and padding, at most


def _layout_bound(names: tuple) -> int:
    return 5 + sum(_str_bytes(name) for name in names)


class IndexBuilder:
    """Collects the index columns of one shard while `ShardWriter` writes its samples."""

    def __init__(self, packing: bool = False):
        self.packing = packing  # blocks may come: every entry's bound counts its `rows` value
        self.keys: list[str] = []
        self.offsets: list[int] = []
        self.layout: list[int] = []
        self.layouts: dict[tuple, int] = {}
        self.sizes: list[int] = []
        self.digests: list[int] = []
        self.heads: list[int] = []  # an adopted shard's member heads (`add_scanned`), else empty
        self.rows: list[int] = []  # per entry: 0 a sample stored whole, n a packed block of n samples
        self.sample_keys: list[str] = []  # every sample's key (a block's rows' included)
        self.bound = FRAMING_BOUND  # len(encoded member) <= bound, kept up to date by `add`

    def add(self, key: str, offset: int, blob: bytes | bytearray, spans: list[tuple[str, int, int, int]],
            rows: Sequence[str] | None = None) -> None:
        """A sample written at `offset` as `blob`; `spans`: (member, data size, start, end) in `blob`;
        `rows`: the keys of the samples it holds when it is a packed block (shards/packed.py)."""
        view = memoryview(blob)
        names = tuple([span[0] for span in spans])
        layout = self.layouts.get(names)
        if layout is None:
            layout = self.layouts[names] = len(self.layouts)
            self.bound += _layout_bound(names)
        for _, size, start, end in spans:
            self.sizes.append(size)
            self.digests.append(digest_of(view[start:end]))
        view.release()
        self.keys.append(key)
        self.offsets.append(offset)
        self.layout.append(layout)
        self.bound += entry_bound(key, len(spans), rows, self.packing)
        self.rows.append(len(rows) if rows else 0)
        self.sample_keys += rows if rows else (key,)

    def add_scanned(self, key: str, offset: int, members: list[tuple[str, int, int, int]]) -> None:
        """A sample of an adopted shard, starting at `offset`: `members` (field, head, data size,
        digest of its head + data + padding) as `wdsprep index` scanned them (module docstring)."""
        names = tuple([member[0] for member in members])
        layout = self.layouts.get(names)
        if layout is None:
            layout = self.layouts[names] = len(self.layouts)
        for _, head, size, digest in members:
            self.heads.append(head)
            self.sizes.append(size)
            self.digests.append(digest)
        self.keys.append(key)
        self.offsets.append(offset)
        self.layout.append(layout)
        self.rows.append(0)
        self.sample_keys.append(key)

    def bound_after(self, key: str, spans: list[tuple[str, int, int, int]], rows: Sequence[str] | None = None) -> int:
        """What `bound` becomes when the sample `key` (or block of `rows`) with these member spans is added."""
        names = tuple([span[0] for span in spans])
        return self.bound + entry_bound(key, len(spans), rows, self.packing) + (0 if names in self.layouts else _layout_bound(names))

    def layout_bound(self) -> int:
        """What the distinct layouts (and the fixed framing) add to `bound`."""
        return FRAMING_BOUND + sum(_layout_bound(names) for names in self.layouts)

    def entries(self) -> Iterator[tuple[str, int, tuple, list[int], list[str] | None]]:
        """(key, offset, member names, member data sizes, a block's row keys or None) of each entry
        (a sample, or a packed block) added, in order."""
        names, k, s = list(self.layouts), 0, 0
        for key, offset, layout, rows in zip(self.keys, self.offsets, self.layout, self.rows):
            members = names[layout]
            yield key, offset, members, self.sizes[k : k + len(members)], self.sample_keys[s : s + rows] if rows else None
            k += len(members)
            s += rows or 1

    def encode(self, reindexed_from: str | None = None) -> bytes:
        """The index member's data; `reindexed_from`: the sha256 of the shard `wdsprep reindex` rebuilt
        this one from, when it did not keep that shard's bytes (module docstring)."""
        data = self._columns()
        if reindexed_from is not None:
            data["reindexed_from"] = reindexed_from
        return msgpack.packb(data)

    def encode_adopted(self) -> bytes:
        """The index of an adopted shard (module docstring): `names: "webdataset"`, and `heads`
        when some member's head is not one 512-byte header."""
        data = self._columns()
        data["names"] = WEBDATASET_NAMES
        if any(head != BLOCK for head in self.heads):
            data["heads"] = _column_bytes(self.heads, "<u4")
        return msgpack.packb(data)

    def _columns(self) -> dict:
        packed = any(self.rows)  # a shard without a block keeps the /2 index, byte for byte
        columns = {
            "format": FORMAT_PACKED if packed else FORMAT, "digest": DIGEST,
            "keys": self.sample_keys if packed else self.keys, "layouts": [list(names) for names in self.layouts],
            "layout": _column_bytes(self.layout, "<u4"), "offsets": _column_bytes(self.offsets, "<u8"),
            "sizes": _column_bytes(self.sizes, "<u8"), "digests": _column_bytes(self.digests, "<u8"),
        }
        if packed:
            columns["rows"] = _column_bytes(self.rows, "<u4")
        return columns


def entry_bound(key: str, members: int, rows: Sequence[str] | None = None, packing: bool = False) -> int:
    """At most what one sample with `members` members adds to the encoded index; `rows`: the keys of
    a packed block's samples; `packing`: the shard may hold blocks (4 bytes more per entry: `rows`)."""
    if rows:
        return sum(_str_bytes(row) for row in rows) + 16 + 16 * members
    return _str_bytes(key) + (16 if packing else 12) + 16 * members


def _uint(value: Any) -> bool:
    return value.__class__ is int and value >= 0


DIGEST_TEXT = re.compile(rf"{DIGEST}:[0-9a-f]{{16}}")


def index_fields_problem(row: dict) -> tuple[str, str] | None:
    """(field, what is wrong) when a row's index fields cannot describe its shard, else None. The
    index member (a 512-byte header, its data, padding) and the end-of-archive blocks end the shard,
    so `index_offset + index_bytes + 1024 == bytes`: checked before any offset is used (a manifest on
    load, each read path before it reads), so a hostile row never becomes a read outside the shard."""
    offset, size, digest, total = (row.get(name) for name in (*ROW_FIELDS, "bytes"))
    shard = f"shard {row.get('name')!s:.80}"
    if adopted(row):
        return _adopted_fields_problem(row, shard)
    if not _uint(offset):
        return "index_offset", f"expected a non-negative integer (got {offset!r:.40}; {shard})"
    if not _uint(size) or size < BLOCK or size % BLOCK:
        return "index_bytes", f"expected a multiple of {BLOCK}, at least {BLOCK} (got {size!r:.40}; {shard})"
    if not isinstance(digest, str) or not DIGEST_TEXT.fullmatch(digest):
        return "index_digest", f"expected \"{DIGEST}:\" and 16 hex digits (got {digest!r:.40}; {shard})"
    if not _uint(total) or offset + size + len(END_OF_ARCHIVE) != total:
        return "index_offset", (f"{offset} with index_bytes {size} does not end {shard} of {total!r:.40} bytes "
                                f"(the index member and the {len(END_OF_ARCHIVE)} bytes of end blocks come last)")
    return None


def _adopted_fields_problem(row: dict, shard: str) -> tuple[str, str] | None:
    """`index_fields_problem` of an adopted shard's row: its index lies in the index file (any
    offset and size there: the file's own record bounds them), its samples within the shard."""
    for name in ("index_offset", "index_bytes"):
        if not _uint(row.get(name)):
            return name, f"expected a non-negative integer (got {row.get(name)!r:.40}; {shard})"
    if not isinstance(row.get("index_digest"), str) or not DIGEST_TEXT.fullmatch(row["index_digest"]):
        return "index_digest", f"expected \"{DIGEST}:\" and 16 hex digits (got {row.get('index_digest')!r:.40}; {shard})"
    if not isinstance(row.get("index_file"), str) or not INDEX_FILE.fullmatch(row["index_file"]):
        return "index_file", f"expected <split>{INDEX_SUFFIX} (got {row.get('index_file')!r:.60}; {shard})"
    end, total = row.get("data_end"), row.get("bytes")
    if not _uint(end) or not _uint(total) or end > total:
        return "data_end", f"expected a non-negative integer within the shard's {total!r:.40} bytes (got {end!r:.40}; {shard})"
    return None


INDEX_SUFFIX = ".index"  # an adopted split's index file: `<split>.index`, beside the manifest
INDEX_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*" + re.escape(INDEX_SUFFIX))


def check_index_fields(url: str, row: dict) -> None:
    """`index_fields_problem` as the `ShardError` of the shard at `url` (every read path, before it reads)."""
    problem = index_fields_problem(row)
    if problem is not None:
        raise ShardError(url, f"manifest row: {problem[0]}: {problem[1]}")


def plain_names(keys: Sequence[str], layouts: Sequence[Sequence[str]]) -> str | None:
    """None when every key and member name is plain (`tarformat`'s rule: never a path), else the
    first that is not, described. Keys are checked in a few passes over them joined by '/' (a
    character no key may hold), without a Python step per key: an index is loaded per shard."""
    joined = "/".join(keys)
    if keys and not (joined and joined.count("/") == len(keys) - 1 and "." not in joined and "\\" not in joined
                     and "\0" not in joined and "//" not in joined and not joined.startswith(("/", "__"))
                     and not joined.endswith("/") and "/__" not in joined):
        key = next(key for key in keys if not KEY.fullmatch(key))
        return f"sample key {key!r:.80} is not a plain name {NAME_RULE}"
    return _layouts_problem(layouts, FIELD, f"is not a plain name {NAME_RULE}")


def _layouts_problem(layouts: Sequence[Sequence[str]], rule: re.Pattern, broken: str) -> str | None:
    """The first member name of `layouts` that `rule` does not match, or a layout naming a member
    twice, described; else None."""
    for names in layouts:
        for name in names:
            if not rule.fullmatch(name):
                return f"member name {name!r:.80} {broken}"
        if len(set(names)) != len(names):
            return f"a sample's member names repeat ({', '.join(names):.80})"
    return None


_WEBDATASET_KEY = re.compile(r"[^\0]+")  # what a key of webdataset's grouping may be (more below)
_WEBDATASET_FIELD = re.compile(r"(?!__)[^/\0]*")
_OUT_OF_ARCHIVE = ("\0\0", "\0/", "\0..\0", "\0../", "/..\0", "/../")  # between NULs: an empty key, a leading /, ..


def webdataset_names(keys: Sequence[str], layouts: Sequence[Sequence[str]]) -> str | None:
    """`plain_names` for an adopted shard's index: keys as webdataset groups them (paths with
    subdirectories), never a path out of the archive (`tarformat.webdataset_member`'s rule)."""
    joined = "\0" + "\0".join(keys) + "\0"  # NUL: in no key; one pass over the keys, not a Python step each
    if keys and (joined.count("\0") != len(keys) + 1 or any(part in joined for part in _OUT_OF_ARCHIVE)):
        key = next(key for key in keys if not _WEBDATASET_KEY.fullmatch(key) or key.startswith("/")
                   or ".." in key.split("/"))
        return f"sample key {key!r:.80} is a path out of the archive"
    return _layouts_problem(layouts, _WEBDATASET_FIELD, "holds a '/' or starts with '__'")


def _column_bytes(values: list[int], dtype: str) -> bytes:
    return np.asarray(values, dtype=dtype).tobytes()


def _column(data: Any, dtype: str, count: int, what: str) -> memoryview:
    """A little-endian column of `count` values as a memoryview of Python ints (read in place)."""
    if not isinstance(data, bytes) or len(data) != count * np.dtype(dtype).itemsize:
        raise ValueError(f"column {what!r} is not {count} values of {dtype}")
    if sys.byteorder != "little":
        data = np.frombuffer(data, dtype).astype(dtype[1:]).tobytes()  # native order, for memoryview
    return memoryview(data).cast({"<u4": "I", "<u8": "Q"}[dtype])


class ShardIndex:
    """A shard's loaded index, checked against its manifest row and the shard's tail bytes.

    Columns (see the module docstring): sample i is `keys[i]`, starts at `offsets[i]`, and has the
    members `names(i)`, whose sizes and digests are `sizes[k]` and `digests[k]` for k from
    `first[i]` on. The columns are memoryviews or tuples of plain ints and strs, so a large index
    costs the cyclic GC nothing later.

    A shard with packed blocks (`wdsprep-index/3`, shards/packed.py) has `pack`, a `PackMap`: its
    columns above are then per entry (a tar member group: a sample stored whole, or a block of
    samples, keyed by its first sample) and `pack` maps each sample to its entry and row; every
    reader turns sample numbers into entries through it (`samples`: the sample count). Else `pack`
    is None and entries are samples.
    """

    def __init__(self, url: str, keys: Sequence, offsets: Sequence, layout: Sequence, layouts: tuple,
                 sizes: Sequence, digests: Sequence, index_offset: int, heads: Sequence | None = None,
                 pack: PackMap | None = None):
        self.url = url
        self.pack = pack
        self.keys, self.offsets, self.layout, self.layouts = keys, offsets, layout, layouts
        self.sizes, self.digests = sizes, digests
        # bytes from each member's start to its data: one header, or an adopted shard's own (module docstring)
        self.heads = memoryview(np.full(len(sizes), BLOCK, "=u4")) if heads is None else heads
        self.index_offset = index_offset  # where the samples end
        lengths = np.fromiter((len(names) for names in layouts), np.int64, len(layouts))
        ids = np.asarray(layout, dtype=np.int64)
        if len(ids) and (ids.min() < 0 or ids.max() >= len(layouts)):
            raise ValueError("a sample's layout is not in the list of layouts")
        first = np.zeros(len(ids) + 1, np.int64)
        np.cumsum(lengths[ids], out=first[1:])
        if first[-1] != len(sizes) or len(sizes) != len(digests) or len(offsets) != len(keys) or len(layout) != len(keys) \
                or len(self.heads) != len(sizes):
            raise ValueError(f"columns disagree ({len(keys)} keys, {len(offsets)} offsets, {len(layout)} layouts, "
                             f"{first[-1]} members named, {len(sizes)} sizes, {len(digests)} digests)")
        self.first = memoryview(first)
        if len(ids):
            self._check_tiling(first)

    def _check_tiling(self, first: np.ndarray) -> None:
        """The samples tile [0, index_offset): each one's members (header, data, padding) end where
        the next sample starts (the last: where the index member does), so no size here exceeds the
        shard. Whole columns at once (spans clipped past the shard, their sum bounded: no overflow)."""
        end = self.index_offset
        sizes = np.minimum(np.asarray(self.sizes, np.uint64), np.uint64(end + 1)).astype(np.int64)
        spans = sizes + np.asarray(self.heads, np.int64) + (-sizes % BLOCK)  # heads: BLOCK unless adopted
        if float(spans.sum(dtype=np.float64)) > 2.0**62:
            raise ShardError(self.url, f"index: its member sizes add up to more than the shard's {end} bytes")
        sums = np.zeros(len(spans) + 1, np.int64)
        np.cumsum(spans, out=sums[1:])
        starts = np.minimum(np.asarray(self.offsets, np.uint64), np.uint64(end + 1)).astype(np.int64)
        ends = starts + sums[first[1:]] - sums[first[:-1]]
        following = np.append(starts[1:], end)
        if starts[0] != 0:
            raise ShardError(self.url, f"index: the first sample starts at byte {self.offsets[0]}, not 0")
        wrong = np.flatnonzero(ends != following)
        if wrong.size:
            i = int(wrong[0])
            raise ShardError(self.url, tiling_problem(self.keys[i], int(ends[i]), int(following[i])))

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def samples(self) -> int:
        """The samples the shard holds (its entries, unless it holds packed blocks)."""
        return len(self.keys) if self.pack is None else len(self.pack)

    def sample_keys(self) -> Sequence[str]:
        return self.keys if self.pack is None else self.pack.keys

    def names(self, i: int) -> tuple:
        return self.layouts[self.layout[i]]

    @classmethod
    def from_tail(cls, url: str, row: dict, tail: bytes) -> "ShardIndex":
        """Parse `tail` = the shard's bytes from `index_offset` to its end."""
        offset, size = row["index_offset"], row["index_bytes"]
        member = tail[:size]
        if len(tail) != row["bytes"] - offset or digest_text(member) != row["index_digest"]:
            raise ShardError(url, f"member {INDEX_MEMBER!r} does not match the manifest row (corrupt index or shard)")
        if tail[size:] != END_OF_ARCHIVE:
            raise ShardError(url, "corrupt end-of-archive blocks (after the last member)")
        _, length, _ = parse_header(member[:BLOCK], url, offset)
        return cls._parsed(url, row, member[BLOCK : BLOCK + length], offset, f"member {INDEX_MEMBER!r}")

    @classmethod
    def from_adopted(cls, url: str, row: dict, data: bytes) -> "ShardIndex":
        """The index of an adopted shard from its bytes in the split's index file (module
        docstring), checked against the row's digest and sample count."""
        if len(data) != row["index_bytes"] or digest_text(data) != row["index_digest"]:
            raise ShardError(url, f"its index in {row.get('index_file')} does not match the manifest row "
                                  "(a corrupt or replaced index file)")
        return cls._parsed(url, row, data, row["data_end"], f"its index in {row.get('index_file')}")

    @classmethod
    def _parsed(cls, url: str, row: dict, payload, offset: int, what: str) -> "ShardIndex":
        """The index in `payload` (its msgpack), its samples ending at `offset`, checked: names by
        their rule (plain, or webdataset's for an adopted shard: only where the row is adopted), count."""
        try:
            data = _unpack_paused(payload)
            if data["digest"] != DIGEST:
                raise ValueError(f"unknown digest {data['digest']!r}")
            webdataset = data.get("names") == WEBDATASET_NAMES
            if webdataset != adopted(row):
                raise ValueError("its naming rule is not its row's (an adopted shard's index in a converted shard, "
                                 "or the reverse)")
            if data["format"] in (FORMAT, FORMAT_PACKED):
                keys, layouts = data["keys"], tuple(tuple(names) for names in data["layouts"])
                if ({type(name) for names in layouts for name in names} | set(map(type, keys))) - {str}:
                    raise ValueError("a key or member name is not a str")
                count, pack = len(keys), None
                if data["format"] == FORMAT_PACKED:  # keys per sample, the columns below per entry
                    if webdataset:
                        raise ValueError("an adopted shard's index with packed blocks")
                    count = len(data["offsets"]) // 8 if isinstance(data["offsets"], bytes) else -1
                    pack = PackMap(keys, _column(data["rows"], "<u4", count, "rows"))
                    keys = pack.entry_keys()
                layout = _column(data["layout"], "<u4", count, "layout")
                total = len(data["sizes"]) // 8
                heads = _column(data["heads"], "<u4", total, "heads") if "heads" in data else None
                index = cls(url, keys, _column(data["offsets"], "<u8", count, "offsets"), layout, layouts,
                            _column(data["sizes"], "<u8", total, "sizes"), _column(data["digests"], "<u8", total, "digests"),
                            offset, heads, pack)
                if pack is not None:
                    _check_blocks(index)
            elif data["format"] == FORMAT_1 and not webdataset:
                index = cls._from_samples(url, data["samples"], offset)
            else:
                raise ValueError(f"unknown index format {data['format']!r}")
            problem = (webdataset_names if webdataset else plain_names)(index.keys, index.layouts)
        except (ValueError, KeyError, TypeError, AttributeError, msgpack.ExtraData) as error:
            raise ShardError(url, f"{what} is unreadable ({error})") from None
        if problem is not None:
            raise ShardError(url, f"index: {problem}: refused")
        if index.samples != row["samples"]:
            raise miscounted(url, index.samples, row)
        return index

    @classmethod
    def _from_samples(cls, url: str, samples: tuple, index_offset: int) -> "ShardIndex":
        """The columns of a `wdsprep-index/1` index (per-sample entries)."""
        keys, offsets, layout, sizes, digests = [], [], [], [], []
        layouts: dict[tuple, int] = {}
        for key, at, members in samples:
            names = tuple(members[0::3])
            keys.append(key)
            offsets.append(at)
            layout.append(layouts.setdefault(names, len(layouts)))
            sizes += members[1::3]
            digests += members[2::3]
        for value in (*offsets, *sizes, *digests):
            if value.__class__ is not int or value < 0:
                raise ValueError(f"an offset, size or digest is not an unsigned int ({value!r})")
        return cls(url, tuple(keys), tuple(offsets), tuple(layout), tuple(layouts), tuple(sizes), tuple(digests), index_offset)

    def sample_end(self, i: int) -> int:
        """Where sample i's bytes end (the next sample's, or the index member's, first header)."""
        return self.offsets[i + 1] if i + 1 < len(self.offsets) else self.index_offset


def _check_blocks(index: ShardIndex) -> None:
    """Every entry the index calls a block (rows > 0) is one member named `PACK_MEMBER`, and no
    sample stored whole has a member of that name (plain readers would take it for a block)."""
    for entry, rows in enumerate(index.pack.rows):
        names = index.names(entry)
        if (rows > 0 and names != (PACK_MEMBER,)) or (rows == 0 and PACK_MEMBER in names):
            raise ValueError(f"entry {entry} ({index.keys[entry]!r:.80}) has rows {rows} and members {names!r:.120}")


def tiling_problem(key: str, end: int, following: int) -> str:
    """The one wording of a sample that does not end where the next one (or the index member) starts."""
    return f"index: sample {key!r:.80} ends at byte {end}, the next one starts at {following}"


def miscounted(url: str, count: int, row: dict) -> ShardError:
    """The one wording of a shard whose sample count is not its manifest row's (its index, or a
    shard without one walked to its end)."""
    return ShardError(url, f"shard holds {count} samples, manifest says {row['samples']}")


def _unpack_paused(data: bytes) -> dict:
    """The index's msgpack, unpacked with the cyclic GC paused: an old (`/1`) index's ~2 lists per
    sample would otherwise trigger full collections of the whole heap (measured: 150 ms instead of
    16 ms for a 20,000-sample index with torch imported). Nothing in it can form a cycle."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return msgpack.unpackb(data, raw=False, use_list=False)
    finally:
        if enabled:
            gc.enable()


def member_span(size: int, head: int = BLOCK) -> int:
    """Bytes a member with `size` data bytes occupies: its head (one header), data, padding."""
    return head + size + (-size % BLOCK)


def has_index(row: dict) -> bool:
    return all(row.get(name) is not None for name in ROW_FIELDS)


def samples_end(row: dict) -> int:
    """Where the row's shard's samples end: its index member (converted), or its `data_end` (adopted)."""
    return row["data_end"] if adopted(row) else row["index_offset"]


def adopted(row: dict) -> bool:
    """Whether the row is an adopted shard's (`wdsprep index`): its index is in the split's index
    file, not in the shard (module docstring)."""
    return "index_file" in row
