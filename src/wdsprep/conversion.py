"""The conversion driver: plan units, build them, verify them, write the manifest last.

`Conversion` is the driver, step by step, for one plan into one output store: which units an
earlier run already made (`done(unit)`: reusable), build one unit here (`build(unit)`), take a
unit built elsewhere (`accept(unit, result)`: a process pool's or Ray's), and `finish()` -> the
manifest. `convert()` is the ordinary run: check every option, plan, open a `Conversion`, build
what is not reusable on an executor, finish. rawnind's `fetch --convert` drives a `Conversion` one
scene at a time as scenes arrive; a source never imports this module: it is handed the driver (the
core's public `wdsprep.Conversion`), so the reuse, the journal and the manifest have this one home.

Resumable: beside the manifest the driver keeps `_units.json` (its journal, `shards.journal`), the results of completed units keyed
by a digest of the unit (its items), the conversion config and the fingerprints of the native inputs
that feed it (one rule for every source, `wdsprep.inputs`: content hashes or size + mtime_ns +
ctime_ns + inode; a source that verified its inputs itself, as rawnind's fetch does with SHA-1s,
hands the driver those). A re-run reuses every unit whose record matches and whose shards still
check out (size, sha256, and an index in each), and rebuilds the rest, so a changed input rebuilds
exactly the units it feeds (and a unit an older wdsprep wrote without shard indexes is built again).
A unit is recorded only after its shards are checked in the store; `build` records durably before
it returns (a caller may then delete the unit's native input, as fetch does with its raws). Units
built on an executor write their shards without an fsync each and are journaled in batches
(`shards.journal`); `finish` makes every shard durable at once (`Store.sync`) before the sample
tables and the manifest name them, and a resumed run checks each recorded shard's sha256, so a crash
costs the units it caught, never a manifest that lies (issue 40: 10^5 tiny units waited on the disk).
The manifest is removed when a `Conversion` opens with work to do and written only by `finish`,
when every unit is done, so a manifest never lists a shard that was not written and verified.

Sample tables. A unit's result also carries its samples' keys and index field values, in the order
it wrote them (`UnitResult.samples`; the fields are `ConvertOptions.index_fields`, else the source's
`Source.index_fields`, each value from `Source.index_values` or the sample: `shards.samples`), and is
journaled with them, so a resumed run has every unit's keys and values without reading a shard. A
recorded unit is reused only when it holds the fields this run indexes (a unit recorded with other
fields, or by a wdsprep that kept none, is built again: its shards come out byte for byte the same).
`finish` concatenates them in plan order, which is the manifest's order of shards and samples,
into one `<split>.samples` file per split, written (atomically) before the manifest and recorded in
its `tables["sample_tables"]`: the same bytes on any executor and worker count, and after a resume.

Nothing is done before every option is checked (`wdsprep.options.ConvertOptions`: one line naming
a bad value, the output not yet touched) and the plan passes the core's rules
(`sources.base.check_plan`: split names, a split without samples reported, nothing to convert
refused). A Ctrl-C at any moment stops the pool's workers and leaves no temporary file
(`executors.process_pool`, `convert`).

One conversion at a time per local output directory (an `flock` the kernel releases when the process
dies; stores without `supports_lock`, such as `s3://` outputs, have no lock). The driver uses the
output only through `wdsprep.storage.Store`'s methods and capability flags, never by probing it.
A failed write of the output (a full disk) stops the conversion at the first failure, with one
line, and leaves no temporary file behind. A `--shard-bytes` that makes most shards hold a single
sample is not refused (the output is valid) but said, in one `UserWarning` when the manifest is
written (`one_sample_shards_warning`; the CLI prints it as one `wdsprep: warning:` line).
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .errors import ConversionError, OutputError
from .inputs import unit_input_fingerprints
from .options import ConvertOptions, check_run_options
from .progress import Progress, human_bytes
from .shards.codec import Encoder
from .shards.index import has_index
from .shards.journal import UnitJournal, UnitResult, load_units, written_by_conversion
from .shards.manifest import MANIFEST_NAME, SPLIT_NAME, Manifest, shard_name_pattern
from .shards.samples import SUFFIX as TABLE_SUFFIX
from .shards.samples import TABLE as SAMPLE_TABLES
from .shards.samples import file_name as table_file_name
from .shards.samples import sample_values, split_table
from .shards.writer import ShardWriter
from .sources.base import Plan, PlanContext, Source, Unit, UnitContext, check_converted, check_plan
from .sources.registry import load_source
from .storage import Store, open_store


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def unit_digest(unit: Unit, config: dict, inputs: str) -> str:
    """What a unit's shards depend on: its items, the config and its inputs' fingerprints."""
    return _digest({"split": unit.split, "index": unit.index, "items": unit.items, "config": config, "inputs": inputs})


def build_unit(source_id: str, unit: Unit, core: ConvertOptions, options: dict, output: str, digest: str,
               durable: bool = False) -> UnitResult:
    """Runs in a worker: build one unit's samples into its shard(s) and publish them (fsynced each
    when `durable` or built on another machine's executor; else, on this machine, the driver makes
    them durable all at once before the manifest)."""
    durable = durable or core.executor != "local"  # the driver's Store.sync flushes its own machine only
    source = load_source(source_id)
    store = open_store(output)
    encoder = Encoder(core.codec, core.zstd_level)
    staging = store.staging_dir()
    ctx = UnitContext(options, core)
    written: list[str] = []
    writer = ShardWriter(
        staging,
        f"{unit.split}-{unit.index:05d}",
        shard_bytes=(1 << 62) if source.whole_units else core.shard_bytes,
        encoder=encoder,
        on_complete=lambda path, row: written.append(path),  # published once the unit is complete
        durable=durable,
        pack=core.pack,
    )
    names = core.index_fields or ()
    keys: list[str] = []
    columns: dict[str, list] = {name: [] for name in names}
    with writer:
        for key, fields in source.build(unit, ctx):
            values = sample_values(key, fields, names, source.index_values(key, fields) if names else {})
            writer.write(key, fields)
            keys.append(key)
            for name, value in zip(names, values):
                columns[name].append(value)
    for path, row in zip(written, writer.rows):
        store.publish(path, row.name)
    rows = [dict(row.as_dict(), unit=unit.index) for row in writer.rows]
    return UnitResult(unit.split, unit.index, digest, rows, ctx.problems, ctx.tables, unit.input_bytes,
                      {"keys": keys, "fields": columns})


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


class Conversion:
    """One conversion of `plan` into `store`, step by step (see the module docstring).

    `core` must be checked (`ConvertOptions.checked`); `options` are the source's own. `inputs` holds
    one fingerprint string per unit of the plan (what its native inputs are), `input_mode` names how
    they were taken; `identities` (default: the units) are what each unit's digest names, e.g. its
    items without a machine-local root. Opening reads `_units.json`, keeps the records whose unit
    digest matches and whose shards check out, and removes the manifest when any unit is left to do.
    Thread-safe: units may be built and accepted from several threads at once.
    """

    def __init__(self, source_id: str, input: str, store: Store, plan: Plan, core: ConvertOptions, options: Mapping,
                 inputs: Sequence[str], *, input_mode: str, problems: Sequence[dict] = (),
                 identities: Sequence[Unit] | None = None):
        self.source_id, self.input, self.store, self.plan = source_id, input, store, plan
        self.source = load_source(source_id)
        # the index fields this run records: the conversion's, else the source's defaults
        fields = core.index_fields if core.index_fields is not None else tuple(self.source.index_fields)
        self.core, self.options = core.replace(index_fields=tuple(fields)), dict(options)
        self.problems = list(problems)
        self.config = dict(plan.config, **core.config())
        self.fingerprint = _digest([input_mode, list(inputs)])
        store.check_replaceable(written_by_conversion)
        store.clean_temporaries()  # ours only: the lock (or the caller) excludes another run
        units = identities if identities is not None else plan.units
        self._digests = {(unit.split, unit.index): unit_digest(identity, self.config, unit_inputs)
                         for unit, identity, unit_inputs in zip(plan.units, units, inputs)}
        previous = load_units(store, self.config)
        self._done: dict[str, UnitResult] = {}
        for digest in self._digests.values():
            record = previous.get(digest)
            if record is not None and _holds_samples(record, self.core.index_fields) \
                    and not unverified_shards(store, record.rows, full=True):
                self._done[digest] = record
        self.reused = len(self._done)
        self.reused_bytes = sum(record.input_bytes for record in self._done.values())
        self.todo = [unit for unit in plan.units if not self.done(unit)]
        if self.todo and store.read_bytes(MANIFEST_NAME) is not None:
            store.delete(MANIFEST_NAME)  # about to change: never leave a manifest that may lie
        self._journal = UnitJournal(store, self.config, self._done)
        self._lock = threading.Lock()

    def digest(self, unit: Unit) -> str:
        return self._digests[unit.split, unit.index]

    def done(self, unit: Unit) -> UnitResult | None:
        """The unit's result when it is done: reused from an earlier run, or built and accepted."""
        return self._done.get(self.digest(unit))

    def task(self, unit: Unit) -> tuple:
        """`build_unit`'s arguments for `unit`, for an executor to run anywhere."""
        return (self.source_id, unit, self.core, self.options, self.store.url, self.digest(unit))

    def build(self, unit: Unit) -> UnitResult:
        """Build `unit` here, check its shards in the store and record it durably."""
        return self.accept(unit, build_unit(*self.task(unit), durable=True), full=True, durable=True)

    def accept(self, unit: Unit, result: UnitResult, *, full: bool = True, durable: bool = False) -> UnitResult:
        """Take `unit`'s result once its shards check out in the store (`full`: by sha256 too, for
        shards another machine wrote), and record it in `_units.json` (`durable`: before returning,
        also where the store cannot append); a ConversionError when the shards are not there."""
        if result.digest != self.digest(unit):
            raise ConversionError(f"unit {unit.split}-{unit.index:05d}: result of another conversion (digest {result.digest[:12]})")
        bad = unverified_shards(self.store, result.rows, full=full)
        if bad:  # e.g. a worker on another node wrote to its own local disk
            raise ConversionError(f"shard(s) {', '.join(bad)} reported written but not found with that size and "
                                  f"sha256 at {self.store.url}")
        with self._lock:
            self._done[result.digest] = result
            self._journal.record(result, durable=durable)
        return result

    def flush(self) -> None:
        """Make every unit accepted so far durable in `_units.json` (the end of a run, failed or not)."""
        with self._lock:
            self._journal.close()

    @property
    def complete(self) -> bool:
        return all(self.done(unit) is not None for unit in self.plan.units)

    def finish(self, started: float | None = None) -> Manifest:
        """The manifest, written when every unit is done (a ConversionError naming the first unit
        left otherwise); shards of the converted splits that it does not list are removed."""
        self.flush()
        missing = [unit for unit in self.plan.units if self.done(unit) is None]
        if missing:
            unit = missing[0]
            raise ConversionError(f"{len(missing)} unit(s) not done, first {unit.split}-{unit.index:05d}; no manifest written")
        results = [self.done(unit) for unit in self.plan.units]
        splits: dict[str, list[dict]] = {}
        for unit, result in zip(self.plan.units, results):
            splits.setdefault(unit.split, []).extend(dict(row, unit_digest=result.digest) for row in result.rows)
        tables = dict(self.plan.tables)
        tables.update(self.source.finalize(self.plan, [r.tables for r in results]))
        problems = self.problems + [p for r in results for p in r.problems]
        splits = check_converted(splits, self.plan, problems, self.input)  # a split whose every item was skipped
        self.store.sync()  # the shards durable before anything names them (written without an fsync each)
        tables[SAMPLE_TABLES] = self._write_sample_tables(splits, results)  # before the manifest: it is last
        manifest = Manifest(
            source=self.source_id,
            config=self.config,
            fingerprint=self.fingerprint,
            splits=splits,
            tables=tables,
            problems=problems,
            input_bytes=self.plan.input_bytes,
            timing={"seconds": round(time.time() - (started or time.time()), 3),
                    "units_built": len(self.plan.units) - self.reused, "units_reused": self.reused},
        )
        _remove_stale_shards(self.store, splits)
        manifest.write(self.store)  # the shard tables, then manifest.json
        manifest.url = f"{self.store.url.rstrip('/')}/{MANIFEST_NAME}"
        warning = one_sample_shards_warning(results, self.core.shard_bytes)
        if warning is not None:
            warnings.warn(warning, UserWarning, stacklevel=2)  # the output is valid: said, not refused
        return manifest


    def _write_sample_tables(self, splits: dict[str, list[dict]], results: list[UnitResult]) -> dict:
        """Write each converted split's `<split>.samples` (its units' keys and values in plan order:
        the manifest's order); returns the manifest's records of them."""
        keys: dict[str, list[str]] = {split: [] for split in splits}
        columns: dict[str, dict[str, list]] = {split: {name: [] for name in self.core.index_fields} for split in splits}
        for unit, result in zip(self.plan.units, results):
            if unit.split in keys:
                keys[unit.split] += result.samples["keys"]
                for name, values in result.samples["fields"].items():
                    columns[unit.split][name] += values
        tables = {split: split_table(split, keys[split], columns[split]) for split in sorted(splits)}  # all or nothing
        held = {name for _, entry in tables.values() for name in entry["fields"]}
        for name in self.core.index_fields:
            if name not in held:
                warnings.warn(f"index field {name!r} is in no sample of any split: it is not indexed", UserWarning,
                              stacklevel=3)
        for split, (data, _) in tables.items():
            self.store.write_bytes(table_file_name(split), data)
        return {split: entry for split, (_, entry) in tables.items()}


