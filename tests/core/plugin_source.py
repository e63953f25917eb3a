"""A source defined outside wdsprep (`plugin_source:SOURCE`), for test_plugin_source.py.

Native data: one text file per split, `<split>.txt`, one sample a line: `KEY V1 V2 ...` (integers).
A sample becomes `values` (int64, times `--scale`) and `meta` ({"line": its line number}). A line
with a value that is not an integer, or longer than MAX_LINE_BYTES, is a bad item (`FILE:LINE`); a
split file above MAX_FILE_BYTES is refused unread (what a plugin does to stay bounded on hostile input). It declares one command of its
own, `wdsprep count plugin_source:SOURCE DIR`, and relies on the base class for every other hook.
"""
from __future__ import annotations

import argparse
import os

import numpy as np

from wdsprep.command import Command
from wdsprep.sources.base import Plan, PlanContext, Source, Unit, UnitContext, group_by_size, read_input_bytes

LINE_BYTES = 64  # the planning estimate of one sample's shard bytes
MAX_FILE_BYTES = 256 << 20  # a split file
MAX_LINE_BYTES = 64 << 10  # a sample: a line is split into its values (~60 bytes of Python objects each) only below this


def _lines(path: str) -> list[str]:
    return read_input_bytes(path, MAX_FILE_BYTES, "a split file").decode().splitlines()


def _is_integer(text: str) -> bool:
    return text.removeprefix("-").isdigit()


class LinesSource(Source):
    id = "lines"
    fingerprint = "content"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--scale", type=int, default=1, help="multiply every value by this")

    def plan(self, input: str, ctx: PlanContext) -> Plan:
        units, total = [], 0
        splits = {}
        for name in sorted(os.listdir(input)):
            path = os.path.join(input, name)
            if not name.endswith(".txt"):
                ctx.ignore(path + "/" * os.path.isdir(path), "not a <split>.txt file")  # reported, not dropped
                continue
            splits[name.removesuffix(".txt")] = path
            items = []
            for number, line in enumerate(_lines(path), 1):
                if len(line) > MAX_LINE_BYTES:
                    ctx.skip_or_raise(f"{path}:{number}", f"a line longer than {MAX_LINE_BYTES} bytes")
                    continue
                key, *values = line.split()
                if not all(map(_is_integer, values)):
                    ctx.skip_or_raise(f"{path}:{number}", "values must be integers")
                    continue
                items.append([path, number, key])
            for index, group in enumerate(group_by_size(items, [LINE_BYTES] * len(items), ctx.core.shard_bytes)):
                units.append(Unit(name.removesuffix(".txt"), index, group, LINE_BYTES * len(group)))
                total += LINE_BYTES * len(group)
        return Plan(units, {"scale": ctx.options.get("scale", 1)}, total, splits=splits)

    def inputs(self, item: list) -> list[str]:
        return [item[0]]

    def build(self, unit: Unit, ctx: UnitContext):
        scale = ctx.options.get("scale", 1)
        for path, number, key in unit.items:
            values = _lines(path)[number - 1].split()[1:]
            yield key, {"values": np.array([int(v) * scale for v in values], dtype=np.int64), "meta": {"line": number}}

    def synth(self, directory: str, seed: int = 0, size: str = "small") -> None:
        rng = np.random.default_rng(seed)
        os.makedirs(directory, exist_ok=True)
        for split, count in (("train", 40), ("valid", 7)):
            with open(os.path.join(directory, f"{split}.txt"), "w") as handle:
                for i in range(count):
                    values = rng.integers(-100, 100, size=int(rng.integers(1, 9)))
                    handle.write(f"{split}{i:04d} " + " ".join(map(str, values)) + "\n")

    def commands(self) -> list[Command]:
        return [Command("count lines", "lines per split", _add_count_arguments, _count_main, usage="DIR")]


def _add_count_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory")


def _count_main(args: argparse.Namespace) -> int:
    for name in sorted(os.listdir(args.directory)):
        print(f"{name.removesuffix('.txt')} {len(_lines(os.path.join(args.directory, name)))}")
    return 0


SOURCE = LinesSource()
