"""RawNIND: download concurrency against a per-connection rate limit, SHA-1 speed, crop-pair reading.

1. The local Dataverse server limits every connection to RATE bytes/s (like a polite remote
   server); the same synthetic dataset is fetched with --concurrency 1 and 5 (no metadata stage).
   The issue asks for at least 4x with 5 downloads.
2. SHA-1 verification speed (the verifier's own rate during the fetch, and hashing a large file),
   compared with the download rate it must keep up with.
3. Training samples/s: the legacy-style path from native files (rawpy read, normalise, demosaic,
   Rec.2020, shift by the cached alignment, random even crops: what `rawds` + its preprocessing do
   per pair) vs `wdsprep.rawnind.pairs` on the converted shards, in this same run.
4. The two shard layouts on the same fetched scenes (Bayer and X-Trans): shard bytes / raw bytes
   per sensor type, and crop pairs/s of `pairs()` on the legacy float layout (today's reader) vs
   the mosaic layout (targets made per crop; also with `legacy_values=True`, and RGB input).
5. `fetch --convert` with a raw-byte bound: the peak raw bytes on local disk against the dataset.
6. Registration: mean L1 between x and gain * y (both linear Rec.2020, crops of clean/noisy Bayer
   pairs) for odd and even shifts, exact (the reader) and with the shift rounded down to even (the
   earlier reader); the clean target's demosaic: upstream's EA against bilinear (PSNR, time per crop).
`WDSPREP_BENCH_SMOKE=1`: tiny sizes, same tables, seconds. Run alone:
`python benchmarks/bench_rawnind.py [WORKDIR]`.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys
import tarfile
import time

import numpy as np

RATE = 500_000  # bytes per second per connection


def _fetch_seconds(server_dir: pathlib.Path, dest: pathlib.Path, concurrency: int) -> tuple[float, dict]:
    from wdsprep.sources.rawnind import FetchOptions, fetch
    from wdsprep.testing.dataverse import DataverseServer, Faults

    shutil.rmtree(dest, ignore_errors=True)
    with DataverseServer(str(server_dir), faults=Faults(rate_limit=RATE)) as server:
        began = time.perf_counter()
        report = fetch(FetchOptions(dest=str(dest), dataverse=server.url, doi=server.doi, concurrency=concurrency,
                                    metadata=False, progress="none"))
        seconds = time.perf_counter() - began
    if report["failed"]:
        raise RuntimeError(f"bench fetch failed: {report['failed'][:2]}")
    return seconds, report


def _sha1_rate(workdir: pathlib.Path) -> float:
    from wdsprep.sources.rawnind.acquire.fetch import sha1_file

    path = workdir / "sha1-probe.bin"
    block = np.random.default_rng(0).integers(0, 256, size=8 * 2**20, dtype=np.uint8).tobytes()
    with open(path, "wb") as handle:
        for _ in range(16):
            handle.write(block)
    sha1_file(str(path))  # warm the page cache
    began = time.perf_counter()
    sha1_file(str(path))
    rate = path.stat().st_size / (time.perf_counter() - began)
    path.unlink()
    return rate


def legacy_pairs(fetched: pathlib.Path, crop_size: int = 256, num_crops: int = 4) -> int:
    """Per pair, what the legacy path computes from the native files (metadata from the cache)."""
    import yaml

    from wdsprep.sources.rawnind.metadata import MetadataCache, anchor_region, pair_key, shift_images
    from wdsprep.sources.rawnind.raw import cam_to_lin_rec2020, demosaic_image, mono_to_rggb, read_bayer

    index = yaml.safe_load((fetched / "dataset_index.yaml").read_text())
    cache = MetadataCache(str(fetched))
    rng = np.random.default_rng(0)
    count = 0
    for scene_name, scene in index["Bayer"].items():
        gt_entry = scene["clean_images"][0]
        for noisy_entry in scene["noisy_images"]:
            gt = read_bayer(str(fetched / "Bayer" / scene_name / "gt" / gt_entry["filename"]))
            noisy = read_bayer(str(fetched / "Bayer" / scene_name / noisy_entry["filename"]))
            meta = cache.get(pair_key(gt_entry["sha1"], noisy_entry["sha1"]))
            gt_rgb = cam_to_lin_rec2020(demosaic_image(gt), gt.rgb_xyz_matrix)  # upstream's EA demosaic
            shift = meta.record["best_alignment"]
            gt_rgb, noisy_mono = shift_images(gt_rgb, noisy.mono, shift)  # the exact shift, as upstream
            mask = meta.mask[tuple(slice(s.start, s.start + n) for s, n in zip(anchor_region(meta.mask.shape, shift), gt_rgb.shape[1:]))]
            height, width = gt_rgb.shape[1:]
            crops = []
            for _ in range(num_crops):
                y = int(rng.integers(0, (height - crop_size) // 2 + 1)) * 2
                x = int(rng.integers(0, (width - crop_size) // 2 + 1)) * 2
                crops.append((gt_rgb[:, y : y + crop_size, x : x + crop_size],
                              mono_to_rggb(noisy_mono[:, y : y + crop_size, x : x + crop_size]),
                              mask[y : y + crop_size, x : x + crop_size]))
            count += len(crops) == num_crops
    return count


def shard_pairs(manifest_url: str, crop_size: int = 256, **options) -> int:
    import webdataset as wds

    import wdsprep

    stage = wdsprep.rawnind.pairs(crop_size=crop_size, num_crops=4, max_alignment_loss=None, min_mask_mean=None,
                                  to_torch=False, seed=0, epoch=0, **options)
    from wdsprep.stream.manifests import load_manifest

    manifest = load_manifest(manifest_url)
    urls = [url for split in sorted(manifest.splits) for url in manifest.shard_urls(split)]
    return sum(1 for _ in wds.WebDataset(urls, shardshuffle=False).compose(stage))


def bytes_by_cfa(manifest) -> dict[str, int]:
    """Shard bytes per sensor type, member by member (header + padded data), read with tarfile."""
    out = {"Bayer": 0, "X-Trans": 0}
    root = pathlib.Path(manifest.url).parent
    for rows in manifest.splits.values():
        for row in rows:
            with tarfile.open(root / row["name"]) as tar:
                for member in tar.getmembers():
                    out["X-Trans" if member.name.startswith("X-Trans-") else "Bayer"] += 512 + -(-member.size // 512) * 512
    return out


def raw_bytes_by_cfa(fetched: pathlib.Path) -> dict[str, int]:
    """Bytes of the files the shards are made from: each scene's clean (not .xmp) and noisy captures."""
    import yaml

    index = yaml.safe_load((fetched / "dataset_index.yaml").read_text())
    out = {}
    for cfa, scenes in index.items():
        out[cfa] = sum(sum((fetched / cfa / name / "gt" / entry["filename"]).stat().st_size
                           for entry in scene["clean_images"] if not entry["filename"].endswith(".xmp"))
                       + sum((fetched / cfa / name / entry["filename"]).stat().st_size for entry in scene["noisy_images"])
                       for name, scene in scenes.items())
    return out


