"""Converting many tiny inputs (issue 40): `--workers 1` against `--workers 2`, CPU/wall, bytes per shard.

N generic samples of one tiny file each (`<key>.x.npy`: 16 float32, 192 bytes; 10^6 by default, set
BENCH_CONVERT_TINY_SAMPLES) are converted by `wdsprep convert generic --shard-bytes 14KB --codec none`
(10 samples a shard: N/10 shards, one unit each) in a child process, once with `--workers 1` and once
with `--workers 2`, each into a fresh output. Reported per run: wall seconds, the CPU seconds of the
conversion and its workers (user + system, from `getrusage(RUSAGE_CHILDREN)`), CPU/wall (what the
workers kept busy: the goal is >= 0.8 x workers on a quiet machine), the peak RSS of the largest of its processes (the driver), and the
bytes written per shard for `manifest.json`, `_units.json` and the sample table. The same shards and
sample table with either worker count are checked (sha256 of every file but the journal, whose lines
come in completion order). Measured on a shared machine: wall times depend on the other load, which the
table states (the 1-minute load average before each run).
"""
from __future__ import annotations

import hashlib
import os
import pathlib
import resource
import subprocess
import sys
import time

import numpy as np

from wdsprep.shards import shardtable
from wdsprep.stream.manifests import load_manifest

from _smoke import sized

SAMPLES = int(os.environ.get("BENCH_CONVERT_TINY_SAMPLES", sized(1_000_000, 2000)))
SHARD_BYTES = "14KB"


def make_input(root: pathlib.Path, count: int) -> None:
    """`count` samples of one 192-byte .npy each (written once; a marker file says it is complete)."""
    done = root.parent / f"{root.name}-{count}.complete"  # beside the input: a file in it would be reported
    if done.exists():
        return
    (root / "train").mkdir(parents=True, exist_ok=True)
    arrays = np.random.default_rng(0).standard_normal((count, 16)).astype(np.float32)
    for i, array in enumerate(arrays):
        np.save(root / "train" / f"s{i:07d}.x.npy", array)
    done.write_text("")


def convert(native: pathlib.Path, output: pathlib.Path, workers: int) -> dict:
    if output.exists():
        subprocess.run(["rm", "-rf", str(output)], check=True)
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "wdsprep", "convert", "generic", str(native), str(output), "--shard-bytes",
                    SHARD_BYTES, "--codec", "none", "--workers", str(workers), "--quiet"], check=True,
                   stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rows = list(load_manifest(str(output)).shards("train"))  # inline rows (v1) or the shard table (v2)
    table = output / shardtable.file_name("train")
    return {"workers": workers, "load": load, "wall": wall, "cpu": cpu, "rss": after.ru_maxrss / 1024,
            "shards": len(rows), "units": len({row["unit"] for row in rows}),
            "samples": sum(row["samples"] for row in rows),
            "manifest": (output / "manifest.json").stat().st_size + (table.stat().st_size if table.exists() else 0),
            "journal": (output / "_units.json").stat().st_size,
            "table": (output / "train.samples").stat().st_size}


def digests(output: pathlib.Path) -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(output.iterdir())
            if path.name.endswith((".tar", ".samples"))}


def run(workdir: pathlib.Path) -> str:
    workdir = pathlib.Path(workdir)
    native = workdir / "input"
    made = time.perf_counter()
    make_input(native, SAMPLES)
    made = time.perf_counter() - made
    results = [convert(native, workdir / f"out-{workers}", workers) for workers in (1, 2)]
    same = digests(workdir / "out-1") == digests(workdir / "out-2")
    lines = [
        "## converting many tiny inputs: --workers 1 and 2",
        "",
        f"{SAMPLES:,} generic samples of one 192-byte `.npy` each (input written in {made:.0f} s, or found), "
        f"`wdsprep convert generic --shard-bytes {SHARD_BYTES} --codec none`: 10 samples a shard, one unit a shard. "
        "CPU = user + system seconds of the conversion and its workers (getrusage of the children); load = "
        "the machine's 1-minute load average before the run (2 cores, shared: other work slows the wall time).",
        "",
        "| workers | load | wall s | CPU s | CPU/wall | samples | shards | units | largest process peak RSS MB | "
        "manifest + shard table B/shard | journal B/shard | sample table B/shard |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        assert r["samples"] == SAMPLES, r
        lines.append(f"| {r['workers']} | {r['load']:.1f} | {r['wall']:.1f} | {r['cpu']:.1f} | {r['cpu'] / r['wall']:.2f} | "
                     f"{r['samples']:,} | {r['shards']:,} | {r['units']:,} | {r['rss']:.0f} | "
                     f"{r['manifest'] / r['shards']:.0f} | {r['journal'] / r['shards']:.0f} | {r['table'] / r['shards']:.1f} |")
    lines += ["", f"Shards and sample table identical with 1 and 2 workers: {'yes' if same else 'NO'}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(run(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "bench-work/bench_convert_tiny")))
