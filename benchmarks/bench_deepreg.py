"""DeepReg: training pairs/s from shards vs DeepReg-style per-sample NIfTI loading with nibabel.

The baseline does what DeepReg's `PairedDataLoader` + `GeneratorDataLoader.data_generator` do per
pair: shuffle the pair indices, `np.asarray(nib.load(path).dataobj, dtype=np.float32)` for the
moving and fixed image and both labels (re-read for every pair, nothing cached), min/max
normalise the images, pick one label channel, then resize to the configured shapes (the same
resize function on both sides, so only loading differs). The shard side streams the converted
shards through `wds.WebDataset(urls).compose(wdsprep.deepreg.pairs("paired", ...))`.
Both sides read the same data (DeepReg's paired test set when present, else synthetic data of the
same shapes) from a warm page cache, in this same run.
Run alone: `python benchmarks/bench_deepreg.py [WORKDIR]`.
"""
from __future__ import annotations

import os
import pathlib
import random
import statistics
import sys
import time

import numpy as np

from _smoke import sized

MOVING_SHAPE, FIXED_SHAPE = (16, 16, 16), (8, 8, 8)  # DeepReg's config/test/paired_nifti.yaml
EPOCHS = sized(3, 1)


def _shared_paired() -> pathlib.Path | None:
    root = pathlib.Path(os.environ.get("WDSPREP_SHARED_DATA",
                                       pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"))
    path = root / "deepreg" / "nifti" / "paired"
    return path if (path / "train" / "moving_images").is_dir() else None


def deepreg_style_epoch(split_dir: pathlib.Path, seed: int) -> int:
    """One epoch the way DeepReg's generator loads it; returns the number of pairs made."""
    import nibabel as nib

    from wdsprep.sources.deepreg import normalize, resize

    names = sorted(p.name[: -len(".nii.gz")] for p in (split_dir / "moving_images").glob("*.nii.gz"))
    order = list(range(len(names)))
    random.Random(seed).shuffle(order)
    count = 0
    for index in order:
        name = names[index]

        def load(folder: str) -> np.ndarray:
            return np.asarray(nib.load(split_dir / folder / f"{name}.nii.gz").dataobj, dtype=np.float32)

        moving_image, fixed_image = normalize(load("moving_images")), normalize(load("fixed_images"))
        moving_label, fixed_label = load("moving_labels"), load("fixed_labels")
        if moving_label.ndim == 4:
            k = random.randrange(moving_label.shape[3])
            moving_label, fixed_label = moving_label[..., k], fixed_label[..., k]
        sample = {
            "moving_image": resize(moving_image, MOVING_SHAPE),
            "fixed_image": resize(fixed_image, FIXED_SHAPE),
            "moving_label": resize(moving_label, MOVING_SHAPE),
            "fixed_label": resize(fixed_label, FIXED_SHAPE),
            "indices": np.asarray([index, 0], dtype=np.float32),
        }
        count += sample is not None
    return count


def shard_epoch(urls: list[str], epoch: int) -> int:
    import webdataset as wds

    import wdsprep

    stage = wdsprep.deepreg.pairs("paired", moving_image_shape=MOVING_SHAPE, fixed_image_shape=FIXED_SHAPE,
                                  epoch=epoch)
    return sum(1 for _ in wds.WebDataset(urls, shardshuffle=False).compose(stage))


def _timed(function, *args_per_run) -> tuple[float, int]:
    times, result = [], 0
    for args in args_per_run:
        started = time.perf_counter()
        result = function(*args)
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def _dir_bytes(path: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run(workdir: pathlib.Path) -> str:
    import wdsprep
    from wdsprep.conversion import convert
    from wdsprep.sources.deepreg import SOURCE

    workdir = pathlib.Path(workdir) / "deepreg"
    workdir.mkdir(parents=True, exist_ok=True)
    real = _shared_paired()
    if real is not None:
        native, data_name = real, "DeepReg test set, nifti/paired/train (25 pairs)"
    else:
        SOURCE.synth(str(workdir / "synth"), 0, "medium")
        native, data_name = workdir / "synth" / "paired" / "nifti", "synthetic paired NIfTI (medium)"
    split_dir = native / "train"
    output = workdir / "shards"
    started = time.perf_counter()
    manifest = convert("deepreg", str(native), str(output), shard_bytes="64MB", workers=1)
    convert_seconds = time.perf_counter() - started
    urls = wdsprep.urls(str(output / "manifest.json"), "train")

    deepreg_style_epoch(split_dir, 0)  # warm the page cache for both sides
    shard_epoch(urls, 0)
    baseline_s, baseline_pairs = _timed(deepreg_style_epoch, *[(split_dir, e) for e in range(EPOCHS)])
    shards_s, shard_pairs = _timed(shard_epoch, *[(urls, e) for e in range(EPOCHS)])
    if baseline_pairs != shard_pairs:
        raise RuntimeError(f"pair counts differ: baseline {baseline_pairs}, shards {shard_pairs}")
    baseline_rate, shard_rate = baseline_pairs / baseline_s, shard_pairs / shards_s
    native_bytes = _dir_bytes(split_dir)
    shard_bytes = manifest.bytes("train")
    lines = [
        "## deepreg",
        "",
        f"Data: {data_name}; moving {MOVING_SHAPE}, fixed {FIXED_SHAPE}, one sampled label per pair; "
        f"median of {EPOCHS} epochs, one process, warm page cache.",
        "",
        "| measure | DeepReg-style nibabel per sample | wdsprep shards | ratio |",
        "|---|---|---|---|",
        f"| pairs/s | {baseline_rate:.1f} | {shard_rate:.1f} | {shard_rate / baseline_rate:.2f}x |",
        f"| seconds per epoch ({baseline_pairs} pairs) | {baseline_s:.3f} | {shards_s:.3f} | |",
        f"| bytes on disk (train) | {native_bytes:,} | {shard_bytes:,} | {native_bytes / shard_bytes:.2f}x |",
        f"| conversion time (all splits) | | {convert_seconds:.2f} s | |",
        "",
        "Target: at least 3x pairs/s. " + ("Met." if shard_rate >= 3 * baseline_rate else "NOT met in this run."),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(run(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "bench-work")))
