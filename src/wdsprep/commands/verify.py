"""`wdsprep verify DIR_OR_URL`: every shard's sha256 and sample count against the manifest, and every
member decoded (`stream.verify`); one `BAD` line per bad shard, exit status 1 when there is one."""
from __future__ import annotations

import argparse
import sys

from ..command import Command
from ..storage import check_url, describe


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("location", help=f"shard directory or manifest.json, as {describe()}")


def check(args: argparse.Namespace) -> None:
    check_url(args.location)


def run(args: argparse.Namespace) -> int:
    from ..progress import Progress
    from ..stream import load_manifest
    from ..stream.verify import verify

    manifest = load_manifest(args.location)
    shards = sum(len(rows) for rows in manifest.splits.values())
    progress = Progress("verify", shards, manifest.bytes(), quiet=args.quiet)
    report = verify(manifest, progress)
    progress.close()
    for url, problem in report.bad:
        print(f"BAD {problem}", file=sys.stderr)
    print(f"{report.checked} shards, {report.samples} samples checked: {len(report.bad)} bad")
    return 1 if report.bad else 0


COMMAND = Command("verify", "sha256, counts, every member decodes", add_arguments, run, usage="DIR_OR_URL", check=check)
