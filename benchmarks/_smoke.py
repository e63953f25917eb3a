"""`make bench-smoke`: every benchmark at tiny sizes, to prove it still runs and writes its table.

`benchmarks/run.py --smoke` sets WDSPREP_BENCH_SMOKE=1 for each bench process; a bench reads
`SMOKE` and picks its small sizes with `sized(full, smoke)`. Smoke numbers are not measurements.
"""
from __future__ import annotations

import os

SMOKE = os.environ.get("WDSPREP_BENCH_SMOKE") == "1"


def sized(full, smoke):
    """`full` in a real run, `smoke` in a smoke run."""
    return smoke if SMOKE else full
