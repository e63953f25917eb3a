"""What a selection costs when a dataset is made: `wdsprep.dataset(..., select=/keys=/fraction=/limit=)`
and `wdsprep.MapDataset(..., select=)` over a split of 10^6 samples, against the same dataset made
without a selection.

The split: 10^6 samples written as files (`train/<key>.meta.json`, {"label": i % 10, "index": i}) and
converted by `wdsprep pipeline` (the command line; its spec names `index_fields = ["meta.label"]`)
into shards of 16 MB, so the conversion writes the split's sample table (keys + the label column)
beside the manifest. Each construction runs in a fresh process (imports before the clock), from local
disk and over HTTP through bench_remote's shaped link (the table is one request); reported: seconds
to construct (the manifest and, with a selection, the table read and the selection evaluated: what
every rank does once), the samples kept, the peak RSS of the process, and the table's size.
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
import time

import bench_remote
from _smoke import sized

SAMPLES = sized(1_000_000, 3_000)
SHARD_BYTES = sized("16MB", "100KB")
REPEATS = sized(3, 1)
RATE, TOTAL, LATENCY = 20e6, 200e6, 0.04
KEYS = len(range(0, SAMPLES, 7))  # keys= lists every seventh sample (all labels among them)
CASES = [  # (label, keywords); "keys" stands for the list of KEYS keys
    ("no selection", {}),
    ("select='meta.label == 3'", {"select": "meta.label == 3"}),
    (f"keys= ({KEYS:,} keys)", {"keys": "keys"}),
    ("fraction=0.1", {"fraction": 0.1}),
    ("limit=1000", {"limit": 1000}),
    ("keys + select + fraction + limit", {"keys": "keys", "select": "meta.label != 0", "fraction": 0.5, "limit": 1000}),
    ("MapDataset, no selection", {"map": True}),
    ("MapDataset, select='meta.label == 3'", {"map": True, "select": "meta.label == 3"}),
]


def key(i: int) -> str:
    return f"s{i:07d}"


# ------------------------------------------------------------------------------------------ child
def child(job: dict) -> dict:
    import wdsprep  # noqa: F401 (before the clock)
    import wdsprep.stream.dataset  # noqa: F401
    import wdsprep.stream.mapdataset  # noqa: F401

    options = dict(job["options"])
    if options.get("keys") == "keys":
        options["keys"] = [key(i) for i in range(0, SAMPLES, 7)]
    mapped = options.pop("map", False)
    start = time.perf_counter()
    if mapped:
        dataset = wdsprep.MapDataset(job["location"], "train", **options)
    else:
        dataset = wdsprep.dataset(job["location"], "train", **options)
    seconds = time.perf_counter() - start
    kept = len(dataset)
    return {"seconds": seconds, "kept": kept, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


# ------------------------------------------------------------------------------------------ parent
def _write(workdir: pathlib.Path) -> pathlib.Path:
    """The split converted once (kept between runs): returns the output folder."""
    output = workdir / f"data-{SAMPLES}" / "shards"
    if (output / ".done").exists():
        return output
    files = output.parent / "files"
    shutil.rmtree(output.parent, ignore_errors=True)
    (files / "train").mkdir(parents=True)
    for i in range(SAMPLES):
        (files / "train" / f"{key(i)}.meta.json").write_text(json.dumps({"label": i % 10, "index": i}))
    spec = output.parent / "spec.toml"
    spec.write_text(f'source = "generic"\ninput = {json.dumps(str(files))}\noutput = {json.dumps(str(output))}\n'
                    f'[convert]\nshard_bytes = "{SHARD_BYTES}"\nworkers = 2\nindex_fields = ["meta.label"]\n')
    src = str(pathlib.Path(__file__).resolve().parent.parent / "src")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, "-m", "wdsprep", "pipeline", str(spec), "--quiet"], capture_output=True,
                            text=True, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"wdsprep pipeline: {result.stderr.strip()[-300:]}")
    shutil.rmtree(files)
    (output / ".done").write_text("")
    return output


def run(workdir: pathlib.Path) -> str:
    workdir = pathlib.Path(workdir)
    started = time.perf_counter()
    output = _write(workdir)
    converted = time.perf_counter() - started
    manifest = json.loads((output / "manifest.json").read_text())
    table = manifest["tables"]["sample_tables"]["train"]
    files = bench_remote._Service("http", str(output))
    results: dict[tuple, list[dict]] = {}
    try:
        files.ask(f"shape {RATE} {TOTAL} {LATENCY} 0")
        for _ in range(REPEATS):
            for where in ("local", "http"):
                location = str(output) if where == "local" else f"{files.url}/manifest.json"
                for label, options in CASES:
                    got = bench_remote.run_child("bench_select.py", {"location": location, "options": options})
                    results.setdefault((where, label), []).append(got)
                    print(f"{where} {label}: {got['seconds']:.3f}s kept {got['kept']:,}", file=sys.stderr, flush=True)
    finally:
        files.stop()
    lines = [
        "## selection: its cost when a dataset is made",
        "",
        f"{SAMPLES:,} samples in {len(manifest['splits']['train']['shards'])} shards (`wdsprep pipeline`, generic, "
        f"`index_fields = [\"meta.label\"]`, shards of {SHARD_BYTES}); the split's sample table is "
        f"{table['bytes'] / 1e6:.1f} MB (keys + one integer column). Each construction in a fresh process "
        f"(imports before the clock), median of {REPEATS}; over HTTP through bench_remote's shaped link "
        f"({TOTAL / 1e6:.0f} MB/s, {LATENCY * 1000:.0f} ms before each first byte). *seconds*: `wdsprep.dataset(...)` "
        "or `wdsprep.MapDataset(...)` returning (manifest, table and the selection's evaluation: what each rank "
        "does once); *peak RSS*: of that process. The conversion took "
        f"{converted:.0f} s (0 when the data was kept from an earlier run). Command: "
        "`python benchmarks/run.py bench_select`.",
        "",
        "| from | dataset | kept | seconds | peak RSS (MB) |",
        "|---|---|---:|---:|---:|",
    ]
    for (where, label), runs in results.items():
        lines.append(f"| {where} | {label} | {runs[0]['kept']:,} | {statistics.median(r['seconds'] for r in runs):.3f} "
                     f"| {statistics.median(r['rss'] for r in runs) / 1e6:.0f} |")
    return "\n".join([*lines, ""])


if __name__ == "__main__":
    bench_remote.main(child, run)
