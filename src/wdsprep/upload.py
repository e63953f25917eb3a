"""Copy a converted shard directory to a store, verified (`wdsprep upload SHARD_DIR URL`, `commands/upload.py`).

The destination is any writable scheme of `wdsprep.storage` (`s3://`, `file://`, a path), used only
through the `Store` methods: `upload_file` (atomic), `stat`, `sha256` (may trust what the store
recorded at upload), `content_sha256` (re-reads), `delete`, `clean_temporaries`, `write_bytes`.

Order of events, so that a reader never sees a half-uploaded dataset:
1. every shard is checked at the destination first; if any must be uploaded (missing, corrupt, or a
   different dataset), the destination manifest is deleted before the first byte goes up, whatever it
   holds (a manifest identical to ours still must not stay visible over a shard being re-uploaded);
2. shards go up in parallel (at most `--workers` at a time, each retried with backoff); a shard already
   there with the manifest's size and sha256 is skipped, so an interrupted upload resumes where it
   stopped and uploads nothing twice; every uploaded object is re-read and hashed against the
   manifest (`--verify content`, the default) or checked by size and stored sha256 (`metadata`);
3. `manifest.json` is written last, only when every shard checked out.
Each split's sample table (`<split>.samples`, shards/samples.py) goes up like a shard, checked
against the sha256 the manifest records (locally before, at the destination after), in steps 1-2:
a table missing or different at the destination hides the manifest as a shard does, and the manifest
never lists a table that is not there.
"""
from __future__ import annotations

import concurrent.futures as futures
import os
import time
from dataclasses import dataclass, field

from .errors import ConfigError, ManifestError, UploadError, WdsprepError
from .progress import Progress
from .shards.manifest import MANIFEST_NAME, Manifest
from .shards.samples import SUFFIX as TABLE_SUFFIX
from .shards.shardtable import SUFFIX as SHARD_TABLE_SUFFIX
from .shards.shardtable import TABLE as SHARD_TABLES
from .shards.samples import TABLE as SAMPLE_TABLES
from .storage import Store, file_sha256, local_path, open_store


@dataclass
class UploadReport:
    url: str
    uploaded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    verified: list[str] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)  # sample tables checked at the destination (uploaded or there)
    bytes_uploaded: int = 0
    manifest_written: bool = False
    seconds: float = 0.0

    def record(self, row: dict, uploaded: bool) -> None:
        """A file now checked at the destination: a shard `uploaded` now (or already there), verified;
        or a sample table."""
        if _what(row) != "shard":
            self.tables.append(row["name"])
            return
        (self.uploaded if uploaded else self.skipped).append(row["name"])
        self.verified.append(row["name"])

    def summary(self) -> str:
        return (
            f"{len(self.uploaded)} shards uploaded ({self.bytes_uploaded / 1e6:.1f} MB), "
            f"{len(self.skipped)} already there, {len(self.verified)} verified, {len(self.tables)} sample tables; "
            f"manifest at {self.url.rstrip('/')}/{MANIFEST_NAME} ({self.seconds:.1f} s)"
        )


def _local_dir(shard_dir: str) -> str:
    path = local_path(shard_dir)
    if path is None:
        raise ConfigError(f"{shard_dir}: upload reads a local shard directory (got a URL)")
    return os.path.abspath(path)


def _already_there(store: Store, row: dict, recheck: bool) -> bool:
    if store.stat(row["name"]) != row["bytes"]:
        return False
    digest = store.content_sha256(row["name"]) if recheck else store.sha256(row["name"])
    return digest == row["sha256"]


def _what(row: dict) -> str:
    if row["name"].endswith(SHARD_TABLE_SUFFIX):
        return "shard table"
    return "sample table" if row["name"].endswith(TABLE_SUFFIX) else "shard"


def _table_rows(manifest: Manifest) -> list[dict]:
    """The manifest's sample and shard tables as rows {name, bytes, sha256}, uploaded and checked
    like shards (before the manifest, which is last)."""
    return [{"name": entry["file"], "bytes": entry["bytes"], "sha256": entry["sha256"]}
            for table in (SAMPLE_TABLES, SHARD_TABLES)
            for _, entry in sorted((manifest.tables.get(table) or {}).items())]


