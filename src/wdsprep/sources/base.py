"""The contract between the core and a source: the `Source` base class and what its hooks get.

A source is a `Source` subclass instance: a built-in one is `SOURCE` in
`wdsprep.sources.<id>.convert` (ids in `registry.BUILTIN`), a plugin one any object named as
`package.module:OBJECT`. The core (cli, conversion, executors) only talks to a source through the
hooks declared on `Source`, each with a documented default, so a new source is a new folder (or a
plugin module) and nothing else changes.

Conversion is planned as independent *units*: a unit is a list of source items that become one shard
(rarely more: a unit whose samples outgrow the target shard size rolls over into a second part).
`group_by_size` cuts a source's items into units by their estimated bytes and by count (at most
`MAX_UNIT_ITEMS` items), so an input of many tiny files makes many units that `--workers` build at once.
Units are built in worker processes (or Ray tasks), so `Unit.items` must be picklable and small
(paths and numbers, not arrays), and `build` must depend only on the unit and the options: that is
what makes the bytes independent of `--workers` and of the executor.

A hook gets the core's options and the source's own apart: `ctx.core` is the conversion's checked
`wdsprep.options.ConvertOptions` (`ctx.core.shard_bytes` for planning, `ctx.core.on_error`, ...),
`ctx.options` the source's own mapping (what its `add_arguments` flags or `convert()` keywords set).

A source also declares which native inputs feed each item (`inputs`); the core fingerprints them
with one rule (`wdsprep.inputs`) and rebuilds exactly the units whose inputs changed.

Bad native items, at plan and at build time alike, go through one rule, `skip_or_raise` on the
context the hook gets: `--on-error raise` (the default) stops with the item's one-line error,
`--on-error skip` leaves the item out and lists it in the manifest's `problems`.

Nothing the input holds is dropped without a word. A source that lists folders reports what it
found and does not take with `ctx.ignore` (a `.png` beside the arrays, a nested or hidden folder),
and names the splits it found in `Plan.splits`, so the driver's `check_plan` can report a split
that yields no sample. `check_plan` also applies the split-name rule to every planned split and
refuses a plan with nothing to convert, all before anything is written; `check_converted` reports
a split whose every item was skipped at build time and refuses a conversion with no sample at all.
Ignored entries and empty splits are `problems` entries as well (and warning lines of the CLI), in
either `--on-error` mode: they are not errors, but the manifest says what it does not hold.
"""
from __future__ import annotations

import abc
import argparse
import importlib
import os
import zipfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from ..command import Command
from ..errors import ConfigError, ConversionError, InputError
from ..shards.codec import beyond, encode_msgpack, npy_size_problem, parse_json_text
from ..options import DEFAULT_ON_ERROR, ON_ERROR, ConvertOptions  # noqa: F401 (ON_ERROR: the sources' name for it)
from ..shards.manifest import check_split_name  # noqa: F401 (the sources' name for it)

if TYPE_CHECKING:
    from ..show.model import ShowContext, Shown

NPY_MAGIC = b"\x93NUMPY"


@dataclass
class Unit:
    split: str
    index: int  # ordinal of the unit within its split; names its shard
    items: list  # small, picklable description of the source items (relative paths, ranges...)
    input_bytes: int = 0  # native bytes this unit reads (for throughput and progress)


@dataclass
class Plan:
    units: list[Unit]
    config: dict  # the conversion config, recorded in the manifest (JSON-serializable)
    input_bytes: int = 0
    tables: dict = field(default_factory=dict)  # source-level tables known at plan time
    # every split found in the input -> where (its folder, file or config entry), also one that
    # yields no unit: the driver reports that one instead of leaving it out without a word
    splits: dict = field(default_factory=dict)


