"""Streaming from object storage through a shaped link: wdsprep against LitData, MosaicML MDS and
webdataset, the same samples, 0/2/4 DataLoader workers, 40 ms and 100 ms before every first byte.

The link is wdsprep's own test server (`python -m wdsprep.testing http`, `Shaping`): 20 MB/s per
connection, 200 MB/s over all connections, `latency` seconds before the first byte of every
response, Range support, keep-alive, and a log of requests, bytes sent and connections. One server
serves the HTTP files (wdsprep shards, webdataset shards); a second one, the same code, is a proxy in
front of the S3 test server (moto, its own process) that wdsprep, LitData and MDS read `s3://` from.
Servers and every measurement run in processes of their own (LitData/MDS caches and shared memory
start clean; webdataset's process never imports wdsprep, so it reads http:// with its own `curl`).

Samples: a 16 KiB float32 array + a small dict, written by each system's own writer (uncompressed,
shards/chunks of 8 MB: bench_peers.py's writers), read the way each is used for training (shuffled
as it shuffles, decoded to an array and a dict; batches of 64 with workers). One full epoch per run.
Reported per run: samples/s over the epoch (construction included), MB/s on the wire (the server's
bytes sent) against the data's MB (wire / data), % of the link's 200 MB/s, time to the first
sample (from construction), requests and the most connections open at once at the server.

The CPU ceiling: wdsprep through the same servers with the link unshaped (no rate, no latency), in
the same run. On a machine whose cores cannot decode 200 MB/s, "% of what this machine can do" is
the wire rate over min(link, ceiling). `wdsprep, prefetch_bytes=0` is the sequential reader (one
stream per piece, what wdsprep did before its read-ahead), for comparison. *CPU s/100 MB*: the
reading process's CPU (user + sys, its DataLoader workers included, imports excluded) per 100 MB on
the wire: what other processes on a busy machine change least.

Quick mode, for every change of the read path (stream/reading/readahead.py, worker.py, read.py, storage/):
`BENCH_REMOTE_QUICK=1` (`make bench-remote`) measures wdsprep alone over HTTP, unshaped and at
40 ms, with 0 and 2 workers, 3 interleaved runs, and prints its table (BENCHMARKS.md untouched).
"""
from __future__ import annotations

import json
import os
import pathlib
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from _smoke import sized

QUICK = os.environ.get("BENCH_REMOTE_QUICK") == "1"  # wdsprep alone over HTTP (the docstring's quick mode)
SAMPLES = int(os.environ.get("BENCH_REMOTE_SAMPLES", sized(16_000, 400)))
ELEMENTS = 4096  # float32: 16 KiB
SHARD_BYTES = sized(8_000_000, 300_000)
RATE, TOTAL = 20e6, 200e6  # per connection, all connections (bytes/s)
LATENCIES = (0.04,) if QUICK else sized((0.04, 0.1), (0.04,))
WORKERS = (0, 2) if QUICK else sized((0, 2, 4), (0, 2))
REPEATS = int(os.environ.get("BENCH_REMOTE_REPEATS", 3 if QUICK else sized(2, 1)))
BATCH = 64
MB = 1e6

# (label, system, transport): what runs over each link
SYSTEMS = [
    ("wdsprep", "wdsprep", "http"),
    ("wdsprep, prefetch_bytes=0", "wdsprep-sequential", "http"),
    ("webdataset (curl)", "webdataset", "http"),
    ("wdsprep", "wdsprep", "s3"),
    ("wdsprep, prefetch_bytes=0", "wdsprep-sequential", "s3"),
    ("LitData", "litdata", "s3"),
    ("MosaicML MDS", "mds", "s3"),
]
if QUICK:
    SYSTEMS = SYSTEMS[:1]


