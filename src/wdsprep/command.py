"""The one shape of a command: what `wdsprep --help` lists and `wdsprep NAME ...` runs.

Every command is one `Command`: the core's (one module per verb in `wdsprep.commands`) and those a
source mounts (`Source.commands()`, e.g. rawnind's `fetch rawnind`) alike. A command has its `name`
(the words that call it: `convert`, or `VERB NAME` for a command under a verb, `fetch rawnind`), a
one-line `summary`, `add_arguments(parser)` (its argparse arguments), `run(args)` (the work; its
return value is the exit status, None meaning 0), the `usage` of its arguments for the command list,
and whether a re-run resumes it (`resumable`: Ctrl-C then says so).

Every parser is made here (`Command.parser`): `prog` is `wdsprep NAME`, the summary its description,
`--quiet` and `--debug` added unless the command has its own, and a bad argument is the command
line's one error line, `wdsprep: error: wdsprep NAME: <what argparse found>`, exit status 2 (what
`wdsprep.cli` says of a command line it cannot take). Errors while a command runs are raised, not
printed: `wdsprep.cli` turns them into one line, exit status 1.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable, NoReturn

USAGE_ERROR = 2  # a command line wdsprep cannot take: no command, an unknown one, a bad argument


class CommandParser(argparse.ArgumentParser):
    """argparse, with a bad argument said in one `wdsprep: error:` line (argparse prints its usage
    and `prog: error:` on two)."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"wdsprep: error: {self.prog}: {message} ({self.prog} --help shows its options)\n")


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

    @property
    def verb(self) -> str:
        return self.name.split()[0]

    def parser(self) -> CommandParser:
        parser = CommandParser(prog=f"wdsprep {self.name}", description=self.summary or None)
        self.add_arguments(parser)
        if not any(action.dest == "debug" for action in parser._actions):
            add_common(parser)
        return parser
