"""Peers: wdsprep against LitData, MosaicML MDS and webdataset on the same samples, plus the floor.

Workloads: W1 a 16 KiB float32 array + a small dict, W2 a 1 MiB array + dict, W3 a 256 B array +
dict. Each system writes them with its own writer (uncompressed) and reads them back the way it is
used for training: shuffled as it shuffles (wdsprep: per-epoch shard permutation + 1,000-sample
block shuffle; LitData `shuffle=True`; MDS `shuffle=True` (py1e); webdataset `shardshuffle=100` +
`.shuffle(1000)`), decoded to a numpy array and a dict, single process and through a 2-worker
DataLoader with batch 64. The floor is a minimal Python loop that yields one writable array and the
decoded dict per sample from precomputed offsets (`os.preadv` into a bytearray, `np.frombuffer`,
msgpack) -- no format, no checks.

Every measurement runs in its own process (so DataLoader workers and MDS's shared memory start
clean); CPU is the measured loop's user+system time of the process and its workers. Systems are
interleaved, repeated, best of the repeats; ratios compare numbers of this one run. Requires the
`bench` extra (`make bench` installs it); a missing peer gets a row saying so.
"""
from __future__ import annotations

import json
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import time

import numpy as np

from _smoke import sized

WORKLOADS = {  # name -> (float32 elements, samples)
    "W1": (4096, sized(10_000, 300)),
    "W2": (262_144, sized(250, 12)),
    "W3": (64, sized(20_000, 300)),
}
SYSTEMS = ("floor", "wdsprep", "litdata", "mds", "webdataset")
MODES = ("single", "2 workers")
REPEATS = sized(3, 1)
SHARD_BYTES = 64_000_000
BATCH = 64


def _samples(elements: int, count: int):
    rng = np.random.default_rng(0)
    for i in range(count):
        yield i, rng.standard_normal(elements).astype(np.float32), {"index": i, "label": i % 10, "name": f"s{i}"}


# ------------------------------------------------------------------------------------------ writers
def _write_wdsprep(directory: str, elements: int, count: int) -> None:
    from wdsprep.shards.codec import Encoder
    from wdsprep.shards.manifest import Manifest
    from wdsprep.shards.writer import ShardWriter

    writer = ShardWriter(directory, "train-00000", shard_bytes=SHARD_BYTES, encoder=Encoder("none"))
    with writer:
        for i, array, meta in _samples(elements, count):
            writer.write(f"s{i:07d}", {"array": array, "meta": meta})
    manifest = Manifest("bench", {}, "", {"train": [row.as_dict() for row in writer.rows]})
    pathlib.Path(directory, "manifest.json").write_bytes(manifest.dumps())


def _write_litdata(directory: str, elements: int, count: int) -> None:
    from litdata.streaming.writer import BinaryWriter

    writer = BinaryWriter(directory, chunk_bytes=SHARD_BYTES)
    for i, array, meta in _samples(elements, count):
        writer.add_item(i, {"array": array, "meta": meta})
    writer.done()
    writer.merge()


def _write_mds(directory: str, elements: int, count: int) -> None:
    _import_streaming()
    from streaming import MDSWriter

    with MDSWriter(out=directory, columns={"array": "ndarray", "meta": "json"}, size_limit=SHARD_BYTES) as writer:
        for _, array, meta in _samples(elements, count):
            writer.write({"array": array, "meta": meta})


def _write_webdataset(directory: str, elements: int, count: int) -> None:
    import webdataset as wds

    with wds.ShardWriter(os.path.join(directory, "wds-%06d.tar"), maxsize=SHARD_BYTES, verbose=0) as sink:
        for i, array, meta in _samples(elements, count):
            sink.write({"__key__": f"s{i:07d}", "array.npy": array, "meta.mp": meta})


WRITERS = {"wdsprep": _write_wdsprep, "litdata": _write_litdata, "mds": _write_mds, "webdataset": _write_webdataset}


def _import_streaming():
    """mosaicml-streaming's package __init__ imports its vision datasets, hence torchvision; the only
    torchvision wheels would replace the pinned torch, and MDS's reader and writer never call it."""
    try:
        import torchvision  # noqa: F401
    except Exception:
        import importlib.machinery
        import types

        for name in ("torchvision", "torchvision.datasets", "torchvision.transforms", "torchvision.transforms.functional"):
            sys.modules[name] = types.ModuleType(name)
            sys.modules[name].__spec__ = importlib.machinery.ModuleSpec(name, None)
        sys.modules["torchvision.datasets"].VisionDataset = object
        sys.modules["torchvision.datasets"].CIFAR10 = object
        sys.modules["torchvision.transforms.functional"].to_tensor = None
    import streaming

    return streaming