# ------------------------------------------------------------------------------------------ child
def _loader(job: dict):
    system, url, workers = job["system"], job["url"], job["workers"]
    if system.startswith("wdsprep"):
        import wdsprep

        prefetch = 0 if system == "wdsprep-sequential" else None
        dataset = wdsprep.dataset(url, "train", seed=0, shuffle_buffer=1000, equalize=None, prefetch_bytes=prefetch)
        dataset = dataset.compose(wdsprep.decode(strip=True))
        return dataset if not workers else wdsprep.Loader(dataset, batch_size=BATCH, num_workers=workers)
    if system == "webdataset":
        import webdataset as wds

        dataset = wds.WebDataset(job["urls"], shardshuffle=100, seed=0, nodesplitter=wds.split_by_node,
                                 workersplitter=wds.split_by_worker, empty_check=False).shuffle(1000).decode()
        return dataset if not workers else wds.WebLoader(dataset.batched(BATCH), batch_size=None, num_workers=workers)
    if system == "litdata":
        from litdata import StreamingDataLoader, StreamingDataset

        dataset = StreamingDataset(url, cache_dir=job["cache"], shuffle=True, seed=0,
                                   storage_options={"endpoint_url": os.environ["AWS_ENDPOINT_URL"]})
        return dataset if not workers else StreamingDataLoader(dataset, batch_size=BATCH, num_workers=workers)
    if system == "mds":
        import bench_peers

        bench_peers._import_streaming()
        import torch
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        dataset = StreamingDataset(remote=url, local=job["cache"], shuffle=True, shuffle_seed=0, batch_size=BATCH)
        return dataset if not workers else torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=workers)
    raise ValueError(system)


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def child(job: dict) -> dict:
    """One epoch in this process: samples, wall seconds, seconds to the first sample, CPU seconds."""
    import bench_peers

    # every system's imports (its transport libraries too) before the clock
    if job["system"] == "mds":
        bench_peers._import_streaming()
    else:
        __import__({"webdataset": "webdataset", "litdata": "litdata"}.get(job["system"], "wdsprep.stream.loader"))
    import boto3  # noqa: F401
    import httpx  # noqa: F401
    import torch  # noqa: F401

    cpu, start = _cpu(), time.perf_counter()
    loader = _loader(job)
    first, count = None, 0
    for item in loader:
        if first is None:
            first = time.perf_counter() - start
        count += bench_peers._count(item)
    wall = time.perf_counter() - start
    del loader
    return {"samples": count, "wall": wall, "first": first, "cpu": _cpu() - cpu}


# ------------------------------------------------------------------------------------------ parent
class _Service:
    """A `python -m wdsprep.testing` server in its own process, driven over its stdin."""

    def __init__(self, *args: str, env: dict | None = None):
        self.process = subprocess.Popen([sys.executable, "-m", "wdsprep.testing", *args], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, env=env)
        line = self.process.stdout.readline().split()
        if not line:
            self.process.kill()
            raise RuntimeError(f"test service {args} did not start")
        self.url = line[0]

    def ask(self, command: str) -> dict:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def stop(self) -> None:
        self.process.stdin.close()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()


def _write(workdir: pathlib.Path, missing: dict[str, str]) -> dict[str, pathlib.Path]:
    import bench_peers

    bench_peers.SHARD_BYTES = SHARD_BYTES
    directories = {}
    for system in ("wdsprep", "webdataset", "litdata", "mds"):
        if system in missing or not any(system == s.split("-")[0] for _, s, _ in SYSTEMS):
            continue
        directory = workdir / f"data-{SAMPLES}" / system
        if not (directory / ".done").exists():
            shutil.rmtree(directory, ignore_errors=True)
            if system == "wdsprep":  # as a user makes them: files on disk, then `wdsprep convert`
                files = directory.parent / "files"
                shutil.rmtree(files, ignore_errors=True)
                bench_peers.write_files(files, ELEMENTS, SAMPLES)
                bench_peers.convert_files(str(files), str(directory), str(SHARD_BYTES))
            else:
                directory.mkdir(parents=True)
                bench_peers.WRITERS[system](str(directory), ELEMENTS, SAMPLES)
            (directory / ".done").write_text("")
        directories[system] = directory
    return directories


def _data_bytes(directory: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file() and p.name != ".done")


