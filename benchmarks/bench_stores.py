"""Each object store scheme through its emulator against S3 (moto), on the same shards, one run.

The same generic shards are put in S3 (moto), GCS (fake-gcs-server), Azure (Azurite) and a Hub repo
(wdsprep.testing.HubServer), each reached through the same request-logging proxy (`RangeHTTPServer
(upstream=...)`) on 127.0.0.1, and read whole by `wdsprep.dataset(url).compose(wdsprep.decode())` in
a child process of its own (the reader's CPU is that process's, servers excluded). Reported per
scheme: samples/s, MB/s, the reader's CPU per sample and its ratio to S3's (the goal: within 10%),
and the GET requests per shard the proxy saw (manifest and tables excluded; a Hub LFS file is a
`resolve` redirect plus the storage's ranged GETs). The emulators differ in speed (moto and the Hub
endpoint are Python, fake-gcs-server Go, Azurite node), so samples/s compares servers as much as
clients; the CPU per sample and the requests per shard are the client's.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

from _smoke import sized

SAMPLES = int(os.environ.get("BENCH_STORES_SAMPLES", sized(3000, 60)))
REPEATS = sized(5, 1)


def child(url: str) -> None:
    """Read `url`'s train split whole 1 + REPEATS times, each pass a dataset made anew; print the
    fastest timed pass's seconds, the least CPU of the timed passes, and the first pass's CPU (it pays
    this process's one-time costs: imports, clients, credentials, the Hub's revision; not timed)."""
    import wdsprep

    passes = []
    for _ in range(1 + REPEATS):
        dataset = wdsprep.dataset(url, "train", shuffle_shards=False, equalize=None).compose(wdsprep.decode())
        wall, cpu = time.perf_counter(), time.process_time()
        count = sum(1 for _ in dataset)
        passes.append({"count": count, "seconds": time.perf_counter() - wall, "cpu": time.process_time() - cpu})
    first, timed = passes[0], passes[1:]
    print(json.dumps({"count": timed[0]["count"], "seconds": min(p["seconds"] for p in timed),
                      "cpu": min(p["cpu"] for p in timed), "first_cpu": first["cpu"], "passes": len(passes)}))


def _measure(url: str, env: dict) -> dict:
    script = pathlib.Path(__file__).resolve()
    result = subprocess.run([sys.executable, str(script), "child", url], capture_output=True, text=True,
                            env={**os.environ, **env}, cwd=script.parent, timeout=1800)
    if result.returncode != 0:
        raise RuntimeError(f"{url}: {result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def run(workdir: pathlib.Path) -> str:
    from wdsprep.conversion import convert
    from wdsprep.sources.generic import SOURCE
    from wdsprep.testing import AzuriteServer, GCSServer, HubServer, RangeHTTPServer, S3Server
    from wdsprep.upload import upload

    workdir = pathlib.Path(workdir) / "stores"
    shards = workdir / "shards"
    if not (shards / "manifest.json").exists():
        SOURCE.synth(str(workdir / "input"), seed=0, size="small", splits={"train": SAMPLES})
    manifest = convert("generic", str(workdir / "input"), str(shards), shard_bytes=sized("8MB", "400KB"))
    rows = manifest.shards("train")
    total_bytes = manifest.bytes("train")

    results = []
    with S3Server() as s3, GCSServer() as gcs, AzuriteServer() as azurite, HubServer() as hub:
        s3.create_bucket("bench")
        gcs.create_bucket("bench")
        azurite.create_container("bench")
        hub.create_repo("bench/stores")
        hub.upload_folder("bench/stores", shards, "generic")
        cases = [("S3 (moto)", s3.endpoint, lambda url: {**s3.env, "AWS_ENDPOINT_URL": url}, "s3://bench/generic"),
                 ("GCS (fake-gcs-server)", gcs.url, gcs.via, "gs://bench/generic"),
                 ("Azure (Azurite)", azurite.url, azurite.via, "az://bench/generic"),
                 ("Hub (wdsprep.testing)", hub.url, hub.via, "hf://datasets/bench/stores/generic")]
        for label, upstream, via, url in cases:
            with RangeHTTPServer(upstream=upstream) as proxy:
                env = via(proxy.url)
                if not url.startswith("hf://"):
                    saved = {name: os.environ.get(name) for name in env}
                    os.environ.update(env)
                    try:
                        upload(str(shards), url, workers=4, quiet=True)
                    finally:
                        for name, value in saved.items():
                            os.environ.pop(name) if value is None else os.environ.__setitem__(name, value)
                proxy.clear_log()
                measured = _measure(url, env)
                gets = [r for r in proxy.requests if r["method"] == "GET" and r["status"] in (200, 206, 302)
                        and (r["name"].endswith(".tar") or "lfs-objects" in r["name"])]
                measured["requests_per_shard"] = len(gets) / (measured["passes"] * len(rows))
                results.append((label, measured))

    s3_cpu = results[0][1]["cpu"] / results[0][1]["count"]
    lines = [
        "## stores",
        "",
        f"{SAMPLES} generic samples (16 KiB float32 array + small dict), {len(rows)} shards, {total_bytes / 1e6:.1f} MB, "
        f"the same shards in each store; `wdsprep.dataset(url).compose(wdsprep.decode())` in a child process, "
        f"a first pass (its process's one-time costs: imports, clients, credentials) then {REPEATS} timed passes, "
        "each of a dataset made anew: the fastest pass's rate, the least CPU of the timed passes, every store behind the same logging proxy on 127.0.0.1. samples/s depends on "
        "each emulator's own speed; CPU per sample (the reader's process only) and requests per shard are the client's.",
        "",
        "| store | samples/s | MB/s | reader CPU ms/sample | CPU ratio to S3 | GET requests per shard | first pass CPU ms/sample |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, measured in results:
        assert measured["count"] == SAMPLES, (label, measured)
        rate = measured["count"] / measured["seconds"]
        cpu = measured["cpu"] / measured["count"]
        lines.append(f"| {label} | {rate:,.0f} | {rate * total_bytes / SAMPLES / 1e6:,.1f} | {cpu * 1e3:.3f} | "
                     f"{cpu / s3_cpu:.2f} | {measured['requests_per_shard']:.1f} | "
                     f"{measured['first_cpu'] / measured['count'] * 1e3:.3f} |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "child":
        child(sys.argv[2])
    else:
        print(run(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "bench-work")))
