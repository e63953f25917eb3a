"""Voxels: ray chunks/s from shards (streaming stage and map-style) vs an upstream-style npz loader.

The baseline does what upstream `HierarchicalVoxelRayDataset` (voxel-dataset-generator HEAD) does per
`__getitem__`: ray files opened with `np.load(path, mmap_mode='r')` (ignored for .npz) and the
NpzFile kept open, so slicing `origins`/`directions`/`distances`/`hits`/`view_ids`/`face_ids` to the
chunk decompresses each whole array again; voxels from `np.load(...)['voxels']` behind a FIFO cache;
dense `(1, D, H, W)` float32 voxels, distances divided by the cube diagonal. Its index is built the
upstream way too (split filter from splits.json, one `np.load` per ray file for the ray count), but
only `__getitem__` is timed on either side. Same data, same chunking, same run, warm page cache.
Run alone: `python benchmarks/bench_voxels.py [WORKDIR]`.
"""
from __future__ import annotations

import json
import math
import pathlib
import sys
import time

import numpy as np
import torch

from _smoke import sized

RAYS_PER_CHUNK = 256
SYNTH = sized(dict(base_resolution=128, min_resolution=16, num_objects=7, samples_per_view=90),  # 1320 rays/subvolume
              dict(base_resolution=32, min_resolution=16, num_objects=2, samples_per_view=20))


class UpstreamStyleLoader:
    """The native-format baseline: upstream's sample collection, chunk index and __getitem__."""

    def __init__(self, dataset_dir: pathlib.Path, ray_dir: pathlib.Path, split: str, rays_per_chunk: int, cache_size=100):
        splits = json.loads((dataset_dir / "splits.json").read_text())
        object_ids = {o for o, s in splits["object_splits"].items() if s == split}
        usage, trivial = splits["hash_object_usage"], set(splits["trivial_hashes"])
        self.samples = []
        for ray_file in (ray_dir / "level_0").glob("**/*_rays.npz"):
            object_id = ray_file.stem[: -len("_rays")]
            if object_id in object_ids:
                voxel = dataset_dir / "objects" / f"object_{object_id}" / "level_0.npz"
                self.samples.append({"hash": f"object_{object_id}", "level": 0, "ray_path": ray_file, "voxel_path": voxel})
        for level_dir in sorted(ray_dir.glob("level_*")):
            level = int(level_dir.name.split("_")[1])
            if level == 0:
                continue
            for ray_file in level_dir.glob("**/*_rays.npz"):
                name = ray_file.stem[: -len("_rays")]
                if name in trivial or not any(o in object_ids for o in usage.get(name, {})):
                    continue
                voxel = dataset_dir / "subvolumes" / f"level_{level}" / name[:2] / f"{name}.npz"
                self.samples.append({"hash": name, "level": level, "ray_path": ray_file, "voxel_path": voxel})
        self.rays_per_chunk = rays_per_chunk
        self.chunks = []
        for number, sample in enumerate(self.samples):
            n = len(np.load(sample["ray_path"])["origins"])
            for start in range(0, n, rays_per_chunk):
                self.chunks.append((number, start, min(start + rays_per_chunk, n)))
        self.cache_size = cache_size
        self._voxels, self._order, self._rays = {}, [], {}

    def __len__(self):
        return len(self.chunks)

    def _load_voxels(self, path):
        key = str(path)
        if key in self._voxels:
            return self._voxels[key]
        voxels = np.load(path)["voxels"]
        self._voxels[key] = voxels
        self._order.append(key)
        if len(self._order) > self.cache_size:
            del self._voxels[self._order.pop(0)]
        return voxels

    def __getitem__(self, index):
        number, start, end = self.chunks[index]
        sample = self.samples[number]
        rays = self._rays.get(sample["ray_path"])
        if rays is None:
            rays = self._rays[sample["ray_path"]] = np.load(sample["ray_path"], mmap_mode="r")
        voxels = self._load_voxels(sample["voxel_path"])
        diag = math.sqrt(3 * (2.0 ** (7 - sample["level"])) ** 2)
        out = {
            "origins": torch.from_numpy(np.array(rays["origins"][start:end]).astype(np.float32)),
            "directions": torch.from_numpy(np.array(rays["directions"][start:end]).astype(np.float32)),
            "distances": torch.from_numpy(np.array(rays["distances"][start:end]).astype(np.float32)) / diag,
            "hits": torch.from_numpy(np.array(rays["hits"][start:end]).astype(np.float32)),
            "level": sample["level"],
            "hash": sample["hash"],
            "chunk_idx": start // self.rays_per_chunk,
            "voxels": torch.from_numpy(voxels.astype(np.float32)).unsqueeze(0),
        }
        if "view_ids" in rays:
            out["view_ids"] = torch.from_numpy(np.array(rays["view_ids"][start:end]))
        if "face_ids" in rays:
            out["face_ids"] = torch.from_numpy(np.array(rays["face_ids"][start:end]))
        return out


