"""`wdsprep inspect DIR_OR_URL | MIX.toml`: a converted dataset's splits, counts, sizes, tables and a
few samples' fields; or what a mix file makes of its parts in an epoch. Which of the two, the
location's suffix says: `.toml` a mix file, anything else a dataset (its directory, or its manifest
`.json`); a local file with neither suffix is one line saying so.

The samples shown are read as training reads them: checked against their shard's row first, so a
corrupt one ends the command with the one line naming the shard, never shown as fine. With a
selection (`--keys`, `--select`, `--fraction`, `--limit`: docs/selecting.md) each split says how many
samples it keeps, in how many shards, and the samples shown are the first it keeps. A mix file
(docs/mixing.md) is loaded as `wdsprep.mix` loads it, so a bad part is the same one line; its parts
are listed with their samples, share, samples in the epoch, passes and shuffle buffer; then, for a
mix with a schedule (or with `--world-size`), each phase: where it starts and its samples of each
part, in the epoch and per rank at that world size (`wdsprep.mix(..., world_size=N)`'s counts). A
location of a scheme wdsprep does not read, a negative count or a selection that cannot be made (a
fraction outside (0, 1], a limit below 1, an expression that does not parse) is a bad argument, exit
status 2 (`check_selection`, shared with `wdsprep show`); a key file is an input, read when the
command runs.
"""
from __future__ import annotations

import argparse
import json
import os

from ..checks import whole_number
from ..command import Command, checked
from ..errors import ConfigError
from ..storage import check_url, describe


def add_selection(parser: argparse.ArgumentParser) -> None:
    """The flags of a selection (docs/selecting.md), as `wdsprep.dataset` takes them (here and in
    `wdsprep show`); `check_selection` judges them, `selection_of` makes them one `Selection` (or None)."""
    group = parser.add_argument_group("selection (docs/selecting.md)")
    group.add_argument("--keys", metavar="FILE", help="only the samples whose keys the file lists, one per line")
    group.add_argument("--select", metavar="EXPR", help="only the samples an expression over indexed fields keeps, "
                                                        "e.g. 'label == 3 and iso >= 800'")
    group.add_argument("--fraction", type=float, help="exactly round(F * n) of the samples kept so far, chosen by --seed")
    group.add_argument("--limit", type=int, help="the first N samples kept, in manifest order")


def check_selection(args: argparse.Namespace) -> None:
    """The location's scheme and `add_selection`'s flags judged before any work (a fraction, a limit,
    an expression); a key file is read when the command runs (`selection_of`), as any input is."""
    from ..stream.planning.catalog import Selection

    check_url(args.location)
    Selection.of(select=args.select, fraction=args.fraction, limit=args.limit, seed=getattr(args, "seed", 0))


def selection_of(args: argparse.Namespace):
    """The `Selection` of `add_selection`'s flags (the fraction chosen by `args.seed`), or None."""
    from ..stream.planning.catalog import Selection

    return Selection.of(keys=args.keys, select=args.select, fraction=args.fraction, limit=args.limit,
                        seed=getattr(args, "seed", 0))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("location", help=f"shard directory or manifest.json, as {describe()}; or a mix file (.toml)")
    parser.add_argument("--samples", type=checked(whole_number, 0), default=2, help="how many samples to show per split")
    parser.add_argument("--split", action="append", dest="splits", help="only this split (repeatable; default all)")
    parser.add_argument("--epoch", type=checked(whole_number, 0), default=0,
                        help="the epoch a mix file is shown for (default 0)")
    parser.add_argument("--world-size", type=checked(whole_number, 1), default=None, metavar="N",
                        help="a mix file's counts per rank at N ranks, in each phase (default 1)")
    parser.add_argument("--seed", type=checked(whole_number, 0), default=0,
                        help="the seed of --fraction, as wdsprep.dataset's (default 0)")
    add_selection(parser)


def check(args: argparse.Namespace) -> None:
    try:
        mix = _is_mix_file(args.location)
    except ConfigError:  # a file that is neither: said when the command runs, as an input it cannot read (exit 1)
        mix = False
    if not mix:
        return check_selection(args)
    if any(value is not None for value in (args.keys, args.select, args.fraction, args.limit)) or args.splits:
        raise ConfigError(f"{args.location}: a mix file's parts carry their own split and selection "
                          "(--split, --keys, --select, --fraction and --limit are for a dataset)")


def run(args: argparse.Namespace) -> int:
    if _is_mix_file(args.location):
        return _inspect_mix(args)
    from ..progress import human_bytes
    from ..stream import load_manifest
    from ..stream.planning.catalog import Catalog

    selection = selection_of(args)
    manifest = load_manifest(args.location)
    chosen = list(dict.fromkeys(args.splits)) if args.splits else sorted(manifest.splits)
    catalogs = {split: Catalog(manifest, split, selection) for split in chosen}  # a bad split or selection: one line
    print(f"source {manifest.source}   manifest {manifest.url}")
    print(f"config {json.dumps(manifest.config, sort_keys=True)}")
    for split in chosen:
        rows = manifest.shards(split)
        print(f"{split:>8}: {len(rows):5d} shards {manifest.samples(split):9d} samples {human_bytes(manifest.bytes(split)):>10}")
    total = manifest.bytes()
    if manifest.input_bytes:
        print(f"input {human_bytes(manifest.input_bytes)}, shards {human_bytes(total)}: compression {manifest.input_bytes / max(total, 1):.2f}x")
    if manifest.tables:
        print("tables: " + ", ".join(f"{name} ({len(value) if hasattr(value, '__len__') else value})" for name, value in sorted(manifest.tables.items())))
    if manifest.problems:
        print(f"problems: {len(manifest.problems)} input items were not converted (listed in the manifest)")
    for split, catalog in catalogs.items():
        if selection is not None:
            print(f"{split:>8}: {catalog.selection.describe()} keeps {catalog.total} of {manifest.samples(split)} samples, "
                  f"in {int((catalog.counts > 0).sum())} of {len(catalog.rows)} shards")
        _show_samples(manifest, split, catalog.positions()[: args.samples].tolist())
    return 0