def _holds_samples(record: UnitResult, fields: tuple) -> bool:
    """Whether a recorded unit carries its samples' keys and exactly these index fields."""
    samples = record.samples
    return (isinstance(samples, dict) and isinstance(samples.get("keys"), list)
            and len(samples["keys"]) == sum(row["samples"] for row in record.rows)
            and isinstance(samples.get("fields"), dict) and sorted(samples["fields"]) == sorted(fields)
            and all(len(values) == len(samples["keys"]) for values in samples["fields"].values()))


def convert(source_id: str, input: str, output: str, *, quiet: bool = True, options: ConvertOptions | None = None,
            **keywords: Any) -> Manifest:
    """Convert `input` with source `source_id` into shards and a manifest at `output`.

    The core's options are `options` (a `ConvertOptions`) or its fields as keywords (`shard_bytes`,
    `codec`, `zstd_level`, `on_error`, `workers`, `executor`, `executor_options`, `fingerprint`,
    `splits`; a keyword overrides `options`); every other keyword is the source's own option."""
    return CheckedConversion.of(source_id, input, output, options, **keywords).convert(quiet=quiet)


@dataclass(frozen=True)
class CheckedConversion:
    """A conversion whose every option was checked (`of`), not started: what `wdsprep convert`
    judges before any work (a bad option there is a bad argument) and then runs (`convert`)."""

    source_id: str
    source: Source
    input: str
    output: str
    core: ConvertOptions
    source_options: dict
    runner: Any  # the executor (executors.py)

    @classmethod
    def of(cls, source_id: str, input: str, output: str, options: ConvertOptions | None = None,
           **keywords: Any) -> "CheckedConversion":
        """Every option checked before the output is opened or the input read: the source loaded,
        the core's options (wdsprep.options), where the output lies and the executor, the source's
        own options; a bad one is one ConfigError line naming it."""
        source = load_source(source_id)
        core, source_options = ConvertOptions.split(keywords, options)
        core = core.checked()
        runner = check_run_options(core, input=input, output=output)
        source.check_options(source_options)
        return cls(source_id, source, input, output, core, source_options, runner)

    def convert(self, quiet: bool = True) -> Manifest:
        started = time.time()
        input = self.input if "://" in str(self.input) else os.path.abspath(self.input)  # units carry paths
        store = open_store(self.output)  # that workers on other nodes can resolve
        with store.lock():
            store.check_replaceable(written_by_conversion)  # before the input is planned and fingerprinted
            try:
                return _convert(self.source_id, self.source, input, store, self.core, self.source_options,
                                runner=self.runner, quiet=quiet, started=started)
            except KeyboardInterrupt:  # Ctrl-C at any moment: leave no temporary file (the lock keeps others out)
                store.clean_temporaries()
                raise


