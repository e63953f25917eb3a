"""Adopt existing WebDataset tars where they are (`wdsprep index SHARDS... --out OUT`, commands/index.py).

What is read. SHARDS are files, directories (their `.tar` files, recursively, sorted), globs and
webdataset brace patterns (`shard-{000000..000999}.tar`), local or any URL scheme the storage layer
reads (`http(s)://`, `s3://`, ...). Each shard is read once, sequentially, as one stream (one
request), several shards at once (`workers`), and never written: not one byte of it changes, and
its directory may be read-only. Memory is bounded by one shard's index and the stream's buffers
per worker (what a shard's scan finds goes to the journal as soon as it is done).

What a scan finds (`scan_shard`). The members are grouped as plain webdataset groups them
(`tarformat.webdataset_member`: the key is the member's path up to the first dot of its basename,
subdirectories kept, the field the rest, lower-cased; `__name__` metadata members and names without
a dot skipped; directories, symlinks and hard links skipped, as webdataset skips every entry that is
not a regular file). Per sample: its key and where it starts; per member: its field, its head (the
bytes from where it starts, the end of the member before it, to its data: its own header, any PAX
or GNU long-name records, and entries skipped in between), its size and the xxh3_64 of its head,
data and padding (shards/index.py: what a converted shard's index holds, and checked the same way
by every reader). Per shard: its size and sha256 (every byte), its sample count, where its samples
end (`data_end`), and its identity: locally its size and mtime (`mtime_ns`), remotely its size and
the ETag the server gave (`etag`), which every reader checks before any sample of it (a shard
changed since it was indexed is refused in one line naming it). `index_fields` are read from small
members (`json`, `cls`, `txt`; at most `FIELD_MEMBER_BYTES`): a field `F` is the value of the
member whose field is `F` (`cls`: an int, `txt`: a string, `json`: a scalar), or `S.path` a path
into the JSON member `S` (`json.label`, `meta.json.size.width`).

What is refused, with one line naming the shard, OUT left as it was (and not created): a file that
is not a tar (or is empty), a truncated tar, a tar compressed as a whole (gzip, zstd, bzip2, xz:
no byte ranges into it, so no checked random access or parallel reads; decompress it first), a
shard that cannot be read (a 404), a key twice in one shard or in two shards of the split (naming
both), a member named twice in one sample, a member that is a path out of the archive (`..`, a
leading `/`), a GNU sparse member.

What OUT holds (a local directory, or any writable store): `manifest.json` (source `webdataset`,
shards/manifest.py's adopted rows: each shard's `name` relative to OUT when it lies below OUT, else
its absolute path or URL), per split its shard table (`<split>.shards`), its index file
(`<split>.index`: the shards' indexes back to back, each row saying where its own is) and its sample
table (`<split>.samples`: keys and index fields, for selections and key lookups). A split already in
OUT's adopted manifest is replaced; other splits are kept (`--split valid` adds one).

Order of events, so that an interrupted run resumes and a failed one leaves nothing: each scanned
shard is appended to the journal (`JOURNAL`, in a local OUT: its row, its index, its field values)
as soon as it is scanned; a re-run with the same SHARDS, split and fields reuses the journal's
shards whose size and mtime still match (a remote one: as journaled; readers check its ETag). When
every shard is scanned, the split's keys are checked across shards, then the index file, the sample
table, the shard table and `manifest.json` are written (the manifest last), and the journal removed.
Bad input ends the run with the journal removed, and OUT removed if this run made it.
"""
from __future__ import annotations

import glob
import hashlib
import io
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Iterable

import msgpack

from .errors import ConfigError, FormatError, ShardError, WdsprepError
from .progress import Progress
from .shards.codec import decode_value
from .shards.index import IndexBuilder, digest_text, xxh3_64
from .shards.manifest import (ADOPTED_SOURCE, INDEX_FILES, MANIFEST_NAME, Manifest, check_split_name,
                              index_file_name)