def _is_mix_file(location: str) -> bool:
    """What `location` names, by its suffix: a mix file (`.toml`, unless a directory of that name),
    or a dataset (a directory or prefix, or its manifest `.json`, any scheme). A local file with
    neither suffix is neither: one line saying what inspect reads, not a manifest error about
    `<file>/manifest.json`."""
    from ..storage import local_path

    path = local_path(location)
    if location.endswith(".toml") and not (path is not None and os.path.isdir(path)):
        return True
    if path is not None and not location.endswith(".json") and os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{location}: neither a dataset nor a mix file: inspect reads a dataset's directory or its "
                          "manifest (.json), or a mix file (.toml)")
    return False


def _show_samples(manifest, split: str, numbers: list[int]) -> None:
    from ..shards.codec import decode_sample
    from ..show.report import fetch

    for _, _, raw in fetch(manifest, split, numbers):
        sample = decode_sample(raw, strip=False)
        fields = ", ".join(f"{name}: {_describe(value)}" for name, value in sample.items() if not name.startswith("__"))
        print(f"  {split}/{sample['__key__']}: {fields}")


def _inspect_mix(args: argparse.Namespace) -> int:
    from ..mixfile import mix

    world = args.world_size or 1
    mixed = mix(args.location, epoch=args.epoch, rank=0, world_size=world)
    counts, buffers = mixed.epoch_counts(args.epoch), mixed.part_buffers(args.epoch)
    size = f", samples_per_epoch {mixed.samples_per_epoch}" if mixed.samples_per_epoch is not None else ""
    phases = mixed.schedule.phases
    scheduled = f", a schedule of {phases} phases" if mixed.schedule.phased else ""
    print(f"mix {args.location}: mode {mixed.mode}, stop {mixed.stop}{size}, seed {mixed.seed}, "
          f"shuffle_buffer {mixed.shuffle_buffer}{scheduled}")
    share = "weight" if mixed.mode == "weighted" else "repeat"
    print(f"epoch {args.epoch}: {sum(counts)} samples")
    print(f"  {'part':<12} {'split':<8} {'samples':>9} {share:>8} {'in epoch':>9} {'passes':>7} {'buffer':>7}  location")
    for part, count, *buffer in zip(mixed.parts, counts, *buffers):
        catalog = part.catalog
        selected = f" ({catalog.selection.describe()})" if catalog.selection is not None else ""
        weight = "phases" if part.share is None else f"{float(part.share):g}"
        held = f"{min(buffer)}-{max(buffer)}" if min(buffer) != max(buffer) else str(buffer[0])
        print(f"  {part.name:<12} {catalog.split:<8} {part.size:9d} {weight:>8} {count:9d} "
              f"{count / part.size:7.2f} {held:>7}  {catalog.manifest.url}{selected}")
    if mixed.schedule.phased or args.world_size is not None:
        _show_phases(mixed, args.epoch, world)
    return 0


def _show_phases(mixed, epoch: int, world: int) -> None:
    """Each phase of the epoch: where it starts (as written, then as a sample position) and its
    samples of each part in the epoch and per rank (a range where ranks differ: equalize=None)."""
    schedule = mixed.schedule
    bounds = schedule.bounds(sum(mixed.epoch_counts(epoch)))
    per_rank = [mixed.rank_counts(epoch, 1, rank=rank) for rank in range(world)]
    print(f"phases: samples of each part in the epoch (and per rank, {world} rank{'s' * (world > 1)}, "
          f"equalize {mixed.equalize})")
    names = [part.name for part in mixed.parts]
    print(f"  {'phase':>5} {'from':>14} {'samples':>9}  " + "  ".join(f"{name:>14}" for name in names))
    for k, (counts, (start, _)) in enumerate(zip(mixed.phase_counts(epoch), schedule.given)):
        cells = []
        for p, count in enumerate(counts):
            ranks = [counts_of_rank[k][p] for counts_of_rank in per_rank]
            cells.append(f"{count} ({min(ranks)}{'' if min(ranks) == max(ranks) else f'-{max(ranks)}'})")
        start_words = f"{start}" if str(start) == str(bounds[k]) else f"{start} ({bounds[k]})"
        print(f"  {k:>5} {start_words:>14} {bounds[k + 1] - bounds[k]:>9}  " + "  ".join(f"{cell:>14}" for cell in cells))


def _describe(value) -> str:
    import numpy as np

    if isinstance(value, np.ndarray):
        return f"{value.dtype}{list(value.shape)}"
    if isinstance(value, dict):
        return "{" + ", ".join(sorted(map(str, value)))[:60] + "}"
    return type(value).__name__


COMMAND = Command("inspect", "splits, counts, sizes, sample fields; a selection's; a mix file's parts",
                  add_arguments, run, usage="DIR_OR_URL | MIX.toml", check=check)
