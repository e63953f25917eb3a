"""A million shards: manifest load, len(), first sample and memory as the shard count grows, locally
and over HTTP, and a simulated multi-node start (issue 40).

The data. `wdsprep convert generic --shard-bytes 200KB` (the CLI) of 1,000 generic samples (16 KiB
float32 array + a small dict each) gives B shards of 10 samples. A dataset of S shards is made from
it by replication: shard i is a hard link to base shard i mod B under the name `train-<i>-00.tar`,
its row that base shard's row (samples, bytes, sha256, index fields) under its own name and unit;
the split's shard table is written by `shardtable.encode_columns` from those columns, and
manifest.json as a conversion writes it (`Manifest.write`'s rule: rows inline too up to 1,000
shards, version 1; above, only the table, version 2). For comparison, "inline" rows are the
same datasets with every row inline in manifest.json (version 1, what wdsprep wrote before; still
read), up to 10^5 shards.

Each number comes from a fresh process (`python bench_manifest_scale.py child ...`), median of
`REPEATS`: load = `wdsprep.dataset(url, "train")` (manifest.json read, table mapped and its sha256
checked, catalog planned); len() = `len(dataset)`; first sample = `next(iter(dataset))` of rank 0
and rank R-1 of R ranks; RSS = the process's peak (ru_maxrss) and its private anonymous memory
(VmHWM of /proc/self/status, and Private_Dirty of /proc/self/smaps_rollup) after load, len and a
first sample, the private memory less the same
process's before `wdsprep.dataset` was called (torch and wdsprep imported); PSS = the proportional
set size of the main process and its 8 `wdsprep.Loader` workers (fork) together after each
worker's first batch. Over HTTP (`python -m wdsprep.testing http`, its own process): the requests
and bytes the server answered before the first sample of rank R-1 of R = 512.

Multi-node: N processes started at once with RANK/WORLD_SIZE (no torchrun), grouped into nodes of 8
that share a node-local `table_cache_dir`, each loading the manifest over HTTP and taking its first
sample; reported: the server's requests and bytes in all, per process, and each process's wall time
to its first sample, peak RSS and private memory (max over processes).
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

from _smoke import sized
from bench_tiny_shards import _ask, _server  # the test http server in its own process

SCALES = sized([10**3, 10**4, 10**5, 10**6], [10**3, 10**4])
INLINE_SCALES = sized([10**3, 10**4, 10**5], [10**3])
WORLDS = sized([8, 512, 65536], [8, 64])
REPEATS = sized(3, 1)
NODE_PROCESSES = sized(32, 8)
PER_NODE = 8
BASE_SAMPLES = 1000
HERE = pathlib.Path(__file__).resolve()


# ------------------------------------------------------------------------------------------ data
def make_base(work: pathlib.Path) -> pathlib.Path:
    out = work / "base"
    if (out / "manifest.json").exists():
        return out
    from wdsprep.sources.generic.synth import synth

    synth(str(work / "base-in"), 0, splits={"train": BASE_SAMPLES})
    subprocess.run([sys.executable, "-m", "wdsprep", "convert", "generic", str(work / "base-in"), str(out),
                    "--shard-bytes", "200KB", "--quiet"], check=True)
    return out


def make_scaled(base: pathlib.Path, root: pathlib.Path, count: int, inline: bool) -> pathlib.Path:
    """S = `count` shards replicated from `base` (see the module docstring)."""
    import numpy as np

    from wdsprep.shards import shardtable
    from wdsprep.shards.manifest import INLINE_SHARDS

    if (root / "manifest.json").exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((base / "manifest.json").read_text())
    rows = manifest["splits"]["train"]["shards"]
    picks = np.arange(count) % len(rows)
    for i, pick in enumerate(picks):
        os.link(base / rows[pick]["name"], root / f"train-{i:05d}-00.tar")
    column = lambda name, dtype: np.array([row[name] for row in rows], dtype=dtype)[picks]
    columns = {"name_unit": np.arange(count, dtype="<u4"), "name_part": np.zeros(count, "<u2"),
               "samples": column("samples", "<u8"), "bytes": column("bytes", "<u8"),
               "sha256": np.array([list(bytes.fromhex(row["sha256"])) for row in rows], dtype=np.uint8)[picks],
               "index_bytes": column("index_bytes", "<u4"),
               "index_digest": np.array([int(row["index_digest"][8:], 16) for row in rows], dtype="<u8")[picks]}
    names = [f"train-{i:05d}-00.tar" for i in range(count)]
    digest = shardtable.rows_digest({"name": n, "samples": int(s), "sha256": bytes(h).hex()}
                                    for n, s, h in zip(names, columns["samples"], columns["sha256"]))
    data = shardtable.encode_columns("train", columns, digest=digest, unit_from_name=True)
    (root / "train.shards").write_bytes(data)
    split = {"samples": int(columns["samples"].sum()), "bytes": int(columns["bytes"].sum())}
    manifest["tables"].pop("sample_tables", None)
    manifest["tables"]["shard_tables"] = {"train": shardtable.entry_for("train", data, count)}
    manifest["splits"] = {"train": {**split, "shards": count}}
    manifest["totals"] = {**split, "shards": count}
    if inline or count <= INLINE_SHARDS:
        manifest["manifest_version"] = 1
        manifest["splits"]["train"]["shards"] = [
            {"name": n, "samples": int(s), "bytes": int(b), "sha256": bytes(h).hex(), "unit": i,
             "index_offset": int(b) - int(x) - 1024, "index_bytes": int(x), "index_digest": f"xxh3_64:{int(d):016x}"}
            for i, (n, s, b, h, x, d) in enumerate(zip(names, columns["samples"], columns["bytes"], columns["sha256"],
                                                       columns["index_bytes"], columns["index_digest"]))]
    else:
        manifest["manifest_version"] = 2
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return root


# ----------------------------------------------------------------------------------- measurement
def _memory() -> dict:
    fields = {}
    with open("/proc/self/smaps_rollup") as file:
        for line in file:
            parts = line.split()
            if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                fields[parts[0][:-1]] = int(parts[1]) * 1024
    return fields


def _peak_rss() -> int:
    """This process's peak RSS since its exec (VmHWM; ru_maxrss would carry the parent's over exec)."""
    with open("/proc/self/status") as file:
        for line in file:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _pss_of(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as file:
        for line in file:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def child(args: dict) -> dict:
    """One fresh process's measurement (run as `python bench_manifest_scale.py child JSON`)."""
    import torch  # noqa: F401  (imported before the baseline, as a training script has it)
    import webdataset  # noqa: F401

    import wdsprep
    import wdsprep.stream.dataset  # noqa: F401  (what wdsprep.dataset imports on first use: not timed)
    import wdsprep.stream.reading.readahead  # noqa: F401

    before = _memory()
    options = dict(args.get("options", {}))
    started = time.perf_counter()
    dataset = wdsprep.dataset(args["url"], "train", **options)
    loaded = time.perf_counter()
    length = len(dataset)
    counted = time.perf_counter()
    result = {"load": loaded - started, "len": counted - loaded, "length": length}
    if args.get("first", True):
        next(iter(dataset))
        result["first"] = time.perf_counter() - counted
        result["load_first"] = time.perf_counter() - started
    after = _memory()
    result["private"] = after.get("Private_Dirty", 0) - before.get("Private_Dirty", 0)
    result["peak_rss"] = _peak_rss()
    result["rss_before"] = before.get("Rss", 0)
    if args.get("workers"):
        result["pss"] = _loader_pss(dataset, args["workers"])
    return result