from .shards.samples import TABLE as SAMPLE_TABLES
from .shards.samples import field_value, split_table
from .shards.samples import file_name as sample_table_name
from .shards.tarformat import TarCursor, sample_members, webdataset_member
from .storage import BUFFER, local_path, open_store, open_url, scheme_of
from .storage.files import remove_quietly
from .storage.local import LOCK_NAME
from .stream.reading.read import Sha256Reader

JOURNAL = "_index.journal"  # a local OUT's record of the shards scanned so far (resume)
JOURNAL_FORMAT = "wdsprep-index-journal/1"
FIELD_EXTENSIONS = ("json", "cls", "txt")  # the members index fields are read from
FIELD_MEMBER_BYTES = 1 << 20  # the most bytes of one member read for index fields
TAR_SUFFIXES = (".tar", ".tgz", ".tar.gz", ".tar.zst", ".tar.bz2", ".tar.xz")  # what a directory lists
_WHOLE_COMPRESSED = {b"\x1f\x8b": "gzip", b"\x28\xb5\x2f\xfd": "zstd", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz"}
_SPARSE = {b"S": "a GNU sparse file (webdataset yields its expanded data, which lies nowhere in the tar)"}


# ---------------------------------------------------------------------------------------- sources
def expand_sources(sources: Iterable[str]) -> list[str]:
    """Shard URLs, in order, each once: brace patterns expanded, then local directories (their tar
    files, recursively, sorted) and globs (sorted) listed; a remote URL is taken as it is. A local
    name that matches nothing is a `ConfigError` naming it."""
    from braceexpand import braceexpand

    found: list[str] = []
    for source in sources:
        for item in braceexpand(str(source)):
            found += _listed(item)
    if not found:
        raise ConfigError("no shards given")
    return list(dict.fromkeys(found))


def _listed(item: str) -> list[str]:
    if scheme_of(item) not in ("", "file"):
        return _remote_listed(item) if item.endswith("/") else [item]
    path = local_path(item) or item
    if os.path.isdir(path):
        names = sorted(os.path.join(root, name) for root, _, files in os.walk(path) for name in files
                       if name.endswith(TAR_SUFFIXES))
        if not names:
            raise ConfigError(f"{item}: a directory without tar files")
        return names
    if glob.has_magic(path):
        names = sorted(name for name in glob.glob(path, recursive=True) if os.path.isfile(name))
        if not names:
            raise ConfigError(f"{item}: matches no file")
        return names
    if not os.path.exists(path):
        raise ConfigError(f"{item}: no such file")
    return [path]


def _remote_listed(item: str) -> list[str]:
    """The tar files directly under a remote folder (`s3://bucket/prefix/`), where its store lists."""
    try:
        store = open_store(item)
    except ConfigError:
        store = None
    if store is None or not store.supports_listing:
        raise ConfigError(f"{item}: this location cannot be listed; name its tars (a brace pattern: "
                          "shard-{000000..000099}.tar)")
    names = [name for name in store.list_names() if name.endswith(TAR_SUFFIXES)]
    if not names:
        raise ConfigError(f"{item}: no tar files there")
    return [store.name_url(name) for name in names]


# ------------------------------------------------------------------------------------------- scan
class _Tap:
    """The tar reader's stream, digesting what passes through it (every byte, in order): the
    digest of the bytes since the last `take()` is one member's head, data and padding. Not
    seekable, so that skipped data is read (and digested) too."""

    def __init__(self, stream: BinaryIO):
        self.stream = stream
        self.position = 0
        self.digest = xxh3_64()

    def readinto(self, view) -> int:
        n = self.stream.readinto(view)
        if n:
            self.digest.update(memoryview(view)[:n])
            self.position += n
        return n

    def seekable(self) -> bool:
        return False

    def take(self) -> int:
        value = self.digest.intdigest()
        self.digest.reset()
        return value


@dataclass
class Scanned:
    """One shard as `scan_shard` found it: its row (without `name` and the index's place), its
    index (encoded), its keys and index field values (one per sample, None where absent)."""

    url: str
    row: dict
    index: bytes
    keys: list[str]
    fields: dict[str, list] = field(default_factory=dict)


def _local_identity(stream) -> int | None:
    """A local shard's mtime (ns): what, with its size, says it is the file that was indexed."""
    try:
        return os.fstat(stream.fileno()).st_mtime_ns
    except (AttributeError, OSError, io.UnsupportedOperation):
        return None


def _opened(url: str, stream: BinaryIO, hashing: Sha256Reader) -> io.BufferedReader:
    """The shard's bytes, buffered; an empty file or a tar compressed as a whole is refused here."""
    buffered = io.BufferedReader(hashing, BUFFER)
    head = buffered.peek(8)[:8]
    if not head:
        raise ShardError(url, "an empty file, not a tar")
    for magic, kind in _WHOLE_COMPRESSED.items():
        if head.startswith(magic):
            raise ShardError(url, f"a tar compressed as a whole ({kind}): it has no byte ranges to read its samples "
                                  "by, so it cannot be adopted; decompress it and index the .tar")
    return buffered


def scan_shard(url: str, fields: tuple[str, ...] = (), options=None) -> Scanned:
    """Read the shard at `url` once, sequentially, and index it (module docstring)."""
    with open_url(url, options) as stream:
        identity = _local_identity(stream)
        hashing = Sha256Reader(stream)
        buffered = _opened(url, stream, hashing)
        tap = _Tap(buffered)
        cursor = TarCursor(tap, url, refuse=_SPARSE)
        builder, values, first_at = IndexBuilder(), [], {}
        sample: tuple | None = None  # (key, start, members, fields read)
        current, end = -1, 0  # the sample read; where the last member ended: the next one starts there
        try:
            for number, key, name, member in sample_members(cursor, url, webdataset_member):
                if number != current:
                    current = number
                    if sample is not None:
                        _add(builder, values, url, sample, fields)
                    if key in first_at:
                        raise ShardError(url, f"key {key!r} is in two places of the shard (samples {first_at[key]} "
                                              f"and {number}): webdataset would yield two samples of one key; refused")
                    first_at[key] = number
                    sample = (key, end, [], {})
                if fields and _field_wanted(name, fields) and member.size <= FIELD_MEMBER_BYTES:
                    sample[3][name] = _member_value(url, key, name, cursor.read())
                cursor.skip()  # the rest of its data and its padding: digested by the tap
                sample[2].append((name, member.offset - end, member.size, tap.take()))
                end = tap.position
        except ShardError as error:
            if "corrupt tar header at byte 0 " in str(error):
                raise ShardError(url, "not a tar file (its first 512 bytes are no tar header)") from None
            raise
        if sample is not None:
            _add(builder, values, url, sample, fields)
        while buffered.read(BUFFER):  # the end blocks and any record padding: in the size and sha256
            pass
        etag = getattr(getattr(stream, "raw", None), "etag", None)
    row = {"samples": len(builder.keys), "bytes": hashing.count, "sha256": hashing.digest.hexdigest(), "data_end": end}
    if identity is not None:
        row["mtime_ns"] = identity
    elif etag:
        row["etag"] = etag
    columns = {name: [sample_values[i] for sample_values in values] for i, name in enumerate(fields)}
    return Scanned(url, row, builder.encode_adopted(), list(builder.keys), columns)


def _add(builder: IndexBuilder, values: list, url: str, sample: tuple, fields: tuple[str, ...]) -> None:
    key, start, members, read = sample
    builder.add_scanned(key, start, members)
    values.append(_values(url, key, read, fields))


def _field_wanted(name: str, fields: tuple[str, ...]) -> bool:
    return name.rsplit(".", 1)[-1] in FIELD_EXTENSIONS and any(
        wanted == name or wanted.startswith(name + ".") for wanted in fields)


def _member_value(url: str, key: str, name: str, data: bytearray) -> Any:
    """A small member's value for the index fields, decoded as `wdsprep.decode()` decodes it."""
    try:
        return decode_value(name, data)
    except FormatError as error:
        raise ShardError(url, f"sample {key!r}: index field member {name!r}: {error}") from None


def _values(url: str, key: str, read: dict[str, Any], fields: tuple[str, ...]) -> list:
    """One sample's index field values, in `fields` order (None where it has none): the member
    whose field is the name, else a path into a JSON member (module docstring)."""
    values = []
    for wanted in fields:
        value = read.get(wanted)
        if wanted not in read:
            for name, parsed in read.items():
                if name.endswith("json") and wanted.startswith(name + "."):
                    value = field_value(parsed, wanted[len(name) + 1:]) if isinstance(parsed, dict) else None
                    break
        try:
            values.append(field_value({wanted: value}, wanted))
        except ConfigError as error:
            raise ShardError(url, f"sample {key!r}: {error}") from None
    return values


# ------------------------------------------------------------------------------------------- adopt
@dataclass
class AdoptReport:
    out: str
    split: str
    shards: int = 0
    samples: int = 0
    bytes: int = 0
    reused: int = 0  # shards an interrupted run had scanned (journal)

    def summary(self) -> str:
        again = f" ({self.reused} from an interrupted run)" if self.reused else ""
        return (f"{self.split}: {self.shards} shards{again}, {self.samples} samples, {self.bytes} bytes indexed; "
                f"manifest at {self.out.rstrip('/')}/{MANIFEST_NAME}")


def adopt(sources: Iterable[str], out: str, *, split: str = "train", index_fields: Iterable[str] = (),
          workers: int = 4, quiet: bool = True) -> AdoptReport:
    """Index the WebDataset tars `sources` (a name or a list: files, directories, globs, brace
    patterns, URLs) into a wdsprep manifest at `out` (module docstring); `wdsprep.index`."""
    sources = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    check_split_name(split, "--split", ConfigError)
    fields = tuple(dict.fromkeys(index_fields))
    for name in fields:
        if not name or name.startswith("__"):
            raise ConfigError(f"--index-fields: {name!r} is not a field name")
    if isinstance(workers, bool) or int(workers) < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers!r}")
    urls = expand_sources(sources)
    out = str(out)
    out_path = local_path(out) if scheme_of(out) in ("", "file") else None
    if out_path is not None and os.path.exists(out_path) and not os.path.isdir(out_path):
        raise ConfigError(f"{out}: not a directory")
    made = out_path is not None and not os.path.exists(out_path)
    lock_made = out_path is not None and not os.path.exists(os.path.join(out_path, LOCK_NAME))
    store = open_store(out)
    try:
        with store.lock("wdsprep index"):
            journal = _Journal(os.path.join(out_path, JOURNAL) if out_path else None, split, fields, urls)
            try:
                done = _scan_all(urls, fields, journal, int(workers), quiet)
                report = _write(store, split, fields, urls, done, journal, sources)
            except WdsprepError:
                journal.remove()  # bad input: nothing of this run stays in OUT
                raise
            journal.remove()
    except WdsprepError:
        if lock_made and out_path is not None:
            remove_quietly(os.path.join(out_path, LOCK_NAME))
        if made and out_path is not None and os.path.isdir(out_path) and not os.listdir(out_path):
            os.rmdir(out_path)
        raise
    return report