class _Context:
    """The conversion's options, the `--on-error` policy and the bad items a plan or a build skipped
    (the manifest's `problems`). `core` is the core's `ConvertOptions` (checked: `core.shard_bytes`
    is a number of bytes), `options` the source's own options only (`add_arguments`' flags or
    `convert()` keywords). Given one mapping and no `core`, the mapping is taken apart
    (`ConvertOptions.split`), so `PlanContext({"shard_bytes": 1 << 20, "levels": "1,2"})` works too."""

    def __init__(self, options: Mapping[str, Any] | None = None, core: ConvertOptions | None = None):
        if core is None:
            core, options = ConvertOptions.split(options or {})
            core = core.checked()
        self.core = core
        self.options = dict(options or {})
        self.on_error = core.on_error or DEFAULT_ON_ERROR
        self.problems: list[dict] = []
        self._ignored: dict[tuple[str, str], tuple[int, list[str]]] = {}  # (folder, reason) -> (entry, names)

    def ignore(self, path: str, reason: str) -> None:
        """Note an entry the source found in the input and does not take (`reason`: why, e.g.
        "not <key>.<field>.npy|json"; a folder's path ends in `/`). Not an error in either
        `--on-error` mode: the entries of one folder ignored for one reason make one `problems`
        entry, `{"item": folder, "message": "not converted (reason): a.png, b.NPY"}`."""
        folder, name = os.path.split(path.rstrip("/"))
        name += "/" if path.endswith("/") else ""
        position, names = self._ignored.setdefault((folder, reason), (len(self.problems), []))
        names.append(name)
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        entry = {"item": folder, "message": f"not converted ({reason}): {shown}"}
        if position == len(self.problems):
            self.problems.append(entry)
        else:
            self.problems[position] = entry

    def report_bad(self, item: str, message: str) -> None:
        """Record an item that was left out in the manifest's `problems`, as `{"item", "message"}`
        with the message not repeating the item (`wdsprep convert` prints `item: message`)."""
        self.problems.append({"item": item, "message": message.removeprefix(f"{item}: ")})

    def skip_or_raise(self, item: str, problem: str | InputError) -> None:
        """The one `--on-error` rule for a bad item. Raise mode (the default): raise `problem` (an
        InputError as it is, a message as `InputError("item: message")`). Skip mode: record it with
        `report_bad` and return; the caller leaves the item out and goes on."""
        if self.on_error != "skip":
            if isinstance(problem, BaseException):
                raise problem
            raise InputError(problem if problem.startswith(f"{item}: ") else f"{item}: {problem}")
        self.report_bad(item, str(problem))


class PlanContext(_Context):
    """What `Source.plan` gets: the conversion options, and `skip_or_raise` for bad native items."""


class UnitContext(_Context):
    """What a unit's build gets besides the unit; what it reports is collected by the driver."""

    def __init__(self, options: Mapping[str, Any] | None = None, core: ConvertOptions | None = None):
        super().__init__(options, core)
        self.tables: dict[str, list] = {}

    def add_table_entry(self, table: str, value: Any) -> None:
        """Append a JSON-serializable value to a per-unit table merged by `Source.finalize`."""
        self.tables.setdefault(table, []).append(value)


Sample = tuple  # (key: str, fields: dict[str, Any])


