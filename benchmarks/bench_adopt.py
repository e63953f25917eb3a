"""Adopting WebDataset tars in place (`wdsprep index`): how fast a dataset is indexed, locally and
through a shaped HTTP link, and what reading an adopted dataset costs against the same samples
converted.

The data: N generic samples (a 16 KiB float32 array and a small dict each, `generic` synth "small")
converted by `wdsprep convert generic --codec none` (the converted dataset), and the same samples --
the same keys and member bytes, read back with plain webdataset -- written again by webdataset's own
`wds.ShardWriter` with its defaults (PAX headers before every member, as its float mtimes make
Python's tarfile write; 10 KiB records): the adopted dataset's tars, indexed with `wdsprep index`.

Indexing: `wdsprep.adopt.adopt` (every byte read once, sha256 and the members' xxh3_64), 4 shards at
once (its default), from local disk and from the project's test server (`python -m wdsprep.testing http`, its own
process) with its link shaped to `LINK` bytes/s over all connections; reported in MB/s and, for the
link, as a share of it (the target: at least 80%).

Reading: one pass of `wdsprep.dataset(out, "train")` (raw samples, then with `wdsprep.decode()`
fused) over each dataset, from local disk (the page cache), in this process; CPU seconds (user +
system) per sample, the median of `REPEATS` passes taken in turns; the ratio adopted / converted (the
target: at most 1.1). Adopted twice: the tars as webdataset wrote them, and the same files copied
(`shutil.copyfile`). Before the passes every shard of the three datasets is put in the same state
(`_cached_alike`): its pages dropped from the page cache, then read once from start to end, as a
dataset that lies on disk is met; left as their writers made them, the cost of reading the same
bytes back moved by up to 20% with how each file was written (tarfile's many small writes, wdsprep's
large ones, a copy), more than the format's own difference. An adopted member's head is its PAX
records and header (1,536 bytes instead of 512), read and digested with it: these tars hold 11% more
bytes than the converted shards for the same samples.
"""
from __future__ import annotations

import contextlib
import io
import os
import pathlib
import resource
import shutil
import statistics
import subprocess
import sys
import time

from _smoke import sized
from _testserver import ask as _ask
from _testserver import server as _server

