"""Packed members: a run of small samples stored as ONE tar member (`wdsprep convert --pack`).

Why. A tar member costs a 512-byte header and up to 511 bytes of padding, so a 256-byte sample
took 1,061 bytes of shard (2,101 with a label beside it) where MosaicML MDS and LitData spend 264.
Packing consecutive small samples into one member keeps what the per-member layout gives (a digest
checked before anything is yielded, one Range read for random access, a shard any tar reader
opens) at a few bytes of overhead per sample (BENCHMARKS.md, *packed members*).

Which samples. With `pack=True` the writer (`shards/writer.py`) packs a sample whose members hold
at most `PACK_SAMPLE_BYTES` together; consecutive packed samples with the same member names form a
block, closed when its rows hold `PACK_BLOCK_BYTES` (or a sample that is larger, or has other
members, comes, or the shard ends). A sample of 64 KiB or more is never packed: it pays the tar's
overhead once, as before (within 5% of its bytes unpacked, what `--pack` promises for them).

The block member: `<first key>.wdsprep-pack.mp` (`PACK_MEMBER`; the field `wdsprep-pack` is
reserved when packing), msgpack, readable by every plain reader that reads `.mp`:

    {"format": "wdsprep-pack/1",
     "keys": [key, ...],                      # the rows' sample keys, n >= 1
     "columns": {member: {"head": bin, "size": int, "ends": bin, "data": bin}, ...}}

one column per member name of the rows (e.g. `data.npy`, `label.mp`), in sorted order. Row r's
member bytes are exactly the bytes an unpacked shard would hold in that member: `head` followed by
- `size >= 0` (fixed rows, `ends` empty): `data[r*size : (r+1)*size]` (`len(data) == n*size`);
- `size == -1` (rows of any length): `data[ends[r-1] : ends[r]]`, `ends` n little-endian uint32,
  non-decreasing, the last `len(data)`, `ends[-1]` of row -1 being 0.
`head` is the rows' common prefix when every row has the same length (a `.npy` header once, not per
row), else empty. Every column has all four fields (a table reader such as Hugging Face datasets
then infers one schema for every block).

The shard's index (`shards/index.py`, `wdsprep-index/3` when a shard holds a block) lists every
SAMPLE's key, and per tar member (an entry) `rows`: 0 for a sample stored whole, n for a block of n
samples; so sample i lies in entry `locate(i)` at row `i - starts[entry]` (`PackMap`). A block is
checked like any member (its header, data and padding against its xxh3_64) before any of its
samples is yielded, then parsed here with every bound checked before anything is allocated
(`Block.parse`): row counts, offsets and sizes inside the block, the rows' bytes together at most
`MAX_MEMBER_BYTES`, member names by the plain-name rule, keys equal to the index's. A block that
breaks one is one `ShardError` naming the shard and the member.
"""
from __future__ import annotations

import re
from bisect import bisect_right
from typing import Any, Callable, Iterable, Iterator, Sequence

import msgpack
import numpy as np

from ..errors import FormatError, ShardError
from .codec import (DECODE_ERRORS, MAX_DEPTH, MAX_MEMBER_BYTES, beyond, check_nesting, decode_msgpack, decode_npy,
                    member_decoder, npy_header_span, npy_meta)
from .tarformat import FIELD, KEY

_KEYS = re.compile(rf"{KEY.pattern}(?:/{KEY.pattern})*")  # a block's keys joined by "/" (which no key may hold)

PACK_FIELD = "wdsprep-pack"  # reserved when packing: the block member's field
PACK_MEMBER = PACK_FIELD + ".mp"
FORMAT = "wdsprep-pack/1"
PACK_SAMPLE_BYTES = 16 << 10  # a sample whose members hold at most this many bytes is packed
PACK_BLOCK_BYTES = 64 << 10  # a block is closed once its rows hold this many bytes
VARIABLE = -1  # a column's `size` when its rows' lengths vary (`ends` gives them)
ONE_PASS_ROWS = 64  # a .mp column of this many rows or more is unpacked in one pass (fewer: row by row is cheaper)
_COLUMN_FIELDS = ("head", "size", "ends", "data")


def packable(members: Sequence[tuple[str, Any]]) -> bool:
    """Whether a sample of these encoded members is packed (its members' bytes together)."""
    return sum(len(data) for _, data in members) <= PACK_SAMPLE_BYTES


