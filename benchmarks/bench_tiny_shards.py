"""Many one-sample shards read over HTTP against local disk: what a request per shard costs.

`wdsprep convert generic --shard-bytes 1KB` of N generic samples (a 16 KiB float32 array and a small
dict each) writes N shards of one sample (and says so in one warning line). They are read with
`wdsprep.dataset(url, "train")` at its defaults (32 Range requests at once in one process) from
local disk and from the Range-capable test server (`python -m wdsprep.testing http`, its own
process on 127.0.0.1), unshaped and with a 20 ms first byte per response; and, for comparison, the
same samples converted with `--shard-bytes 16MB`, from the same server. Reported per row: the
wall time of one pass, samples/s, the requests the server answered, the most it answered at once,
and its count of the client's sequential waits (`RangeHTTPServer.round_trips`: N for a client that
fetches one shard after the other).
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

from _smoke import sized
from _testserver import ask as _ask
from _testserver import server as _server

SAMPLES = int(os.environ.get("BENCH_TINY_SHARDS_SAMPLES", sized(20000, 200)))


def _pass(url: str) -> tuple[float, int]:
    import wdsprep

    dataset = wdsprep.dataset(url, "train", shuffle_shards=False, equalize=None)
    started = time.perf_counter()
    count = sum(1 for _ in dataset)
    return time.perf_counter() - started, count


def run(workdir: pathlib.Path) -> str:
    workdir = pathlib.Path(workdir) / "tiny-shards"
    native, shards, large = workdir / "input", workdir / "shards", workdir / "large"
    if not (shards / "manifest.json").exists():
        from wdsprep.sources.generic import SOURCE

        SOURCE.synth(str(native), seed=0, size="small", splits={"train": SAMPLES})
    warning = "none"
    for output, size in ((shards, "1KB"), (large, "16MB")):
        converted = subprocess.run([sys.executable, "-m", "wdsprep", "convert", "generic", str(native), str(output),
                                    "--shard-bytes", size, "--split", "train", "--workers", "2", "--quiet"],
                                   capture_output=True, text=True, check=True)
        if output == shards:
            warning = next((line for line in converted.stderr.splitlines() if line.startswith("wdsprep: warning:")), "none")
    assert len(list(shards.glob("*.tar"))) == SAMPLES
    large_shards = len(list(large.glob("*.tar")))

    rows = []
    seconds, count = _pass(str(shards))
    rows.append(("local disk", seconds, count, None))
    process, url = _server(workdir)
    try:
        for label, latency, where in (("HTTP (127.0.0.1)", 0.0, "shards"), ("HTTP, 20 ms to the first byte", 0.02, "shards"),
                                      (f"HTTP, the same samples in {large_shards} shard{'s' * (large_shards != 1)} of 16MB", 0.0, "large")):
            _ask(process, f"shape 0 0 {latency} 0")
            _ask(process, "clear")
            seconds, count = _pass(f"{url}/{where}/manifest.json")
            rows.append((label, seconds, count, _ask(process, "stats")))
    finally:
        process.stdin.close()
        process.wait(timeout=30)

    local = rows[0][1]
    lines = [
        "## tiny shards: one sample per shard over HTTP",
        "",
        f"{SAMPLES} generic samples (16 KiB float32 array + small dict) converted with `--shard-bytes 1KB`: "
        f"{SAMPLES} shards of one sample. `wdsprep.dataset(url, \"train\")` at its defaults (one process, 32 "
        "requests at once), one pass; the server is `python -m wdsprep.testing http` in its own process "
        "(Python's threading HTTP server: its CPU is part of the cost). Round trips: the client's sequential "
        "waits as the server saw them (one shard after the other would be one per shard).",
        "",
        "| read from | seconds | samples/s | requests | most at once | round trips | time ÷ local |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, seconds, count, stats in rows:
        assert count == SAMPLES, (label, count)
        served = ("", "", "") if stats is None else (f"{stats['requests']:,}", stats["peak_requests"], f"{stats['round_trips']:,}")
        lines.append(f"| {label} | {seconds:.2f} | {count / seconds:,.0f} | {served[0]} | {served[1]} | {served[2]} | "
                     f"{seconds / local:.1f} |")
    lines += ["", f"The conversion's warning: `{warning}`", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(run(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "bench-work")))