class Source(abc.ABC):
    """Base class of every source, built-in or plugin: the only way the core talks to one.

    Subclasses set `id` and implement `plan`, `inputs` and `build`; every other hook has a
    documented default here, so the core calls each hook unconditionally and never asks a source
    what it has (no `hasattr`). Import-light: a source's converter module is imported in every
    conversion worker, so it must not import torch (readers do that, in `read.py`).
    """

    id: str = ""
    # True: a unit always makes exactly one shard, even above the target size (for sources whose
    # reader pairs samples within a shard, e.g. deepreg); `shard_bytes` then only guides planning
    whole_units: bool = False
    # default input fingerprint mode, "content" or "stat" (see wdsprep.inputs; --fingerprint overrides)
    fingerprint: str = "stat"
    # the source's own drawing for `wdsprep show`, as "package.module:function" (`<id>/show.py`):
    # named, not imported, so a converter never loads its readers (drawing uses them), like `lazy_exports`
    show_with: str | None = None
    # the per-sample fields each split's sample table records when a conversion names none
    # (`ConvertOptions.index_fields`, `--index-fields`): small scalars a user selects on
    # (`select="meta.episode == 'e1'"`): a top-level field, a dotted path into a dict field
    # (`meta.episode`), or a name `index_values` computes (shards/samples.py, docs/converting.md)
    index_fields: tuple[str, ...] = ()

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add source-specific `wdsprep convert <id>` options. Default: none."""

    def check_options(self, options: dict) -> None:
        """Check the source's own options (those `add_arguments` adds, or `convert()` keywords; never
        the core's, which `ConvertOptions` checks) before any work starts; a bad value raises
        ConfigError naming the option. Default: nothing to check."""

    @abc.abstractmethod
    def plan(self, input: str, ctx: PlanContext) -> Plan:
        """Scan the native input and split it into units. A bad item goes to `ctx.skip_or_raise`;
        an input that cannot be converted at all raises InputError naming the file."""

    @abc.abstractmethod
    def inputs(self, item: Any) -> list:
        """The native inputs that feed one unit item: file paths, or (zip archive, member) pairs."""

    @abc.abstractmethod
    def build(self, unit: Unit, ctx: UnitContext) -> Iterator[Sample]:
        """Yield (key, fields) samples of one unit, in a deterministic order.

        Field names without an extension are encoded by the core: numpy arrays as `.npy`
        (or `.npy.zst` with the zstd codec), everything else as msgpack `.mp`. A name with an
        explicit extension (`.json`, `.npy`, `.mp`, `.npy.zst`) is encoded as that extension.
        A bad item goes to `ctx.skip_or_raise`.
        """

    def index_values(self, key: str, sample: dict) -> Mapping[str, Any]:
        """Index fields computed from one built sample (`key`, its fields as `build` yielded them):
        name -> a number, bool, string or None (absent), for names that are not a field or a dotted
        path of the sample (e.g. whether it holds a label). An index field is looked up here first,
        then in the sample (`shards.samples.field_value`). Default: none computed."""
        return {}

    def finalize(self, plan: Plan, unit_tables: Sequence[dict]) -> dict:
        """Merge per-unit tables (in unit order) into the manifest's `tables`. Default: none."""
        return {}

    def synth(self, directory: str, seed: int = 0, size: str = "small") -> None:
        """Write synthetic native data for `wdsprep synth <id>`. Default: this source has none."""
        raise ConfigError(f"source {self.id!r} cannot write synthetic data (it defines no Source.synth)")

    def show(self, sample: dict, context: "ShowContext") -> "Shown":
        """Pictures of one raw shard sample for `wdsprep show` (`wdsprep.show.model`): the way the
        source's users look at it, ideally the training sample its reader yields, as `Panel`s, and
        that sample's fields for the report's field table. `context` has the manifest, the split,
        the sample's index and an `rng` for the source's own choices. Default: the function that
        `show_with` names, or, without one, every decoded field by its rank
        (`wdsprep.show.defaults`: 2-D image, 3-D mid-slices, 1-D line plot, dicts as text)."""
        if self.show_with:
            module, _, name = self.show_with.partition(":")
            return getattr(importlib.import_module(module), name)(sample, context)
        from ..show.defaults import default_show

        return default_show(sample, context)

    def commands(self) -> list[Command]:
        """Extra CLI commands (`wdsprep.command.Command`), each named `VERB NAME` (rawnind: `fetch
        rawnind`); the CLI mounts them as `wdsprep VERB NAME ...` (a plugin's as `wdsprep VERB
        package.module:OBJECT ...`) and hands each the conversion driver as `args.driver`
        (`wdsprep.conversion.Conversion`: a source never imports the driver's module). Declaring them
        must stay light (`wdsprep --help` lists them): import what they run when they run. Default: none."""
        return []


