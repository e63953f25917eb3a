"""Runs a conversion: plan units, build them on an executor, verify, write the manifest last.

Resumable: beside the manifest the driver keeps `_units.json`, the results of completed units keyed
by a digest of the unit (its items), the conversion config and the fingerprints of the native inputs
that feed it (one rule for every source, `wdsprep.inputs`: content hashes or size + mtime_ns +
ctime_ns + inode). A re-run reuses every unit whose record matches and whose shards still check out
(size, sha256, and an index in each), and rebuilds the rest, so a changed input rebuilds exactly the
units it feeds (and a unit an older wdsprep wrote without shard indexes is built again).
The manifest is removed at the start of a run that would change it and written only when every unit
is done, so a manifest never lists a shard that was not written and verified.

Nothing is done before every option is checked (`wdsprep.options`: one line naming a bad value, the
output not yet touched) and the plan passes the core's rules (`sources.base.check_plan`: split
names, a split without samples reported, nothing to convert refused). A Ctrl-C at any moment stops
the pool's workers and leaves no temporary file (`executors.process_pool`, `convert`).

One conversion at a time per local output directory (an `flock` the kernel releases when the process
dies; stores without `supports_lock`, such as `s3://` outputs, have no lock). The driver uses the
output only through `wdsprep.storage.Store`'s methods and capability flags, never by probing it.
A failed write of the output (a full disk) stops the conversion at the first failure, with one
line, and leaves no temporary file behind.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import ConversionError, OutputError
from .inputs import unit_input_fingerprints
from .options import check_core_options, check_run_options, parse_size  # noqa: F401 (parse_size: re-exported)
from .progress import Progress
from .shards.codec import Encoder
from .shards.index import has_index
from .shards.manifest import MANIFEST_NAME, Manifest, shard_name_pattern
from .shards.writer import ShardWriter
from .sources.base import DEFAULT_ON_ERROR, PlanContext, Unit, UnitContext, check_converted, check_plan
from .sources.registry import load_source
from .storage import Store, open_store

UNITS_NAME = "_units.json"
CORE_CONFIG = ("shard_bytes", "codec", "zstd_level", "on_error")


@dataclass
class UnitResult:
    split: str
    index: int
    digest: str
    rows: list[dict]
    problems: list[dict] = field(default_factory=list)
    tables: dict = field(default_factory=dict)
    input_bytes: int = 0


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def unit_digest(unit: Unit, config: dict, inputs: str) -> str:
    """What a unit's shards depend on: its items, the config and its inputs' fingerprints."""
    return _digest({"split": unit.split, "index": unit.index, "items": unit.items, "config": config, "inputs": inputs})


def build_unit(source_id: str, unit: Unit, options: dict, output: str, digest: str) -> UnitResult:
    """Runs in a worker: build one unit's samples into its shard(s) and publish them."""
    source = load_source(source_id)
    store = open_store(output)
    encoder = Encoder(options["codec"], options["zstd_level"])
    staging = store.staging_dir()
    ctx = UnitContext(options)
    written: list[str] = []
    writer = ShardWriter(
        staging,
        f"{unit.split}-{unit.index:05d}",
        shard_bytes=(1 << 62) if source.whole_units else options["shard_bytes"],
        encoder=encoder,
        on_complete=lambda path, row: written.append(path),  # published once the unit is complete
    )
    with writer:
        for key, fields in source.build(unit, ctx):
            writer.write(key, fields)
    for path, row in zip(written, writer.rows):
        store.publish(path, row.name)
    rows = [dict(row.as_dict(), unit=unit.index) for row in writer.rows]
    return UnitResult(unit.split, unit.index, digest, rows, ctx.problems, ctx.tables, unit.input_bytes)


def unverified_shards(store, rows: list[dict], *, full: bool) -> list[str]:
    """Shards of a finished unit that are not in the store as a conversion writes them: by size, by
    sha256 when another machine may have written them (a local worker hashed what it wrote itself),
    and with their index (a unit an older wdsprep wrote without it is built again)."""
    return [
        row["name"]
        for row in rows
        if not has_index(row) or store.stat(row["name"]) != row["bytes"]
        or (full and store.sha256(row["name"]) != row["sha256"])
    ]


