"""Instructions per sample of bench_mix's reads, counted by valgrind's cachegrind: the same count on
a busy machine as on a quiet one, where CPU time drifts by more than the few percent a mix's goals
are about. Not part of `make bench` (each run takes minutes under valgrind); its numbers, with this
command, are in BENCHMARKS.md.

    python benchmarks/instructions.py [--cycles] WORKDIR SYSTEM [SYSTEM ...]

WORKDIR holds bench_mix's converted parts (`WORKDIR/wdsprep/<part>`: what `benchmarks/run.py --one
bench_mix` leaves in bench-work/bench_mix, or bench_packed's packed parts in bench-work/bench_packed/mix);
SYSTEM is one of bench_mix's reads (wdsprep-alone, wdsprep-mix, wdsprep-mix-sized, ...). A read's
count is that of a process reading two passes less that of one reading one pass (imports and the
first pass's one-time costs cancel), over the samples of a pass. Two processes run at a time.
OpenBLAS gets one thread (OPENBLAS_NUM_THREADS=1): its idle helper threads spin under valgrind, never
outside it, and no read here calls BLAS.

`--cycles` also simulates the caches and the branch predictor (twice as slow): this machine's first
level (I1, D1) and, as the last level, its per-core second level (`getconf LEVEL2_CACHE_SIZE`: the
shared third level of a cloud host is not the reader's to count on), and prints each read's misses,
mispredicted branches and the cycles they model at valgrind's manual's costs: an instruction 1, a
first-level miss 10, a last-level miss 200, a mispredicted branch 20 ("an L1 miss will typically
cost around 10 cycles, an LL miss can cost as much as 200 cycles, and a mispredicted branch costs in
the region of 10 to 30 cycles"). What instructions alone leave out: a mix touches its parts' state
in turn, where parts read alone touch one part's.
"""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

HERE = pathlib.Path(__file__).resolve().parent
READ = """
import sys
sys.path.insert(0, {here!r})
import bench_mix
samples = 0
for _ in range({passes}):
    for source in bench_mix._read_sources({system!r}, {workdir!r}):
        for sample in source:
            bench_mix._identity(sample)
            samples += 1
print(samples // {passes})
"""
COSTS = {"Ir": 1, "I1mr": 10, "D1mr": 10, "D1mw": 10, "ILmr": 200, "DLmr": 200, "DLmw": 200, "Bcm": 20, "Bim": 20}


def _cache(level: int, fallback: tuple[int, int, int]) -> str:
    """`size,associativity,line` of this machine's cache `level` (data), as cachegrind takes it
    (`getconf`), or `fallback` where getconf does not say."""
    found = []
    for what in ("SIZE", "ASSOC", "LINESIZE"):
        name = f"LEVEL{level}_{'D' if level == 1 else ''}CACHE_{what}"
        said = subprocess.run(["getconf", name], capture_output=True, text=True).stdout.strip()
        found.append(int(said) if said.isdigit() else 0)
    return ",".join(map(str, found if all(found) else fallback))


def _count(workdir: str, system: str, passes: int, scratch: pathlib.Path, cycles: bool) -> tuple[dict, int]:
    out = scratch / f"{system}-{passes}"
    env = dict(os.environ, PYTHONHASHSEED="0", OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(HERE.parent / "src"), os.environ.get("PYTHONPATH")])))
    script = READ.format(here=str(HERE), passes=passes, system=system, workdir=workdir)
    simulate = (["--cache-sim=yes", "--branch-sim=yes", f"--D1={_cache(1, (49152, 12, 64))}",
                 f"--LL={_cache(2, (2097152, 16, 64))}"] if cycles else ["--cache-sim=no"])
    result = subprocess.run(["valgrind", "--tool=cachegrind", *simulate, f"--cachegrind-out-file={out}",
                             sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    text = out.read_text()
    events = re.search(r"^events:\s+(.*)$", text, re.M).group(1).split()
    totals = map(int, re.search(r"^summary:\s+(.*)$", text, re.M).group(1).split())
    return dict(zip(events, totals)), int(result.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    cycles = "--cycles" in argv
    workdir, *systems = [arg for arg in argv if arg != "--cycles"]
    with tempfile.TemporaryDirectory() as scratch, ThreadPoolExecutor(2) as pool:
        jobs = {(system, passes): pool.submit(_count, workdir, system, passes, pathlib.Path(scratch), cycles)
                for system in systems for passes in (1, 2)}
        if cycles:
            print("| read | samples a pass | instructions/sample | first-level misses | last-level misses "
                  "| mispredicted branches | modelled cycles/sample |")
            print("|---|---:|---:|---:|---:|---:|---:|")
        else:
            print("| read | samples a pass | instructions a pass | per sample |")
            print("|---|---:|---:|---:|")
        for system in systems:
            (one, samples), (two, _) = jobs[system, 1].result(), jobs[system, 2].result()
            per = {event: (two[event] - one[event]) / samples for event in one}
            if not cycles:
                print(f"| {system} | {samples:,} | {two['Ir'] - one['Ir']:,} | {per['Ir']:,.0f} |")
                continue
            first = per["I1mr"] + per["D1mr"] + per["D1mw"]
            last = per["ILmr"] + per["DLmr"] + per["DLmw"]
            modelled = sum(cost * per[event] for event, cost in COSTS.items())
            print(f"| {system} | {samples:,} | {per['Ir']:,.0f} | {first:,.0f} | {last:,.0f} "
                  f"| {per['Bcm'] + per['Bim']:,.0f} | {modelled:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