def _convert(source_id, source, input, store, core: ConvertOptions, source_options: dict, *, runner, quiet,
             started) -> Manifest:
    plan_ctx = PlanContext(source_options, core)
    plan = source.plan(input, plan_ctx)
    check_plan(plan, plan_ctx, input, core.splits)  # split names, empty splits, nothing to convert
    mode = core.fingerprint or source.fingerprint
    inputs = unit_input_fingerprints(source, plan.units, mode, min(core.workers, os.cpu_count() or 1))
    conversion = Conversion(source_id, input, store, plan, core, source_options, inputs, input_mode=mode,
                            problems=plan_ctx.problems)
    todo = conversion.todo
    progress = Progress(f"convert {source_id}", len(plan.units), plan.input_bytes, quiet=quiet)
    progress.advance(conversion.reused, conversion.reused_bytes)
    failures: list[tuple[Unit, BaseException]] = []
    results_stream = runner.map_unordered(build_unit, [conversion.task(unit) for unit in todo])
    try:
        for task_index, result in results_stream:
            unit = todo[task_index]
            if isinstance(result, OutputError):
                raise result  # a full disk fails every later unit too: stop at the first
            if isinstance(result, BaseException):
                failures.append((unit, result))
                continue
            try:
                conversion.accept(unit, result, full=core.executor != "local")
            except ConversionError as error:
                failures.append((unit, error))
                continue
            progress.advance(1, result.input_bytes)
        conversion.flush()
    except (OutputError, KeyboardInterrupt):
        results_stream.close()  # stops the pool before cleaning up
        try:
            conversion.flush()  # the units accepted so far stay journaled (records are batched)
        except OutputError:
            pass  # a full disk: they are built again by the next run
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
    return conversion.finish(started)