# ------------------------------------------------------------------------------------------ readers
def _floor_items(directory: str, worker: int = 0, workers: int = 1):
    """One writable array and the decoded dict per sample, copied out of mapped shards at offsets
    computed beforehand: the least a Python loop can do (no format, no checks)."""
    import mmap

    import msgpack

    from wdsprep.shards.codec import npy_header_span, npy_meta
    from wdsprep.shards.manifest import Manifest
    from wdsprep.stream.read import load_index

    manifest = Manifest.loads(pathlib.Path(directory, "manifest.json").read_bytes())
    for row in manifest.splits["train"][worker::workers]:
        path = os.path.join(directory, row["name"])
        with open(path, "rb") as handle:
            index = load_index(path, row, handle.fileno())
            first = os.pread(handle.fileno(), 4096, 512)
            start, length = npy_header_span(first)
            dtype, shape, _, _ = npy_meta(bytes(first[start : start + length]))
            skip = start + length
            # precomputed, outside the loop, as flat lists of ints (no object per sample for the GC to track)
            a0s, a1s, m0s, m1s = [], [], [], []
            for i, offset in enumerate(index.offsets):
                array_size, meta_size = index.sizes[2 * i], index.sizes[2 * i + 1]  # members: array.npy, meta.mp
                meta_at = offset + 512 + array_size + (-array_size % 512) + 512
                a0s.append(offset + 512 + skip)
                a1s.append(offset + 512 + array_size)
                m0s.append(meta_at)
                m1s.append(meta_at + meta_size)
            with mmap.mmap(handle.fileno(), 0, prot=mmap.PROT_READ) as mapped:
                view = memoryview(mapped)
                for key, a0, a1, m0, m1 in zip(index.keys, a0s, a1s, m0s, m1s):
                    yield {"__key__": key, "array": np.frombuffer(bytearray(view[a0:a1]), dtype).reshape(shape),
                           "meta": msgpack.unpackb(view[m0:m1])}
                view.release()


def _floor_loader(directory: str, mode: str):
    import torch

    if mode == "single":
        return _floor_items(directory)

    class Floor(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            return _floor_items(directory, info.id, info.num_workers)

    return torch.utils.data.DataLoader(Floor(), batch_size=BATCH, num_workers=2)


def _wdsprep_loader(directory: str, mode: str):
    import wdsprep

    dataset = wdsprep.dataset(os.path.join(directory, "manifest.json"), "train", seed=0, shuffle_buffer=1000, equalize=None)
    if mode == "single":
        return dataset.compose(wdsprep.decode(strip=True))
    return wdsprep.Loader(dataset.compose(wdsprep.decode(strip=True)), batch_size=BATCH, num_workers=2)


def _litdata_loader(directory: str, mode: str):
    from litdata import StreamingDataLoader, StreamingDataset

    dataset = StreamingDataset(directory, shuffle=True, seed=0)
    return dataset if mode == "single" else StreamingDataLoader(dataset, batch_size=BATCH, num_workers=2)


def _mds_loader(directory: str, mode: str):
    _import_streaming()
    import torch
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    dataset = StreamingDataset(local=directory, shuffle=True, shuffle_seed=0, batch_size=BATCH)
    return dataset if mode == "single" else torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=2)


def _webdataset_loader(directory: str, mode: str):
    import webdataset as wds

    urls = sorted(str(p) for p in pathlib.Path(directory).glob("*.tar"))
    dataset = wds.WebDataset(urls, shardshuffle=100, seed=0, nodesplitter=wds.split_by_node, workersplitter=wds.split_by_worker, empty_check=False)
    dataset = dataset.shuffle(1000).decode()
    if mode == "single":
        return dataset
    return wds.WebLoader(dataset.batched(BATCH), batch_size=None, num_workers=2)


LOADERS = {"floor": _floor_loader, "wdsprep": _wdsprep_loader, "litdata": _litdata_loader, "mds": _mds_loader, "webdataset": _webdataset_loader}


def _count(item) -> int:
    """Samples in one item: a sample (its array is 1-D) or a batch (2-D)."""
    array = item.get("array", item.get("array.npy")) if isinstance(item, dict) else None
    if array is None:
        raise TypeError(f"unexpected item {type(item)}")
    return len(array) if array.ndim == 2 else 1


def _warm_imports(system: str) -> None:
    """Import the writer's modules before the clock starts (conversion time excludes imports)."""
    if system == "mds":
        _import_streaming()
    modules = {"wdsprep": ["wdsprep.shards.writer"], "litdata": ["litdata.streaming.writer"], "webdataset": ["webdataset"]}
    for module in modules.get(system, []):
        __import__(module)


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def child(job: dict) -> dict:
    """One measurement in this process: write (CPU s) or read (wall samples/s, CPU us/sample)."""
    if job["task"] == "write":
        os.makedirs(job["directory"], exist_ok=True)
        _warm_imports(job["system"])
        start = time.process_time()
        WRITERS[job["system"]](job["directory"], job["elements"], job["samples"])
        return {"cpu_s": time.process_time() - start}
    loader = LOADERS[job["system"]](job["directory"], job["mode"])
    cpu, wall = _cpu(), time.perf_counter()
    count = 0
    for item in loader:
        count += _count(item)
    wall = time.perf_counter() - wall
    del loader  # exhausted DataLoaders have joined their workers: their CPU is in RUSAGE_CHILDREN
    cpu = _cpu() - cpu
    return {"samples": count, "rate": count / wall, "cpu_us": cpu / max(count, 1) * 1e6}