def _scan_all(urls: list[str], fields: tuple[str, ...], journal: "_Journal", workers: int, quiet: bool) -> dict:
    """Shard number -> its journal position, every shard scanned (those the journal holds reused)."""
    done = journal.reusable()
    todo = [number for number in range(len(urls)) if number not in done]
    progress = Progress("index", len(urls), 0, quiet=quiet)
    progress.advance(len(done), sum(journal.sizes[number] for number in done))
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="wdsprep-index") as pool:
            running = {}
            queue = iter(todo)
            for number in queue:  # at most 2 * workers scans queued: a failure stops the rest early
                running[number] = pool.submit(scan_shard, urls[number], fields)
                if len(running) >= 2 * workers:
                    break
            while running:
                number = min(running)
                scanned = running.pop(number).result()
                done[number] = journal.append(number, scanned)
                progress.advance(1, scanned.row["bytes"])
                following = next(queue, None)
                if following is not None:
                    running[following] = pool.submit(scan_shard, urls[following], fields)
    finally:
        progress.close()
    journal.reused = len(urls) - len(todo)
    return done


class _Journal:
    """The scanned shards of this run (and of an interrupted one with the same shards, split and
    fields): one msgpack record per shard, appended as it is scanned. Without a local OUT, kept in
    memory (nothing to resume from)."""

    def __init__(self, path: str | None, split: str, fields: tuple[str, ...], urls: list[str]):
        self.path = path
        self.header = {"format": JOURNAL_FORMAT, "split": split, "fields": list(fields), "shards": urls}
        self.records: dict[int, dict] = {}  # in memory (no local OUT)
        self.positions: dict[int, int] = {}
        self.sizes: dict[int, int] = {}
        self.reused = 0
        self.good_end = 0  # where the journal's last whole record ends (a record cut by an interruption is dropped)
        self._file = None

    def reusable(self) -> dict[int, int]:
        """Shard number -> journal position of the shards an interrupted run scanned that are unchanged."""
        if self.path is None or not os.path.exists(self.path):
            return {}
        try:
            with open(self.path, "rb") as file:
                unpacker = msgpack.Unpacker(file, raw=False, max_buffer_size=1 << 31)
                if next(unpacker, None) != self.header:
                    return {}  # another run's (other shards, split or fields): started again
                position = self.good_end = unpacker.tell()
                for record in unpacker:
                    if _unchanged(self.header["shards"][record["n"]], record["row"]):
                        self.positions[record["n"]] = position
                        self.sizes[record["n"]] = record["row"]["bytes"]
                    position = self.good_end = unpacker.tell()
        except (ValueError, KeyError, TypeError, IndexError, msgpack.ExtraData, msgpack.FormatError):
            pass  # a record cut by the interruption: the ones before it are kept
        return dict(self.positions)

    def append(self, number: int, scanned: Scanned) -> int:
        record = {"n": number, "row": scanned.row, "index": scanned.index, "keys": scanned.keys, "fields": scanned.fields}
        self.sizes[number] = scanned.row["bytes"]
        if self.path is None:
            self.records[number] = record
            return number
        if self._file is None:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            fresh = not self.good_end
            self._file = open(self.path, "wb" if fresh else "r+b")
            if fresh:
                self._file.write(msgpack.packb(self.header))
            else:  # after the whole records of the interrupted run
                self._file.seek(self.good_end)
                self._file.truncate()
        position = self._file.tell()
        self._file.write(msgpack.packb(record, use_bin_type=True))
        self._file.flush()
        return position

    def record(self, position: int) -> dict:
        if self.path is None:
            return self.records[position]
        if self._file is not None:
            self._file.flush()
        with open(self.path, "rb") as file:
            file.seek(position)
            return next(msgpack.Unpacker(file, raw=False, max_buffer_size=1 << 31))

    def remove(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.path is not None and os.path.exists(self.path):
            os.unlink(self.path)


def _unchanged(url: str, row: dict) -> bool:
    """Whether a journaled shard may be reused: locally, the same size and mtime; remotely, as
    journaled (every reader checks its size and ETag)."""
    path = local_path(url)
    if path is None:
        return True
    try:
        stat = os.stat(path)
    except OSError:
        return False
    return stat.st_size == row["bytes"] and stat.st_mtime_ns == row.get("mtime_ns")


def _write(store, split: str, fields: tuple[str, ...], urls: list[str], done: dict, journal: _Journal,
           sources: Iterable[str]) -> AdoptReport:
    """Check the split's keys across its shards, then write OUT: the index file, the sample table,
    the shard table and `manifest.json` (last)."""
    first_shard: dict[str, int] = {}
    keys: list[str] = []
    columns: dict[str, list] = {name: [] for name in fields}
    for number, url in enumerate(urls):
        record = journal.record(done[number])
        for key in record["keys"]:
            other = first_shard.setdefault(key, number)
            if other != number:
                raise ShardError(url, f"key {key!r} is also in {urls[other]}: a key names one sample of a split; refused")
        keys += record["keys"]
        for name in fields:
            columns[name] += record["fields"][name]
    manifest = _existing(store, split)
    staged = os.path.join(store.staging_dir(), f".{index_file_name(split)}.{os.getpid()}.tmp")
    rows, digest, written = [], hashlib.sha256(), 0
    try:
        with open(staged, "wb") as index_file:
            for number, url in enumerate(urls):
                record = journal.record(done[number])
                index = record["index"]
                rows.append({"name": _name(store.url, url), **record["row"], "index_offset": written,
                             "index_bytes": len(index), "index_digest": digest_text(index),
                             "index_file": index_file_name(split)})
                index_file.write(index)
                digest.update(index)
                written += len(index)
        store.publish(staged, index_file_name(split))
    finally:
        remove_quietly(staged)
    table, table_record = split_table(split, keys, columns)
    store.write_bytes(sample_table_name(split), table)
    manifest.splits[split] = rows
    manifest.tables.setdefault(INDEX_FILES, {})[split] = {"file": index_file_name(split), "bytes": written,
                                                          "sha256": digest.hexdigest()}
    manifest.tables.setdefault(SAMPLE_TABLES, {})[split] = table_record
    manifest.config.setdefault("index", {})[split] = {"shards": [str(source) for source in sources],
                                                      "index_fields": list(fields)}
    manifest.fingerprint = hashlib.sha256(json.dumps(
        {name: [[row["name"], row["bytes"], row["sha256"]] for row in manifest.splits[name]]
         for name in sorted(manifest.splits)}).encode()).hexdigest()
    manifest.write(store)
    return AdoptReport(store.url, split, len(rows), len(keys), sum(row["bytes"] for row in rows), journal.reused)


def _existing(store, split: str) -> Manifest:
    """OUT's adopted manifest to add the split to (its other splits kept), or a new one; OUT holding
    a converted dataset is refused (its shards are not to be mixed with adopted rows)."""
    text = store.read_bytes(MANIFEST_NAME)
    if text is None:
        return Manifest(ADOPTED_SOURCE, {}, "", {})
    manifest = Manifest.loads(text, store.name_url(MANIFEST_NAME))
    if not manifest.adopted:
        raise ConfigError(f"{store.name_url(MANIFEST_NAME)}: holds a dataset of source {manifest.source!r}; "
                          "index into another directory")
    splits = {name: [_stored(row) for row in manifest.shards(name)] for name in manifest.splits if name != split}
    tables = {name: {s: entry for s, entry in records.items() if s != split} if isinstance(records, dict) else records
              for name, records in manifest.tables.items()}
    return Manifest(ADOPTED_SOURCE, manifest.config, manifest.fingerprint, splits, tables)


def _stored(row: dict) -> dict:
    row = dict(row)
    row.pop("index_url", None)
    return row


def _name(out: str, url: str) -> str:
    """The shard's name in OUT's manifest: relative to OUT when below it, else absolute (path or URL)."""
    out_path, path = local_path(out) if scheme_of(out) in ("", "file") else None, local_path(url)
    if out_path is not None and path is not None:
        base, absolute = os.path.realpath(out_path), os.path.realpath(path)
        return os.path.relpath(absolute, base) if absolute.startswith(base + os.sep) else absolute
    prefix = out.rstrip("/") + "/"
    if scheme_of(url) not in ("", "file") and url.startswith(prefix) and ".." not in url[len(prefix):].split("/"):
        return url[len(prefix):]
    return url
