"""`wdsprep convert | synth | inspect | verify | show | pipeline | upload | reindex`, and the sources' own commands.

A source's extra commands (`Source.commands()`, e.g. rawnind's `fetch rawnind` and `serve dataverse`)
are mounted as `wdsprep VERB NAME ...`: the core knows no source by name, built-in ids come from
`sources.registry.BUILTIN`, and every command that takes a SOURCE also takes a plugin
`package.module:OBJECT` or an installed `wdsprep.sources` entry point's name (the user named it);
`wdsprep show` draws with the source its manifest names only when that is allowed (`--plugin`).
Nor does it name any executor's flag: each `executors.EXECUTORS` entry declares its own.
`wdsprep convert`'s flags take their defaults from `options.ConvertOptions` and are handed to
`conversion.convert` apart: the core's options, and the source's own.

One convention for what goes wrong: an error is one `wdsprep: error: ...` line, exit status 1 (2 for
a command line that names no command: an unknown command, named with the list of commands); a
warning wdsprep gives while a command runs (a `UserWarning` from the package) is one
`wdsprep: warning: ...` line. `wdsprep --version` prints the installed version, `wdsprep VERB
--help` the whole help of every `VERB NAME` command a source mounts.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import signal
import sys
import tomllib
import warnings
from typing import Sequence

from .errors import ConfigError, WdsprepError
from .executors import EXECUTORS, executor_kind
from .sources.registry import BUILTIN, ENTRY_POINT_GROUP, is_plugin, load_source
from .storage import describe as describe_schemes

SOURCES_HELP = f"{', '.join(BUILTIN)}, an installed '{ENTRY_POINT_GROUP}' entry point, or a plugin package.module:OBJECT"


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quiet", action="store_true", help="no progress display")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")


def _add_convert_options(parser: argparse.ArgumentParser) -> None:
    """The core's `wdsprep convert` flags: defaults from `ConvertOptions`, each executor's own flags
    from its `EXECUTORS` entry."""
    from .options import DEFAULTS, ON_ERROR
    from .shards.codec import ARRAY_CODECS

    parser.add_argument("--split", action="append", dest="splits", help="convert only this split (repeatable)")
    parser.add_argument("--shard-bytes", default=DEFAULTS.shard_bytes,
                        help=f"target shard size, headers included (default {DEFAULTS.shard_bytes})")
    parser.add_argument("--workers", type=int, default=DEFAULTS.workers, help="parallel unit builders (bytes do not depend on it)")
    parser.add_argument("--executor", default=DEFAULTS.executor, choices=tuple(EXECUTORS))
    for entry in EXECUTORS.values():
        executor_kind(entry).add_arguments(parser)
    parser.add_argument("--codec", default=DEFAULTS.codec, choices=tuple(ARRAY_CODECS), help="array member codec")
    parser.add_argument("--zstd-level", type=int, default=DEFAULTS.zstd_level)
    parser.add_argument("--fingerprint", default=DEFAULTS.fingerprint, choices=("content", "stat"),
                        help="how changed inputs are found: content hashes, or size+mtime+ctime+inode (default: the source's)")
    parser.add_argument("--on-error", default=DEFAULTS.on_error, choices=ON_ERROR,
                        help=f"bad input items: stop, or skip and report them in the manifest (default {DEFAULTS.on_error})")


def _convert_parser(source_id: str):
    parser = argparse.ArgumentParser(prog=f"wdsprep convert {source_id}")
    parser.add_argument("input")
    parser.add_argument("output")
    _add_convert_options(parser)
    _add_common(parser)
    load_source(source_id).add_arguments(parser)
    return parser


def convert_options_from(args: argparse.Namespace):
    """Parsed `wdsprep convert` flags taken apart: `(ConvertOptions, the source's own options)`; the
    chosen executor's flags become its `executor_options`, the other executors' flags are dropped."""
    from .options import ConvertOptions

    kind = executor_kind(EXECUTORS[args.executor])
    not_options = {"input", "output", "quiet", "debug"}.union(*(executor_kind(e).flag_names() for e in EXECUTORS.values()))
    core, own = ConvertOptions.split({name: value for name, value in vars(args).items() if name not in not_options})
    return core.replace(executor_options=kind.options_from(args)), own


def cmd_convert(argv: Sequence[str]) -> int:
    from .conversion import convert

    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: wdsprep convert SOURCE INPUT OUTPUT [options]   (SOURCE: {SOURCES_HELP})")
        print("       wdsprep convert SOURCE --help   shows the options of a source")
        return 0 if argv else 2
    source_id, rest = argv[0], argv[1:]
    args = _convert_parser(source_id).parse_args(rest)
    core, own = convert_options_from(args)
    manifest = convert(source_id, args.input, args.output, quiet=args.quiet, options=core, **own)
    _print_summary(manifest)
    return 0


def _print_summary(manifest, shown: int = 10) -> None:
    """Counts per split on stdout; what the input held and the shards do not, as warnings on stderr."""
    from .progress import human_bytes

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


def cmd_synth(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="wdsprep synth")
    parser.add_argument("source", help=SOURCES_HELP)
    parser.add_argument("directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", default="small", choices=("small", "medium"))
    _add_common(parser)
    args = parser.parse_args(argv)
    load_source(args.source).synth(args.directory, args.seed, args.size)
    print(f"wrote synthetic {args.source} data to {args.directory}")
    return 0


def cmd_inspect(argv: Sequence[str]) -> int:
    from .progress import human_bytes
    from .shards.codec import decode_sample
    from .stream import load_manifest
    from .stream.read import checked_samples

    parser = argparse.ArgumentParser(prog="wdsprep inspect")
    parser.add_argument("location", help=f"shard directory or manifest.json, as {describe_schemes()}")
    parser.add_argument("--samples", type=int, default=2, help="how many sample keys to show")
    _add_common(parser)
    args = parser.parse_args(argv)
    manifest = load_manifest(args.location)
    print(f"source {manifest.source}   manifest {manifest.url}")
    print(f"config {json.dumps(manifest.config, sort_keys=True)}")
    for split in sorted(manifest.splits):
        rows = manifest.shards(split)
        print(f"{split:>8}: {len(rows):5d} shards {manifest.samples(split):9d} samples {human_bytes(manifest.bytes(split)):>10}")
    total = manifest.bytes()
    if manifest.input_bytes:
        print(f"input {human_bytes(manifest.input_bytes)}, shards {human_bytes(total)}: compression {manifest.input_bytes / max(total, 1):.2f}x")
    if manifest.tables:
        print("tables: " + ", ".join(f"{name} ({len(value) if hasattr(value, '__len__') else value})" for name, value in sorted(manifest.tables.items())))
    if manifest.problems:
        print(f"problems: {len(manifest.problems)} input items were not converted (listed in the manifest)")
    for split in sorted(manifest.splits):
        urls = manifest.shard_urls(split)
        if not urls:
            continue
        # the samples shown are read as training reads them: checked against the shard's row first,
        # so a corrupt one ends the command with the one line naming the shard, never shown as fine
        for raw in checked_samples(urls[0], manifest.shards(split)[0], 0, max(args.samples, 0)):
            sample = decode_sample(raw, strip=False)
            fields = ", ".join(f"{name}: {_describe(value)}" for name, value in sample.items() if not name.startswith("__"))
            print(f"  {split}/{sample['__key__']}: {fields}")
    return 0


def _describe(value) -> str:
    import numpy as np

    if isinstance(value, np.ndarray):
        return f"{value.dtype}{list(value.shape)}"
    if isinstance(value, dict):
        return "{" + ", ".join(sorted(map(str, value)))[:60] + "}"
    return type(value).__name__


def cmd_verify(argv: Sequence[str]) -> int:
    from .progress import Progress
    from .stream import load_manifest
    from .stream.verify import verify

    parser = argparse.ArgumentParser(prog="wdsprep verify")
    parser.add_argument("location")
    _add_common(parser)
    args = parser.parse_args(argv)
    manifest = load_manifest(args.location)
    shards = sum(len(rows) for rows in manifest.splits.values())
    progress = Progress("verify", shards, manifest.bytes(), quiet=args.quiet)
    report = verify(manifest, progress)
    progress.close()
    for url, problem in report.bad:
        print(f"BAD {problem}", file=sys.stderr)
    print(f"{report.checked} shards, {report.samples} samples checked: {len(report.bad)} bad")
    return 1 if report.bad else 0


def cmd_show(argv: Sequence[str]) -> int:
    from .show.report import add_arguments, main

    parser = argparse.ArgumentParser(prog="wdsprep show", description="draw samples of a dataset into one HTML file")
    add_arguments(parser)
    _add_common(parser)
    return main(parser.parse_args(argv))


def cmd_pipeline(argv: Sequence[str]) -> int:
    from .conversion import convert

    parser = argparse.ArgumentParser(prog="wdsprep pipeline", description="run a pipelines/*.toml spec")
    parser.add_argument("spec")
    parser.add_argument("--input", help="override the spec's native input (e.g. real data)")
    parser.add_argument("--output", help="override the spec's output")
    parser.add_argument("--workers", type=int, default=None)
    _add_common(parser)
    args = parser.parse_args(argv)
    with open(args.spec, "rb") as handle:
        spec = tomllib.load(handle)
    root = os.path.dirname(os.path.dirname(os.path.abspath(args.spec)))
    source_id = spec["source"]
    source = load_source(source_id)
    input_path = args.input or os.path.join(root, spec["input"])
    output = args.output or os.path.join(root, spec["output"])
    synth = spec.get("synth")
    if not args.input and synth is not None and not os.path.exists(input_path):
        print(f"[{source_id}] synthesizing native data in {input_path}")
        source.synth(input_path, int(synth.get("seed", 0)), synth.get("size", "small"))
    if not args.input:
        input_path = source.prepare_input(dict(spec, input=input_path), os.path.join(root, "data"))
    options = dict(spec.get("convert", {}))
    options.update(spec.get("options", {}))
    if args.workers is not None:
        options["workers"] = args.workers
    print(f"[{source_id}] converting {input_path} -> {output}")
    manifest = convert(source_id, input_path, output, quiet=args.quiet, **options)
    _print_summary(manifest)
    return 0


def source_commands(name: str | None = None) -> dict:
    """`(VERB, NAME) -> Command` of the built-in sources (and of the plugin `name` when it is one)."""
    ids = list(BUILTIN) + ([name] if name and is_plugin(name) else [])
    mounted = {}
    for source_id in ids:
        try:
            commands = load_source(source_id).commands()
        except ConfigError:
            if source_id == name:
                raise
            continue  # a built-in source this installation lacks: its commands are absent too
        for (verb, target), command in commands.items():
            mounted[verb, name if source_id == name else target] = command
    return mounted


def _source_command_parser(verb: str, name: str, command) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"wdsprep {verb} {name}", description=command.summary or None)
    command.add_arguments(parser)
    if not any(action.dest == "debug" for action in parser._actions):
        _add_common(parser)
    return parser


def run_source_command(argv: Sequence[str]) -> int:
    """`wdsprep VERB NAME ...` for a command a source declares; `wdsprep VERB --help`: the complete
    help of every `VERB NAME` command."""
    verb, name = argv[0], (argv[1] if len(argv) > 1 else None)
    mounted = source_commands(name if name not in ("-h", "--help") else None)
    if name in ("-h", "--help"):
        print("\n\n".join(_source_command_parser(verb, target, command).format_help().rstrip()
                           for (known, target), command in mounted.items() if known == verb))
        return 0
    command = mounted.get((verb, name))
    if command is None:
        names = sorted(target for known, target in mounted if known == verb)
        print(f"usage: wdsprep {verb} {{{','.join(names)}}} ...   (wdsprep {verb} --help: their options)", file=sys.stderr)
        return 2
    return int(command.main(_source_command_parser(verb, name, command).parse_args(argv[2:])) or 0)


def cmd_upload(argv: Sequence[str]) -> int:
    from .upload import add_arguments, main

    parser = argparse.ArgumentParser(prog="wdsprep upload")
    add_arguments(parser)
    _add_common(parser)
    return int(main(parser.parse_args(argv)) or 0)


def cmd_reindex(argv: Sequence[str]) -> int:
    from .reindex import add_arguments, main

    parser = argparse.ArgumentParser(prog="wdsprep reindex", description="give the shards of an older conversion their sample index")
    add_arguments(parser)
    _add_common(parser)
    return int(main(parser.parse_args(argv)) or 0)


COMMANDS = {
    "convert": cmd_convert,
    "synth": cmd_synth,
    "inspect": cmd_inspect,
    "verify": cmd_verify,
    "show": cmd_show,
    "pipeline": cmd_pipeline,
    "upload": cmd_upload,
    "reindex": cmd_reindex,
}


def usage() -> str:
    """The command list: the core's, then the built-in sources' own commands."""
    mounted = source_commands()
    verbs = list(COMMANDS) + list(dict.fromkeys(verb for verb, _ in mounted))
    rows = [
        ("convert SOURCE INPUT OUTPUT", "native data -> shards + manifest.json"),
        ("synth SOURCE DIR", "write synthetic native data"),
        ("inspect DIR_OR_URL", "splits, counts, sizes, sample fields"),
        ("verify DIR_OR_URL", "sha256, counts, every member decodes"),
        ("show DIR_OR_URL", "samples drawn as pictures, one HTML file"),
        ("pipeline pipelines/X.toml", "synth/fetch + convert as one declared step"),
        ("upload SHARD_DIR URL", f"copy shards to {describe_schemes(writable=True)}; verified, manifest last"),
        ("reindex DIR_OR_URL", "give older shards their sample index (fast, checked reads)"),
    ]
    rows += [(f"{verb} {name} {command.usage}".rstrip(), command.summary) for (verb, name), command in mounted.items()]
    return "usage: wdsprep {" + ",".join(verbs) + "} ...\n" + "\n".join(f"  {words:<29} {text}" for words, text in rows)


def version() -> str:
    """The installed distribution's version (its metadata), else the package's own."""
    try:
        return importlib.metadata.version("wdsprep")
    except importlib.metadata.PackageNotFoundError:
        from . import __version__

        return __version__


def _warning_line(message, category, filename, lineno, file=None, line=None) -> None:
    """wdsprep's own warnings as one `wdsprep: warning: ...` line on stderr; others as Python shows them."""
    if os.path.realpath(str(filename)).startswith(PACKAGE_DIR + os.sep):
        print(f"wdsprep: warning: {message}", file=sys.stderr)
    else:
        _SHOW_WARNING(message, category, filename, lineno, file, line)


