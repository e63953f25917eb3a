"""Streaming throughput from object storage against local disk, same shards, one run.

Generic shards (a 16 KiB float32 array and a small dict per sample) are read with
`wdsprep.dataset(...).compose(wdsprep.decode())` from local disk, from an HTTP server (Range-capable,
`wdsprep.testing`) and from an S3-compatible server (moto), each server in a process of its own on
127.0.0.1. Reported: decoded samples/s and MB/s, and the ratio to local disk. Also the time of
`wdsprep upload` to the S3 server and of a re-run that finds everything there.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

from _smoke import sized

SAMPLES = int(os.environ.get("BENCH_OBJECTSTORE_SAMPLES", sized(3000, 60)))
REPEATS = sized(2, 1)


def _start(service: list[str], env: dict | None = None) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([sys.executable, "-m", "wdsprep.testing", *service], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, env=env)
    line = process.stdout.readline().split()
    if not line:
        process.kill()
        raise RuntimeError(f"test service {service} did not start")
    return process, line[0]


def _stop(process: subprocess.Popen) -> None:
    process.stdin.close()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()


def _rate(url: str) -> tuple[float, int]:
    """Best of REPEATS full passes: (samples/s, samples)."""
    import wdsprep

    best = 0.0
    count = 0
    for _ in range(REPEATS):
        dataset = wdsprep.dataset(url, "train", shuffle_shards=False, equalize=None).compose(wdsprep.decode())
        start = time.perf_counter()
        count = sum(1 for _ in dataset)
        best = max(best, count / (time.perf_counter() - start))
    return best, count


def run(workdir: pathlib.Path) -> str:
    from wdsprep.conversion import convert
    from wdsprep.sources.generic import SOURCE
    from wdsprep.testing.s3server import AWS_ENV
    from wdsprep.upload import upload

    workdir = pathlib.Path(workdir) / "objectstore"
    shards = workdir / "shards"
    if not (shards / "manifest.json").exists():
        SOURCE.synth(str(workdir / "input"), seed=0, size="small", splits={"train": SAMPLES})
        convert("generic", str(workdir / "input"), str(shards), shard_bytes="8MB")
    manifest = convert("generic", str(workdir / "input"), str(shards), shard_bytes="8MB")
    total_bytes = manifest.bytes("train")

    s3_process, endpoint = _start(["s3", "--bucket", "bench"])
    http_process, http_url = _start(["http", str(shards)])
    saved = {k: os.environ.get(k) for k in (*AWS_ENV, "AWS_ENDPOINT_URL")}
    os.environ.update(AWS_ENV)
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    try:
        started = time.perf_counter()
        report = upload(str(shards), "s3://bench/generic", workers=4)
        upload_seconds = time.perf_counter() - started
        started = time.perf_counter()
        again = upload(str(shards), "s3://bench/generic", workers=4)
        rerun_seconds = time.perf_counter() - started
        rows = []
        for label, url in (("local disk", str(shards)), ("HTTP (127.0.0.1)", http_url), ("S3 (moto, 127.0.0.1)", "s3://bench/generic")):
            rate, count = _rate(url)
            rows.append((label, rate, count))
    finally:
        _stop(s3_process)
        _stop(http_process)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    local = rows[0][1]
    lines = [
        "## objectstore",
        "",
        f"{SAMPLES} generic samples (16 KiB float32 array + small dict), {len(manifest.splits['train'])} shards, "
        f"{total_bytes / 1e6:.1f} MB; `wdsprep.dataset(url).compose(wdsprep.decode())`, one process, best of "
        f"{REPEATS} passes; servers in their own processes on 127.0.0.1 (moto is a Python emulator, so the S3 "
        "row measures our client path against a slow server, not AWS).",
        "",
        "| read from | samples/s | MB/s | ratio to local disk |",
        "|---|---:|---:|---:|",
    ]
    for label, rate, count in rows:
        assert count == SAMPLES, (label, count)
        lines.append(f"| {label} | {rate:,.0f} | {rate * total_bytes / SAMPLES / 1e6:,.1f} | {rate / local:.2f} |")
    lines += [
        "",
        f"`wdsprep upload` to the S3 server: {len(report.uploaded)} shards in {upload_seconds:.1f} s "
        f"(verified by re-reading); re-run: {len(again.skipped)} already there, {rerun_seconds:.2f} s.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(run(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "bench-work")))
