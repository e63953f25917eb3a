"""`make bench`: run every benchmarks/bench_*.py in its own process and write BENCHMARKS.md.

Each bench module defines `run(workdir: pathlib.Path) -> str` returning a Markdown section whose
numbers were all measured in that one run (ratios, not absolute speeds, are what compare across
these noisy machines). `python benchmarks/run.py NAME...` runs only the named benches.

`python benchmarks/run.py --smoke [NAME...]` (`make bench-smoke`) runs every bench at tiny sizes
(WDSPREP_BENCH_SMOKE=1, see `_smoke.py`) in bench-work-smoke/, prints the tables and writes them to
bench-work-smoke/BENCHMARKS-smoke.md, leaving BENCHMARKS.md alone; it fails if any bench fails or
returns no table. No speed is asserted: smoke numbers are not measurements.
"""
from __future__ import annotations

import datetime
import importlib.util
import os
import pathlib
import platform
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent


def work_root() -> pathlib.Path:
    return ROOT / ("bench-work-smoke" if os.environ.get("WDSPREP_BENCH_SMOKE") == "1" else "bench-work")


def run_one(name: str) -> str:
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    workdir = work_root() / name
    workdir.mkdir(parents=True, exist_ok=True)
    return module.run(workdir)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--one":
        print(run_one(argv[1]))
        return 0
    smoke = bool(argv) and argv[0] == "--smoke"
    if smoke:
        argv = argv[1:]
        os.environ["WDSPREP_BENCH_SMOKE"] = "1"  # inherited by every bench process
    names = sorted(p.stem for p in HERE.glob("bench_*.py"))
    if argv:
        names = [n for n in names if n in argv or n.removeprefix("bench_") in argv]
    sections, failed = [], []
    for name in names:
        print(f"== {name}", file=sys.stderr, flush=True)
        started = time.monotonic()
        result = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True, cwd=ROOT)
        seconds = time.monotonic() - started
        if result.returncode != 0 or "|" not in result.stdout:
            failed.append(name)
            tail = "\n".join(result.stderr.strip().splitlines()[-15:])
            sections.append(f"## {name}\n\nFAILED after {seconds:.0f} s:\n\n```\n{tail}\n```\n")
            print(tail, file=sys.stderr)
        else:
            sections.append(result.stdout.strip() + f"\n\n_(bench ran {seconds:.0f} s)_\n")
            print(result.stdout, file=sys.stderr)
    if smoke:
        report = work_root() / "BENCHMARKS-smoke.md"
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text("# Benchmark smoke run (tiny sizes; not measurements)\n\n" + "\n".join(sections))
        print(f"smoke: {len(names) - len(failed)} of {len(names)} benchmarks ran and wrote their tables"
              + (f"; FAILED: {', '.join(failed)}" if failed else ""))
        return 1 if failed else 0
    header = (
        "# Benchmarks\n\n"
        f"Produced by `make bench` (`python benchmarks/run.py`) on {datetime.date.today()}, "
        f"{platform.machine()} with {os.cpu_count()} CPUs, Python {platform.python_version()}. "
        "Every ratio compares numbers measured in the same run on the same data.\n"
    )
    if argv:
        header += f"\nThis file holds only: {', '.join(names)} (`python benchmarks/run.py {' '.join(argv)}`).\n"
    (ROOT / "BENCHMARKS.md").write_text(header + "\n" + "\n".join(sections))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
