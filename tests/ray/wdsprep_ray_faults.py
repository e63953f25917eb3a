"""A test source plugin (`wdsprep_ray_faults:SOURCE`): the generic source with an injected failure.

`--fail-unit SPLIT-INDEX` picks the unit; `--fail-mode once` makes its first attempt raise after
writing half of its samples (a transient error: a retry must give the same bytes), `crash` makes
its first attempt kill its worker process there (as a node or an OOM kill would), `always` makes
every attempt raise. Each attempt on the picked unit appends a line to `<fail-dir>/attempts-<unit>`
so tests can count attempts across worker processes. The failure options are not part of the plan
config, so the output is comparable with a run without injection.
"""
from __future__ import annotations

import os

from wdsprep.sources.generic import GenericSource


class InjectedFailure(RuntimeError):
    pass


class FaultySource(GenericSource):
    id = "faulty"

    def add_arguments(self, parser) -> None:
        parser.add_argument("--fail-unit", dest="fail_unit", default=None, help="SPLIT-INDEX, e.g. train-1")
        parser.add_argument("--fail-mode", dest="fail_mode", default="once", choices=("once", "crash", "always"))
        parser.add_argument("--fail-dir", dest="fail_dir", default=None, help="where attempts are counted")

    def build(self, unit, ctx):
        options = ctx.options
        name = f"{unit.split}-{unit.index}"
        if options.get("fail_unit") != name:
            yield from super().build(unit, ctx)
            return
        log = os.path.join(options["fail_dir"], f"attempts-{name}")
        with open(log, "a") as handle:
            handle.write(f"{os.getpid()}\n")
        with open(log) as handle:
            attempt = len(handle.read().splitlines())
        mode = options.get("fail_mode", "once")
        fail = mode == "always" or attempt == 1
        for number, sample in enumerate(super().build(unit, ctx)):
            if fail and number == len(unit.items) // 2:
                if mode == "crash":
                    os._exit(17)  # no exception, no cleanup: the worker process is gone
                raise InjectedFailure(f"injected failure in unit {name} (attempt {attempt})")
            yield sample


def attempts(fail_dir, unit: str) -> int:
    try:
        with open(os.path.join(fail_dir, f"attempts-{unit}")) as handle:
            return len(handle.read().splitlines())
    except FileNotFoundError:
        return 0


SOURCE = FaultySource()
