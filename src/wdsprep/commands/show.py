"""`wdsprep show DIR_OR_URL`: a dataset's samples drawn as pictures, in one self-contained HTML file.

The drawing is `wdsprep.show` (picking, fetching only the picked samples, the field table, the page);
what the command adds is the gate of who draws. Data never chooses the code that runs: the source
a manifest names draws its samples (`Source.show`) only when it is built in or the user allowed it
(`--plugin`, `wdsprep.register_source`, an installed entry point: `sources.registry.manifest_source`);
any other, and a source that cannot be loaded here, is drawn by the default hook, by rank, and the
page and one warning line say so. An adopted dataset (`wdsprep index`: source `webdataset`) has no
source of its own: the default hook draws it, without a warning. A plugin the user named that fails to load is an error.
`build_report` is the same report for Python callers, gate included.
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

from ..checks import whole_number
from ..command import Command, checked
from ..errors import ConfigError
from ..shards.manifest import ADOPTED_SOURCE
from ..show import report
from ..show.defaults import default_show
from ..sources.registry import ENTRY_POINT_GROUP, manifest_source
from ..storage import describe
from .inspect import add_selection, check_selection, selection_of


def source_hook(source_id: str, plugins: Sequence[str] = ()) -> tuple[Callable, str]:
    """(the drawing hook, a note) for the source a manifest names: its own `Source.show` when it may
    be loaded and loads; else the default hook and one line saying why. A plugin the user named
    (`plugins`) that fails to load is an error, not a note."""
    if source_id == ADOPTED_SOURCE:  # WebDataset tars adopted where they are: drawn by rank, nothing to say
        return default_show, ""
    try:
        return manifest_source(source_id, plugins).show, ""
    except ConfigError as error:
        if source_id in plugins:
            raise
        return default_show, f"{error}; fields drawn by rank"


def build_report(location: str, splits: list[str] | None = None, count: int = 4, seed: int = 0,
                 quiet: bool = False, stream=None, plugins: Sequence[str] = (), selection=None) -> report.Report:
    """Pick, fetch and draw the samples of `location` (a shard directory or manifest URL). The
    manifest's source draws them only when it is built in or allowed (`plugins`: what the user
    named, as `--plugin`); else the default hook does, and `Report.source_note` says why. A
    `selection` (`stream.planning.catalog.Selection`: docs/selecting.md) narrows what is drawn from."""
    return report.build_report(location, lambda source_id: source_hook(source_id, plugins), splits, count, seed,
                               quiet, stream, selection)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("location", help=f"shard directory or manifest.json, as {describe()}")
    parser.add_argument("--split", action="append", dest="splits", help="show only this split (repeatable; default all)")
    parser.add_argument("--samples", type=checked(whole_number, 0), default=4, help="samples drawn per split (default 4)")
    parser.add_argument("--seed", type=int, default=0, help="which samples are drawn: any integer (default 0)")
    parser.add_argument("--out", default="report.html", help="the HTML file to write (default report.html)")
    add_plugin_argument(parser)
    add_selection(parser)


def add_plugin_argument(parser: argparse.ArgumentParser) -> None:
    """`--plugin`: the plugin sources a manifest may name (the gate, `sources.registry.manifest_source`)."""
    parser.add_argument("--plugin", action="append", dest="plugins", default=[], metavar="package.module:OBJECT",
                        help="let the manifest's source be this plugin (repeatable): a manifest alone loads only "
                             f"built-in sources and installed '{ENTRY_POINT_GROUP}' entry points")


def run(args: argparse.Namespace) -> int:
    from ..storage.files import refuse_unless_regular

    refuse_unless_regular(args.out)  # before any work
    drawn = build_report(args.location, args.splits, args.samples, args.seed, quiet=args.quiet, plugins=args.plugins,
                         selection=selection_of(args))
    if drawn.source_note:
        print(f"wdsprep: warning: {drawn.source_note}", file=sys.stderr)
    report.write_report(drawn, args.out)
    print(f"wrote {args.out}: {len(drawn.drawn)} samples of {len(drawn.splits)} split{'s' * (len(drawn.splits) != 1)}")
    for item in drawn.problems:
        print(f"could not draw {item.problem}", file=sys.stderr)
    return 1 if drawn.problems else 0


COMMAND = Command("show", "samples drawn as pictures, one HTML file", add_arguments, run, usage="DIR_OR_URL",
                  check=check_selection)