def packed_bytes(key: str, sizes: Sequence[int]) -> int | None:
    """A planning estimate of what a sample with members of these sizes takes in a shard when packed:
    its members' bytes, its key (in the block and the index) and a row end per member, and its share
    of the block's header and padding; None when it would not be packed (larger than `PACK_SAMPLE_BYTES`)."""
    if sum(sizes) > PACK_SAMPLE_BYTES:
        return None
    return sum(sizes) + 2 * (len(key) + 1) + 4 * len(sizes) + 16


# ----------------------------------------------------------------------------------------- writing
def encode_block(keys: Sequence[str], names: Sequence[str], rows: Sequence[Sequence[Any]]) -> bytes:
    """The block member's bytes: rows[r][m] is row r's bytes of member names[m] (module docstring)."""
    columns = {}
    for m, name in enumerate(names):
        columns[name] = _column([row[m] for row in rows])
    return msgpack.packb({"format": FORMAT, "keys": list(keys), "columns": columns}, use_bin_type=True)


def _column(values: list) -> dict:
    length = len(values[0])
    if all(len(value) == length for value in values):
        table = np.frombuffer(b"".join(values), np.uint8).reshape(len(values), length)
        differs = np.flatnonzero((table != table[0]).any(axis=0))
        common = int(differs[0]) if differs.size else length
        return {"head": bytes(values[0][:common]), "size": length - common, "ends": b"",
                "data": table[:, common:].tobytes()}
    ends = np.cumsum([len(value) for value in values], dtype=np.uint64)
    return {"head": b"", "size": VARIABLE, "ends": ends.astype("<u4").tobytes(), "data": b"".join(values)}


# ----------------------------------------------------------------------------------------- reading
class PackMap:
    """A packed shard's samples over its entries (tar members or whole samples): `keys` (every
    sample's), `rows` (per entry: 0 for a sample stored whole, n for a block), `starts` (per entry,
    its first sample; one more at the end: the sample count)."""

    __slots__ = ("keys", "rows", "starts")

    def __init__(self, keys: Sequence[str], rows: Sequence[int]):
        self.keys = keys
        self.rows = rows
        starts = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(np.maximum(np.asarray(rows, np.int64), 1), out=starts[1:])
        if starts[-1] != len(keys):
            raise ValueError(f"its entries hold {int(starts[-1])} samples, it lists {len(keys)} keys")
        self.starts = starts.tolist()  # plain ints: `locate` bisects them once per sample

    def __len__(self) -> int:
        return len(self.keys)

    def locate(self, i: int) -> tuple[int, int]:
        """(entry, row) of sample i."""
        entry, first, _ = self.span(i)
        return entry, i - first

    def span(self, i: int) -> tuple[int, int, int]:
        """(entry, its first sample, its end) of the entry holding sample i."""
        starts = self.starts
        entry = bisect_right(starts, i) - 1
        return entry, starts[entry], starts[entry + 1]

    def entries(self, start: int, stop: int) -> tuple[int, int]:
        """The entries [first, end) that hold samples [start, stop) (stop > start)."""
        return self.locate(start)[0], self.locate(stop - 1)[0] + 1

    def samples(self, entry: int) -> range:
        return range(self.starts[entry], self.starts[entry + 1])

    def entry_keys(self) -> tuple:
        """Each entry's own key: its first sample's (a block's member is named after it)."""
        return tuple(self.keys[at] for at in self.starts[:-1])