def check_plan(plan: Plan, ctx: PlanContext, input: str, selected: Sequence[str] | None = None) -> None:
    """The driver's rules for every source's plan, before anything is written: every planned split
    follows the split-name rule; `selected` (`--split`) keeps those splits' units; a split the input
    holds without a unit is listed in `ctx.problems`; a plan left with no unit is an InputError."""
    planned = {unit.split for unit in plan.units}
    found = planned | set(plan.splits)
    if selected:
        unknown = set(selected) - found
        if unknown:
            raise ConfigError(f"{input}: no split(s) {', '.join(sorted(unknown))} in the input")
        plan.units = [unit for unit in plan.units if unit.split in selected]
        planned &= set(selected)
        found &= set(selected)
    for split in sorted(found, key=str):
        check_split_name(split, plan.splits.get(split) or input)
    for split in sorted(found - planned):
        ctx.report_bad(plan.splits[split], f"split {split!r} has no sample to convert; it is left out of the manifest")
    if not plan.units:
        raise InputError(f"{input}: nothing to convert ({_first_problems(ctx.problems) or 'no sample found'})")


def check_converted(splits: dict[str, list[dict]], plan: Plan, problems: list[dict], input: str) -> dict[str, list[dict]]:
    """The splits of a finished conversion without those whose every item was skipped (each listed
    in `problems`); a conversion that wrote no sample at all is a ConversionError."""
    kept = {split: rows for split, rows in splits.items() if sum(row["samples"] for row in rows)}
    if not kept:
        raise ConversionError(f"{input}: nothing converted, every item was skipped ({_first_problems(problems)}); "
                              "no manifest written")
    for split in sorted(set(splits) - set(kept)):
        where = plan.splits.get(split, split)
        problems.append({"item": where, "message": f"split {split!r}: every item was skipped; it is left out of the manifest"})
    return kept


def _first_problems(problems: list[dict], count: int = 3) -> str:
    shown = [f"{p['item']}: {p['message']}" for p in problems[:count]]
    return "; ".join(shown) + (f"; and {len(problems) - count} more" if len(problems) > count else "")


# Units are planned to fill this fraction of the target by the sources' estimates: a unit whose
# written bytes (tar headers, codec) come out a little above its estimate would otherwise roll over
# into a one-sample tail shard (1 MiB samples, 64 MB shards: 32 of 65 shards held one sample).
PLAN_FILL = 0.9

# At most this many items in one unit, whatever their bytes: 200,000 tiny files below the target size
# were one unit, built by one worker while the rest sat idle. A constant (never --workers: the shards'
# bytes must not depend on it), so a split of n items makes at least ceil(n / MAX_UNIT_ITEMS) units.
MAX_UNIT_ITEMS = 4096

TAR_BLOCK = 512


