"""`wdsprep fetch rawnind DEST ...`: the command rawnind mounts (`RawNINDSource.commands()`), one
`wdsprep.command.Command`, `COMMAND`.

Declaring the command imports neither httpx nor trio (`wdsprep --help` declares it): the fetcher,
which needs both, is imported when the command runs. With `--convert` the fetch converts scene by
scene with the conversion driver the command line hands every mounted command (`args.driver`).

Exit status, as every command's: 0 every file verified or present, 1 some files failed (listed, and
in the report) or the run could not start (one `wdsprep: error:` line: bad index, unreachable
server, unwritable destination), 2 a bad argument.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from ....checks import number, size, whole_number
from ....command import Command, checked
from ...base import DEFAULT_ON_ERROR, ON_ERROR
from ..index import DEFAULT_DOI

if TYPE_CHECKING:
    from .fetch import FetchOptions

__all__ = ["COMMAND", "add_fetch_arguments", "run_fetch"]


FETCH_EXIT_STATUS = ("exit status: 0 every file verified or present, 1 some files failed (see the report) or the run "
                     "could not start (bad index, unreachable server, unwritable destination), 2 a bad argument")


def add_fetch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = FETCH_EXIT_STATUS  # `wdsprep fetch --help` and `fetch rawnind --help` are the whole story
    parser.add_argument("dest", help="destination directory (<CFA>/<scene>/[gt/]<file> below it)")
    parser.add_argument("--index", default=None, metavar="PATH_OR_URL",
                        help="the index YAML (default: dataset.yaml from the Dataverse listing)")
    parser.add_argument("--dataverse", default=None, metavar="BASE_URL",
                        help="Dataverse server, e.g. https://dataverse.uclouvain.be or http://127.0.0.1:8080")
    parser.add_argument("--doi", default=DEFAULT_DOI, help=f"dataset persistent id (default {DEFAULT_DOI})")
    parser.add_argument("--listing", default=None, metavar="PATH_OR_URL",
                        help="the Dataverse dataset JSON (default: fetched from --dataverse)")
    parser.add_argument("--concurrency", type=checked(whole_number, 1), default=5, help="downloads at once (default 5)")
    parser.add_argument("--max-scenes", type=checked(whole_number, 1), default=None, metavar="N",
                        help="only the first N scenes")
    parser.add_argument("--cfa", choices=["Bayer", "X-Trans"], default=None, help="only this sensor type")
    parser.add_argument("--scenes", nargs="+", default=None, metavar="SCENE", help="only these scenes")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, download nothing")
    parser.add_argument("--no-metadata", dest="metadata", action="store_false",
                        help="skip alignment/gain/mask computation")
    parser.add_argument("--metadata-workers", type=checked(whole_number, 1), default=4,
                        help="CPU workers for metadata (default 4)")
    parser.add_argument("--attempts", type=checked(whole_number, 1), default=3, help="download attempts per file (default 3)")
    parser.add_argument("--backoff", type=checked(number, 0), default=1.0,
                        help="first retry delay in seconds, doubling (default 1)")
    parser.add_argument("--timeout", type=checked(number, 0, above=True), default=60.0,
                        help="network timeout in seconds (default 60)")
    parser.add_argument("--progress", choices=["auto", "bar", "log", "none"], default="auto",
                        help="live display on a terminal, log lines otherwise (default auto)")
    parser.add_argument("--log-interval", type=checked(number, 0, above=True), default=10.0,
                        help="seconds between log lines (default 10)")
    parser.add_argument("--report", default=None, metavar="PATH", help="JSON report (default DEST/fetch_report.json)")
    parser.add_argument("--rehash", action="store_true", help="re-verify the SHA-1 of files already present")
    parser.add_argument("--json", action="store_true", help="with --dry-run: also print the plan as one JSON line")
    convert = parser.add_argument_group("fetch straight into shards")
    convert.add_argument("--convert", default=None, metavar="OUTPUT",
                         help="convert each scene as soon as it is verified into shards at OUTPUT (a directory or "
                              "s3://bucket/prefix), then remove its raw files")
    convert.add_argument("--keep-raw", action="store_true", help="with --convert: keep the raw files")
    convert.add_argument("--max-raw-bytes", type=checked(size, 1), default=None, metavar="SIZE",
                         help="with --convert: raw bytes of scenes in flight on local disk, e.g. 2GB "
                              "(at least one scene; default: no bound)")
    convert.add_argument("--tile-size", type=int, default=1024, help="with --convert: tile edge (default 1024)")
    convert.add_argument("--layout", choices=["mosaic", "legacy"], default="mosaic", help="with --convert: shard layout")
    convert.add_argument("--shard-bytes", type=checked(size, 1), default="256MB",
                         help="with --convert: target shard size (default 256MB)")
    convert.add_argument("--on-error", choices=ON_ERROR, default=DEFAULT_ON_ERROR,
                         help="with --convert: skip (and report) an unreadable scene instead of failing it")


def options_from_args(args: argparse.Namespace) -> FetchOptions:
    from .fetch import FetchOptions

    return FetchOptions(
        dest=args.dest, dataverse=args.dataverse, doi=args.doi, index=args.index, listing=args.listing,
        concurrency=args.concurrency, max_scenes=args.max_scenes, cfa=args.cfa, scenes=args.scenes,
        dry_run=args.dry_run, metadata=args.metadata, metadata_workers=args.metadata_workers,
        attempts=args.attempts, backoff=args.backoff, timeout=args.timeout, progress=args.progress,
        log_interval=args.log_interval, report=args.report, rehash=args.rehash,
        convert=args.convert, keep_raw=args.keep_raw, driver=getattr(args, "driver", None),
        max_raw_bytes=args.max_raw_bytes,
        convert_options={"tile_size": args.tile_size, "layout": args.layout, "shard_bytes": args.shard_bytes,
                         "on_error": args.on_error},
    )


def format_plan(plan: dict) -> str:
    lines = [
        f"scenes: {plan['scenes']} ({', '.join(f'{cfa} {count}' for cfa, count in plan['scenes_by_cfa'].items())}; "
        f"test_reserve {plan['test_reserve_scenes']})",
        f"index entries: {plan['index_entries']} (clean {plan['clean']}, noisy {plan['noisy']}, sidecars {plan['sidecars']})",
        f"files to fetch: {plan['files']} ({plan['bytes']} bytes, {plan['bytes'] / 1e9:.1f} GB); "
        f"already present: {plan.get('already_present', 0)}",
        f"index entries with no Dataverse id: {len(plan['unmatched'])}",
    ]
    lines += [f"  {name}" for name in plan["unmatched"]]
    if "listing_files" in plan:
        lines.append(f"Dataverse files: {plan['listing_files']} ({plan['listing_bytes']} bytes); "
                     f"not in the selected index entries: {len(plan['listing_not_in_index'])}")
    return "\n".join(lines)


def run_fetch(args: argparse.Namespace) -> int:
    from .fetch import fetch

    report = fetch(options_from_args(args))
    if report.get("dry_run"):
        print(format_plan(report))
        if getattr(args, "json", False):
            print(json.dumps(report))
        return 0
    failed = report["failed"]
    print(f"verified {len(report['verified'])}, skipped {len(report['skipped'])}, failed {len(failed)}, "
          f"scenes complete {report['scenes']['complete']}/{report['scenes']['total']}")
    for entry in failed:
        print(f"  failed: {entry['file']}: {entry['reason']}", file=sys.stderr)
    converted = report.get("convert")
    if converted is not None:
        print(f"converted {converted['scenes_converted']} scenes now, {len(converted['scenes_converted_before'])} before; "
              f"raw bytes on disk peaked at {converted['raw_bytes_peak']}; manifest: {converted['manifest'] or 'not written'}")
        for entry in converted["problems"]:
            print(f"  not converted: {entry['scene']}: {entry['reason']}", file=sys.stderr)
        if converted["manifest"] is None:
            return 1
    return 1 if failed else 0


COMMAND = Command("fetch rawnind", "download RawNIND from a Dataverse server", add_fetch_arguments, run_fetch,
                  usage="DEST ...", resumable=True)