class Block:
    """A block member parsed and checked (`parse`): `keys`, `names` (member names), and row r's bytes
    of member m as a fresh bytearray (`member(r, m)`) or decoded (`decoded`)."""

    __slots__ = ("keys", "names", "columns", "values")

    def __init__(self, keys: list, names: tuple, columns: list):
        self.keys, self.names, self.columns = keys, names, columns
        self.values: dict = {}  # (strip, torch) -> (fields, per column the rows' values): `decoded`

    def __len__(self) -> int:
        return len(self.keys)

    @classmethod
    def parse(cls, data: Any, what: str = PACK_MEMBER) -> "Block":
        """The block in `data` (its member's bytes, or its msgpack decoded by a plain reader), every
        bound checked before a row is made; a `FormatError` naming `what` and the broken rule."""
        try:
            # plain msgpack: `_checked` takes nothing but its one shape (no nesting to walk), msgpack's
            # own depth limit stops a deeper one
            value = msgpack.unpackb(data, raw=False) if isinstance(data, (bytes, bytearray, memoryview)) else data
            return cls._checked(value)
        except (*DECODE_ERRORS, msgpack.StackError, KeyError, TypeError) as error:
            raise FormatError(f"{what}: not a packed block ({str(error) or type(error).__name__})") from None

    @classmethod
    def _checked(cls, value: Any) -> "Block":
        if not isinstance(value, dict) or set(value) != {"format", "keys", "columns"} or value["format"] != FORMAT:
            raise ValueError(f"expected a map of format {FORMAT!r}")
        keys, columns = value["keys"], value["columns"]
        if not isinstance(keys, (list, tuple)) or not keys or not isinstance(columns, dict):
            raise ValueError("expected a non-empty list of keys and a map of columns")
        n = len(keys)
        joined = "/".join(keys) if set(map(type, keys)) == {str} else None
        if joined is None or joined.count("/") != n - 1 or not _KEYS.fullmatch(joined):  # one match, not one per key
            for key in keys:  # which one
                if not isinstance(key, str) or not KEY.fullmatch(key):
                    raise ValueError(f"sample key {key!r:.80} is not a plain name")
        if len(set(keys)) != n:
            raise ValueError("a sample key repeats")
        names, parsed, total = [], [], 0
        for name, column in columns.items():
            if not isinstance(name, str) or not FIELD.fullmatch(name) or name == PACK_MEMBER:
                raise ValueError(f"member name {name!r:.80} is not a plain name")
            if not isinstance(column, dict) or set(column) != set(_COLUMN_FIELDS):
                raise ValueError(f"column {name!r}: expected the fields {', '.join(_COLUMN_FIELDS)}")
            head, size, ends, data = (column[field] for field in _COLUMN_FIELDS)
            if not all(isinstance(part, (bytes, bytearray)) for part in (head, ends, data)) or size.__class__ is not int:
                raise ValueError(f"column {name!r}: head, ends and data must be bytes, size an integer")
            if size >= 0:
                if ends or len(data) != n * size:
                    raise ValueError(f"column {name!r}: {len(data)} bytes of data for {n} rows of {size} bytes")
                bounds = None
                total += n * (len(head) + size)
            elif size == VARIABLE:
                if len(ends) != 4 * n:
                    raise ValueError(f"column {name!r}: {len(ends)} bytes of row ends for {n} rows")
                bounds = np.zeros(n + 1, np.int64)
                bounds[1:] = np.frombuffer(ends, "<u4")
                if (np.diff(bounds) < 0).any() or bounds[-1] != len(data):
                    raise ValueError(f"column {name!r}: its row ends are not non-decreasing up to its {len(data)} bytes")
                total += n * len(head) + len(data)
            else:
                raise ValueError(f"column {name!r}: size {size} is neither a row size nor {VARIABLE}")
            if total > MAX_MEMBER_BYTES:
                raise ValueError(beyond(f"its rows hold {total} bytes", "a member", MAX_MEMBER_BYTES))
            names.append(name)
            # a column `_stacked` may hand out as views: its bytes in a bytearray of the block's own, copied
            # now, while msgpack's copy is in the cache (copied when first decoded, they were often not: a
            # shuffle buffer parses its blocks as it fills and decodes each when it delivers its first row,
            # a thousand samples later)
            if _stackable(head, bounds):
                data = bytearray(data)
            elif data.__class__ is not bytes:
                data = bytes(data)
            parsed.append((bytes(head), size, bounds, data))
        if not names:
            raise ValueError("no columns")
        if list(names) != sorted(names):
            raise ValueError("its columns are not in sorted order")
        return cls(list(keys), tuple(names), parsed)

    def member(self, r: int, m: int) -> bytearray:
        """Row r's bytes of member `names[m]`: the caller's own copy."""
        head, size, bounds, data = self.columns[m]
        if bounds is None:
            low, high = r * size, (r + 1) * size
        else:
            low, high = int(bounds[r]), int(bounds[r + 1])
        out = bytearray(head)
        out += memoryview(data)[low:high]
        return out

    def sample(self, r: int, url: str | None = None) -> dict:
        """Row r as a raw sample: `__key__`, (`__url__`) and each member's bytes."""
        sample = {"__key__": self.keys[r]}
        if url is not None:
            sample["__url__"] = url
        for m, name in enumerate(self.names):
            sample[name] = self.member(r, m)
        return sample

    def decoded(self, r: int, url: str, strip: bool, torch: bool, with_url: bool = True) -> dict:
        """Row r decoded (each member by its extension, as `member_decoder` decodes it), with its
        `__url__` or (`with_url` False) without; a member that does not decode is the shard's error,
        raised for its row only. The block's columns are decoded once, for all its rows, at the first
        row asked for (`_column_values`)."""
        decoded = self.values.get((strip, torch))
        if decoded is None:
            decoded = self.values[strip, torch] = self._column_values(strip, torch)
        key = self.keys[r]
        sample = {"__key__": key, "__url__": url} if with_url else {"__key__": key}
        for field, values in decoded:
            value = values[r]
            if value.__class__ is _Failed:
                raise ShardError(url, f"member {key}.{value.name}: {value.error}")
            sample[field] = value
        return sample

    def _column_values(self, strip: bool, torch: bool) -> list:
        """(field, each row's value) per column: a `.npy` column of same-shaped rows as ONE array
        (each row a view of it: writable, its own rows), any other member row by row."""
        out = []
        for m, name in enumerate(self.names):
            field, decode = member_decoder(name, strip, torch)
            plain = member_decoder(name, strip)[1]
            if plain is decode_npy:
                values = self._stacked(m, torch)
            elif decode is decode_msgpack and len(self.keys) >= ONE_PASS_ROWS:
                values = self._unpacked(m)
            else:
                values = None
            if values is None:
                values = []
                for r in range(len(self.keys)):
                    try:
                        values.append(decode(self.member(r, m)))
                    except DECODE_ERRORS as error:
                        values.append(_Failed(name, error))
            out.append((field, values))
        return out

    def _unpacked(self, m: int) -> list | None:
        """The rows of a `.mp` column, unpacked in one pass over their bytes back to back (each
        value must end where its row does; nested at most `MAX_DEPTH` deep), or None: decoded row by
        row (then a row that does not decode is that row's error)."""
        head, size, bounds, data = self.columns[m]
        n = len(self.keys)
        if bounds is not None:
            ends = (bounds[1:] + np.arange(1, n + 1) * len(head)).tolist()
            if head:
                data = b"".join(head + data[low:high] for low, high in zip(bounds[:-1].tolist(), bounds[1:].tolist()))
        elif size or head:
            ends = range(size + len(head), (size + len(head)) * n + 1, size + len(head))
            if head:
                table = np.frombuffer(data, np.uint8).reshape(n, size)
                data = np.concatenate([np.broadcast_to(np.frombuffer(head, np.uint8), (n, len(head))), table], axis=1).tobytes()
        else:
            return None
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(len(data), 1))
        unpacker.feed(data)
        values = []
        try:
            for end in ends:
                values.append(unpacker.unpack())
                if unpacker.tell() != end:
                    return None
            containers = _containers(data, ends)
            if containers > MAX_DEPTH:  # some row holds enough containers to nest too deep: each walked
                for value in values:
                    if isinstance(value, (dict, list)):
                        check_nesting(value, containers)
        except Exception:  # noqa: BLE001 -- any failure: the rows are decoded one by one, each naming its own error
            return None
        return values

    def _stacked(self, m: int, torch: bool):
        """The rows of a fixed-size `.npy` column whose common head is their whole header, as one
        array (n, *shape), or None (any other column: decoded row by row). The block's first decode
        takes the column's bytearray as the array's memory (no copy); a later one (another `strip`
        or `torch`) gets a copy, so no two decodes share a row."""
        head, size, bounds, data = self.columns[m]
        if not _stackable(head, bounds):  # (its data is then the block's own bytearray: `_checked`)
            return None
        try:
            start, length = npy_header_span(head)
            if start + length != len(head):
                return None
            dtype, shape, fortran, count = npy_meta(bytes(head[start:]))
        except FormatError:
            return None
        if fortran or not shape or count * dtype.itemsize != size:  # a 0-d row would come out a scalar: row by row
            return None
        array = np.frombuffer(bytearray(data) if self.values else data, dtype).reshape((len(self.keys), *shape))
        if torch:
            import torch as torch_module

            return torch_module.from_numpy(array)
        return array


