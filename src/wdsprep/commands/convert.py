"""`wdsprep convert SOURCE INPUT OUTPUT [options]`: native data -> shards + manifest.json.

`wdsprep convert SOURCE --help` shows a source's options: the core's flags take their defaults from
`options.ConvertOptions`, each executor of `executors.EXECUTORS` declares its own, and the source
adds its own (`Source.add_arguments`). They are handed to `conversion.convert` apart: the core's
options and the source's own (`convert_options_from`). All of it is judged before any work
(`check`: `conversion.CheckedConversion.of`), so a source that does not load, an option value out of its
rule or an output inside the input is a bad argument, exit status 2. `print_summary` is what a conversion prints
(counts per split; what the input held and the shards do not, as warning lines), here and in
`wdsprep pipeline`.
"""
from __future__ import annotations

import argparse
import sys

from ..command import Command, CommandParser, add_common
from ..executors import EXECUTORS, executor_kind
from ..sources.registry import describe, load_source


def add_convert_options(parser: argparse.ArgumentParser) -> None:
    """The core's `wdsprep convert` flags: defaults from `ConvertOptions`, each executor's own flags
    from its `EXECUTORS` entry."""
    from ..options import DEFAULTS, ON_ERROR
    from ..shards.codec import ARRAY_CODECS

    parser.add_argument("--split", action="append", dest="splits", help="convert only this split (repeatable)")
    parser.add_argument("--shard-bytes", default=DEFAULTS.shard_bytes,
                        help=f"target shard size, headers included (default {DEFAULTS.shard_bytes})")
    parser.add_argument("--workers", type=int, default=DEFAULTS.workers, help="parallel unit builders (bytes do not depend on it)")
    parser.add_argument("--executor", default=DEFAULTS.executor, choices=tuple(EXECUTORS))
    for entry in EXECUTORS.values():
        executor_kind(entry).add_arguments(parser)
    parser.add_argument("--pack", action="store_true", default=DEFAULTS.pack,
                        help="store runs of small samples (up to 16 KiB) as one member each: a few bytes per "
                             "sample instead of a tar header and padding (docs/format.md#packed-members)")
    parser.add_argument("--codec", default=DEFAULTS.codec, choices=tuple(ARRAY_CODECS), help="array member codec")
    parser.add_argument("--zstd-level", type=int, default=DEFAULTS.zstd_level)
    parser.add_argument("--fingerprint", default=DEFAULTS.fingerprint, choices=("content", "stat"),
                        help="how changed inputs are found: content hashes, or size+mtime+ctime+inode (default: the source's)")
    parser.add_argument("--index-fields", default=None, metavar="A,B",
                        help="fields recorded per sample in the split's sample table, for selections "
                             "(docs/selecting.md); '' for keys only (default: the source's)")
    parser.add_argument("--on-error", default=DEFAULTS.on_error, choices=ON_ERROR,
                        help=f"bad input items: stop, or skip and report them in the manifest (default {DEFAULTS.on_error})")


def source_parser(source_id: str) -> CommandParser:
    """The parser of `wdsprep convert SOURCE ...`: input, output, the core's flags, the source's own."""
    parser = CommandParser(prog=f"wdsprep convert {source_id}")
    parser.add_argument("input")
    parser.add_argument("output")
    add_convert_options(parser)
    add_common(parser)
    load_source(source_id).add_arguments(parser)
    return parser


def convert_options_from(args: argparse.Namespace):
    """Parsed `wdsprep convert` flags taken apart: `(ConvertOptions, the source's own options)`; the
    chosen executor's flags become its `executor_options`, the other executors' flags are dropped."""
    from ..options import ConvertOptions

    kind = executor_kind(EXECUTORS[args.executor])
    not_options = {"input", "output", "quiet", "debug"}.union(*(executor_kind(e).flag_names() for e in EXECUTORS.values()))
    core, own = ConvertOptions.split({name: value for name, value in vars(args).items() if name not in not_options})
    return core.replace(executor_options=kind.options_from(args)), own


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = "wdsprep convert SOURCE --help shows the options of a source"
    parser.add_argument("source", help=describe())
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="INPUT OUTPUT and the options of the source")


def check(args: argparse.Namespace) -> None:
    """The source's own command line parsed (`args.parsed`) and every option checked before any work
    (`args.conversion`, a `conversion.CheckedConversion`)."""
    from ..conversion import CheckedConversion

    args.parsed = source_parser(args.source).parse_args(args.arguments)
    core, own = convert_options_from(args.parsed)
    args.conversion = CheckedConversion.of(args.source, args.parsed.input, args.parsed.output, core, **own)


def run(args: argparse.Namespace) -> int:
    print_summary(args.conversion.convert(quiet=args.parsed.quiet))
    return 0


def print_summary(manifest, shown: int = 10) -> None:
    """Counts per split on stdout; what the input held and the shards do not, as warnings on stderr."""
    from ..progress import human_bytes

    total = manifest.bytes()
    for split in sorted(manifest.splits):
        print(f"{split}: {len(manifest.shards(split))} shards, {manifest.samples(split)} samples, {human_bytes(manifest.bytes(split))}")
    if manifest.input_bytes:
        print(f"input {human_bytes(manifest.input_bytes)} -> shards {human_bytes(total)} (ratio {manifest.input_bytes / max(total, 1):.2f}x)")
    lines = []
    for problem in manifest.problems:
        item, message = str(problem.get("item")), str(problem.get("message"))
        lines.append(message if message.startswith(item) else f"{item}: {message}")
    if len(lines) == 1:
        print(f"wdsprep: warning: {lines[0]}", file=sys.stderr)
    elif lines:
        print(f"wdsprep: warning: {len(lines)} input items not converted (listed in the manifest's 'problems'):", file=sys.stderr)
        for line in lines[:shown]:
            print(f"  {line}", file=sys.stderr)
        if len(lines) > shown:
            print(f"  ... and {len(lines) - shown} more", file=sys.stderr)


COMMAND = Command("convert", "native data -> shards + manifest.json", add_arguments, run,
                  usage="SOURCE INPUT OUTPUT", resumable=True, check=check)