SAMPLES = int(os.environ.get("BENCH_ADOPT_SAMPLES", sized(20000, 300)))
LINK = float(os.environ.get("BENCH_ADOPT_LINK", sized(40e6, 20e6)))  # bytes/s over all connections
REPEATS = sized(11, 1)  # passes of ~0.2 s each: a median of 5 moved by 10% between runs on this VM
MB = 1e6


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _data(workdir: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """(the converted dataset, the folder of webdataset-written tars of the same samples)."""
    import webdataset as wds

    import wdsprep
    from wdsprep.sources.generic import SOURCE

    native, converted, tars = workdir / "input", workdir / "converted", workdir / "tars"
    if not (converted / "manifest.json").exists():
        SOURCE.synth(str(native), seed=0, size="small", splits={"train": SAMPLES})
        subprocess.run([sys.executable, "-m", "wdsprep", "convert", "generic", str(native), str(converted),
                        "--shard-bytes", sized("16MB", "256KB"), "--codec", "none", "--workers", "2", "--quiet"],
                       check=True)
    if not tars.exists():
        tars.mkdir()
        with contextlib.redirect_stdout(io.StringIO()):
            with wds.ShardWriter(str(tars / "shard-%06d.tar"), maxsize=sized(16e6, 256e3), maxcount=10**9) as writer:
                for sample in wds.WebDataset(wdsprep.urls(str(converted), "train"), shardshuffle=False):
                    writer.write({name: value for name, value in sample.items() if name not in ("__url__", "__local_path__")})
    copied = workdir / "tars-copied"
    if not copied.exists():
        copied.mkdir()
        for path in sorted(tars.glob("*.tar")):
            shutil.copyfile(path, copied / path.name)
    return converted, tars


def _cached_alike(paths: list) -> None:
    """Each file's pages dropped from the page cache (written back first), then read once, start to
    end: every dataset's pages made by the kernel's read-ahead alike, whoever wrote the file."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            while os.read(fd, 1 << 20):
                pass
        finally:
            os.close(fd)


def _index_pass(sources, out: pathlib.Path) -> tuple[float, float, int]:
    from wdsprep.adopt import adopt

    shutil.rmtree(out, ignore_errors=True)
    cpu, started = _cpu(), time.perf_counter()
    report = adopt(sources, str(out))  # its default: 4 shards at once
    return time.perf_counter() - started, _cpu() - cpu, report.bytes


def _read_pass(location: str, fused: bool) -> tuple[float, int]:
    import wdsprep

    dataset = wdsprep.dataset(location, "train", seed=1, equalize=None)
    if fused:
        dataset = dataset.compose(wdsprep.decode())
    cpu = _cpu()
    count = sum(1 for _ in dataset)
    return _cpu() - cpu, count


def run(workdir: pathlib.Path) -> str:
    workdir = pathlib.Path(workdir) / "adopt"
    workdir.mkdir(parents=True, exist_ok=True)
    converted, tars = _data(workdir)
    names = sorted(path.name for path in tars.glob("*.tar"))
    total = sum((tars / name).stat().st_size for name in names)

    local_seconds, local_cpu, indexed = _index_pass([str(tars)], workdir / "adopted")
    assert indexed == total
    _index_pass([str(workdir / "tars-copied")], workdir / "adopted-copied")
    process, url = _server(workdir)
    try:
        _ask(process, f"shape 0 {LINK} 0 0")
        _ask(process, "clear")
        pattern = f"{url}/tars/shard-{{000000..{len(names) - 1:06d}}}.tar"
        link_seconds, link_cpu, sent = _index_pass([pattern], workdir / "adopted-http")
        stats = _ask(process, "stats")
    finally:
        process.stdin.close()
        process.wait(timeout=60)
    assert sent == total and stats["sent"] == total, (sent, stats)

    _cached_alike([*converted.glob("*.tar"), *tars.glob("*.tar"), *(workdir / "tars-copied").glob("*.tar")])
    runs = {(kind, fused): [] for kind in ("converted", "adopted", "adopted-copied") for fused in (False, True)}
    for _ in range(REPEATS):  # in turns, so that the machine's load falls on all alike
        for (kind, fused), seconds in runs.items():
            location = str(converted if kind == "converted" else workdir / kind)
            cpu, count = _read_pass(location, fused)
            assert count == SAMPLES, (kind, count)
            seconds.append(cpu / count)
    per_sample = {key: statistics.median(values) for key, values in runs.items()}

    lines = [
        "## adopting WebDataset tars (`wdsprep index`)",
        "",
        f"{SAMPLES} generic samples (16 KiB float32 array + small dict), converted with `--codec none`, and the "
        f"same samples written again by `wds.ShardWriter` with its defaults: {len(names)} tars, {total / MB:.1f} MB "
        "(PAX records before every member). Indexed by `wdsprep.adopt.adopt` (4 shards at once: every byte read "
        "once, its sha256 and each member's xxh3_64), from local disk and from `python -m wdsprep.testing http` "
        f"with its link shaped to {LINK / MB:.0f} MB/s over all connections.",
        "",
        "| indexing from | seconds | MB/s | CPU s | share of the link |",
        "|---|---:|---:|---:|---:|",
        f"| local disk | {local_seconds:.2f} | {total / local_seconds / MB:.1f} | {local_cpu:.2f} | |",
        f"| HTTP, {LINK / MB:.0f} MB/s link | {link_seconds:.2f} | {total / link_seconds / MB:.1f} | {link_cpu:.2f} | "
        f"{total / link_seconds / LINK:.0%} |",
        "",
        f"Reading one pass of `wdsprep.dataset` (shuffled, local disk), CPU per sample, median of {REPEATS} passes "
        "taken in turns, every shard's pages first dropped from the page cache and read once, alike:",
        "",
        "| samples | converted µs/sample | adopted, as written µs/sample | ÷ converted | adopted, copied µs/sample | ÷ converted |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for fused, label in ((False, "raw"), (True, "`wdsprep.decode()` fused")):
        a, b, c = per_sample["adopted", fused], per_sample["adopted-copied", fused], per_sample["converted", fused]
        lines.append(f"| {label} | {c * 1e6:.1f} | {a * 1e6:.1f} | {a / c:.2f} | {b * 1e6:.1f} | {b / c:.2f} |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(run(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "bench-work")))