def _stackable(head: bytes, bounds) -> bool:
    """Whether a column's rows may come out as one array (`Block._stacked`): rows of one size behind
    a head long enough to be a `.npy` header."""
    return bounds is None and len(head) >= 10


_CONTAINER_BYTES = np.zeros(256, bool)
_CONTAINER_BYTES[[*range(0x80, 0xA0), 0xDC, 0xDD, 0xDE, 0xDF]] = True  # fixmap, fixarray, array/map 16/32


def _containers(data: bytes, ends) -> int:
    """At least the arrays and maps any one row of msgpack `data` holds (rows end at `ends`):
    `codec.check_nesting`'s hint, so that no row with fewer than MAX_DEPTH of them is walked. Each
    takes a byte: rows of at most MAX_DEPTH bytes (nearly all) need no count."""
    ends = np.asarray([0, *ends], np.int64)
    longest = int(np.diff(ends).max(initial=0))
    if longest <= MAX_DEPTH:
        return longest
    counts = np.zeros(len(data) + 1, np.int64)
    np.cumsum(_CONTAINER_BYTES[np.frombuffer(data, np.uint8)], out=counts[1:])
    return int(np.diff(counts[ends]).max(initial=0))


class _Failed:
    """A row's member that did not decode (raised when that row is asked for)."""

    __slots__ = ("name", "error")

    def __init__(self, name: str, error: Exception):
        self.name, self.error = name, error