def _spawn(job: dict) -> dict:
    result = subprocess.run([sys.executable, __file__, "child", json.dumps(job)], capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": last[:120]}
    return json.loads(result.stdout.strip().splitlines()[-1])


def _available(system: str) -> str | None:
    module = {"litdata": "litdata", "mds": "streaming", "webdataset": "webdataset"}.get(system)
    if module is None:
        return None
    probe = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r}); "
                            f"import bench_peers; bench_peers._import_streaming() if {module!r} == 'streaming' else __import__({module!r})"],
                           capture_output=True, text=True)
    return None if probe.returncode == 0 else f"not installed (`make bench` installs the bench extra): {probe.stderr.strip().splitlines()[-1][:80]}"


def run(workdir: pathlib.Path) -> str:
    missing = {system: _available(system) for system in SYSTEMS}
    writes: dict = {}
    reads: dict = {}
    for workload, (elements, samples) in WORKLOADS.items():
        for repeat in range(REPEATS):  # writes too: interleaved, best of the repeats (the last one's shards are read)
            for system in SYSTEMS[1:]:
                directory = workdir / workload / system
                shutil.rmtree(directory, ignore_errors=True)
                if missing[system]:
                    writes[workload, system] = {"error": missing[system]}
                    continue
                result = _spawn({"task": "write", "system": system, "directory": str(directory), "elements": elements, "samples": samples})
                best = writes.get((workload, system))
                if best is None or "error" in result or ("error" not in best and result["cpu_s"] < best["cpu_s"]):
                    writes[workload, system] = result
        for repeat in range(REPEATS):
            for mode in MODES:
                for system in SYSTEMS:  # interleaved: every system once per round
                    if missing[system] or "error" in writes.get((workload, "wdsprep" if system == "floor" else system), {}):
                        continue
                    directory = workdir / workload / ("wdsprep" if system == "floor" else system)
                    result = _spawn({"task": "read", "system": system, "mode": mode, "directory": str(directory)})
                    best = reads.get((workload, mode, system))
                    if best is None or "error" in best or ("rate" in result and result["cpu_us"] < best["cpu_us"]):
                        reads[workload, mode, system] = result
    return _table(writes, reads, missing)


def _fmt(result: dict | None, key: str, spec: str) -> str:
    if not result or "error" in result:
        return "n/a"
    return format(result[key], spec)


def _table(writes: dict, reads: dict, missing: dict) -> str:
    lines = [
        "## peers: wdsprep, LitData, MosaicML MDS, webdataset (and the floor)",
        "",
        "Same samples written by each system's own writer (uncompressed), read back shuffled as each does it "
        "for training, decoded to an array + dict, from local disk (page cache). "
        f"W1: 16 KiB float32 + dict ({WORKLOADS['W1'][1]:,} samples), W2: 1 MiB + dict ({WORKLOADS['W2'][1]:,}), "
        f"W3: 256 B + dict ({WORKLOADS['W3'][1]:,}). Each cell: best of {REPEATS} interleaved runs, each in a fresh "
        "process; CPU counts the process and its DataLoader workers. Ratios: wdsprep CPU / that system's CPU.",
        "",
        "| workload | mode | system | samples/s (wall) | CPU µs/sample | wdsprep CPU ÷ this |",
        "|---|---|---|---:|---:|---:|",
    ]
    for workload in WORKLOADS:
        for mode in MODES:
            ours = reads.get((workload, mode, "wdsprep"))
            for system in SYSTEMS:
                result = reads.get((workload, mode, system))
                note = missing.get(system) or (result or {}).get("error") or ""
                ratio = "n/a"
                if result and "cpu_us" in result and ours and "cpu_us" in ours:
                    ratio = f"{ours['cpu_us'] / result['cpu_us']:.2f}"
                name = system + (f" ({note})" if note and not (result and "rate" in result) else "")
                lines.append(f"| {workload} | {mode} | {name} | {_fmt(result, 'rate', ',.0f')} | {_fmt(result, 'cpu_us', '.1f')} | {ratio} |")
    lines += ["", f"Conversion: CPU seconds per 1,000 samples, each system's writer, in-process, uncompressed, best of {REPEATS} interleaved runs.", "",
              "| workload | " + " | ".join(SYSTEMS[1:]) + " |", "|---|" + "---:|" * len(SYSTEMS[1:])]
    for workload, (_, samples) in WORKLOADS.items():
        cells = [_fmt({"v": writes[workload, s]["cpu_s"] / samples * 1000} if "cpu_s" in writes.get((workload, s), {}) else None, "v", ".3f") for s in SYSTEMS[1:]]
        lines.append(f"| {workload} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "child":
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "src"))
        print(json.dumps(child(json.loads(sys.argv[2]))))
