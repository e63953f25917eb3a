"""Give the shards of an older conversion their sample index (`wdsprep reindex DIR_OR_URL`, `commands/reindex.py`).

Shards written before every shard carried `__wdsprep_index__` have manifest rows without
`index_offset`/`index_bytes`/`index_digest`. Readers then hash a local shard whole before its first
sample and refuse a remote one (`stream/reading/read.py`). Reindexing writes each such shard again through
`shards.writer.ShardFile` (the one writer of shard bytes): its samples, then the index member and the
end blocks, so it reads on the indexed path, member by member checked. Its samples are grouped as
every reader groups them (`tarformat.sample_members`), so every shard `wdsprep verify` accepts is
indexed, and a member name that is a path is refused here as there.

What is kept. Each sample member keeps its bytes: its own 512-byte header where it has one plain
ustar header, its data, zero padding. What belongs to no sample member is left out: the zeros at the
end (two blocks, or a whole tar record: GNU tar pads to 10,240 bytes), metadata members (the first
indexed format balanced a unit's last two shards by concatenating their bytes, leaving the first
one's index member inside the tail shard, followed by more samples) and GNU/PAX extension records
(the member gets a plain header of its own instead). When only zeros were left out, the new shard is
the old one's sample bytes and the index, byte for byte what a conversion writes; otherwise its index
records `reindexed_from`, the sha256 of the shard it replaced (`_samples_alone` decides, from the
rebuilt samples and the row alone).

The output is used only through `Store` methods (a local directory or `s3://`; like a conversion's
output). Order of events, so that nothing is lost and an interrupted run resumes:
1. per shard without index fields: stream it, rebuilding its samples' bytes member by member into
   a staged new shard; the object must be byte for byte the row's shard (size and sha256) with the
   row's count of samples, else the shard is left as it is and reported (one line naming it);
2. the new shard replaces the old one atomically (`Store.publish`: a rename over it, or an upload
   over it; never a delete first, so a failure at that moment leaves the old shard, which the manifest
   still lists). A shard that is already byte for byte what this run builds from it (an interrupted
   run replaced it but never wrote the manifest) is recognised, and is not written again when it
   belongs to the row: its samples followed by zeros have the row's sha256, or its index says
   `reindexed_from` the row's sha256 (a damaged byte since then fails its own index, so it is named);
3. when every shard is done, each split without a sample table that checks out (an older conversion
   has none) gets one, of keys only (read from the shards' indexes; the fields a conversion indexes
   come from the samples as the source built them, so indexing fields means converting again):
   `<split>.samples`, written atomically; then `_units.json` (so a later `convert` re-run still
   reuses the units: records without their samples get their keys) and then `manifest.json` get the
   new rows and tables, last.
Between 2 and 3 the manifest still lists the old rows: a reader of a replaced shard then gets a
`ShardError` (size or sha256), never a wrong sample. One run at a time per local directory (the
conversion's lock, held as "wdsprep reindex", which a second run's refusal names).
"""
from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass, field

from .errors import FormatError, ManifestError, ShardError
from .progress import Progress
from .shards.index import has_index
from .shards.journal import replace_unit_rows, written_by_conversion
from .shards.manifest import MANIFEST_NAME, Manifest
from .shards.samples import TABLE as SAMPLE_TABLES
from .shards.samples import SampleTable, split_table, table_entry
from .shards.samples import file_name as table_file_name
from .shards.tarformat import BLOCK, TarCursor, header, padding, sample_members
from .shards.writer import ShardFile
from .storage import BUFFER, Store, open_store, open_url
from .stream.manifests import load_manifest
from .stream.reading.read import Sha256Reader
from .stream.planning.samples import shard_keys


