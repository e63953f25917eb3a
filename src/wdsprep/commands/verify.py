"""`wdsprep verify DIR_OR_URL`: every shard's sha256 and sample count against the manifest, every
member decoded, and each sample table's keys and field values against the shards (`stream.verify`);
one `BAD` line per bad shard or table, exit status 1 when there is one. The field values are derived
as the conversion derived them, with the manifest's source's `index_values`: the source is loaded
through the plugin gate (built in, registered, an installed entry point, or `--plugin`); one that
may not or cannot be loaded leaves the values unchecked, with one warning line saying so."""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

from ..command import Command
from ..errors import ConfigError
from ..storage import check_url, describe
from .show import add_plugin_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("location", help=f"shard directory or manifest.json, as {describe()}")
    add_plugin_argument(parser)


def check(args: argparse.Namespace) -> None:
    check_url(args.location)


def index_values(manifest, plugins: Sequence[str] = ()) -> Callable | None:
    """The manifest's source's `Source.index_values` when a sample table of it lists fields and the
    source may be loaded; None otherwise (said in one warning line when fields go unchecked). A
    plugin the user named that fails to load is an error."""
    from ..shards.samples import table_entry
    from ..sources.registry import manifest_source

    if not any((table_entry(manifest, split) or {}).get("fields") for split in manifest.splits):
        return None
    try:
        return manifest_source(manifest.source, plugins).index_values
    except ConfigError as error:
        if manifest.source in plugins:
            raise
        print(f"wdsprep: warning: {error}; the sample tables' field values are not checked against the shards",
              file=sys.stderr)
        return None


def run(args: argparse.Namespace) -> int:
    from ..progress import Progress
    from ..stream import load_manifest
    from ..stream.verify import verify

    manifest = load_manifest(args.location)
    shards = sum(len(rows) for rows in manifest.splits.values())
    derive = index_values(manifest, args.plugins)
    progress = Progress("verify", shards, manifest.bytes(), quiet=args.quiet)
    report = verify(manifest, progress, derive)
    progress.close()
    for url, problem in report.bad:
        print(f"BAD {problem}", file=sys.stderr)
    print(f"{report.checked} shards, {report.samples} samples checked: {len(report.bad)} bad")
    return 1 if report.bad else 0


COMMAND = Command("verify", "sha256, counts, every member decodes, sample tables against the shards", add_arguments,
                  run, usage="DIR_OR_URL [--plugin package.module:OBJECT]", check=check)