def convert(
    source_id: str,
    input: str,
    output: str,
    *,
    shard_bytes: int | str = "256MB",
    codec: str = "zstd",
    zstd_level: int = 3,
    workers: int = 1,
    executor: str = "local",
    on_error: str = DEFAULT_ON_ERROR,
    quiet: bool = True,
    executor_options: dict | None = None,
    splits: list[str] | None = None,
    fingerprint: str | None = None,
    **source_options: Any,
) -> Manifest:
    started = time.time()
    source = load_source(source_id)
    # every option is checked (wdsprep.options) before the output is opened or the input read
    workers, runner = check_run_options(input=input, output=output, workers=workers, executor=executor,
                                        fingerprint=fingerprint, splits=splits, executor_options=executor_options)
    core = check_core_options(dict(shard_bytes=shard_bytes, codec=codec, zstd_level=zstd_level, on_error=on_error))
    options = dict(source_options, **core, workers=workers)
    source.check_options(options)
    if "://" not in str(input):
        input = os.path.abspath(input)  # units carry paths that workers on other nodes can resolve
    store = open_store(output)
    with store.lock():
        try:
            return _convert(source_id, source, input, store, options, splits=splits, fingerprint=fingerprint,
                            executor=executor, runner=runner, quiet=quiet, started=started)
        except KeyboardInterrupt:  # Ctrl-C at any moment: leave no temporary file (the lock keeps others out)
            store.clean_temporaries()
            raise


def _convert(source_id, source, input, store, options, *, splits, fingerprint, executor, runner, quiet,
             started) -> Manifest:
    plan_ctx = PlanContext(options)
    plan = source.plan(input, plan_ctx)
    check_plan(plan, plan_ctx, input, splits)  # split names, empty splits, nothing to convert
    config = dict(plan.config)
    config.update({name: options[name] for name in CORE_CONFIG})
    store.clean_temporaries()  # ours only: the lock excludes another run

    mode = fingerprint or source.fingerprint
    inputs = unit_input_fingerprints(source, plan.units, mode)
    input_fingerprint = _digest([mode, inputs])
    digests = [unit_digest(unit, config, unit_inputs) for unit, unit_inputs in zip(plan.units, inputs)]
    previous = _load_units(store, config)
    done: dict[str, UnitResult] = {}
    for digest in digests:
        record = previous.get(digest)
        if record is not None and not unverified_shards(store, record.rows, full=True):
            done[digest] = record

    old_manifest = store.read_bytes(MANIFEST_NAME)
    todo = [(unit, digest) for unit, digest in zip(plan.units, digests) if digest not in done]
    if todo and old_manifest is not None:
        store.delete(MANIFEST_NAME)  # about to change: never leave a manifest that may lie

    run_options = {k: v for k, v in options.items() if k != "workers"}
    tasks = [(source_id, unit, run_options, store.url, digest) for unit, digest in todo]
    progress = Progress(f"convert {source_id}", len(plan.units), plan.input_bytes, quiet=quiet)
    progress.advance(len(done), sum(r.input_bytes for r in done.values()))
    failures: list[tuple[Unit, BaseException]] = []
    journal = _UnitJournal(store, config, done) if todo else None
    results_stream = runner.map_unordered(build_unit, tasks)
    try:
        for task_index, result in results_stream:
            unit, digest = todo[task_index]
            if isinstance(result, OutputError):
                raise result  # a full disk fails every later unit too: stop at the first
            if isinstance(result, BaseException):
                failures.append((unit, result))
                continue
            bad = unverified_shards(store, result.rows, full=executor != "local")
            if bad:  # e.g. a worker on another node wrote to its own local disk
                failures.append((unit, ConversionError(f"shard(s) {', '.join(bad)} reported written but not found with that size and sha256 at {store.url}")))
                continue
            done[digest] = result
            journal.record(result)
            progress.advance(1, result.input_bytes)
        if journal is not None:
            journal.close()
    except (OutputError, KeyboardInterrupt):
        results_stream.close()  # stops the pool before cleaning up
        store.clean_temporaries()
        raise
    finally:
        progress.close()

    if len(failures) == 1:
        unit, error = failures[0]
        raise ConversionError(
            f"{error} (unit {unit.split}-{unit.index:05d}: {_describe_items(unit.items)}; no manifest written, "
            "re-run to resume)"
        )
    if failures:
        lines = [f"unit {unit.split}-{unit.index:05d} ({_describe_items(unit.items)}): {error}" for unit, error in failures]
        raise ConversionError(
            f"{len(failures)} of {len(plan.units)} units failed; no manifest written "
            f"(re-run to resume, completed units are kept):\n  " + "\n  ".join(lines)
        )

    results = [done[digest] for digest in digests]
    splits: dict[str, list[dict]] = {}
    for unit, result in zip(plan.units, results):
        splits.setdefault(unit.split, []).extend(dict(row, unit_digest=result.digest) for row in result.rows)
    tables = dict(plan.tables)
    tables.update(source.finalize(plan, [r.tables for r in results]))
    problems = plan_ctx.problems + [p for r in results for p in r.problems]
    splits = check_converted(splits, plan, problems, input)  # a split whose every item was skipped
    manifest = Manifest(
        source=source_id,
        config=config,
        fingerprint=input_fingerprint,
        splits=splits,
        tables=tables,
        problems=problems,
        input_bytes=plan.input_bytes,
        timing={"seconds": round(time.time() - started, 3), "units_built": len(todo), "units_reused": len(plan.units) - len(todo)},
    )
    _remove_stale_shards(store, splits)
    store.write_bytes(MANIFEST_NAME, manifest.dumps())
    manifest.url = f"{store.url.rstrip('/')}/{MANIFEST_NAME}"
    return manifest