def registration_rows(manifest_url: str, crop: int) -> list[str]:
    """x vs gain * y L1 over fully valid crops of every clean/noisy Bayer pair, odd vs even shifts,
    exact and rounded down to even; EA vs bilinear clean targets."""
    import webdataset as wds

    import wdsprep
    from wdsprep.sources.rawnind.raw import demosaic_ea, demosaic_padded, ea_scale, normalise
    from wdsprep.sources.rawnind.read import _capture, _mosaic_rec2020, crops_at, tile_mask

    l1 = {(kind, mode): [] for kind in ("odd", "even") for mode in ("exact", "rounded")}
    psnr, ea_s, bilinear_s, timed = [], 0.0, 0.0, 0
    for split in ("train", "test"):
        for sample in wds.WebDataset(wdsprep.urls(manifest_url, split), shardshuffle=False).compose(wdsprep.rawnind.tiles()):
            meta = sample["meta"]
            if not meta["is_bayer"]:
                continue
            top, left = meta["tile"]
            height, width = meta["tile_size"]
            for n, (y_clean, (dy, dx)) in enumerate(zip(meta["pair_y_clean"], meta["best_alignment"])):
                if y_clean or meta["pair_gt"][n]:
                    continue
                mask = tile_mask(sample, n)
                origins = [(y, x) for y in range(0, height - crop + 1, crop) for x in range(0, width - crop + 1, crop)
                           if mask[y : y + crop, x : x + crop].mean() >= 0.99]
                if not origins:
                    continue
                out = crops_at(sample, n, origins, crop_size=crop, input="rgb", to_torch=False)
                gained = out["y_crops"] * np.float32(meta["rgb_gain"][n])
                kind = "odd" if dy % 2 or dx % 2 else "even"
                l1[(kind, "exact")].append(float(np.abs(out["x_crops"] - gained).mean()))
                rounded = [(top + y + dy - dy % 2, left + x + dx - dx % 2) for y, x in origins]  # the earlier reader
                old_x = _mosaic_rec2020(sample, _capture(sample, True, meta["pair_gt"][n]), rounded, (crop, crop), False)
                l1[(kind, "rounded")].append(float(np.abs(old_x - gained).mean()))
            # the clean target: upstream's EA against bilinear on the tile's first crop (+1 px border)
            mosaic, (wy, wx), black, white, ranges = _capture(sample, True, 0)
            pattern = np.asarray(meta["cfa_pattern"], dtype=np.uint8)
            cy, cx = (height // 2 - crop // 2) & ~1, (width // 2 - crop // 2) & ~1  # the tile's centre crop
            y0, x0 = top + cy - wy, left + cx - wx
            if y0 >= 2 and x0 >= 2 and y0 + crop + 2 <= mosaic.shape[0] and x0 + crop + 2 <= mosaic.shape[1]:
                window = normalise(mosaic[y0 - 2 : y0 + crop + 2, x0 - 2 : x0 + crop + 2], pattern, black, white,
                                   (top + cy - 2, left + cx - 2))
                began = time.perf_counter()
                ea = demosaic_ea(window, ea_scale(*ranges[:2]))[:, 2:-2, 2:-2]
                ea_s += time.perf_counter() - began
                began = time.perf_counter()
                bilinear = demosaic_padded(window[1:-1, 1:-1].astype(np.float64))
                bilinear_s += time.perf_counter() - began
                timed += 1
                error = float(((ea - bilinear) ** 2).mean())
                psnr.append(10 * np.log10(1.0 / error))
    mean = lambda values: float(np.mean(values)) if values else float("nan")  # noqa: E731
    return [
        f"Registration of clean/noisy Bayer pairs (first reference; every {crop} px crop of a tile grid with 99% valid pixels): "
        "mean |x - gain * y|, both linear Rec.2020 (y demosaiced like x):",
        "",
        "| shift | pairs x tiles | L1, exact shift (this reader, as upstream) | L1, shift rounded down to even (earlier reader) |",
        "|---|---|---|---|",
        *(f"| {kind} | {len(l1[(kind, 'exact')])} | **{mean(l1[(kind, 'exact')]):.5f}** | {mean(l1[(kind, 'rounded')]):.5f} "
          f"({mean(l1[(kind, 'rounded')]) / mean(l1[(kind, 'exact')]):.3f}x) |" for kind in ("odd", "even")),
        "",
        f"Clean target demosaic on {timed} tiles ({crop} px crops): bilinear vs upstream's OpenCV EA, "
        f"PSNR {min(psnr, default=float('nan')):.1f}-{max(psnr, default=float('nan')):.1f} dB; "
        f"time per crop EA {1e3 * ea_s / max(timed, 1):.2f} ms, bilinear {1e3 * bilinear_s / max(timed, 1):.2f} ms.",
        "",
    ]


def _rate(function, passes: int) -> tuple[float, int]:
    function()  # warm-up pass
    began = time.perf_counter()
    count = sum(function() for _ in range(passes))
    return count / (time.perf_counter() - began), count


def streaming_rows(server_dir: pathlib.Path, workdir: pathlib.Path, tile: int) -> list[str]:
    """`fetch --convert` with a raw-byte bound of about one scene: peak raw bytes on disk vs all."""
    from wdsprep.conversion import Conversion
    from wdsprep.sources.rawnind.acquire.fetch import FetchOptions, fetch
    from wdsprep.testing.dataverse import DataverseServer

    listing = json.loads((server_dir / "dataverse_dataset.json").read_text())["data"]["latestVersion"]["files"]
    total = sum(entry["dataFile"]["filesize"] for entry in listing if entry["dataFile"]["filename"].endswith(".dng"))
    dest, output = workdir / "stream-raw", workdir / "stream-shards"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.rmtree(output, ignore_errors=True)
    with DataverseServer(str(server_dir)) as server:
        began = time.perf_counter()
        report = fetch(FetchOptions(dest=str(dest), dataverse=server.url, doi=server.doi, progress="none",
                                    convert=str(output), max_raw_bytes=1, convert_options={"tile_size": tile},
                                    driver=Conversion))
        seconds = time.perf_counter() - began
    converted = report["convert"]
    mb = 1e6
    return [
        "`fetch --convert` into shards with `--max-raw-bytes 1` (one scene at a time):",
        "",
        "| measure | value |",
        "|---|---|",
        f"| capture bytes on the server | {total / mb:.2f} MB |",
        f"| **peak raw bytes on local disk** | **{converted['raw_bytes_peak'] / mb:.2f} MB** "
        f"({converted['raw_bytes_peak'] / total:.2f} of all) |",
        f"| scenes converted, time | {converted['scenes_converted']}, {seconds:.2f} s |",
        "",
    ]


def layout_rows(fetched: pathlib.Path, workdir: pathlib.Path, tile: int, crop: int, passes: int) -> list[str]:
    from wdsprep.conversion import convert

    shutil.rmtree(workdir / "shards-legacy", ignore_errors=True)
    shutil.rmtree(workdir / "shards-mosaic", ignore_errors=True)
    legacy = convert("rawnind", str(fetched), str(workdir / "shards-legacy"), shard_bytes="64MB", tile_size=tile, layout="legacy")
    mosaic = convert("rawnind", str(fetched), str(workdir / "shards-mosaic"), shard_bytes="64MB", tile_size=tile)
    raw = raw_bytes_by_cfa(fetched)
    new, old = bytes_by_cfa(mosaic), bytes_by_cfa(legacy)
    today, today_n = _rate(lambda: shard_pairs(legacy.url, crop), passes)
    compact, compact_n = _rate(lambda: shard_pairs(mosaic.url, crop), passes)
    compat, compat_n = _rate(lambda: shard_pairs(mosaic.url, crop, legacy_values=True), passes)
    rgb, rgb_n = _rate(lambda: shard_pairs(mosaic.url, crop, input="rgb"), passes)
    mb = 1e6
    return [
        f"Shard layouts on the same fetched scenes (tile {tile}, zstd 3; raw bytes = each scene's clean + noisy files):",
        "",
        "| layout | Bayer shard bytes / raw bytes | X-Trans shard bytes / raw bytes |",
        "|---|---|---|",
        f"| legacy float32 tiles (today) | {old['Bayer'] / raw['Bayer']:.2f} ({old['Bayer'] / mb:.1f} / {raw['Bayer'] / mb:.1f} MB) | not converted |",
        f"| **mosaic (uint16 + halo, packed masks)** | **{new['Bayer'] / raw['Bayer']:.2f}** ({new['Bayer'] / mb:.1f} MB) "
        f"| **{new['X-Trans'] / max(raw.get('X-Trans', 0), 1):.2f}** ({new['X-Trans'] / mb:.1f} / {raw.get('X-Trans', 0) / mb:.1f} MB) |",
        "",
        f"| reader (crop {crop}, 4 crops per pair, {passes} passes over all splits) | pairs/s | pairs |",
        "|---|---|---|",
        f"| `pairs()` on the legacy float layout (today) | {today:.1f} | {today_n} |",
        f"| **`pairs()` on the mosaic layout** | **{compact:.1f}** ({compact / today:.2f}x) | {compact_n} |",
        f"| `pairs(legacy_values=True)` on the mosaic layout | {compat:.1f} ({compat / today:.2f}x) | {compat_n} |",
        f"| `pairs(input=\"rgb\")` on the mosaic layout (Bayer + X-Trans, LibRaw VNG) | {rgb:.1f} | {rgb_n} |",
        "",
        "The two layouts tile and pair differently (legacy: overlapping T x T tiles, first clean x noisy pairs; mosaic:",
        "non-overlapping tiles of about T in train, upstream's pre-crops in test, upstream's pairs), so their pair",
        "counts differ; pairs/s is per (tile, pair) sample.",
    ]


def run(workdir: pathlib.Path) -> str:
    from wdsprep.conversion import convert
    from wdsprep.sources.rawnind.acquire.fetch import FetchOptions, fetch
    from wdsprep.testing.dataverse import DataverseServer
    from wdsprep.sources.rawnind.synth import synth

    workdir = pathlib.Path(workdir)
    smoke = os.environ.get("WDSPREP_BENCH_SMOKE") == "1"
    many_files = workdir / ("dataverse-bench-smoke" if smoke else "dataverse-bench")
    if not (many_files / "dataverse_dataset.json").exists():
        synth(str(many_files), 0, "tiny" if smoke else "bench")
    server_dir = workdir / ("dataverse-smoke" if smoke else "dataverse")
    if not (server_dir / "dataverse_dataset.json").exists():
        synth(str(server_dir), 0, "xtrans" if smoke else "small")
    tile, crop, passes = (256, 64, 1) if smoke else (512, 256, 3)
    one_s, one = _fetch_seconds(many_files, workdir / "fetch-1", 1)
    five_s, five = _fetch_seconds(many_files, workdir / "fetch-5", 5)
    total = five["bytes_downloaded"]
    files = len(five["verified"])
    verifier_rate = five["sha1_rate_bps"] or 0.0
    big_rate = _sha1_rate(workdir)

    # metadata + conversion for the reading comparison (metadata computed once by a normal fetch)
    fetched = workdir / "fetched"
    shutil.rmtree(fetched, ignore_errors=True)
    shutil.rmtree(workdir / "shards", ignore_errors=True)
    with DataverseServer(str(server_dir)) as server:
        began = time.perf_counter()
        report = fetch(FetchOptions(dest=str(fetched), dataverse=server.url, doi=server.doi, progress="none"))
        fetch_meta_s = time.perf_counter() - began
    began = time.perf_counter()
    manifest = convert("rawnind", str(fetched), str(workdir / "shards"), shard_bytes="64MB", tile_size=tile)
    convert_s = time.perf_counter() - began
    import webdataset  # noqa: F401  (imports torch: keep it out of the timings)

    shard_pairs(manifest.url, crop)  # warm-up pass
    legacy_pairs(fetched, crop)
    began = time.perf_counter()
    legacy_count = legacy_pairs(fetched, crop)
    legacy_s = time.perf_counter() - began
    began = time.perf_counter()
    shard_count = 0
    for _ in range(passes):
        shard_count += shard_pairs(manifest.url, crop)
    shard_s = time.perf_counter() - began
    layouts = layout_rows(fetched, workdir, tile, crop, passes)
    registration = registration_rows(manifest.url, 128 if not smoke else 32)
    streaming = streaming_rows(server_dir, workdir, tile)

    mb = 1e6
    ratio = (one_s / five_s) if five_s else float("nan")
    lines = [
        "## rawnind",
        "",
        f"Synthetic RawNIND (`synth --size bench`: {files} DNG files, {total / mb:.1f} MB) served by the local Dataverse "
        f"server with a per-connection limit of {RATE / mb:.1f} MB/s; fetched with SHA-1 verification, no metadata stage.",
        "",
        "| measure | value |",
        "|---|---|",
        f"| fetch, --concurrency 1 | {one_s:.2f} s ({one['bytes_downloaded'] / one_s / mb:.2f} MB/s) |",
        f"| fetch, --concurrency 5 | {five_s:.2f} s ({total / five_s / mb:.2f} MB/s) |",
        f"| **throughput ratio 5 vs 1** | **{ratio:.2f}x** (asked: >= 4x) |",
        f"| SHA-1 verifier rate during the fetch | {verifier_rate / mb:.0f} MB/s |",
        f"| SHA-1 of a 128 MB file (page cache) | {big_rate / mb:.0f} MB/s |",
        f"| SHA-1 headroom over the 5-way download rate | {verifier_rate / (total / five_s):.0f}x |",
        f"| fetch + metadata ({report['scenes']['complete']} scenes, {report['metadata']['pairs_computed']} pairs, unlimited rate) | {fetch_meta_s:.2f} s |",
        f"| convert to shards (mosaic layout, tile {tile}, metadata cached) | {convert_s:.2f} s |",
        f"| crop pairs/s, legacy-style from native DNGs (Bayer) | {legacy_count / legacy_s:.1f} ({legacy_count} pairs) |",
        f"| crop pairs/s, `pairs()` on mosaic shards (Bayer) | {shard_count / shard_s:.1f} ({shard_count} pairs, {passes} passes) |",
        f"| **reading speed-up** | **{(shard_count / shard_s) / (legacy_count / legacy_s):.1f}x** |",
        "",
        f"Both reading paths give 4 crops of {crop} px per sample; the legacy path one per (first clean, noisy) pair,",
        "the shard path one per (tile, pair) with upstream's pairs (clean-clean and second references included),",
        "2 tiles per train image and the test scene's whole-image pre-crop.",
        "The synthetic captures are 0.4 MP; a real 24 MP capture makes the legacy path ~60x slower per pair",
        "while a shard tile costs the same, so the real speed-up is larger than measured here.",
        "",
        *layouts,
        "",
        *registration,
        *streaming,
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    target = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "bench-work/bench_rawnind")
    target.mkdir(parents=True, exist_ok=True)
    print(run(target))