def _loader_pss(dataset, workers: int) -> int:
    """PSS of this process and its Loader workers after each worker's first batch."""
    import wdsprep

    loader = wdsprep.Loader(dataset, batch_size=2, num_workers=workers, persistent_workers=True)
    iterator = iter(loader)
    for _ in range(workers):
        next(iterator)
    children = set()
    for task in os.listdir(f"/proc/{os.getpid()}/task"):
        with open(f"/proc/{os.getpid()}/task/{task}/children") as file:
            children.update(int(pid) for pid in file.read().split())
    total = _pss_of(os.getpid()) + sum(_pss_of(pid) for pid in children)
    del iterator
    return total


def measure(args: dict, repeats: int = REPEATS) -> dict:
    results = []
    for _ in range(repeats):
        done = subprocess.run([sys.executable, str(HERE), "child", json.dumps(args)], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-3000:])
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {key: statistics.median(r[key] for r in results) for key in results[0]}


def multi_node(root: pathlib.Path, work: pathlib.Path, processes: int) -> dict:
    """N rank processes at once over HTTP, nodes of PER_NODE sharing a table cache."""
    server, url = _server(root)
    try:
        _ask(server, "clear")
        cache = work / "node-caches"
        shutil.rmtree(cache, ignore_errors=True)  # every node starts without the table
        children = []
        started = time.perf_counter()
        for rank in range(processes):
            options = {"table_cache_dir": str(cache / f"node{rank // PER_NODE}")}
            env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(processes)}
            children.append(subprocess.Popen([sys.executable, str(HERE), "child",
                                               json.dumps({"url": url + "/manifest.json", "options": options})],
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
        outputs = [child.communicate() for child in children]
        wall = time.perf_counter() - started
        for child, (out, err) in zip(children, outputs):
            if child.returncode != 0:
                raise RuntimeError(err[-3000:])
        results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
        stats = _ask(server, "stats")
    finally:
        server.stdin.close()
        server.wait()
    return {"processes": processes, "wall": wall, "stats": stats,
            "load_first": max(r["load_first"] for r in results), "load_first_median": statistics.median(r["load_first"] for r in results),
            "peak_rss": max(r["peak_rss"] for r in results), "private": max(r["private"] for r in results)}


def http_first(root: pathlib.Path, world: int) -> dict:
    server, url = _server(root)
    try:
        out = {}
        for rank in (0, world - 1):
            _ask(server, "clear")
            measure({"url": url + "/manifest.json", "options": {"rank": rank, "world_size": world}}, repeats=1)
            out[rank] = _ask(server, "stats")
    finally:
        server.stdin.close()
        server.wait()
    return out


# ---------------------------------------------------------------------------------------- report
def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


def run(work: pathlib.Path) -> str:
    base = make_base(work)
    lines = ["## manifest scale: a million shards (issue 40)", "",
             "`python benchmarks/run.py manifest_scale` (benchmarks/bench_manifest_scale.py): datasets of S shards of "
             "10 samples replicated from a CLI-converted generic dataset (hard links; the table written from its "
             "columns, see the module docstring); fresh processes, medians of "
             f"{REPEATS}; memory after load + len + one first sample, over the process's own baseline with torch "
             "and wdsprep imported.", "",
             "| shards (samples) | manifest | on disk / shard | load | `len()` | first sample r0 / rR-1 (R=" + "/".join(map(str, WORLDS)) + ") "
             "| load + first | peak RSS (its baseline) | private memory | PSS, main + 8 workers |",
             "|---|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    http_rows = []
    for inline in (False, True):
        for count in (INLINE_SCALES if inline else SCALES):
            root = make_scaled(base, work / f"{'inline' if inline else 'table'}-{count}", count, inline)
            disk = (root / "manifest.json").stat().st_size + ((root / "train.shards").stat().st_size if not inline else 0)
            url = str(root / "manifest.json")
            firsts = []
            for world in WORLDS:
                for rank in (0, world - 1):
                    firsts.append(measure({"url": url, "options": {"rank": rank, "world_size": world}})["first"])
            main = measure({"url": url, "options": {"rank": 0, "world_size": 8}, "workers": 8})
            version = json.loads((root / "manifest.json").read_text())["manifest_version"]
            kind = "inline rows (v1)" if version == 1 and (inline or count > 1000) else ("v1 + table" if version == 1 else "table (v2)")
            lines.append(f"| 10^{len(str(count)) - 1} ({count * 10:,}) | {kind} | {disk / count:.0f} B | {main['load']:.3f} s "
                         f"| {main['len']:.4f} s | " + " / ".join(f"{t:.3f}" for t in firsts) + " s "
                         f"| {main['load_first']:.3f} s | {_mb(main['peak_rss'])} ({_mb(main['rss_before'])}) "
                         f"| {_mb(main['private'])} | {_mb(main['pss'])} |")
            if not inline:
                for world in (WORLDS[1],):
                    got = http_first(root, world)
                    http_rows.append(f"| 10^{len(str(count)) - 1} | {world} | {got[0]['requests']} / {_mb(got[0]['sent'])} "
                                     f"| {got[world - 1]['requests']} / {_mb(got[world - 1]['sent'])} |")
    lines += ["", "Over HTTP (`python -m wdsprep.testing http`), everything the server answered before the first sample "
              "of one fresh rank process (manifest.json, the table, the first shards' index and bytes; read-ahead "
              "starts with the first shuffle block's pieces):", "",
              "| shards | R | rank 0: requests / bytes | rank R-1: requests / bytes |", "|---|---:|---:|---:|", *http_rows]
    biggest = work / f"table-{SCALES[-1]}"
    node = multi_node(biggest, work, NODE_PROCESSES)
    stats = node["stats"]
    lines += ["", f"Simulated multi-node start over HTTP: {node['processes']} processes at once (RANK/WORLD_SIZE, no "
              f"torchrun; nodes of {PER_NODE} sharing a `table_cache_dir`) over the {SCALES[-1]:,}-shard manifest, "
              "each loading it and taking its first sample, on this machine's cores:", "",
              "| processes | requests (per process) | bytes (per process) | load + first sample, median / slowest "
              "| peak RSS, max | private memory, max |", "|---:|---:|---:|---:|---:|---:|",
              f"| {node['processes']} | {stats['requests']} ({stats['requests'] / node['processes']:.1f}) "
              f"| {_mb(stats['sent'])} ({_mb(stats['sent'] / node['processes'])}) "
              f"| {node['load_first_median']:.2f} s / {node['load_first']:.2f} s | {_mb(node['peak_rss'])} | {_mb(node['private'])} |"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if sys.argv[1] == "child":
        print(json.dumps(child(json.loads(sys.argv[2]))))
