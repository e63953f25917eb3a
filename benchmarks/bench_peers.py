"""Peers: wdsprep against LitData, MosaicML MDS and webdataset on the same samples, plus the floor.

Workloads: W1 a 16 KiB float32 array + a small dict, W2 a 1 MiB array + dict, W3 a 256 B array +
dict. wdsprep's datasets are what users get: the samples are written to disk as files in the
`generic` source's layout (`train/<key>.array.npy`, `train/<key>.meta.json`) and converted with
the `wdsprep convert` command line (`--codec none`), once at the default `--shard-bytes` and once
at a size at which the conversion's units outgrow their target, roll over and have their last two
shards balanced (the bench reads the manifest and says how many units were). The peers write the
same samples with their own writers (uncompressed). Each system reads them back the way it is used
for training: shuffled as it shuffles (wdsprep: per-epoch shard permutation + 1,000-sample block
shuffle; LitData `shuffle=True`; MDS `shuffle=True` (py1e); webdataset `shardshuffle=100` +
`.shuffle(1000)`), decoded to a numpy array and a dict, single process and through a 2-worker
DataLoader with batch 64. The floor is a minimal Python loop that yields one writable array and the
decoded dict per sample from precomputed offsets (`os.preadv` into a bytearray, `np.frombuffer`,
msgpack) over wdsprep's default-size shards -- no format, no checks.

Every measurement runs in its own process (so DataLoader workers and MDS's shared memory start
clean); CPU is the measured loop's user+system time of the process and its workers. Systems are
interleaved, repeated, best of the repeats; ratios compare numbers of this one run. Writes: CPU of
each system's writer in-process; for wdsprep also `ShardWriter` in-process (the writer under
`convert`, from the arrays in memory, like the peers) as well as the whole `wdsprep convert`
process (imports and reading the input files included). Requires the `bench` extra (`make bench`
installs it); a missing peer gets a row saying so.
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
SYSTEMS = ("floor", "wdsprep", "wdsprep-balanced", "litdata", "mds", "webdataset")
MODES = ("single", "2 workers")
REPEATS = sized(3, 1)
SHARD_BYTES = 64_000_000  # the peers' shard / chunk size
DEFAULT_SHARD_BYTES = "256MB"  # `wdsprep convert`'s default
# `--shard-bytes` at which the workload's units overrun their planned size (tar headers and padding
# are ~12% of W1's bytes and ~80% of W3's) and end in two balanced shards; W2's 1 MiB arrays are
# their own size on disk, so no size makes its units overrun
BALANCED_SHARD_BYTES = {"W1": sized("64MB", "1MB"), "W3": sized("13MB", "280KB")}
BATCH = 64


def _samples(elements: int, count: int):
    rng = np.random.default_rng(0)
    for i in range(count):
        yield i, rng.standard_normal(elements).astype(np.float32), {"index": i, "label": i % 10, "name": f"s{i}"}


# ------------------------------------------------------------------------------------------ writers
def write_files(directory: pathlib.Path, elements: int, count: int) -> None:
    """The samples as files in the generic source's layout: what `wdsprep convert generic` reads."""
    write_sample_files(directory, _samples(elements, count))


def write_sample_files(directory: pathlib.Path, samples, prefix: str = "s") -> None:
    """(number, array, meta) samples as `train/<prefix><number>.array.npy` + `.meta.json` files."""
    train = directory / "train"
    train.mkdir(parents=True)
    for i, array, meta in samples:
        np.save(train / f"{prefix}{i:07d}.array.npy", array)
        (train / f"{prefix}{i:07d}.meta.json").write_text(json.dumps(meta))


def convert_files(source: str, directory: str, shard_bytes: str) -> None:
    """`wdsprep convert generic` in its own process, as a user runs it."""
    command = [sys.executable, "-m", "wdsprep", "convert", "generic", source, directory,
               "--shard-bytes", shard_bytes, "--codec", "none", "--quiet"]
    result = subprocess.run(command, capture_output=True, text=True, env=_child_env())
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {result.stderr.strip()[-200:]}")


def _child_env() -> dict:
    src = str(pathlib.Path(__file__).resolve().parent.parent / "src")
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])))


def _write_shardwriter(directory: str, elements: int, count: int) -> None:
    from wdsprep.shards.codec import Encoder
    from wdsprep.shards.writer import ShardWriter

    with ShardWriter(directory, "train-00000", shard_bytes=SHARD_BYTES, encoder=Encoder("none")) as writer:
        for i, array, meta in _samples(elements, count):
            writer.write(f"s{i:07d}", {"array": array, "meta": meta})


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


WRITERS = {"wdsprep-shardwriter": _write_shardwriter, "litdata": _write_litdata, "mds": _write_mds, "webdataset": _write_webdataset}


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
    from wdsprep.stream.reading.read import load_index

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


