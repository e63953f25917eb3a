"""Source `generic`: a directory of per-sample files, `<split>/<key>.<field>.npy|json`, to shards.

This is the unpacked form of a webdataset (one file per member). It backs the core's tests and
benchmarks and is useful on its own for data that is already arrays on disk. A field given twice
(`x.a.npy` and `x.a.json`) is an error naming both files; with `--on-error skip` a sample with a bad
file is dropped and listed in the manifest's `problems`. Inputs are fingerprinted by content.

Every entry of the input is either converted or reported (`ctx.ignore`, the manifest's `problems`):
each folder of INPUT is a split (its name must follow the split-name rule, `check_plan`), a hidden
entry (`.ipynb_checkpoints/`, `.DS_Store`) and a file beside the split folders are skipped with a
note, and so are, inside a split, files that are not `<key>.<field>.npy|json` (`.png`, `.npz`,
`.NPY`) and nested folders. A JSON file nested deeper than Python can read, naming a key twice in
one object, or holding a value a shard cannot hold (an integer outside 64 bits), is an error naming
the file when it is read; one above `MAX_JSON_BYTES` (16 MiB) is refused unread, while planning. A
`.npy` file whose header declares other than the bytes that follow it is refused before its array
is allocated.
"""
from __future__ import annotations

import os
from typing import Iterator

from ...errors import InputError
from ...shards.index import FRAMING_BOUND, entry_bound
from ...shards.packed import packed_bytes
from ...shards.tarformat import END_OF_ARCHIVE
from ..base import (MAX_JSON_BYTES, Plan, PlanContext, Source, Unit, UnitContext, group_by_size, input_size, read_json_file,
                    read_npy_file, tar_member_bytes)

EXTENSIONS = (".npy", ".json")
LAYOUT = "<key>.<field>.npy|json"


class GenericSource(Source):
    id = "generic"
    fingerprint = "content"  # files are read once more while planning: cheap next to the conversion

    def _samples(self, split_dir: str, report, ctx: PlanContext) -> dict[str, list[str]]:
        samples: dict[str, list[str]] = {}
        bad: set[str] = set()
        for name in sorted(os.listdir(split_dir)):
            path = os.path.join(split_dir, name)
            if name.startswith("."):
                ctx.ignore(path + "/" * os.path.isdir(path), "hidden")
                continue
            if not name.endswith(EXTENSIONS):
                if os.path.isdir(path):
                    ctx.ignore(path + "/", "a folder inside a split: only its own files are read")
                else:
                    ctx.ignore(path, f"not {LAYOUT}")
                continue
            key, _, rest = name.partition(".")
            if not rest or "." not in rest:
                raise InputError(f"{path}: expected {LAYOUT}")
            field = rest.rsplit(".", 1)[0]
            for other in samples.get(key, []):
                if other.partition(".")[2].rsplit(".", 1)[0] == field:
                    report(f"{os.path.join(split_dir, other)} and {os.path.join(split_dir, name)}: field {field!r} "
                           f"of sample {key!r} is given twice (keep one file per field)")
                    bad.add(key)
            samples.setdefault(key, []).append(name)
        return {key: files for key, files in samples.items() if key not in bad}

    def plan(self, input: str, ctx: PlanContext) -> Plan:
        if not os.path.isdir(input):
            raise InputError(f"{input}: not a directory")
        splits = []
        for name in sorted(os.listdir(input)):
            path = os.path.join(input, name)
            if name.startswith("."):
                ctx.ignore(path + "/" * os.path.isdir(path), "hidden")
            elif os.path.isdir(path):
                splits.append(name)  # its name is checked by the driver (check_plan)
            else:
                ctx.ignore(path, "a file beside the split folders")
        if not splits:
            raise InputError(f"{input}: no split directories (expected e.g. {input}/train/)")

        def report(message: str) -> None:  # messages start with the file they name
            ctx.skip_or_raise(message.partition(": ")[0], message)

        units: list[Unit] = []
        total = 0
        for split in splits:
            split_dir = os.path.join(input, split)
            items, estimates = [], []
            for key, files in self._samples(split_dir, report, ctx).items():
                try:
                    file_sizes = [_file_size(os.path.join(split_dir, f)) for f in files]
                except InputError as error:
                    report(str(error))
                    continue
                items.append([split, key, files, sum(file_sizes)])
                estimates.append(_written_bytes(key, file_sizes, ctx.core.pack))
                total += sum(file_sizes)
            # the estimates count what a sample writes (headers, padding, index entry): filled to the
            # target less a shard's own bytes (its index member's framing, the end blocks)
            target = max(1, ctx.core.shard_bytes - FRAMING_BOUND - len(END_OF_ARCHIVE))
            for index, group in enumerate(group_by_size(items, estimates, target, fill=1.0)):
                unit_bytes = sum(item[3] for item in group)
                units.append(Unit(split, index, [[input, *item[:3]] for item in group], unit_bytes))
        return Plan(units, {"layout": f"<split>/{LAYOUT}"}, total,
                    splits={split: os.path.join(input, split) for split in splits})

    def inputs(self, item) -> list[str]:
        root, split, _, files = item
        return [os.path.join(root, split, name) for name in files]

    def build(self, unit: Unit, ctx: UnitContext) -> Iterator[tuple[str, dict]]:
        for root, split, key, files in unit.items:
            try:
                yield key, self._fields(os.path.join(root, split), key, files)
            except InputError as error:
                ctx.skip_or_raise(str(error).partition(": ")[0], error)

    @staticmethod
    def _fields(directory: str, key: str, files: list[str]) -> dict:
        fields = {}
        for name in files:
            field, ext = name[len(key) + 1 :].rsplit(".", 1)
            path = os.path.join(directory, name)
            fields[field] = read_npy_file(path) if ext == "npy" else read_json_file(path)
        return fields

    def synth(self, directory: str, seed: int = 0, size: str = "small", *, samples: int | None = None,
              splits: dict | None = None) -> None:
        from .synth import synth

        synth(directory, seed, size, samples=samples, splits=splits)

def _written_bytes(key: str, file_sizes: list[int], pack: bool = False) -> int:
    """A sample's bytes in a shard, estimated: random arrays hardly compress, so each file as one
    tar member of its size (tiny files are mostly tar headers and padding), and its index entry; or,
    with `--pack`, a small sample's share of a block (`packed_bytes`)."""
    packed = packed_bytes(key, file_sizes) if pack else None
    if packed is not None:
        return packed
    return sum(tar_member_bytes(size) for size in file_sizes) + entry_bound(key, len(file_sizes))


def _file_size(path: str) -> int:
    """An input file's size; a JSON file above MAX_JSON_BYTES is refused here, before the driver
    fingerprints (reads) it."""
    if path.endswith(".json"):
        return input_size(path, MAX_JSON_BYTES, "a JSON input")
    return input_size(path)


SOURCE = GenericSource()
