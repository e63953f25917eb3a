"""The `wdsprep` command (`python -m wdsprep`, and the console script, `wdsprep.__main__:entry`).

`entry` takes over Ctrl-C before the command table is imported (numpy, every command's module:
most of a command's start-up) and hands over to `cli.entry` once it is: a Ctrl-C at any moment of
the start-up is the one line and status 130, never a `KeyboardInterrupt` traceback. Only the
interpreter's own start and the light package root (`import wdsprep`: the exceptions and the list of
sources) come before it.
"""
import signal
import sys


def entry() -> None:
    try:
        from .cli import entry as run  # the heavy imports

        run()  # exits with the command's status, handling a Ctrl-C from here on itself
    except KeyboardInterrupt:  # came while the command table was being imported, or as it took over
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # nothing is left to stop: exit with the one line
        print("wdsprep: interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    entry()
