"""The command line: the table of every command, the dispatcher, and the one convention for what
goes wrong.

The table is the core's commands (`wdsprep.commands`, one module per verb, in `COMMANDS`' order)
and the commands sources mount (`Source.commands()`, e.g. rawnind's `fetch rawnind`), each one
`wdsprep.command.Command`; `wdsprep --help` is built from it (`usage`), and so is the list an
unknown command is answered with. The core knows no source by name: built-in ids come from
`sources.registry.BUILTIN`, and a command that takes a SOURCE also takes a plugin
`package.module:OBJECT` or an installed `wdsprep.sources` entry point's name (the user named it,
and so does `wdsprep VERB package.module:OBJECT ...` for a plugin's own commands). A command a
source mounts is handed the conversion driver as `args.driver` (`wdsprep.conversion.Conversion`;
a source never imports the driver's module).

`wdsprep NAME ...` runs the command called by its first word, or by its first two (`VERB NAME`);
`wdsprep VERB --help` is the whole help of every `VERB NAME` command.

One convention for what goes wrong, every command alike: an error is one `wdsprep: error: ...` line
on stderr; exit status 1 for an error while a command runs (a `WdsprepError`, an `OSError` the code
did not wrap: raised by the command, printed only here) and 2 for a command line wdsprep cannot take,
judged before any work: no command, an unknown one (named with the list of commands; a second word
that is no plugin name, a URL say, is never loaded as one), a plugin named after a verb that does
not load, or a bad argument of a command (what argparse finds, `command.CommandParser`, and what the
command's `check` refuses: an unknown source, a size or number out of its rule, a selection that
does not parse; a bad `WDSPREP_*` variable it meets there is the environment's, exit status 1). `--help`, of wdsprep and of every command, prints on stdout, exit status 0. A
warning wdsprep gives while a command runs (a `UserWarning` from the package) is one
`wdsprep: warning: ...` line. `wdsprep --version` prints the installed version. Ctrl-C is one line,
which asks for a re-run only of a command whose re-run resumes.
"""
from __future__ import annotations

import importlib.metadata
import os
import re
import signal
import sys
import warnings
from typing import Sequence

from ._version import __version__
from .command import USAGE_ERROR, Command, bad_argument
from .commands import convert, index, inspect, pipeline, reindex, serve, show, synth, upload, verify
from .errors import ConfigError, WdsprepError
from .sources.registry import is_plugin, mounted_commands

COMMANDS: tuple[Command, ...] = tuple(module.COMMAND for module in (convert, synth, inspect, verify, show, pipeline,
                                                                    upload, reindex, index, serve))


def commands(name: str | None = None) -> list[Command]:
    """Every command: the core's, then those the built-in sources mount (and the plugin `name`'s,
    when the command line names one)."""
    return [*COMMANDS, *mounted_commands(name)]


def verbs(table: Sequence[Command]) -> list[str]:
    return list(dict.fromkeys(command.verb for command in table))


def usage() -> str:
    """The command list of `wdsprep --help`, built from the table."""
    table = commands()
    rows = [(f"{command.name} {command.usage}".rstrip(), command.summary) for command in table]
    return "usage: wdsprep {" + ",".join(verbs(table)) + "} ...\n" + "\n".join(f"  {words:<29} {text}" for words, text in rows)


def find(argv: Sequence[str]) -> tuple[Command | None, list[Command], str]:
    """The command `argv` calls (by its first word, or its first two), every command under its
    first word (none: an unknown command), and the line saying why there is none when the plugin
    named second does not load (else ""). A core command is found without loading any source; the
    second word is loaded as a plugin only when it is one's name (`package.module:OBJECT`)."""
    for command in COMMANDS:
        if command.name == argv[0]:
            return command, [command], ""
    plugin = argv[1] if len(argv) > 1 and is_plugin(argv[1]) else None
    try:
        table = commands(plugin)
    except ConfigError as error:  # the plugin does not load: it mounts no command, and says why
        return None, [], str(error) if argv[0] in verbs(commands()) else f"{_unknown(argv[0])}; {error}"
    under = [command for command in table if command.verb == argv[0]]
    named = " ".join(argv[:2])
    return next((command for command in under if command.name == named), None), under, ""


def run(command: Command, argv: Sequence[str]) -> int:
    """`command` with the words after its name, checked (`Command.check`: a `ConfigError` there is a
    bad argument, exit status 2) before it runs; a command a source mounts is handed the driver."""
    parser = command.parser()
    if command not in COMMANDS:
        from .conversion import Conversion

        parser.set_defaults(driver=Conversion)
    args = parser.parse_args(argv[len(command.name.split()):])
    if command.check is not None:
        try:
            command.check(args)
        except ConfigError as error:
            if args.debug or _VARIABLE.match(str(error)):  # a WDSPREP_* variable: the environment, exit 1
                raise
            print(bad_argument(parser.prog, str(error)), file=sys.stderr)
            return USAGE_ERROR
    return int(command.run(args) or 0)


_VARIABLE = re.compile(r"WDSPREP_[A-Z0-9_]+=")


def _unknown(verb: str) -> str:
    return f"unknown command {verb!r} (commands: {', '.join(verbs(commands()))}; wdsprep --help describes them)"


def no_command(argv: Sequence[str], under: Sequence[Command]) -> int:
    """A command line that calls no command: an unknown verb, or a verb without (or with an unknown)
    NAME, one line each; `wdsprep VERB --help` prints the help of every command under the verb."""
    if not under:
        print(f"wdsprep: error: {_unknown(argv[0])}", file=sys.stderr)
        return USAGE_ERROR
    if argv[1:2] in (["-h"], ["--help"]):
        print("\n\n".join(command.parser().format_help().rstrip() for command in under))
        return 0
    names = ", ".join(command.name.split(" ", 1)[1] for command in under)
    if len(argv) > 1:
        line = f"unknown command {' '.join(argv[:2])!r} (wdsprep {argv[0]} takes {names}; wdsprep {argv[0]} --help describes them)"
    else:
        line = f"wdsprep {argv[0]} needs a name: {names} (wdsprep {argv[0]} --help describes them)"
    print(f"wdsprep: error: {line}", file=sys.stderr)
    return USAGE_ERROR


def version() -> str:
    """The installed distribution's version (its metadata), else the package's own."""
    try:
        return importlib.metadata.version("wdsprep")
    except importlib.metadata.PackageNotFoundError:
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
        print(usage(), file=sys.stdout if argv else sys.stderr)  # asked for: stdout; no command: an error
        return 0 if argv else USAGE_ERROR
    if argv[0] == "--version":
        print(f"wdsprep {version()}")
        return 0
    command = None
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _warning_line
            command, under, problem = find(argv)
            if problem:
                print(f"wdsprep: error: {problem}", file=sys.stderr)
                return USAGE_ERROR
            return no_command(argv, under) if command is None else run(command, argv)
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
        print(interrupted(command), file=sys.stderr)
        return 130


INTERRUPTED = "wdsprep: interrupted (re-run the same command to resume)"


def interrupted(command: Command | None) -> str:
    """The one line for Ctrl-C: only a command whose re-run resumes says to re-run it."""
    return INTERRUPTED if command is not None and command.resumable else "wdsprep: interrupted"


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
            called = [command for command in COMMANDS if command.name.split() == sys.argv[1:][:len(command.name.split())]]
            print(interrupted(called[0] if called else None), file=sys.stderr)
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
