"""Random access: `wdsprep.MapDataset` against LitData's and MosaicML MDS's `StreamingDataset[i]`, the
same samples at the same random positions, from local disk and through the shaped link of bench_remote.

Samples: a 16 KiB float32 array + a small dict (bench_peers' W1), written as files and converted by
`wdsprep convert generic` (`--codec none`), and by LitData's and MDS's own writers (uncompressed),
shards or chunks of 8 MB. Each run opens the dataset in a fresh process and reads the same random
positions (a seeded permutation of the dataset), decoded to an array and a dict, each checked to be
the sample at that position (its `meta["index"]`): one position per call (`ds[i]`), or 64 per call
(`MapDataset.__getitems__`, what torch's DataLoader calls with each batch of a sampler's indices;
the peers have no batched read, so theirs is 64 `ds[i]` calls). Remote: wdsprep reads HTTP from the
file server and S3 through the proxy in front of moto; LitData and MDS read S3 through the same proxy
(they do not read HTTP), each into an empty cache directory (they download whole chunks or shards;
wdsprep reads byte ranges and writes nothing locally). The link is bench_remote's: 20 MB/s per
connection, 200 MB/s in all, 40 ms before every response's first byte.

Reported per run (median of the repeats): *open (s)*: construction (manifest, index or table);
*samples/s* over the reads after it; *requests/sample* and *wire KB/sample*: what the server
counted, opening included (remote only).
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

import bench_remote
from _smoke import sized

SAMPLES = sized(20_000, 300)
ELEMENTS = 4096  # float32: 16 KiB
SHARD_BYTES = sized(8_000_000, 300_000)
READS = {"local": sized(4096, 128), "remote": sized(512, 64)}  # positions read per run
BATCHES = (1, 64)
RATE, TOTAL, LATENCY = 20e6, 200e6, 0.04
REPEATS = sized(2, 1)
SYSTEMS = [  # (label, system, transports)
    ("wdsprep MapDataset", "wdsprep", ("local", "http", "s3")),
    ("LitData StreamingDataset[i]", "litdata", ("local", "s3")),
    ("MosaicML MDS StreamingDataset[i]", "mds", ("local", "s3")),
]


def positions(count: int) -> list[int]:
    return [int(i) for i in np.random.default_rng(1).permutation(SAMPLES)[:count]]


# ------------------------------------------------------------------------------------------ child
def _open(job: dict):
    system, location = job["system"], job["location"]
    if system == "wdsprep":
        import wdsprep

        return wdsprep.MapDataset(location, "train", decode=wdsprep.decode(strip=True))
    if system == "litdata":
        from litdata import StreamingDataset

        options = {"storage_options": {"endpoint_url": os.environ["AWS_ENDPOINT_URL"]}} if location.startswith("s3://") else {}
        return StreamingDataset(location, cache_dir=job["cache"] if location.startswith("s3://") else None, **options)
    if system == "mds":
        import bench_peers

        bench_peers._import_streaming()
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        if location.startswith("s3://"):
            return StreamingDataset(remote=location, local=job["cache"], batch_size=1)
        return StreamingDataset(local=location, batch_size=1)
    raise ValueError(system)


def _read(dataset, system: str, chunk: list[int]) -> list:
    if len(chunk) > 1 and system == "wdsprep":
        return dataset.__getitems__(chunk)
    return [dataset[i] for i in chunk]


def child(job: dict) -> dict:
    """Open, then read `job["positions"]` in calls of `job["batch"]`: wall seconds of each, and a check."""
    import bench_peers

    if job["system"] == "mds":
        bench_peers._import_streaming()
    else:
        __import__({"litdata": "litdata"}.get(job["system"], "wdsprep.stream.mapdataset"))
    import boto3  # noqa: F401
    import torch  # noqa: F401

    start = time.perf_counter()
    dataset = _open(job)
    opened = time.perf_counter()
    wanted, batch = job["positions"], job["batch"]
    for at in range(0, len(wanted), batch):
        chunk = wanted[at : at + batch]
        for i, sample in zip(chunk, _read(dataset, job["system"], chunk), strict=True):
            if sample["meta"]["index"] != i or sample["array"].shape != (ELEMENTS,):
                raise RuntimeError(f"{job['system']}: position {i} gave sample {sample['meta']['index']}")
    return {"open": opened - start, "read": time.perf_counter() - opened, "samples": len(wanted)}


# ------------------------------------------------------------------------------------------ parent
def run(workdir: pathlib.Path) -> str:
    from wdsprep.testing.s3server import AWS_ENV

    import bench_peers

    workdir = pathlib.Path(workdir)
    missing = {system: reason for system in ("litdata", "mds") if (reason := bench_peers._available(system))}
    bench_remote.SAMPLES, bench_remote.SHARD_BYTES = SAMPLES, SHARD_BYTES  # its writers, at this bench's sizes
    directories = bench_remote._write(workdir, {"webdataset": "not used here", **missing})
    moto = bench_remote._Service("s3", "--bucket", "bench")
    files = bench_remote._Service("http", str(directories["wdsprep"].parent))
    proxy = bench_remote._Service("http", "--upstream", moto.url)
    cells: dict[tuple, list[dict]] = {}
    try:
        bench_remote._upload(directories, moto.url)
        env = {**os.environ, **AWS_ENV, "AWS_ENDPOINT_URL": proxy.url, "S3_ENDPOINT_URL": proxy.url}
        for server in (files, proxy):
            server.ask(f"shape {RATE} {TOTAL} {LATENCY} 0")
        for repeat in range(REPEATS):
            for label, system, transports in SYSTEMS:
                for transport in transports:
                    for batch in BATCHES:
                        key = (label, transport, batch)
                        if system in missing:
                            cells.setdefault(key, []).append({"failed": missing[system]})
                            continue
                        server = files if transport == "http" else proxy
                        location = {"local": str(directories.get(system, "")),
                                    "http": f"{files.url}/{system}/manifest.json",
                                    "s3": f"s3://bench/{system}" + ("/manifest.json" if system == "wdsprep" else "")}[transport]
                        cache = tempfile.mkdtemp(prefix="bench-random-cache-")
                        reads = READS["local" if transport == "local" else "remote"]
                        job = {"system": system, "location": location, "batch": batch, "cache": cache,
                               "positions": positions(reads)}
                        server.ask("clear")
                        try:
                            got = bench_remote.run_child("bench_random_access.py", job, env)
                        except RuntimeError as error:
                            if system == "wdsprep":
                                raise
                            got = {"failed": str(error).strip().splitlines()[-1][:120]}
                        finally:
                            shutil.rmtree(cache, ignore_errors=True)
                        if transport != "local":
                            got.update(server.ask("stats"))
                        cells.setdefault(key, []).append(got)
                        if "failed" not in got:
                            print(f"[{repeat}] {label} {transport} batch {batch}: {got['samples'] / got['read']:,.0f}/s "
                                  f"open {got['open']:.2f}s", file=sys.stderr, flush=True)
    finally:
        for service in (proxy, files, moto):
            service.stop()
    (workdir / "cells.json").write_text(json.dumps([[list(key), runs] for key, runs in cells.items()]))
    return _report(cells)


def _median(runs: list[dict], key) -> float:
    return statistics.median(key(run) for run in runs)


def _report(cells: dict) -> str:
    lines = [
        "## random access: wdsprep.MapDataset, LitData and MDS `dataset[i]`",
        "",
        f"{SAMPLES:,} samples (16 KiB float32 array + small dict) in shards or chunks of {SHARD_BYTES / 1e6:g} MB "
        "(wdsprep's from `wdsprep convert generic --codec none`, the peers' from their own writers); the same "
        f"random positions read in a fresh process per run ({READS['local']:,} locally, {READS['remote']:,} "
        "remotely), each decoded and checked to be the sample at its position; *batch*: positions per call "
        "(wdsprep: one `__getitems__`; the peers have no batched read: that many `ds[i]`); median of "
        f"{REPEATS} runs. Remote: bench_remote's shaped link ({RATE / 1e6:.0f} MB/s per connection, "
        f"{TOTAL / 1e6:.0f} MB/s in all, {LATENCY * 1000:.0f} ms before each first byte); LitData and MDS "
        "read S3 only, into an empty cache (they fetch whole chunks or shards). *requests/sample* and "
        "*wire KB/sample*: the server's count over the run, opening included. Command: "
        "`python benchmarks/run.py bench_random_access`.",
        "",
        "| reader | from | batch | open (s) | samples/s | requests/sample | wire KB/sample |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for (label, transport, batch), runs in cells.items():
        failures = [run["failed"] for run in runs if "failed" in run]
        runs = [run for run in runs if "failed" not in run]
        if not runs:
            lines.append(f"| {label} | {transport} | {batch} | failed: {failures[0]} ||||")
            continue
        rate = _median(runs, lambda r: r["samples"] / r["read"])
        remote = transport != "local"
        requests = f"{_median(runs, lambda r: r['requests'] / r['samples']):.2f}" if remote else "-"
        wire = f"{_median(runs, lambda r: r['sent'] / r['samples'] / 1e3):,.1f}" if remote else "-"
        lines.append(f"| {label} | {transport} | {batch} | {_median(runs, lambda r: r['open']):.2f} | {rate:,.0f} "
                     f"| {requests} | {wire} |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    bench_remote.main(child, run)