def _upload_shard(store: Store, directory: str, row: dict, *, verify: str, retries: int) -> bool:
    """Upload one shard (known not to be at the destination) and verify it; True when done."""
    name = row["name"]
    local = os.path.join(directory, name)
    try:
        size = os.path.getsize(local)
    except FileNotFoundError:
        raise UploadError(f"{local}: {_what(row)} listed in the manifest is missing locally") from None
    if size != row["bytes"] or file_sha256(local) != row["sha256"]:
        raise UploadError(f"{local}: local {_what(row)} does not match its manifest row (size or sha256); "
                          "run `wdsprep verify`")
    delay = 0.5
    last: BaseException | None = None
    for attempt in range(retries + 1):
        try:
            store.upload_file(local, name, row["sha256"])
            if verify == "content":
                got = store.content_sha256(name)
            else:
                got = store.sha256(name) if store.stat(name) == row["bytes"] else None
            if got == row["sha256"]:
                return True
            last = UploadError(f"{store.url}/{name}: sha256 after upload is {got}, manifest says {row['sha256']}")
            store.delete(name)
        except WdsprepError as error:
            last = error
        except Exception as error:  # transient network or service errors: retry with backoff
            last = error
        if attempt < retries:
            time.sleep(delay)
            delay = min(delay * 2, 10.0)
    raise UploadError(f"{name}: upload to {store.url} failed after {retries + 1} attempts: {last}")


def upload(
    shard_dir: str,
    url: str,
    *,
    workers: int = 4,
    verify: str = "content",
    recheck: bool = False,
    retries: int = 3,
    multipart_bytes: int | None = None,
    part_bytes: int | None = None,
    quiet: bool = True,
) -> UploadReport:
    """Upload the shards of `shard_dir` then its manifest to `url`; resumable and verified."""
    started = time.time()
    if workers < 1:
        raise ConfigError(f"--workers must be at least 1 (got {workers})")
    if verify not in ("content", "metadata"):
        raise ConfigError(f"--verify must be 'content' or 'metadata' (got {verify!r})")
    directory = _local_dir(shard_dir)
    manifest_path = os.path.join(directory, MANIFEST_NAME)
    try:
        with open(manifest_path, "rb") as handle:
            manifest_bytes = handle.read()
    except FileNotFoundError:
        raise ManifestError(f"{manifest_path}: no manifest (is the conversion complete?)") from None
    manifest = Manifest.loads(manifest_bytes, manifest_path)
    if manifest.adopted:  # its shards stay where they are; its manifest names them there
        raise ConfigError(f"{manifest_path}: an adopted dataset (wdsprep index) is not uploaded: its shards stay "
                          "where they are; index them into the destination instead (wdsprep index SHARDS --out URL)")
    shards = [row for split in sorted(manifest.splits) for row in manifest.splits[split]]
    rows = shards + _table_rows(manifest)

    store = open_store(url, multipart_bytes=multipart_bytes, part_bytes=part_bytes)
    destination = local_path(store.url)
    if destination is not None and os.path.samefile(destination, directory):
        raise ConfigError(f"{url}: destination is the shard directory itself")
    owned = {row["name"] for row in rows} | {MANIFEST_NAME}
    store.check_replaceable(lambda name: name in owned or name.endswith(".tmp"))  # before any work
    report = UploadReport(url=store.url)

    existing = store.read_bytes(MANIFEST_NAME)
    with futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="wdsprep-upload") as pool:
        present = list(pool.map(lambda row: _already_there(store, row, recheck), rows))
    missing = [row for row, there in zip(rows, present) if not there]
    if existing is not None and (missing or existing != manifest_bytes):
        # shards are about to be (re)written: hide the manifest first, even one identical to ours, so a
        # reader sees either no manifest or the complete dataset
        store.delete(MANIFEST_NAME)
        existing = None
    store.clean_temporaries({row["name"] for row in rows})  # what an interrupted upload left

    progress = Progress(f"upload to {store.url}", len(rows), sum(r["bytes"] for r in rows), quiet=quiet)
    for row, there in zip(rows, present):
        if there:
            report.record(row, uploaded=False)
            progress.advance(1, row["bytes"])
    with futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="wdsprep-upload") as pool:
        pending = {
            pool.submit(_upload_shard, store, directory, row, verify=verify, retries=retries): row
            for row in missing
        }
        try:
            for future in futures.as_completed(pending):
                row = pending[future]
                future.result()
                report.bytes_uploaded += row["bytes"]
                report.record(row, uploaded=True)
                progress.advance(1, row["bytes"])
        except BaseException:
            for future in pending:
                future.cancel()
            raise
        finally:
            progress.close()

    if existing != manifest_bytes:
        store.write_bytes(MANIFEST_NAME, manifest_bytes)
        if store.read_bytes(MANIFEST_NAME) != manifest_bytes:
            raise UploadError(f"{store.url}/{MANIFEST_NAME}: manifest read back differs from the one written")
        report.manifest_written = True
    report.uploaded.sort()
    report.skipped.sort()
    report.verified.sort()
    report.tables.sort()
    report.seconds = time.time() - started
    return report