def _measure(loaders: dict, rounds: int = sized(3, 1)) -> dict:
    """Best wall and best CPU seconds per loader over `rounds` round-robin passes (the box is
    shared: interleaving spreads other load over all loaders, the best pass is the least disturbed)."""
    best = {name: [math.inf, math.inf, None] for name in loaders}
    for _ in range(rounds):
        for name, function in loaders.items():
            started, cpu = time.perf_counter(), time.process_time()
            result = function()
            wall, cpu = time.perf_counter() - started, time.process_time() - cpu
            entry = best[name]
            entry[0], entry[1], entry[2] = min(entry[0], wall), min(entry[1], cpu), result
    return best


def _drain(iterable) -> int:
    count = 0
    for sample in iterable:
        count += sample["origins"].shape[0] > 0
    return count


def run(workdir: pathlib.Path) -> str:
    import webdataset as wds

    import wdsprep
    from wdsprep.conversion import convert
    from wdsprep.sources.voxels import HierarchicalVoxelRayDataset, samples
    from wdsprep.sources.voxels.synth import synth

    workdir = pathlib.Path(workdir)
    native = workdir / "voxels-native"
    if not (native / "ray_dataset_hierarchical" / "processing_summary.json").exists():
        synth(str(native), 0, "small", **SYNTH)
    shards = workdir / "voxels-shards"
    manifest = convert("voxels", str(native), str(shards), shard_bytes="64MB")
    split = "train"

    baseline = UpstreamStyleLoader(native / "dataset", native / "ray_dataset_hierarchical", split, RAYS_PER_CHUNK)
    mapped = HierarchicalVoxelRayDataset(shards, split=split, rays_per_chunk=RAYS_PER_CHUNK)
    urls = wdsprep.urls(str(shards / "manifest.json"), split)
    assert len(baseline) == len(mapped), (len(baseline), len(mapped))
    chunks = len(mapped)
    order = np.random.default_rng(0).permutation(chunks).tolist()

    def fresh_baseline():  # caches start cold on both sides, as for a new epoch in a new worker
        baseline._voxels, baseline._order, baseline._rays = {}, [], {}
        return baseline

    def fresh_mapped():
        mapped._reset_process_state()
        return mapped

    timings = _measure({
        "baseline, sequential": lambda: _drain(fresh_baseline()[i] for i in range(chunks)),
        "baseline, random order": lambda: _drain(fresh_baseline()[i] for i in order),
        "shards, streaming stage": lambda: _drain(
            wds.WebDataset(urls, shardshuffle=False).compose(samples(rays_per_chunk=RAYS_PER_CHUNK))
        ),
        "shards, map-style sequential": lambda: _drain(fresh_mapped()[i] for i in range(chunks)),
        "shards, map-style random order": lambda: _drain(fresh_mapped()[i] for i in order),
    })
    for name, (_, _, count) in timings.items():
        assert count == chunks, (name, count, chunks)
    rate = {name: chunks / wall for name, (wall, _, _) in timings.items()}
    cpu_rate = {name: chunks / cpu for name, (_, cpu, _) in timings.items()}
    baseline_of = {
        "shards, streaming stage": "baseline, sequential",
        "shards, map-style sequential": "baseline, sequential",
        "shards, map-style random order": "baseline, random order",
    }
    shard_bytes = manifest.bytes(split)
    native_bytes = sum(
        s["ray_path"].stat().st_size + s["voxel_path"].stat().st_size for s in baseline.samples
    )
    rays = sum(row[2] for row in manifest.tables["samples"][split])
    lines = [
        "## voxels",
        "",
        f"Synthetic voxel-dataset-generator data ({SYNTH['num_objects']} objects at {SYNTH['base_resolution']}^3, "
        f"levels 0..3, {rays // len(mapped.samples)} rays per subvolume), split `{split}`: {len(mapped.samples)} "
        f"subvolumes, {chunks} chunks of {RAYS_PER_CHUNK} rays, dense voxels, one process, warm page cache, "
        "best of 3. Baseline = upstream `HierarchicalVoxelRayDataset.__getitem__` logic on the native npz files.",
        "",
        "| loader | chunks/s (wall) | vs baseline | chunks per CPU-second | vs baseline |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in timings:
        base = baseline_of.get(name, name)
        lines.append(
            f"| {name} | {rate[name]:,.0f} | {rate[name] / rate[base]:.1f}x "
            f"| {cpu_rate[name]:,.0f} | {cpu_rate[name] / cpu_rate[base]:.1f}x |"
        )
    lines += [
        "",
        "| bytes | native npz (rays + voxels) | shards | shards / native |",
        "|---|---:|---:|---:|",
        f"| split `{split}` | {native_bytes:,} | {shard_bytes:,} | {shard_bytes / native_bytes:.2f} |",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    target = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else pathlib.Path("bench-work")
    target.mkdir(parents=True, exist_ok=True)
    print(run(target))