@dataclass
class ReindexReport:
    url: str
    indexed: list[str] = field(default_factory=list)  # shards written again with their index
    resumed: list[str] = field(default_factory=list)  # shards an interrupted run had indexed already
    had_index: int = 0
    bad: list[str] = field(default_factory=list)  # one line per shard left as it was
    tables: list[str] = field(default_factory=list)  # splits given a sample table (keys only)

    def summary(self) -> str:
        tables = f", {len(self.tables)} sample tables written (keys only)" if self.tables else ""
        return (f"{len(self.indexed) + len(self.resumed)} shards indexed, {self.had_index} had an index already, "
                f"{len(self.bad)} left as they were{tables}; manifest at {self.url.rstrip('/')}/{MANIFEST_NAME}")


def reindex(location: str, *, quiet: bool = True) -> ReindexReport:
    load_manifest(location)  # a location without a manifest is refused before anything is made there
    store = open_store(location.removesuffix(MANIFEST_NAME).rstrip("/") or ".")
    with store.lock("wdsprep reindex"):
        store.check_replaceable(written_by_conversion)  # a symlink, FIFO or device among them: refused
        text = store.read_bytes(MANIFEST_NAME)  # again, under the lock
        if text is None:
            raise ManifestError(f"{store.name_url(MANIFEST_NAME)}: no manifest (is this a `wdsprep convert` output?)")
        manifest = Manifest.loads(text, store.name_url(MANIFEST_NAME))
        report = ReindexReport(store.url)
        todo = [(split, i) for split, rows in manifest.splits.items() for i, row in enumerate(rows) if not has_index(row)]
        report.had_index = sum(len(rows) for rows in manifest.splits.values()) - len(todo)
        progress = Progress("reindex", len(todo), sum(manifest.splits[s][i]["bytes"] for s, i in todo), quiet=quiet)
        new_rows: dict[str, dict] = {}
        try:
            for split, i in todo:
                row = manifest.splits[split][i]
                try:
                    written, resumed = _reindex_shard(store, row)
                except ShardError as error:
                    report.bad.append(f"{error} (left as it is: convert it again)")
                else:
                    new_rows[row["name"]] = written
                    manifest.splits[split][i] = dict(row, **written)
                    (report.resumed if resumed else report.indexed).append(row["name"])
                progress.advance(1, row["bytes"])
        finally:
            progress.close()
        unindexed = {split for split, rows in manifest.splits.items() if not all(map(has_index, rows))}
        keys = _write_sample_tables(store, manifest, [split for split in sorted(manifest.splits) if split not in unindexed])
        report.tables = sorted({split for split, _ in keys.values()})
        if new_rows or keys:
            replace_unit_rows(store, new_rows, {name: shard for name, (_, shard) in keys.items()})
            manifest.write(store)  # its shard tables, then manifest.json
    return report


def _write_sample_tables(store: Store, manifest: Manifest, splits: list[str]) -> dict[str, tuple[str, list[str]]]:
    """Give each of `splits` whose sample table is missing or does not check out a table of keys
    only, read from its shards' indexes, and record it in `manifest`; returns shard name -> (split,
    its keys) for the shards of those splits."""
    found: dict[str, tuple[str, list[str]]] = {}
    for split in splits:
        entry = table_entry(manifest, split)
        if entry is not None:
            try:
                SampleTable.load(manifest, split, entry)
                continue
            except ManifestError:
                pass  # missing or damaged: rebuilt of keys, as for an older conversion
        keys = []
        for url, row in zip(manifest.shard_urls(split), manifest.shards(split)):
            found[row["name"]] = (split, shard_keys(url, row))
            keys += found[row["name"]][1]
        data, record = split_table(split, keys, {})
        store.write_bytes(table_file_name(split), data)
        manifest.tables.setdefault(SAMPLE_TABLES, {})[split] = record
    return found


MAX_ZERO_TAIL = 1 << 20  # zero bytes after the samples believed at most (beyond their own size): tar records of 1 MiB


