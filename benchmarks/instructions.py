"""Instructions per sample of bench_mix's reads, counted by valgrind's cachegrind: the same count on
a busy machine as on a quiet one, where CPU time drifts by more than the few percent a mix's goals
are about. Not part of `make bench` (each run takes minutes under valgrind); its numbers, with this
command, are in BENCHMARKS.md.

    python benchmarks/instructions.py WORKDIR SYSTEM [SYSTEM ...]

WORKDIR holds bench_mix's converted parts (`WORKDIR/wdsprep/<part>`: what `benchmarks/run.py --one
bench_mix` leaves in bench-work/bench_mix, or bench_packed's packed parts in bench-work/bench_packed/mix);
SYSTEM is one of bench_mix's reads (wdsprep-alone, wdsprep-mix, wdsprep-mix-sized, ...). A read's
count is that of a process reading two passes less that of one reading one pass (imports and the
first pass's one-time costs cancel), over the samples of a pass. Two processes run at a time.
OpenBLAS gets one thread (OPENBLAS_NUM_THREADS=1): its idle helper threads spin under valgrind, never
outside it, and no read here calls BLAS.
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


def _count(workdir: str, system: str, passes: int, scratch: pathlib.Path) -> tuple[int, int]:
    out = scratch / f"{system}-{passes}"
    env = dict(os.environ, PYTHONHASHSEED="0", OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(HERE.parent / "src"), os.environ.get("PYTHONPATH")])))
    script = READ.format(here=str(HERE), passes=passes, system=system, workdir=workdir)
    result = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}",
                             sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    return int(re.search(r"^summary:\s+(\d+)", out.read_text(), re.M).group(1)), int(result.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    workdir, systems = argv[0], argv[1:]
    with tempfile.TemporaryDirectory() as scratch, ThreadPoolExecutor(2) as pool:
        jobs = {(system, passes): pool.submit(_count, workdir, system, passes, pathlib.Path(scratch))
                for system in systems for passes in (1, 2)}
        print("| read | samples a pass | instructions a pass | per sample |")
        print("|---|---:|---:|---:|")
        for system in systems:
            (one, samples), (two, _) = jobs[system, 1].result(), jobs[system, 2].result()
            print(f"| {system} | {samples:,} | {two - one:,} | {(two - one) / samples:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
