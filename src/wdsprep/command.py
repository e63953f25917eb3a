"""The one shape of a command: what `wdsprep --help` lists and `wdsprep NAME ...` runs.

Every command is one `Command`: the core's (one module per verb in `wdsprep.commands`) and those a
source mounts (`Source.commands()`, e.g. rawnind's `fetch rawnind`) alike. A command has its `name`
(the words that call it: `convert`, or `VERB NAME` for a command under a verb, `fetch rawnind`), a
one-line `summary`, `add_arguments(parser)` (its argparse arguments), `check(args)` (optional: the
arguments judged before any work, where argparse alone cannot: a source that does not load, an
option value out of its rule, a selection that does not parse; it may keep what it made on `args`),
`run(args)` (the work; its return value is the exit status, None meaning 0), the `usage` of its
arguments for the command list, and whether a re-run resumes it (`resumable`: Ctrl-C then says so).

Every parser is made here (`Command.parser`): `prog` is `wdsprep NAME`, the summary its description,
`--quiet` and `--debug` added unless the command has its own, and a bad argument is the command
line's one error line, `wdsprep: error: wdsprep NAME: <what is wrong> (wdsprep NAME --help shows its
options)`, exit status 2 (`bad_argument`: what `wdsprep.cli` says of a command line it cannot
take): what argparse finds, a value an argument's `type=checked(...)` refuses (the ground floor's
checkers, wdsprep/checks.py), and a `ConfigError` that `check` raises. Errors while a command runs
are raised, not printed: `wdsprep.cli` turns them into one line, exit status 1. `--help` prints on
stdout, exit status 0.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable, NoReturn

from .errors import ConfigError

USAGE_ERROR = 2  # a command line wdsprep cannot take: no command, an unknown one, a bad argument


def bad_argument(prog: str, message: str) -> str:
    """The one line of a bad argument of command `prog` (`wdsprep NAME`)."""
    return f"wdsprep: error: {prog}: {message} ({prog} --help shows its options)"


class CommandParser(argparse.ArgumentParser):
    """argparse, with a bad argument said in one `wdsprep: error:` line (argparse prints its usage
    and `prog: error:` on two)."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, bad_argument(self.prog, message) + "\n")


def checked(check: Callable[..., Any], *rule: Any, **options: Any) -> Callable[[str], Any]:
    """An argparse `type=` that judges an argument's text by one of the ground floor's checkers
    (wdsprep/checks.py: `whole_number`, `number`, `size`), e.g. `type=checked(whole_number, 1)`;
    a value it refuses is argparse's one line, `argument --workers: '0': must be a whole number >= 1`."""

    def convert(text: str) -> Any:
        try:
            return check(text, None, *rule, **options)
        except ConfigError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    convert.__name__ = check.__name__
    return convert


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quiet", action="store_true", help="no progress display")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")


@dataclass(frozen=True)
class Command:
    name: str  # the words that call it: "convert", "fetch rawnind"
    summary: str  # one line, for `wdsprep --help` and the command's own help
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], "int | None"]  # its return value is the exit status (None: 0)
    usage: str = ""  # its arguments for `wdsprep --help`, e.g. "SOURCE INPUT OUTPUT"
    resumable: bool = False  # a re-run continues where an interrupted run stopped
    check: Callable[[argparse.Namespace], None] | None = None  # before any work: a ConfigError is a bad argument

    @property
    def verb(self) -> str:
        return self.name.split()[0]

    def parser(self) -> CommandParser:
        parser = CommandParser(prog=f"wdsprep {self.name}", description=self.summary or None)
        self.add_arguments(parser)
        if not any(action.dest == "debug" for action in parser._actions):
            add_common(parser)
        return parser