LOADERS = {"floor": _floor_loader, "wdsprep": _wdsprep_loader, "wdsprep-balanced": _wdsprep_loader, "litdata": _litdata_loader,
           "mds": _mds_loader, "webdataset": _webdataset_loader}


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
    modules = {"wdsprep-shardwriter": ["wdsprep.shards.writer"], "litdata": ["litdata.streaming.writer"], "webdataset": ["webdataset"]}
    for module in modules.get(system, []):
        __import__(module)


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def child(job: dict) -> dict:
    """One measurement in this process: write (CPU s) or read (wall samples/s, CPU us/sample)."""
    if job["task"] == "write" and "shard_bytes" in job:  # the command line, files on disk -> shards
        start = _cpu()
        convert_files(job["input"], job["directory"], job["shard_bytes"])
        return {"cpu_s": _cpu() - start, **_shard_summary(job["directory"], job["shard_bytes"])}
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


def _shard_summary(directory: str, shard_bytes: str) -> dict:
    """Shards written, and the units whose last two shards were balanced (`balanced_units`: the
    second-to-last shard left room for the last one's first sample, which a writer that only rolls
    over never does)."""
    from wdsprep.sizes import parse_size
    from wdsprep.conformance import balanced_units

    rows = json.loads(pathlib.Path(directory, "manifest.json").read_text())["splits"]["train"]["shards"]
    return {"shards": len(rows), "balanced": len(balanced_units(pathlib.Path(directory), parse_size(shard_bytes))),
            "indexed": sum(row.get("index_offset") is not None for row in rows)}


def _available(system: str) -> str | None:
    module = {"litdata": "litdata", "mds": "streaming", "webdataset": "webdataset"}.get(system)
    if module is None:
        return None
    probe = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r}); "
                            f"import bench_peers; bench_peers._import_streaming() if {module!r} == 'streaming' else __import__({module!r})"],
                           capture_output=True, text=True)
    return None if probe.returncode == 0 else f"not installed (`make bench` installs the bench extra): {probe.stderr.strip().splitlines()[-1][:80]}"


def _best(table: dict, key, result: dict, measure: str) -> None:
    """Keep the lowest `measure` of the repeats (an error only where nothing else was measured)."""
    best = table.get(key)
    if best is None or "error" in best or ("error" not in result and result[measure] < best[measure]):
        table[key] = result


def _directory(workdir: pathlib.Path, workload: str, system: str) -> pathlib.Path:
    return workdir / workload / ("wdsprep" if system == "floor" else system)


def run(workdir: pathlib.Path) -> str:
    missing = {system: _available(system) for system in SYSTEMS}
    writes: dict = {}
    reads: dict = {}
    for workload, (elements, samples) in WORKLOADS.items():
        files = workdir / workload / "files"
        shutil.rmtree(files, ignore_errors=True)
        write_files(files, elements, samples)
        converts = {"wdsprep": DEFAULT_SHARD_BYTES}
        if workload in BALANCED_SHARD_BYTES:
            converts["wdsprep-balanced"] = BALANCED_SHARD_BYTES[workload]
        for repeat in range(REPEATS):  # writes too: interleaved, best of the repeats (the last one's shards are read)
            for system, shard_bytes in converts.items():
                directory = _directory(workdir, workload, system)
                shutil.rmtree(directory, ignore_errors=True)
                job = {"task": "write", "system": system, "directory": str(directory), "input": str(files), "shard_bytes": shard_bytes}
                _best(writes, (workload, system), _spawn(job), "cpu_s")
            for system in WRITERS:
                directory = _directory(workdir, workload, system)
                shutil.rmtree(directory, ignore_errors=True)
                if missing.get(system):
                    writes[workload, system] = {"error": missing[system]}
                    continue
                job = {"task": "write", "system": system, "directory": str(directory), "elements": elements, "samples": samples}
                _best(writes, (workload, system), _spawn(job), "cpu_s")
        shutil.rmtree(workdir / workload / "wdsprep-shardwriter", ignore_errors=True)  # written to be timed, not read
        for repeat in range(REPEATS):
            for mode in MODES:
                for system in SYSTEMS:  # interleaved: every system once per round
                    writer = "wdsprep" if system == "floor" else system
                    if missing[system] or (workload, writer) not in writes or "error" in writes[workload, writer]:
                        continue
                    job = {"task": "read", "system": system, "mode": mode, "directory": str(_directory(workdir, workload, system))}
                    result = _spawn(job)
                    if "rate" in result or (workload, mode, system) not in reads:
                        _best(reads, (workload, mode, system), result, "cpu_us")
    return _table(writes, reads, missing)


def _fmt(result: dict | None, key: str, spec: str) -> str:
    if not result or "error" in result:
        return "n/a"
    return format(result[key], spec)


NAMES = {"wdsprep": f"wdsprep (`convert`, --shard-bytes {DEFAULT_SHARD_BYTES})", "wdsprep-balanced": "wdsprep (`convert`, balanced: --shard-bytes {})"}


def _name(system: str, workload: str) -> str:
    return NAMES.get(system, system).format(BALANCED_SHARD_BYTES.get(workload))