def block_of(url: str, entry_key: str, data: Any, keys: Sequence[str] | None = None) -> Block:
    """The block member `data` of the entry `entry_key` of shard `url`, parsed and checked, and its
    keys equal to `keys` (the shard index's, when it has one); else one `ShardError` naming both."""
    member = f"member {entry_key}.{PACK_MEMBER}"
    try:
        block = Block.parse(data, member)
    except FormatError as error:
        raise ShardError(url, str(error)) from None
    if keys is not None and (len(block) != len(keys) or block.keys != list(keys)):
        raise ShardError(url, f"{member}: its {len(block)} rows are not the {len(keys)} samples the index lists there")
    return block


def is_block(sample: dict) -> bool:
    """Whether a raw (or decoded) sample of a plain reader is a packed block."""
    return PACK_MEMBER in sample


def unpacked(sample: dict) -> list[dict]:
    """A plain reader's sample: its rows as raw samples (members as bytes, `__url__` kept) if it is
    a block, else itself."""
    if not is_block(sample):
        return [sample]
    url = sample.get("__url__")
    block = block_of(str(url or "<sample>"), str(sample.get("__key__")), sample[PACK_MEMBER])
    rows = []
    for r in range(len(block)):
        row = {"__key__": block.keys[r]}
        if url is not None:
            row["__url__"] = url
        row.update((name, bytes(block.member(r, m))) for m, name in enumerate(block.names))
        rows.append(row)
    return rows


def unpack_rows(batch: dict) -> dict:
    """Hugging Face datasets' batched `map` over a packed split: each block's rows, decoded by their
    extensions, and each sample stored whole as it came
    (`ds.map(wdsprep.unpack_rows, batched=True, remove_columns=ds.column_names)`)."""
    from .codec import decode_value

    rows = []
    for j, block_value in enumerate(batch.get(PACK_MEMBER) or [None] * len(batch["__key__"])):
        if block_value is None:  # a sample stored whole (too large to pack): its own columns
            rows.append({name: values[j] for name, values in batch.items()
                         if name == "__key__" or not (name.startswith("__") or name == PACK_MEMBER)})
            continue
        block = Block.parse(block_value)
        for r in range(len(block)):
            row = {"__key__": block.keys[r]}
            row.update((name, decode_value(name, bytes(block.member(r, m)))) for m, name in enumerate(block.names))
            rows.append(row)
    names = list(dict.fromkeys(name for row in rows for name in row))
    return {name: [row.get(name) for row in rows] for name in names}


def iter_unpacked(samples: Iterable[dict]) -> Iterator[dict]:
    """Plain samples with every packed block replaced by its rows, in order."""
    for sample in samples:
        if PACK_MEMBER in sample:
            yield from unpacked(sample)
        else:
            yield sample


def unpack() -> Callable[[Iterable[dict]], Iterator[dict]]:
    """`wdsprep.unpack()`: the stage that turns a plain reader's packed blocks into their samples,
    raw (`wds.WebDataset(urls).compose(wdsprep.unpack()).decode()`); `wdsprep.decode()` does it too."""
    return iter_unpacked
