"""Batches from DataLoader workers: wdsprep.Loader against LitData and against the transfer's floor.

The samples of bench_peers.py (W1 a 16 KiB float32 array + a small dict, W2 1 MiB + dict, W3 256 B +
dict), written as files in the `generic` layout and converted by the command line (`wdsprep convert
generic FILES OUT --codec none`); LitData's written by its own writer. Read through DataLoader
workers (1, 2, 4), batch 64, unshuffled and shuffled (wdsprep: shard permutation + `shuffle_buffer=1000`;
LitData `shuffle=True`), with the Loader's own collate and with `collate_fn=torch.utils.data.
default_collate` (LitData's StreamingDataLoader collates with default_collate either way, so one
LitData run serves both rows).

Systems: `wdsprep` (the Loader as users get it: batches through its ring of shared-memory slabs,
stream/slabs.py), `wdsprep, torch transfer` (the same with `slabs=0`: torch's own transfer, what
the Loader did before), `litdata`, and two floors: a minimal worker that yields pre-made batches
(the workload's array stacked, the dicts, the keys; nothing read) through the same ring
(`floor`) and through torch's transfer (`floor, torch transfer`). CPU is the measured loop's
user+system time of the process and its workers, each run in a fresh process, systems interleaved,
best of the repeats; ratios compare numbers of this one run.
"""
from __future__ import annotations

import itertools
import json
import pathlib
import shutil
import subprocess
import sys
import time

import bench_peers
from _smoke import sized

WORKLOADS = {  # name -> (float32 elements, samples)
    "W1": (4096, sized(10_000, 256)),
    "W2": (262_144, sized(256, 16)),
    "W3": (64, sized(20_000, 256)),
}
WORKERS = (1, 2, 4)
COLLATES = ("loader", "default_collate")
SHUFFLES = (False, True)
REPEATS = sized(2, 1)
BATCH = 64
SHUFFLE_BUFFER = 1000


# ------------------------------------------------------------------------------------------ readers
def _wdsprep(directory: str, workers: int, collate: str, shuffle: bool, slabs: int | None):
    import wdsprep
    from torch.utils.data import default_collate

    dataset = wdsprep.dataset(str(pathlib.Path(directory, "manifest.json")), "train", seed=0, shuffle_shards=shuffle,
                              shuffle_buffer=SHUFFLE_BUFFER if shuffle else 0, equalize=None)
    options = {"collate_fn": default_collate} if collate == "default_collate" else {}
    return wdsprep.Loader(dataset.compose(wdsprep.decode(strip=True)), batch_size=BATCH, num_workers=workers,
                          slabs=slabs, **options)


def _litdata(directory: str, workers: int, collate: str, shuffle: bool):
    from litdata import StreamingDataLoader, StreamingDataset

    return StreamingDataLoader(StreamingDataset(directory, shuffle=shuffle, seed=0), batch_size=BATCH,
                               num_workers=workers)


def _floor(elements: int, samples: int, workers: int, ring: bool):
    """Pre-made batches from a minimal worker, through the Loader's ring or through torch's transfer."""
    import numpy as np
    import torch

    from wdsprep.stream.slabs import SlabRing

    # made once, before the clock starts; forked workers inherit them
    array = np.random.default_rng(0).standard_normal((BATCH, elements)).astype(np.float32)
    metas = [{"index": i, "label": i % 10, "name": f"s{i}"} for i in range(BATCH)]
    keys = [f"s{i:07d}" for i in range(BATCH)]

    class Premade(torch.utils.data.IterableDataset):
        def __init__(self, ring):
            self.ring = ring

        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            batches = -(-samples // BATCH)
            write = self.ring.writer(info.id).write if self.ring is not None else None
            for _ in range(info.id, batches, info.num_workers):
                batch = {"__key__": keys, "array": array, "meta": metas}
                yield write(batch) if write is not None else (batch, None)

    def batches():  # a pass, as the Loader's: a new ring and new workers when iterated
        slab_ring = SlabRing(workers, 4) if ring else None
        convert = torch.utils.data.default_convert
        loader = torch.utils.data.DataLoader(Premade(slab_ring), batch_size=None, num_workers=workers,
                                             collate_fn=lambda item: item if item[1] is not None else (convert(item[0]), None))
        for payload, slab in loader:
            yield slab_ring.read(payload, slab) if slab is not None else payload

    return batches()  # what is imported and defined above is ready before the clock starts


def child(job: dict) -> dict:
    system, workers = job["system"], job["workers"]
    if system == "litdata":
        loader = _litdata(job["directory"], workers, job["collate"], job["shuffle"])
    elif system.startswith("floor"):
        loader = _floor(job["elements"], job["samples"], workers, ring=system == "floor")
    else:
        loader = _wdsprep(job["directory"], workers, job["collate"], job["shuffle"], 0 if system == "wdsprep-torch" else None)
    cpu, wall = bench_peers._cpu(), time.perf_counter()
    count = 0
    for batch in loader:
        count += len(batch["array"])
    wall = time.perf_counter() - wall
    del loader
    cpu = bench_peers._cpu() - cpu
    return {"samples": count, "rate": count / wall, "cpu_us": cpu / max(count, 1) * 1e6}


def _spawn(job: dict) -> dict:
    result = subprocess.run([sys.executable, __file__, "child", json.dumps(job)], capture_output=True, text=True,
                            timeout=1800, env=bench_peers._child_env())
    if result.returncode != 0:
        return {"error": ((result.stderr.strip().splitlines() or ["no output"])[-1])[:120]}
    return json.loads(result.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------ the run
SYSTEMS = ("wdsprep", "wdsprep-torch", "litdata", "floor", "floor-torch")
NAMES = {"wdsprep": "wdsprep", "wdsprep-torch": "wdsprep, torch transfer", "litdata": "LitData",
         "floor": "floor", "floor-torch": "floor, torch transfer"}


def _jobs(workload: str, elements: int, samples: int, workdir: pathlib.Path):
    """(key, job) of every measurement of one workload, in one interleaved round."""
    for workers, shuffle in itertools.product(WORKERS, SHUFFLES):
        for collate in COLLATES:
            for system in ("wdsprep", "wdsprep-torch"):
                yield (workload, workers, shuffle, collate, system), {
                    "system": system, "workers": workers, "collate": collate, "shuffle": shuffle,
                    "directory": str(workdir / workload / "wdsprep")}
        yield (workload, workers, shuffle, "any", "litdata"), {
            "system": "litdata", "workers": workers, "collate": "default_collate", "shuffle": shuffle,
            "directory": str(workdir / workload / "litdata")}
    for workers in WORKERS:
        for system in ("floor", "floor-torch"):
            yield (workload, workers, None, "any", system), {"system": system, "workers": workers,
                                                            "elements": elements, "samples": samples}


def run(workdir: pathlib.Path) -> str:
    missing = bench_peers._available("litdata")
    results: dict = {}
    for workload, (elements, samples) in WORKLOADS.items():
        files = workdir / workload / "files"
        for name in ("files", "wdsprep", "litdata"):
            shutil.rmtree(workdir / workload / name, ignore_errors=True)
        bench_peers.write_files(files, elements, samples)
        bench_peers.convert_files(str(files), str(workdir / workload / "wdsprep"), bench_peers.DEFAULT_SHARD_BYTES)
        if not missing:
            subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import bench_peers; "
                            "bench_peers._write_litdata(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))",
                            str(pathlib.Path(__file__).parent), str(workdir / workload / "litdata"), str(elements),
                            str(samples)], check=True, env=bench_peers._child_env())
        for _ in range(REPEATS):
            for key, job in _jobs(workload, elements, samples, workdir):
                if missing and job["system"] == "litdata":
                    results[key] = {"error": missing}
                    continue
                bench_peers._best(results, key, _spawn(job), "cpu_us")
        shutil.rmtree(files, ignore_errors=True)
    return _table(results, missing)


