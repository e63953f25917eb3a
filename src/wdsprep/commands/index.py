"""`wdsprep index SHARDS... --out OUT [--split NAME]`: adopt existing WebDataset tars where they are
(the scan, the rules and OUT's contents are `wdsprep.adopt`'s; docs/adopting.md)."""
from __future__ import annotations

import argparse

from ..checks import whole_number
from ..command import Command, checked
from ..storage import check_url, describe


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shards", nargs="+", metavar="SHARDS",
                        help=f"tar files, directories, globs or brace patterns (shard-{{000..099}}.tar), as {describe()}")
    parser.add_argument("--out", required=True, help=f"where the manifest and its tables go: {describe(writable=True)}")
    parser.add_argument("--split", default="train", help="the split these shards make (default train)")
    parser.add_argument("--index-fields", default="", metavar="F1,F2",
                        help="per-sample fields to select on, from small json/cls/txt members: cls, txt, json.label, ...")
    parser.add_argument("--workers", type=checked(whole_number, 1), default=4, help="shards read at once (default 4)")


def check(args: argparse.Namespace) -> None:
    check_url(args.out, writable=True)


def run(args: argparse.Namespace) -> int:
    from ..adopt import adopt

    fields = [name.strip() for name in args.index_fields.split(",") if name.strip()]
    report = adopt(args.shards, args.out, split=args.split, index_fields=fields, workers=args.workers,
                   quiet=args.quiet)
    print(report.summary())
    return 0


COMMAND = Command("index", "adopt existing WebDataset tars where they are: a manifest, nothing rewritten",
                  add_arguments, run, usage="SHARDS... --out OUT", resumable=True, check=check)