def tar_member_bytes(size: int) -> int:
    """What a member of `size` data bytes takes in a shard: its header block and its data padded to
    whole blocks (the planning estimate of a small file, whose size alone says little)."""
    return TAR_BLOCK + -(-size // TAR_BLOCK) * TAR_BLOCK


def group_by_size(items: Iterable[Any], sizes: Iterable[int], target_bytes: int,
                  max_items: int = MAX_UNIT_ITEMS, fill: float = PLAN_FILL) -> list[list]:
    """Group consecutive items so each group's size stays near `fill * target_bytes` (at least
    one item per group) and no group holds more than `max_items` items. With items of at most
    (fill - 1/2) x target, only the last group may be under half the target; when it is, it and
    the group before share their items evenly by size if that leaves both at least half. (`fill`
    below 1 leaves room for estimates below what is written; a source whose estimate is already
    what it writes passes 1.)"""
    items, sizes = list(items), list(sizes)
    if len(items) != len(sizes):
        raise ValueError(f"group_by_size: {len(items)} items but {len(sizes)} sizes")
    if max_items < 1:
        raise ValueError(f"group_by_size: max_items must be at least 1 (got {max_items})")
    limit = max(1, int(target_bytes * fill))
    bounds: list[int] = [0]  # group i is items[bounds[i]:bounds[i+1]]
    total = 0
    for i, size in enumerate(sizes):
        if i > bounds[-1] and (total + size > limit or i - bounds[-1] >= max_items):
            bounds.append(i)
            total = 0
        total += size
    bounds.append(len(items))
    if len(bounds) > 2 and total < target_bytes / 2:
        cut = _even_cut(sizes, bounds[-3], len(items), limit)
        parts = sum(sizes[bounds[-3] : cut]), sum(sizes[cut:])
        counts = cut - bounds[-3], len(items) - cut
        if min(parts) >= target_bytes / 2 and max(parts) <= limit and max(counts) <= max_items:
            bounds[-2] = cut  # else two small shards instead of one
    return [items[lo:hi] for lo, hi in zip(bounds, bounds[1:]) if hi > lo]


def _even_cut(sizes: list[int], lo: int, hi: int, limit: int) -> int:
    """The cut in sizes[lo:hi] (keeping an item on each side) that best halves their total while
    the first part stays within `limit`."""
    whole = sum(sizes[lo:hi])
    best, best_gap, prefix = lo + 1, None, 0
    for cut in range(lo + 1, hi):
        prefix += sizes[cut - 1]
        if prefix > limit and cut > lo + 1:
            break
        gap = abs(whole - 2 * prefix)
        if best_gap is None or gap < best_gap:
            best, best_gap = cut, gap
    return best


# -- reading native input files: one line naming the file and the rule broken, whatever goes wrong,
# and never more memory or reading than the file's format allows: a size cap checked before a byte is
# read (and again on what was read), a header's declared size checked against the bytes present
MAX_JSON_BYTES = 16 << 20  # a JSON input (metadata, split lists, listings); its objects take up to ~20x this in memory
MAX_YAML_BYTES = 16 << 20  # a YAML input (an index, a config); the real RawNIND index is 457 kB


def input_size(path: str, limit: int | None = None, what: str = "this input") -> int:
    """The size of the input file at `path`; above `limit` an InputError naming it (refused unread)."""
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        raise InputError(f"{path}: {'dangling symbolic link' if os.path.islink(path) else 'no such file'}") from None
    except OSError as error:
        raise InputError(f"{path}: cannot read ({error.strerror or error})") from None
    check_input_size(path, size, limit, what)
    return size


def check_input_size(where: str, size: int, limit: int | None, what: str = "this input", read: bool = False) -> None:
    """InputError "`where`: N bytes, more than `what` may hold (`limit` bytes)" when `size` > `limit`;
    `read`: `size` is what was read (at most limit + 1: the file grew, or a member lied about its size)."""
    if limit is not None and size > limit:
        amount = f"more than {limit} bytes read" if read else f"{size} bytes"
        raise InputError(f"{where}: {beyond(amount, what, limit)}")


def read_input_bytes(path: str, limit: int | None = None, what: str = "this input") -> bytes:
    """The bytes of an input file; above `limit` (by its size, or by reading at most limit + 1
    bytes) an InputError naming it."""
    input_size(path, limit, what)  # names a dangling link as such; refuses a file above the cap unread
    try:
        with open(path, "rb") as handle:
            data = handle.read() if limit is None else handle.read(limit + 1)
    except OSError as error:
        raise InputError(f"{path}: cannot read ({error.strerror or error})") from None
    check_input_size(path, len(data), limit, what, read=True)
    return data


def read_npy_file(path: str) -> np.ndarray:
    """A `.npy` array file, never unpickled: its header's shape and dtype must account for exactly the
    bytes after it (checked before anything is allocated); empty, non-.npy, truncated or padded
    files are InputErrors."""
    size = input_size(path)
    if not size:
        raise InputError(f"{path}: empty file (0 bytes), expected a .npy array")
    try:
        with open(path, "rb") as handle:
            if handle.read(len(NPY_MAGIC)) != NPY_MAGIC:
                raise InputError(f"{path}: not a .npy file (does not start with the \\x93NUMPY magic)")
            handle.seek(0)
            shape, fortran, dtype = npy_header(handle, path)
            # the header parsed once (numpy's read_array would parse it again: most of a tiny file's cost)
            buffer = bytearray(check_npy_bytes(path, shape, dtype, size - handle.tell()))
            if handle.readinto(buffer) != len(buffer):  # a file that changed under us
                raise InputError(f"{path}: truncated or malformed .npy (shorter than its header declares)")
            return np.frombuffer(buffer, dtype=dtype).reshape(shape, order="F" if fortran else "C")
    except OSError as error:
        raise InputError(f"{path}: cannot read ({error.strerror or error})") from None


def npy_header(stream, where: str) -> tuple[tuple, bool, np.dtype]:
    """(shape, fortran order, dtype) of the .npy header at the stream's position, which it leaves at
    the data; a pickled (object) array or a header numpy cannot parse is an InputError naming `where`."""
    try:
        version = np.lib.format.read_magic(stream)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(stream)  # (3, 0) differs from (2, 0) in the header's encoding only
    except Exception as error:  # numpy's header parser raises ValueError, EOFError, SyntaxError, TokenError...
        raise InputError(f"{where}: truncated or malformed .npy header ({str(error) or type(error).__name__})") from None
    if dtype.hasobject:
        raise InputError(f"{where}: holds pickled (object) data; only plain arrays are read")
    return shape, fortran, dtype


def check_npy_bytes(where: str, shape: tuple, dtype: np.dtype, present: int) -> int:
    """The data bytes a .npy header declares, which must be the `present` bytes after it and no more
    than a shard member may hold (the format's rule, `codec.npy_size_problem`): a header declaring more
    (or less) than the file holds is refused before its array is allocated."""
    problem = npy_size_problem(dtype, shape, present)
    if problem is not None:
        raise InputError(f"{where}: {problem}")
    return present


def read_npz_file(path: str, member_limit: int, what: str = "an array of this file") -> dict[str, np.ndarray]:
    """Every array of an `.npz` file (a zip of `.npy` members), never unpickled and never more than
    its format allows: a member whose declared size is above `member_limit`, or whose header declares
    other than the bytes the member holds, is refused before anything is inflated or allocated (zipfile
    itself never inflates past a member's declared size, and checks its CRC). Any problem is an
    InputError naming the file (and the member)."""
    if not input_size(path):
        raise InputError(f"{path}: not a readable .npz file (empty file, 0 bytes)")
    arrays: dict[str, np.ndarray] = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                where = f"{path}: member {info.filename}"
                if not info.filename.endswith(".npy"):
                    raise InputError(f"{where}: not a .npy array (an .npz holds .npy members only)")
                check_input_size(where, info.file_size, member_limit, what)
                with archive.open(info) as member:
                    shape, fortran, dtype = npy_header(member, where)
                    buffer = bytearray(check_npy_bytes(where, shape, dtype, info.file_size - member.tell()))
                    if member.readinto(buffer) != len(buffer):
                        raise InputError(f"{where}: truncated")
                array = np.frombuffer(buffer, dtype=dtype).reshape(shape, order="F" if fortran else "C")
                arrays[info.filename[: -len(".npy")]] = array
    except InputError:
        raise
    except OSError as error:
        raise InputError(f"{path}: cannot read ({error.strerror or error})") from None
    except Exception as error:  # zipfile and zlib raise BadZipFile, zlib.error, EOFError, NotImplementedError...
        raise InputError(f"{path}: not a readable .npz file ({str(error) or type(error).__name__})") from None
    return arrays


def postorder_shared(root: Any, children_of: Callable[[Any], Sequence]) -> Iterator[tuple[Any, Sequence]]:
    """(node, its children) for every distinct object under `root` (by identity), each once and after
    all of its children, however many references reach it: what a count "as if every shared reference
    were a copy" is memoized on. Iterative (no recursion limit, whatever the nesting); a structure
    that contains itself raises ValueError("a structure that contains itself")."""
    done: set[int] = set()
    on_path: set[int] = set()
    work: list[tuple[Any, Sequence | None]] = [(root, None)]
    while work:
        node, children = work.pop()
        key = id(node)
        if children is not None:  # its children are done
            on_path.discard(key)
            done.add(key)
            yield node, children
            continue
        if key in done:
            continue
        if key in on_path:
            raise ValueError("a structure that contains itself")
        on_path.add(key)
        children = children_of(node)
        work.append((node, children))
        for child in children:
            if id(child) in on_path:
                raise ValueError("a structure that contains itself")
            if id(child) not in done:
                work.append((child, None))


def check_expanded_size(value: Any, where: str, limit: int) -> None:
    """Refuse a parsed document (YAML: its aliases share one object) that holds more than `limit`
    values once every shared part is counted as the copy a reader walking it meets (a "billion laughs"
    of nested aliases: kilobytes of text, 10**9 values), or that contains itself. Counted on the
    object graph, memoized (`postorder_shared`): linear in the distinct objects, so the check itself
    is bounded."""
    def children_of(node: Any) -> Sequence:
        if isinstance(node, dict):
            return list(node.keys()) + list(node.values())
        return list(node) if isinstance(node, (list, tuple, set, frozenset)) else ()

    counts: dict[int, int] = {}
    try:
        for node, children in postorder_shared(value, children_of):
            count = counts[id(node)] = min(1 + sum(counts[id(child)] for child in children), limit + 1)
            if count > limit:
                raise InputError(f"{where}: holds more than {limit} values once its aliases are expanded")
    except ValueError:
        raise InputError(f"{where}: a structure that contains itself (an alias of its own ancestor)") from None


def parse_yaml(data: bytes | str, where: str, error: type[Exception] = InputError) -> Any:
    """The one YAML parser of native inputs: safe tags only (libyaml's parser when installed), a
    mapping key given twice refused (PyYAML keeps the last silently), and no more values than
    `len(data) + 10000` with aliases expanded (`check_expanded_size`). Problems are `error` (InputError,
    or ConfigError for a config) "`where`: not valid YAML (...)"."""
    import yaml

    try:
        value = yaml.load(data, Loader=_strict_yaml_loader())
    except RecursionError:
        raise error(f"{where}: not valid YAML here (nested too deeply)") from None
    except (yaml.YAMLError, ValueError) as problem:  # UnicodeDecodeError is a ValueError
        raise error(f"{where}: not valid YAML ({' '.join(str(problem).split())})") from None
    check_expanded_size(value, where, len(data) + 10_000)
    return value


_STRICT_YAML_LOADER = None


def _strict_yaml_loader():
    """yaml's (C) SafeLoader, refusing a key given twice in one mapping (made once, on first use)."""
    global _STRICT_YAML_LOADER
    if _STRICT_YAML_LOADER is None:
        import yaml

        class StrictSafeLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
            def construct_mapping(self, node, deep=False):
                seen = set()
                for key_node, _ in node.value:
                    key = self.construct_object(key_node, deep=True)
                    if isinstance(key, (str, int, float, bool, type(None))) and key in seen:
                        raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r} in one mapping",
                                                                key_node.start_mark)
                    seen.add(key) if isinstance(key, (str, int, float, bool, type(None))) else None
                return super().construct_mapping(node, deep)

        _STRICT_YAML_LOADER = StrictSafeLoader
    return _STRICT_YAML_LOADER


