"""`wdsprep reindex DIR_OR_URL`: give the shards of an older conversion their sample index.

Shards written before every shard carried `__wdsprep_index__` have manifest rows without
`index_offset`/`index_bytes`/`index_digest`. Readers then hash a local shard whole before its first
sample and refuse a remote one (`stream/read.py`). Reindexing writes each such shard again through
`shards.writer.ShardFile` (the one writer of shard bytes): its samples' bytes unchanged, then the
index member and the end blocks, so it reads on the indexed path, member by member checked.

The output is used only through `Store` methods (a local directory or `s3://`; like a conversion's
output). Order of events, so that nothing is lost and an interrupted run resumes:
1. per shard without index fields: stream it, rebuilding its samples' bytes member by member into
   a staged new shard; the samples must be exactly the converted ones (their bytes, followed by the
   end blocks, have the row's size and sha256, and the count matches) and the object byte for byte
   the row's shard, else the shard is left as it is and reported (one line naming it);
2. the new shard replaces the old one atomically (`Store.publish`). A shard that is already byte
   for byte what this run builds (an interrupted run replaced it but never wrote the manifest) is
   recognised, its samples checked the same way, and is not written again;
3. when every shard is done, `_units.json` (so a later `convert` re-run still reuses the units) and
   then `manifest.json` get the new rows, last.
Between 2 and 3 the manifest still lists the old rows: a reader of a replaced shard then gets a
`ShardError` (size or sha256), never a wrong sample. One run at a time per local directory (the
conversion's lock).
"""
from __future__ import annotations

import argparse
import hashlib
import io
import sys
from dataclasses import dataclass, field

from .conversion import replace_unit_rows, written_by_conversion
from .errors import ManifestError, ShardError
from .progress import Progress
from .shards.index import INDEX_MEMBER, has_index
from .shards.manifest import MANIFEST_NAME, Manifest
from .shards.tarformat import BLOCK, END_OF_ARCHIVE, TarCursor, padding, split_key
from .shards.writer import ShardFile
from .storage import BUFFER, Store, describe, open_store, open_url
from .stream.manifests import load_manifest
from .stream.read import Sha256Reader


@dataclass
class ReindexReport:
    url: str
    indexed: list[str] = field(default_factory=list)  # shards written again with their index
    resumed: list[str] = field(default_factory=list)  # shards an interrupted run had indexed already
    had_index: int = 0
    bad: list[str] = field(default_factory=list)  # one line per shard left as it was

    def summary(self) -> str:
        return (f"{len(self.indexed) + len(self.resumed)} shards indexed, {self.had_index} had an index already, "
                f"{len(self.bad)} left as they were; manifest at {self.url.rstrip('/')}/{MANIFEST_NAME}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("location", help=f"a converted shard directory: {describe(writable=True)}")


def main(args: argparse.Namespace) -> int:
    report = reindex(args.location, quiet=args.quiet)
    for line in report.bad:
        print(f"BAD {line}", file=sys.stderr)
    print(report.summary())
    return 1 if report.bad else 0


def reindex(location: str, *, quiet: bool = True) -> ReindexReport:
    load_manifest(location)  # a location without a manifest is refused before anything is made there
    store = open_store(location.removesuffix(MANIFEST_NAME).rstrip("/") or ".")
    with store.lock():
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
        if new_rows:
            replace_unit_rows(store, new_rows)
            store.write_bytes(MANIFEST_NAME, manifest.dumps())
    return report


def _reindex_shard(store: Store, row: dict) -> tuple[dict, bool]:
    """(the shard's new row fields, whether an interrupted run had written it already)."""
    url = store.name_url(row["name"])
    shard = ShardFile(store.staging_dir(), row["name"])
    try:
        with open_url(url) as stream:
            hashing = Sha256Reader(stream)  # the object as it is
            samples = _Samples(TarCursor(io.BufferedReader(hashing, BUFFER), url), url)
            for key, blob, spans in samples:
                shard.append(key, blob, spans)
            while hashing.readinto(bytearray(BUFFER)):
                pass
        samples.body.update(END_OF_ARCHIVE)
        if (samples.size + len(END_OF_ARCHIVE), samples.body.hexdigest(), shard.samples) != (row["bytes"], row["sha256"], row["samples"]):
            raise ShardError(url, "its samples differ from the manifest row (size, sha256 or sample count)")
        written = shard.finish().as_dict()
        del written["name"]
        found = (hashing.count, hashing.digest.hexdigest())
        if found == (written["bytes"], written["sha256"]):  # an interrupted run's: already what this run writes
            shard.abort()
            return written, True
        if samples.indexed or found != (row["bytes"], row["sha256"]):
            raise ShardError(url, "differs from the manifest row (size or sha256) and from its indexed form")
        store.publish(shard.publish(), row["name"])
        return written, False
    except BaseException:
        shard.abort()
        raise


class _Samples:
    """(key, blob, spans) of each sample of an older shard, its bytes rebuilt member by member from
    the tar stream (each member's 512-byte header, its data, zero padding), checked to tile the
    shard from byte 0 as the indexed read path requires. `body` hashes the rebuilt bytes, `size`
    counts them; `indexed` says the samples were followed by an index member (an interrupted run's)."""

    def __init__(self, cursor: TarCursor, url: str):
        self.cursor, self.url = cursor, url
        self.body = hashlib.sha256()
        self.size = 0
        self.indexed = False

    def __iter__(self):
        cursor, key, blob, spans = self.cursor, None, bytearray(), []
        while (member := cursor.next()) is not None:
            if member.name == INDEX_MEMBER:
                self.indexed = True
                if cursor.next() is not None:
                    raise ShardError(self.url, f"a member follows {INDEX_MEMBER!r}")
                break
            parts = split_key(member.name)
            if parts is None or member.start != self.size + len(blob) or member.offset != member.start + BLOCK:
                raise ShardError(self.url, f"member {member.name!r} at byte {member.start} is not a plain member of a "
                                           "sample as wdsprep writes them: the shard cannot be indexed")
            if parts[0] != key and key is not None:
                yield self._sample(key, blob, spans)
                blob, spans = bytearray(), []
            key = parts[0]
            data = cursor.read()
            start = len(blob)
            blob += cursor.header
            blob += data
            blob += padding(len(data))
            spans.append((parts[1], len(data), start, len(blob)))
        if key is not None:
            yield self._sample(key, blob, spans)

    def _sample(self, key: str, blob: bytearray, spans: list) -> tuple[str, bytearray, list]:
        self.body.update(blob)
        self.size += len(blob)
        return key, blob, spans
