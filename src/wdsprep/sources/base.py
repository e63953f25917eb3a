"""The contract between the core and a source package.

A source package `wdsprep.sources.<id>` exposes a module-level object `SOURCE` with the attributes
below. The core (cli, conversion, executors) only talks to a source through this object, so a new
source is a new folder and nothing else changes.

Conversion is planned as independent *units*: a unit is a list of source items that become one shard
(rarely more: a unit whose samples outgrow the target shard size rolls over into a second part).
Units are built in worker processes (or Ray tasks), so `Unit.items` must be picklable and small
(paths and numbers, not arrays), and `build` must depend only on the unit and the options: that is
what makes the bytes independent of `--workers` and of the executor.

A source also declares which native inputs feed each item (`inputs`); the core fingerprints them
with one rule (`wdsprep.inputs`) and rebuilds exactly the units whose inputs changed.
"""
from __future__ import annotations

import argparse
import io
import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Protocol, Sequence

import numpy as np

from ..errors import InputError

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
    problems: list = field(default_factory=list)  # bad items found while planning (skip mode)


class UnitContext:
    """What a unit's build may report besides samples; collected by the driver."""

    def __init__(self, options: dict):
        self.options = options
        self.problems: list[dict] = []
        self.tables: dict[str, list] = {}

    def report_bad(self, item: str, message: str) -> None:
        """Record a bad item that was skipped (only where skipping is safe and asked for)."""
        self.problems.append({"item": item, "message": message})

    def add_table_entry(self, table: str, value: Any) -> None:
        """Append a JSON-serializable value to a per-unit table merged by `Source.finalize`."""
        self.tables.setdefault(table, []).append(value)


Sample = tuple  # (key: str, fields: dict[str, Any])


class Source(Protocol):
    id: str
    # True: a unit always makes exactly one shard, even above the target size (for sources whose
    # reader pairs samples within a shard, e.g. deepreg); `shard_bytes` then only guides planning
    whole_units: bool
    # default input fingerprint mode, "content" or "stat" (see wdsprep.inputs; --fingerprint overrides)
    fingerprint: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add source-specific `wdsprep convert <id>` options (optional)."""

    def plan(self, input: str, options: dict) -> Plan:
        """Scan the native input and split it into units. Raise InputError naming the file."""

    def inputs(self, item: Any) -> list:
        """The native inputs that feed one unit item: file paths, or (zip archive, member) pairs."""

    def build(self, unit: Unit, ctx: UnitContext) -> Iterator[Sample]:
        """Yield (key, fields) samples of one unit, in a deterministic order.

        Field names without an extension are encoded by the core: numpy arrays as `.npy`
        (or `.npy.zst` with the zstd codec), everything else as msgpack `.mp`. A name with an
        explicit extension (`.json`, `.npy`, `.mp`, `.npy.zst`) is encoded as that extension.
        """

    def finalize(self, plan: Plan, unit_tables: Sequence[dict]) -> dict:
        """Merge per-unit tables (in unit order) into the manifest's `tables` (optional)."""

    def synth(self, directory: str, seed: int, size: str) -> None:
        """Write synthetic native data for `wdsprep synth <id>`."""


# Units are planned to fill this fraction of the target by the sources' estimates: a unit whose
# written bytes (tar headers, codec) come out a little above its estimate would otherwise roll over
# into a one-sample tail shard (1 MiB samples, 64 MB shards: 32 of 65 shards held one sample).
PLAN_FILL = 0.9


def group_by_size(items: Iterable[Any], sizes: Iterable[int], target_bytes: int) -> list[list]:
    """Group consecutive items so each group's size stays near `PLAN_FILL * target_bytes` (at least
    one item per group). With items of at most (PLAN_FILL - 1/2) x target, only the last group may
    be under half the target; when it is, it and the group before share their items evenly by size
    if that leaves both at least half."""
    items, sizes = list(items), list(sizes)
    if len(items) != len(sizes):
        raise ValueError(f"group_by_size: {len(items)} items but {len(sizes)} sizes")
    limit = max(1, int(target_bytes * PLAN_FILL))
    bounds: list[int] = [0]  # group i is items[bounds[i]:bounds[i+1]]
    total = 0
    for i, size in enumerate(sizes):
        if i > bounds[-1] and total + size > limit:
            bounds.append(i)
            total = 0
        total += size
    bounds.append(len(items))
    if len(bounds) > 2 and total < target_bytes / 2:
        cut = _even_cut(sizes, bounds[-3], len(items), limit)
        parts = sum(sizes[bounds[-3] : cut]), sum(sizes[cut:])
        if min(parts) >= target_bytes / 2 and max(parts) <= limit:  # else two small shards instead of one
            bounds[-2] = cut
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


# -- reading native input files: one line naming the file and the rule broken, whatever goes wrong
def input_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        raise InputError(f"{path}: {'dangling symbolic link' if os.path.islink(path) else 'no such file'}") from None
    except OSError as error:
        raise InputError(f"{path}: cannot read ({error.strerror or error})") from None


def read_input_bytes(path: str) -> bytes:
    input_size(path)  # names a dangling link as such
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as error:
        raise InputError(f"{path}: cannot read ({error.strerror or error})") from None


def read_npy_file(path: str) -> np.ndarray:
    """A `.npy` array file, never unpickled; empty, non-.npy and truncated files are InputErrors."""
    data = read_input_bytes(path)
    if not data:
        raise InputError(f"{path}: empty file (0 bytes), expected a .npy array")
    if not data.startswith(NPY_MAGIC):
        raise InputError(f"{path}: not a .npy file (does not start with the \\x93NUMPY magic)")
    try:

        return np.load(io.BytesIO(data), allow_pickle=False)
    except ValueError as error:
        if "allow_pickle" in str(error):
            raise InputError(f"{path}: holds pickled (object) data; only plain arrays are read") from None
        raise InputError(f"{path}: truncated or malformed .npy ({error})") from None
    except (EOFError, SyntaxError, OSError) as error:
        raise InputError(f"{path}: truncated or malformed .npy ({error})") from None


def read_json_file(path: str) -> Any:
    data = read_input_bytes(path)
    if not data:
        raise InputError(f"{path}: empty file (0 bytes), expected JSON")
    try:
        return json.loads(data)
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError alike
        raise InputError(f"{path}: not valid JSON ({error})") from None
