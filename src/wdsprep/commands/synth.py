"""`wdsprep synth SOURCE DIR`: a source's synthetic native data (`Source.synth`), by seed and size."""
from __future__ import annotations

import argparse

from ..command import Command
from ..sources.registry import describe, load_source


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help=describe())
    parser.add_argument("directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", default="small", choices=("small", "medium"))


def run(args: argparse.Namespace) -> int:
    load_source(args.source).synth(args.directory, args.seed, args.size)
    print(f"wrote synthetic {args.source} data to {args.directory}")
    return 0


COMMAND = Command("synth", "write synthetic native data", add_arguments, run, usage="SOURCE DIR")
