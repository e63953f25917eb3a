"""`wdsprep synth SOURCE DIR`: a source's synthetic native data (`Source.synth`), by seed and size; a
source that does not load is a bad argument (exit status 2), judged before anything is written."""
from __future__ import annotations

import argparse

from ..checks import whole_number
from ..command import Command, checked
from ..sources.registry import describe, load_source


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help=describe())
    parser.add_argument("directory")
    parser.add_argument("--seed", type=checked(whole_number, 0), default=0)
    parser.add_argument("--size", default="small", choices=("small", "medium"))


def check(args: argparse.Namespace) -> None:
    args.loaded = load_source(args.source)


def run(args: argparse.Namespace) -> int:
    args.loaded.synth(args.directory, args.seed, args.size)
    print(f"wrote synthetic {args.source} data to {args.directory}")
    return 0


COMMAND = Command("synth", "write synthetic native data", add_arguments, run, usage="SOURCE DIR", check=check)