PACKAGE_DIR = os.path.dirname(os.path.realpath(__file__))
_SHOW_WARNING = warnings.showwarning


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stderr)
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"wdsprep {version()}")
        return 0
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _warning_line
            if argv[0] in COMMANDS:
                return COMMANDS[argv[0]](argv[1:])
            name = argv[1] if len(argv) > 1 and argv[1] not in ("-h", "--help") else None
            verbs = list(COMMANDS) + list(dict.fromkeys(verb for verb, _ in source_commands(name)))  # a plugin's too
            if argv[0] not in verbs:
                print(f"wdsprep: error: unknown command {argv[0]!r} (commands: {', '.join(verbs)}; "
                      "wdsprep --help describes them)", file=sys.stderr)
                return 2
            return run_source_command(argv)
    except WdsprepError as error:
        if debug:
            raise
        print(f"wdsprep: error: {error}", file=sys.stderr)
        return 1
    except OSError as error:  # an input or output the code did not wrap: still one line, never a traceback
        if debug:
            raise
        where = f"{error.filename}: " if error.filename else ""
        print(f"wdsprep: error: {where}{error.strerror or error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(interrupted(argv), file=sys.stderr)
        return 130


RESUMABLE = ("convert", "pipeline", "upload", "reindex")  # a re-run of these continues where it stopped
INTERRUPTED = "wdsprep: interrupted (re-run the same command to resume)"


def interrupted(argv: Sequence[str]) -> str:
    """The one line for Ctrl-C: only a command whose re-run resumes says to re-run it."""
    return INTERRUPTED if argv and argv[0] in RESUMABLE else "wdsprep: interrupted"


def entry() -> None:
    """The `wdsprep` command (console script and `python -m wdsprep`): `main()`, then exit with its
    status. Once the command has returned, Ctrl-C is ignored while the interpreter exits: Python's
    exit restores the default action of SIGINT, under which a Ctrl-C that comes just after the work
    was done would kill the finished command without a word (status -2), or print a traceback from
    the pool's shutdown. (`main` itself changes no signal handling: tests call it in-process.)"""
    code = None
    try:
        code = main()
    except KeyboardInterrupt:  # came before main's own handling began, or as it returned
        if code is None:
            print(interrupted(sys.argv[1:]), file=sys.stderr)
            code = 130
    finally:
        while True:
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                break
            except KeyboardInterrupt:  # a Ctrl-C that came while the handler was being set: nothing to stop
                continue
    sys.exit(code)


if __name__ == "__main__":
    entry()
