"""Minecraft: frame pairs/s from shards vs upstream-style per-frame pickle loading; bytes on disk.

The baseline is how upstream `MinecraftDataset.load_data` reads: rglob the creative:* folders, sort,
`np.load(path, allow_pickle=True).item()` every frame, then pair frame idx with idx+1 inside each
episode. It is timed without upstream's text rendering (which only makes it slower), so the
ratio is a conservative one. Both sides read from a warm page cache, in this same run.
Run alone: `python benchmarks/bench_minecraft.py [WORKDIR]`.
"""
from __future__ import annotations

import os
import pathlib
import sys
import time
import zipfile

import numpy as np

from _smoke import sized


def _shared_zip() -> pathlib.Path | None:
    root = pathlib.Path(os.environ.get("WDSPREP_SHARED_DATA", pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"))
    path = root / "minecraft" / "data.zip"
    return path if path.is_file() else None


def upstream_pairs(data_dir: pathlib.Path, history_length: int = 1) -> int:
    """Upstream's loading and pairing (raw arrays only); returns the number of pairs made."""
    creative_dirs = sorted(p for p in data_dir.rglob("*") if p.is_dir() and p.name.startswith("creative:"))
    count = 0
    for creative_dir in creative_dirs:
        files = sorted(creative_dir.glob("*.npy"))
        frames = [np.load(path, allow_pickle=True).item() for path in files]
        if len(frames) < 2 or len(frames) <= history_length:
            continue
        for idx in range(history_length - 1, len(frames) - 1):
            item = {"x_raw": frames[idx]["voxel"], "y_raw": frames[idx]["action"], "z_raw": frames[idx + 1]["voxel"],
                    "episode": creative_dir.name, "history_start_index": idx - history_length + 1}
            count += item is not None
    return count


def shard_pairs(urls: list[str], history_length: int = 1) -> int:
    import webdataset as wds

    import wdsprep

    stage = wdsprep.minecraft.pairs(history_length=history_length)
    return sum(1 for _ in wds.WebDataset(urls, shardshuffle=False).compose(stage))


def _timed(function, *args, repeats: int = 5) -> tuple[float, float, int]:
    """Best wall and best CPU seconds of `repeats` calls (the box is shared: the best pass is the least
    disturbed one), and the call's result."""
    walls, cpus, result = [], [], None
    for _ in range(repeats):
        started, cpu = time.perf_counter(), time.process_time()
        result = function(*args)
        walls.append(time.perf_counter() - started)
        cpus.append(time.process_time() - cpu)
    return min(walls), min(cpus), result


def run(workdir: pathlib.Path) -> str:
    import wdsprep
    from wdsprep.conversion import convert

    workdir = pathlib.Path(workdir) / "minecraft"
    native = workdir / "native"
    source = _shared_zip()
    if not (native / "data").is_dir():
        if source is not None:
            with zipfile.ZipFile(source) as archive:
                archive.extractall(native)
        else:
            wdsprep.minecraft.SOURCE.synth(str(native), 0, "medium")
    what = f"real `data.zip` ({source.name})" if source is not None else "synthetic (medium; real data.zip not found)"
    native_bytes = sum(p.stat().st_size for p in native.rglob("*.npy"))
    frames = sum(1 for _ in native.rglob("*.npy"))

    started = time.perf_counter()
    manifest = convert("minecraft", str(native), str(workdir / "shards"))
    convert_seconds = time.perf_counter() - started
    urls = wdsprep.urls(manifest.url, "train")
    shard_bytes = sum(row["bytes"] for row in manifest.splits["train"])

    rows = []
    for history in (1, 10):
        shard_pairs(urls, history)  # warm-up: imports, first decode
        base_s, base_cpu, base_n = _timed(upstream_pairs, native / "data", history, repeats=sized(5, 1))
        # a pass over the shards takes milliseconds: more passes, so one scheduler hiccup cannot decide
        ours_s, ours_cpu, ours_n = _timed(shard_pairs, urls, history, repeats=sized(30, 1))
        if base_n != ours_n:
            raise RuntimeError(f"pair counts differ (history {history}): upstream {base_n}, shards {ours_n}")
        rows.append((history, ours_n, base_n / base_s, ours_n / ours_s, base_n / base_cpu, ours_n / ours_cpu))

    lines = [
        "## minecraft",
        "",
        f"Data: {what}, {frames} frames; one run, best of 5 passes (baseline) and 30 passes (shards, a pass takes milliseconds), warm page cache, single process.",
        "Baseline: upstream-style `np.load(allow_pickle=True)` of every per-frame `.npy`, paired in memory "
        "(no text rendering). Shards: `wds.WebDataset(urls).compose(wdsprep.minecraft.pairs(...))`.",
        "",
        "| measure | upstream-style | wdsprep shards | ratio |",
        "|---|---:|---:|---:|",
    ]
    for history, count, base_rate, ours_rate, base_cpu_rate, ours_cpu_rate in rows:
        lines.append(f"| pairs/s, history_length={history} ({count} pairs), wall | {base_rate:,.0f} | {ours_rate:,.0f} "
                     f"| {ours_rate / base_rate:,.1f}x |")
        lines.append(f"| pairs per CPU-second, history_length={history} | {base_cpu_rate:,.0f} | {ours_cpu_rate:,.0f} "
                     f"| {ours_cpu_rate / base_cpu_rate:,.1f}x |")
    lines.append(f"| bytes on disk | {native_bytes:,} (.npy files) | {shard_bytes:,} (tar shards) "
                 f"| {native_bytes / shard_bytes:,.0f}x smaller |")
    if source is not None:
        lines.append(f"| bytes, vs the deflated data.zip | {source.stat().st_size:,} | {shard_bytes:,} "
                     f"| {source.stat().st_size / shard_bytes:,.1f}x smaller |")
    lines.append(f"| conversion (plan scan + build, 1 worker) | | {convert_seconds:.1f} s "
                 f"({frames / convert_seconds:,.0f} frames/s) | |")
    lines.append("")
    lines.append("Targets: pairs/s >= 20x, bytes >= 50x smaller.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(run(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "bench-work")))