def _describe_items(items: list) -> str:
    """`N items, first ...`: enough to find the unit, short enough for one line."""
    first = json.dumps(items[0], default=str) if items else "none"
    first = first if len(first) <= 80 else first[:77] + "..."
    return f"{len(items)} item{'s' if len(items) != 1 else ''}, first {first}"


def _load_units(store, config: dict) -> dict[str, UnitResult]:
    """Completed units of an earlier run with the same config (JSON lines); each unit's digest holds
    its inputs' fingerprints, so a changed input only loses the units it feeds."""
    raw = store.read_bytes(UNITS_NAME)
    if raw is None:
        return {}
    lines = raw.splitlines()
    try:
        head = json.loads(lines[0])
        if head.get("config") != json.loads(json.dumps(config)):
            return {}
    except (ValueError, IndexError, AttributeError):
        return {}
    units = {}
    for line in lines[1:]:
        try:
            record = UnitResult(**json.loads(line))
        except (ValueError, TypeError):
            continue  # a torn last line after a crash only costs a rebuild of that unit
        units[record.digest] = record
    return units


def replace_unit_rows(store: Store, rows: dict[str, dict]) -> None:
    """Give the shards named in `rows` (name -> new row fields) their new rows in `_units.json`, so a
    re-run of the conversion still finds its units' shards as recorded (`wdsprep reindex`)."""
    raw = store.read_bytes(UNITS_NAME)
    if raw is None:
        return
    lines = raw.decode().splitlines()
    for number, line in enumerate(lines[1:], 1):
        try:
            record = json.loads(line)
            record["rows"] = [dict(row, **rows.get(row["name"], {})) for row in record["rows"]]
        except (ValueError, TypeError, KeyError):
            continue  # a torn line: that unit is rebuilt by the next conversion, as after a crash
        lines[number] = json.dumps(record, sort_keys=True, default=str)
    store.write_bytes(UNITS_NAME, ("\n".join(lines) + "\n").encode())


class _UnitJournal:
    """Appends each finished unit to `_units.json` at once (stores that cannot append get the whole
    file rewritten at most once a second, and at the end). Nothing is written before the first unit
    of this run is done, so a run that fails at once leaves the output as it was."""

    def __init__(self, store: Store, config: dict, done: dict[str, UnitResult]):
        self.store = store
        self.lines = [json.dumps({"config": config}, sort_keys=True, default=str)]
        self.lines += [json.dumps(asdict(r), sort_keys=True, default=str) for r in done.values()]
        self.can_append = store.supports_append
        self.written = False
        self.last_flush = time.monotonic()

    def record(self, result: UnitResult) -> None:
        line = json.dumps(asdict(result), sort_keys=True, default=str)
        self.lines.append(line)
        if not self.written or (not self.can_append and time.monotonic() - self.last_flush > 1.0):
            self._rewrite()  # the first record replaces a journal of an earlier config
        elif self.can_append:
            self.store.append_bytes(UNITS_NAME, (line + "\n").encode())

    def close(self) -> None:
        if self.written and not self.can_append:
            self._rewrite()

    def _rewrite(self) -> None:
        self.store.write_bytes(UNITS_NAME, ("\n".join(self.lines) + "\n").encode())
        self.written = True
        self.last_flush = time.monotonic()


def _remove_stale_shards(store: Store, splits: dict[str, list[dict]]) -> None:
    """Delete shards of the converted splits left by an earlier, different conversion (in stores
    that can list their objects; elsewhere they stay, unlisted by the manifest)."""
    if not store.supports_listing:
        return
    listed = {row["name"] for rows in splits.values() for row in rows}
    rules = [shard_name_pattern(split) for split in splits]
    for name in store.list_names():
        if name not in listed and any(rule.fullmatch(name) for rule in rules):
            store.delete(name)
