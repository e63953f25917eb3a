"""`wdsprep reindex DIR_OR_URL`: give the shards of an older conversion their sample index (the work
and its order of events are `wdsprep.reindex`'s); one `BAD` line per shard left as it was, exit
status 1 when there is one."""
from __future__ import annotations

import argparse
import sys

from ..command import Command
from ..storage import check_url, describe


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("location", help=f"a converted shard directory: {describe(writable=True)}")


def check(args: argparse.Namespace) -> None:
    check_url(args.location, writable=True)


def run(args: argparse.Namespace) -> int:
    from ..reindex import reindex

    report = reindex(args.location, quiet=args.quiet)
    for line in report.bad:
        print(f"BAD {line}", file=sys.stderr)
    print(report.summary())
    return 1 if report.bad else 0


COMMAND = Command("reindex", "give older shards their sample index (fast, checked reads)", add_arguments, run,
                  usage="DIR_OR_URL", resumable=True, check=check)