def _ratio(ours: dict | None, theirs: dict | None) -> str:
    if ours and "cpu_us" in ours and theirs and "cpu_us" in theirs:
        return f"{ours['cpu_us'] / theirs['cpu_us']:.2f}"
    return "n/a"


def _table(writes: dict, reads: dict, missing: dict) -> str:
    lines = [
        "## peers: wdsprep, LitData, MosaicML MDS, webdataset (and the floor)",
        "",
        "The same samples for every system. wdsprep's: written as files (`train/<key>.array.npy` + `<key>.meta.json`, "
        "the generic source's layout) and converted by the command line, `wdsprep convert generic FILES OUT --codec none`, "
        f"at the default `--shard-bytes {DEFAULT_SHARD_BYTES}` and at a size at which the conversion's units overrun "
        "their target, roll over and end in two balanced shards (W2's 1 MiB arrays never overrun: no such size). "
        "The peers': their own writers (uncompressed). Read back shuffled as each does it for training, decoded to an "
        "array + dict, from local disk (page cache). "
        f"W1: 16 KiB float32 + dict ({WORKLOADS['W1'][1]:,} samples), W2: 1 MiB + dict ({WORKLOADS['W2'][1]:,}), "
        f"W3: 256 B + dict ({WORKLOADS['W3'][1]:,}). Each cell: best of {REPEATS} interleaved runs, each in a fresh "
        "process; CPU counts the process and its DataLoader workers. Ratios: wdsprep's CPU / that system's CPU.",
        "",
        "wdsprep's conversions (shards; units whose last two shards were balanced; shards with their index):",
        "",
        "| workload | --shard-bytes | shards | balanced units | shards with an index |",
        "|---|---|---:|---:|---:|",
    ]
    for workload in WORKLOADS:
        for system in ("wdsprep", "wdsprep-balanced"):
            result = writes.get((workload, system))
            if result and "shards" in result:
                size = DEFAULT_SHARD_BYTES if system == "wdsprep" else BALANCED_SHARD_BYTES[workload]
                lines.append(f"| {workload} | {size} | {result['shards']} | {result['balanced']} | {result['indexed']} |")
    lines += ["", "wdsprep ÷ LitData, CPU per sample (the goal: at most 0.8 on W1 and W3):", "",
              "| workload | mode | " + f"--shard-bytes {DEFAULT_SHARD_BYTES} | balanced |", "|---|---|---:|---:|"]
    for workload in WORKLOADS:
        for mode in MODES:
            theirs = reads.get((workload, mode, "litdata"))
            cells = [_ratio(reads.get((workload, mode, system)), theirs) for system in ("wdsprep", "wdsprep-balanced")]
            lines.append(f"| {workload} | {mode} | {cells[0]} | {cells[1] if workload in BALANCED_SHARD_BYTES else '—'} |")
    lines += ["", "| workload | mode | system | samples/s (wall) | CPU µs/sample | wdsprep (default size) ÷ this | wdsprep (balanced) ÷ this |",
              "|---|---|---|---:|---:|---:|---:|"]
    for workload in WORKLOADS:
        for mode in MODES:
            ours = [reads.get((workload, mode, system)) for system in ("wdsprep", "wdsprep-balanced")]
            for system in SYSTEMS:
                if system == "wdsprep-balanced" and workload not in BALANCED_SHARD_BYTES:
                    continue
                result = reads.get((workload, mode, system))
                note = missing.get(system) or (result or {}).get("error") or ""
                name = _name(system, workload) + (f" ({note})" if note and not (result and "rate" in result) else "")
                balanced = _ratio(ours[1], result) if workload in BALANCED_SHARD_BYTES else "—"
                lines.append(f"| {workload} | {mode} | {name} | {_fmt(result, 'rate', ',.0f')} | {_fmt(result, 'cpu_us', '.1f')} "
                             f"| {_ratio(ours[0], result)} | {balanced} |")
    writers = ("wdsprep-shardwriter", "litdata", "mds", "webdataset")
    lines += ["", f"Conversion: CPU seconds per 1,000 samples, best of {REPEATS} interleaved runs. Each system's writer in-process, "
              "uncompressed, from the arrays in memory (wdsprep: `ShardWriter`, the writer `convert` uses); and the whole "
              f"`wdsprep convert` command from the files (process start, imports and reading the input included), at --shard-bytes {DEFAULT_SHARD_BYTES}.",
              "", "| workload | wdsprep ShardWriter | " + " | ".join(writers[1:]) + " | wdsprep convert (whole command) |",
              "|---|" + "---:|" * (len(writers) + 1)]
    for workload, (_, samples) in WORKLOADS.items():
        cells = [_fmt({"v": writes[workload, s]["cpu_s"] / samples * 1000} if "cpu_s" in writes.get((workload, s), {}) else None, "v", ".3f")
                 for s in (*writers, "wdsprep")]
        lines.append(f"| {workload} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "child":
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "src"))
        print(json.dumps(child(json.loads(sys.argv[2]))))