def parse_json(data: bytes | str, where: str, what: str = "") -> Any:
    """The JSON parser of native inputs: `data` read by the format's one JSON rule (`codec.
    parse_json_text`), a key given twice in one object, NaN or Infinity, a nesting deeper than
    `codec.MAX_DEPTH` or malformed text an InputError naming `where` ("`where`: [`what` is ]not valid
    JSON (duplicate key 'x' in one object)")."""
    prefix = f"{what} is " if what else ""
    try:
        return parse_json_text(data)
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError, duplicate keys, NaN and nesting alike
        raise InputError(f"{where}: {prefix}not valid JSON ({error})") from None


def read_json_file(path: str, limit: int = MAX_JSON_BYTES) -> Any:
    """A JSON file whose value a shard can hold (it is stored as msgpack: integers within 64 bits);
    an empty, oversized (above `limit`), malformed or too deeply nested file, a key given twice, or a
    value msgpack cannot hold, is an InputError."""
    data = read_input_bytes(path, limit, "a JSON input")
    if not data:
        raise InputError(f"{path}: empty file (0 bytes), expected JSON")
    value = parse_json(data, path)
    try:
        encode_msgpack(value)
    except (TypeError, ValueError, OverflowError) as error:
        raise InputError(f"{path}: a value a shard cannot hold ({error}; integers must lie within "
                         "-2**63 .. 2**64-1)") from None
    return value