def _upload(directories: dict, endpoint: str) -> None:
    import boto3

    from wdsprep.testing.s3server import AWS_ENV

    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=AWS_ENV["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=AWS_ENV["AWS_SECRET_ACCESS_KEY"], region_name=AWS_ENV["AWS_REGION"])
    for system in ("wdsprep", "litdata", "mds"):
        for path in sorted(directories[system].rglob("*") if system in directories else ()):
            if path.is_file() and path.name != ".done":
                client.upload_file(str(path), "bench", f"{system}/{path.relative_to(directories[system])}")


def run_child(script: str, job: dict, env: dict | None = None) -> dict:
    """`python benchmarks/<script> child JOB` in a fresh process: its result (the last line of its
    output, JSON); a RuntimeError with its stderr's tail when it fails."""
    here = pathlib.Path(__file__).resolve().parent
    result = subprocess.run([sys.executable, str(here / script), "child", json.dumps(job)], env=env,
                            capture_output=True, text=True, timeout=1800, cwd=here)
    if result.returncode != 0:
        raise RuntimeError(f"{job.get('system', job)} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _measure(job: dict, env: dict) -> dict:
    return run_child("bench_remote.py", job, env)


def main(child, run) -> None:
    """A bench that measures in fresh processes: `python <bench>.py child JOB` runs `child(job)` and
    prints its result as JSON (what `run_child` reads); `python <bench>.py [WORKDIR]` runs the bench."""
    if len(sys.argv) > 2 and sys.argv[1] == "child":
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
        print(json.dumps(child(json.loads(sys.argv[2]))))
    else:
        print(run(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "bench-work")))


def run(workdir: pathlib.Path) -> str:
    from wdsprep.testing.s3server import AWS_ENV

    import bench_peers

    workdir = pathlib.Path(workdir)
    # peers not installed (`make bench` installs them; `make bench-smoke` runs without): their rows say so
    missing = {system: reason for system in ("litdata", "mds") if (reason := bench_peers._available(system))}
    directories = _write(workdir, missing)
    data_bytes = {system: _data_bytes(directory) for system, directory in directories.items()}
    wds_urls = sorted(p.name for p in directories["webdataset"].glob("*.tar")) if "webdataset" in directories else []

    s3 = any(transport == "s3" for _, _, transport in SYSTEMS)  # not in the quick mode
    moto = _Service("s3", "--bucket", "bench") if s3 else None
    files = _Service("http", str(directories["wdsprep"].parent))
    proxy = _Service("http", "--upstream", moto.url) if s3 else None
    cells: dict[tuple, list[dict]] = {}
    try:
        child_env = dict(os.environ)
        if s3:
            _upload(directories, moto.url)
            child_env.update(AWS_ENV, AWS_ENDPOINT_URL=proxy.url, S3_ENDPOINT_URL=proxy.url)
        links = [("unshaped", 0, 0, 0)] + [(f"{latency * 1000:.0f} ms", RATE, TOTAL, latency) for latency in LATENCIES]
        for repeat in range(REPEATS):
            for link, rate, total, latency in links:
                for server in (files, proxy) if s3 else (files,):
                    server.ask(f"shape {rate} {total} {latency} 0")
                for label, system, transport in SYSTEMS:
                    if link == "unshaped" and system != "wdsprep":
                        continue  # the ceiling: wdsprep alone
                    if system == "wdsprep-sequential" and latency not in (0, LATENCIES[0]):
                        continue
                    server = files if transport == "http" else proxy
                    for workers in WORKERS:
                        if system in missing:
                            cells.setdefault((link, label, transport, workers), []).append({"failed": missing[system]})
                            continue
                        cache = tempfile.mkdtemp(prefix="bench-remote-cache-")
                        job = {"system": system, "workers": workers, "cache": cache}
                        if transport == "http":
                            job["url"] = f"{files.url}/{system.split('-')[0]}/manifest.json"
                            job["urls"] = [f"{files.url}/webdataset/{name}" for name in wds_urls]
                        else:
                            job["url"] = f"s3://bench/{system.split('-')[0]}" + ("/manifest.json" if system.startswith("wdsprep") else "")
                        server.ask("clear")
                        try:
                            got = _measure(job, child_env)
                        except RuntimeError as error:
                            if system.startswith("wdsprep"):
                                raise
                            got = {"failed": str(error).strip().splitlines()[-1][:120]}  # a peer's failure: a row says so
                        finally:
                            shutil.rmtree(cache, ignore_errors=True)
                        got.update(server.ask("stats"))
                        if "failed" not in got and got["samples"] != SAMPLES:
                            raise RuntimeError(f"{label} over {transport}, {workers} workers: {got['samples']} samples of {SAMPLES}")
                        cells.setdefault((link, label, transport, workers), []).append(got)
                        if "failed" in got:
                            print(f"[{repeat}] {link} {label} {transport} w{workers}: FAILED {got['failed']}", file=sys.stderr, flush=True)
                            continue
                        print(f"[{repeat}] {link} {label} {transport} w{workers}: {SAMPLES / got['wall']:,.0f}/s "
                              f"{got['sent'] / got['wall'] / MB:.1f} MB/s first {got['first']:.2f}s "
                              f"CPU {got['cpu'] / got['sent'] * 100 * MB:.3f} s/100 MB", file=sys.stderr, flush=True)
    finally:
        for service in (proxy, files, moto):
            if service is not None:
                service.stop()
    (workdir / "cells.json").write_text(json.dumps([[list(key), runs] for key, runs in cells.items()]))  # the raw runs
    return _report(cells, data_bytes)


def _median(runs: list[dict], key) -> float:
    return statistics.median(key(run) for run in runs)


def _report(cells: dict, data_bytes: dict) -> str:
    system_of = {label: system for label, system, _ in SYSTEMS}
    ceiling = {(transport, workers): _median(runs, lambda r: r["sent"] / r["wall"])
               for (link, label, transport, workers), runs in cells.items() if link == "unshaped"}
    lines = [
        "## remote: streaming through a shaped link (" + ("quick: wdsprep over HTTP" if QUICK else
                                                          "wdsprep, LitData, MDS, webdataset") + ")",
        "",
        f"{SAMPLES:,} samples (16 KiB float32 array + small dict), shards or chunks of {SHARD_BYTES / MB:g} MB written "
        "by each peer's own writer, wdsprep's by `wdsprep convert generic` from the samples as files "
        f"(`--shard-bytes {SHARD_BYTES}`); one full shuffled epoch per run, decoded, batches of 64 with workers; "
        f"median of {REPEATS} interleaved runs, each in a fresh process. The link: wdsprep's test server "
        f"(`wdsprep.testing.httpserver.Shaping`) at {RATE / MB:.0f} MB/s per connection, {TOTAL / MB:.0f} MB/s in all, "
        "the latency before every response's first byte; S3 is moto behind the same server as a proxy. "
        "*wire/data*: bytes the server sent over the bytes of the data set; *% link*: wire MB/s over "
        f"{TOTAL / MB:.0f} MB/s; *% ceiling*: wire MB/s over min(link, wdsprep unshaped through the same server "
        "with the same workers: what this machine's CPUs reach); *first*: seconds from construction to the "
        "first sample; *conns*: most connections open at once at the server; *CPU s/100 MB*: the reading "
        "process's CPU (workers included) per 100 MB on the wire. Command: "
        + ("`BENCH_REMOTE_QUICK=1 python benchmarks/run.py --one bench_remote` (`make bench-remote`: wdsprep "
           "alone over HTTP)." if QUICK else
           "`python benchmarks/run.py bench_remote` (installs: `make .venv/.bench-stamp`)."),
        "",
        "| link | reader | over | workers | samples/s | wire MB/s | wire/data | % link | % ceiling | first (s) | requests | conns | CPU s/100 MB |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    order = {key: i for i, key in enumerate(cells)}
    for (link, label, transport, workers), runs in sorted(cells.items(), key=lambda kv: order[kv[0]]):
        failures = [run["failed"] for run in runs if "failed" in run]
        runs = [run for run in runs if "failed" not in run]
        if not runs:
            lines.append(f"| {link} | {label} | {transport} | {workers} | failed: {failures[0]} ||||||||||")
            continue
        system = system_of[label].split("-")[0]
        if failures:
            label += f" ({len(failures)} of {len(failures) + len(runs)} runs failed)"
        rate = _median(runs, lambda r: r["samples"] / r["wall"])
        wire = _median(runs, lambda r: r["sent"] / r["wall"])
        sent = _median(runs, lambda r: r["sent"])
        top = min(TOTAL, ceiling.get((transport, workers), TOTAL)) if link != "unshaped" else wire
        lines.append(
            f"| {link} | {label} | {transport} | {workers} | {rate:,.0f} | {wire / MB:.1f} | {sent / data_bytes[system]:.3f} "
            f"| {wire / TOTAL * 100:.0f}% | {wire / top * 100:.0f}% | {_median(runs, lambda r: r['first']):.2f} "
            f"| {_median(runs, lambda r: r['requests']):.0f} | {_median(runs, lambda r: r['peak_connections']):.0f} "
            f"| {_median(runs, lambda r: r['cpu'] / r['sent'] * 100 * MB):.3f} |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main(child, run)