def one_sample_shards_warning(results: Sequence[UnitResult], shard_bytes: int) -> str | None:
    """One line when most shards hold a single sample because `--shard-bytes` is smaller than two
    samples: a one-sample shard more than half the target (two such would not fit: a unit of one
    item, or the writer closed it before the next sample), or closed before the next sample within
    a unit. Valid shards, but each costs a request when read remotely. None for a few (one sample
    larger than the rest) and for a unit's small remainder (one sample, at most half the target)."""
    total = sum(len(result.rows) for result in results)
    single = [row for result in results for at, row in enumerate(result.rows)
              if row["samples"] == 1 and (2 * row["bytes"] > shard_bytes or at < len(result.rows) - 1)]
    if len(single) < 2 or 2 * len(single) < total:
        return None
    largest = max(row["bytes"] for row in single)
    return (f"{len(single)} of {total} shards hold a single sample: --shard-bytes {human_bytes(shard_bytes)} is "
            f"smaller than two samples (such shards are up to {human_bytes(largest)}); each costs a request when "
            "read remotely, so a --shard-bytes of many samples reads faster")


def _describe_items(items: list) -> str:
    """`N items, first ...`: enough to find the unit, short enough for one line."""
    first = json.dumps(items[0], default=str) if items else "none"
    first = first if len(first) <= 80 else first[:77] + "..."
    return f"{len(items)} item{'s' if len(items) != 1 else ''}, first {first}"


def _remove_stale_shards(store: Store, splits: dict[str, list[dict]]) -> None:
    """Delete shards of the converted splits left by an earlier, different conversion, and sample
    tables of splits this one does not hold (in stores that can list their objects; elsewhere they
    stay, unlisted by the manifest)."""
    if not store.supports_listing:
        return
    listed = {row["name"] for rows in splits.values() for row in rows}
    rules = [shard_name_pattern(split) for split in splits]
    for name in store.list_names():
        stale_table = name.endswith(TABLE_SUFFIX) and SPLIT_NAME.fullmatch(name.removesuffix(TABLE_SUFFIX)) \
            and name.removesuffix(TABLE_SUFFIX) not in splits
        if stale_table or (name not in listed and any(rule.fullmatch(name) for rule in rules)):
            store.delete(name)