def _us(result: dict | None) -> str:
    return f"{result['cpu_us']:.1f}" if result and "cpu_us" in result else "n/a"


def _over(ours: dict | None, theirs: dict | None) -> str:
    if ours and "cpu_us" in ours and theirs and "cpu_us" in theirs:
        return f"{ours['cpu_us'] / theirs['cpu_us']:.2f}"
    return "n/a"


def _table(results: dict, missing: str | None) -> str:
    lines = [
        "## workers: wdsprep.Loader's batches from DataLoader workers, against LitData and the transfer's floor",
        "",
        "Shards made by `wdsprep convert generic FILES OUT --codec none` (LitData's by its writer); batch "
        f"{BATCH}; shuffled = wdsprep's shard permutation + `shuffle_buffer={SHUFFLE_BUFFER}`, LitData `shuffle=True`. "
        "`collate`: the Loader's own (webdataset's default collation) or `torch.utils.data.default_collate`; LitData "
        "collates with default_collate in both rows. `wdsprep`: the Loader as shipped (its ring of shared-memory "
        "slabs); `torch transfer`: the same with `slabs=0`. `floor`: a minimal worker yielding pre-made batches "
        "through the same ring (and through torch's transfer). CPU µs per sample of the process and its workers, "
        f"best of {REPEATS} interleaved runs, each in a fresh process. "
        f"W1: 16 KiB float32 + dict ({WORKLOADS['W1'][1]:,} samples), W2: 1 MiB + dict ({WORKLOADS['W2'][1]:,}), "
        f"W3: 256 B + dict ({WORKLOADS['W3'][1]:,}). Goals: wdsprep ÷ LitData ≤ 0.7 on W1 and W3, ≤ 1.0 on W2; "
        "wdsprep ÷ floor ≤ 1.3." + (f" LitData: {missing}." if missing else ""),
        "",
        "| workload | workers | shuffled | collate | wdsprep | wdsprep, torch transfer | LitData | floor | floor, torch transfer "
        "| wdsprep ÷ LitData | wdsprep ÷ floor |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for workload in WORKLOADS:
        for workers, shuffle, collate in itertools.product(WORKERS, SHUFFLES, COLLATES):
            ours = results.get((workload, workers, shuffle, collate, "wdsprep"))
            torch_transfer = results.get((workload, workers, shuffle, collate, "wdsprep-torch"))
            litdata = results.get((workload, workers, shuffle, "any", "litdata"))
            floor = results.get((workload, workers, None, "any", "floor"))
            floor_torch = results.get((workload, workers, None, "any", "floor-torch"))
            errors = [f"{NAMES[s]}: {r['error']}" for s, r in (("wdsprep", ours), ("wdsprep-torch", torch_transfer),
                                                                 ("floor", floor)) if r and "error" in r]
            lines.append(f"| {workload} | {workers} | {'yes' if shuffle else 'no'} | {collate} | {_us(ours)} | "
                         f"{_us(torch_transfer)} | {_us(litdata)} | {_us(floor)} | {_us(floor_torch)} | "
                         f"{_over(ours, litdata)} | {_over(ours, floor)} |" + (f" {'; '.join(errors)}" if errors else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "child":
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "src"))
        print(json.dumps(child(json.loads(sys.argv[2]))))