def _reindex_shard(store: Store, row: dict) -> tuple[dict, bool]:
    """(the shard's new row fields, whether an interrupted run had written it already)."""
    url = store.name_url(row["name"])
    shard = ShardFile(store.staging_dir(), row["name"])
    try:
        with open_url(url) as stream:
            hashing = Sha256Reader(stream)  # the object as it is
            samples = _Samples(TarCursor(io.BufferedReader(hashing, BUFFER), url), url)
            for key, blob, spans in samples:
                try:
                    shard.append(key, blob, spans)
                except FormatError as error:  # a key twice: no index can hold the shard
                    raise ShardError(url, f"{error}: the shard cannot be indexed") from None
            while hashing.readinto(bytearray(BUFFER)):
                pass
        if shard.samples != row["samples"]:
            raise ShardError(url, f"holds {shard.samples} samples, its manifest row says {row['samples']}")
        kept = _samples_alone(samples, row)
        written = shard.finish(reindexed_from=None if kept else row["sha256"]).as_dict()
        del written["name"]
        found = (hashing.count, hashing.digest.hexdigest())
        if found == (written["bytes"], written["sha256"]):  # an interrupted run's: already what this run writes
            shard.abort()
            return written, True
        if found != (row["bytes"], row["sha256"]):
            raise ShardError(url, "differs from the manifest row (size or sha256) and from its indexed form")
        store.publish(shard.publish(), row["name"])  # a rename over the old shard (or its upload): never a delete first
        return written, False
    except BaseException:
        shard.abort()
        raise


def _samples_alone(samples: "_Samples", row: dict) -> bool:
    """Whether the row's shard is the rebuilt samples followed by zero bytes alone (end blocks of any
    record size): then the new shard keeps every byte but those zeros, and a new shard is recognised
    by its samples' bytes and the row's sha256. A function of the rebuilt samples and the row only,
    so an interrupted run and its resumption decide alike."""
    zeros = row["bytes"] - samples.size
    if not 0 <= zeros <= samples.size + MAX_ZERO_TAIL:
        return False
    digest = samples.body.copy()
    block = bytes(min(zeros, BUFFER))
    while zeros:
        digest.update(block[:zeros])
        zeros -= min(zeros, len(block))
    return digest.hexdigest() == row["sha256"]


class _Samples:
    """(key, blob, spans) of each sample of a shard, grouped as every reader groups them
    (`tarformat.sample_members`: plain names only, metadata members such as a stale index left out),
    its bytes rebuilt member by member: the member's own 512-byte header where it has one plain
    header (wdsprep's and plain ustar writers'), a fresh one (`tarformat.header`) where extension
    records (GNU long names, PAX) come before it, its data, zero padding. `body` hashes the rebuilt
    bytes, `size` counts them."""

    def __init__(self, cursor: TarCursor, url: str):
        self.cursor, self.url = cursor, url
        self.body = hashlib.sha256()
        self.size = 0

    def __iter__(self):
        cursor, number, key, blob, spans = self.cursor, -1, None, bytearray(), []
        for sample, sample_key, field, member in sample_members(cursor, self.url):
            if sample != number:
                if number >= 0:
                    yield self._sample(key, blob, spans)
                number, key, blob, spans = sample, sample_key, bytearray(), []
            data = cursor.read()
            start = len(blob)
            blob += cursor.header if member.offset == member.start + BLOCK else self._header(member.name, len(data))
            blob += data
            blob += padding(len(data))
            spans.append((field, len(data), start, len(blob)))
        if number >= 0:
            yield self._sample(key, blob, spans)

    def _header(self, name: str, size: int) -> bytes:
        try:
            return header(name, size)
        except FormatError as error:
            raise ShardError(self.url, f"member {name!r}: {error}: the shard cannot be indexed") from None

    def _sample(self, key: str, blob: bytearray, spans: list) -> tuple[str, bytearray, list]:
        self.body.update(blob)
        self.size += len(blob)
        return key, blob, spans
