"""Fetched RawNIND scenes -> shards of aligned clean/noisy tiles, in one of two layouts.

`--layout mosaic` (the default) stores what the cameras recorded. One sample per (scene, tile): the
clean image is cut into non-overlapping tiles of about T x T (`tile_spans`); a sample holds
  clean   uint16 [h+2a, w+2a]     the reference clean mosaic over the tile plus a halo `a` (clipped
                                  at the image edges), at its native integer precision
  noisy   uint16 [N, h+2a, w+2a]  every noisy mosaic over the same window moved by its shift
                                  (zero where the noisy capture has no pixels)
  mask    uint8  [N, ceil(h*w/8)] per noisy capture the bool mask over the tile (loss mask x
                                  overexposure x overlap), bit-packed row-major
  meta    msgpack                 geometry (tile, window, valid rectangles), CFA pattern and
                                  colours, black/white levels, rgb_xyz_matrix, alignments, gains
and the reader makes the float targets (normalise, demosaic, colour transform, gain) for each crop
only, so shards are about the size of the raw files. The halo (2 px Bayer, 6 px X-Trans) lets a
crop's demosaic see its neighbours: a Bayer crop equals the crop of the whole-image demosaic.

`--layout legacy` (Bayer only) is the earlier float layout, kept for users whose code reads it:
  gt_rgb       float32 [3, T, T]        clean, demosaiced, linear Rec.2020
  noisy_bayer  float32 [N, 4, T/2, T/2] every noisy capture, RGGB, aligned to the clean tile
  mask         bool    [N, T, T]        per noisy capture: loss mask x overexposure x overlap
  meta         msgpack                  scene, files, alignments, gains, mask means, matrix
on overlapping T x T tiles (`tile_origins`).

Alignment keeps the Bayer phase: a Bayer noisy capture is sampled at `clean - shift` with the
shift rounded down to even numbers (the original trims one extra row/column for an odd shift;
both leave at most one pixel of misalignment). X-Trans captures are only read as RGB, so they use
the exact shift (the stored CFA pattern is rolled to each window). Windows outside the noisy
capture are zero, and masked. Scenes in `test_reserve` go to the `test` split, the others to `train`.

`RawNINDSource` (`SOURCE`) is what the core talks to: plan/build above, `prepare_input` (what
`make shards` runs: synth a Dataverse directory, serve it, fetch through it) and the commands
`wdsprep fetch rawnind` and `wdsprep serve dataverse` (in `cli.py`).
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Iterator

import numpy as np

from ...errors import InputError
from ..base import Command, Plan, PlanContext, Source, Unit, UnitContext, group_by_size
from .index import INDEX_FILENAME, build_scenes, load_index
from .metadata import MetadataCache, PairMetadata, scene_metadata
from .raw import RawImage, cam_to_lin_rec2020, demosaic, mono_to_rggb, read_raw
from .units import DEFAULT_TILE, LAYOUTS, STORE_DTYPES, check_options, conversion_config, merge_pairs, scene_item

HALO = {True: 2, False: 6}  # by is_bayer: bilinear needs 1 px (2 keeps the RGGB phase); VNG 2-3


def _locate(root: str, image) -> str | None:
    """The fetched layout first (`<CFA>/<scene>/[gt/]<file>`), then a served/synth `files/` dir."""
    candidates = [
        os.path.join(root, image.relpath),
        os.path.join(root, image.cfa, image.scene, image.filename),
        os.path.join(root, "files", image.filename),
        os.path.join(root, image.filename),
    ]
    for candidate in candidates:
        if os.path.isfile(candidate):
            return candidate
    return None


def _window(array: np.ndarray, top: int, left: int, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """array[..., top:top+h, left:left+w] with zeros outside, and the in-bounds mask [h, w]."""
    out = np.zeros(array.shape[:-2] + (height, width), dtype=array.dtype)
    valid = np.zeros((height, width), dtype=bool)
    full_h, full_w = array.shape[-2:]
    y0, y1 = max(top, 0), min(top + height, full_h)
    x0, x1 = max(left, 0), min(left + width, full_w)
    if y0 < y1 and x0 < x1:
        out[..., y0 - top : y1 - top, x0 - left : x1 - left] = array[..., y0:y1, x0:x1]
        valid[y0 - top : y1 - top, x0 - left : x1 - left] = True
    return out, valid


def tile_origins(length: int, tile: int) -> list[int]:
    """Even tile starts covering [0, length): stride `tile`, the last one flush with the end."""
    if length <= tile:
        return [0]
    starts = list(range(0, length - tile + 1, tile))
    last = (length - tile) & ~1
    if starts[-1] != last:
        starts.append(last)
    return starts


def tile_spans(length: int, tile: int) -> list[tuple[int, int]]:
    """(start, size) of ceil(length/tile) non-overlapping tiles covering [0, length) exactly.

    Sizes are multiples of 4 that differ by at most 4, so with more than one tile each is over
    tile/2 - 4 and a crop of tile/2 - 4 fits any of them; `length` is a multiple of 4 (`read_raw`).
    """
    count = max(1, -(-length // tile))
    quads, extra = divmod(length // 4, count)
    spans, start = [], 0
    for number in range(count):
        size = 4 * (quads + (number < extra))
        spans.append((start, size))
        start += size
    return spans


def _even(value: int) -> int:
    return value - (value % 2)


def _add_pairs_table(item, pairs: list[PairMetadata], ctx) -> None:
    scene_key = f"{item['cfa']}/{item['scene']}"
    for (path, _), pair in zip(item["noisy"], pairs, strict=True):
        ctx.add_table_entry("pairs", {
            "scene": scene_key, "split": "test" if item["test_reserve"] else "train",
            "gt_file": os.path.basename(item["gt"][0]), "noisy_file": os.path.basename(path),
            **{name: value for name, value in pair.record.items() if name != "rgb_xyz_matrix"},
        })


def _pair_meta(item, records: list[dict], gt: RawImage) -> dict:
    """The per-scene part of a tile's meta (files, SHA-1s, alignments, gains, matrix)."""
    return {
        "scene": item["scene"],
        "cfa": item["cfa"],
        "test_reserve": bool(item["test_reserve"]),
        "gt_file": os.path.basename(item["gt"][0]),
        "gt_sha1": item["gt"][1],
        "noisy_files": [os.path.basename(path) for path, _ in item["noisy"]],
        "noisy_sha1": [sha1 for _, sha1 in item["noisy"]],
        "best_alignment": [r["best_alignment"] for r in records],
        "best_alignment_loss": [r["best_alignment_loss"] for r in records],
        "raw_gain": [r["raw_gain"] for r in records],
        "rgb_gain": [r["rgb_gain"] for r in records],
        "mask_mean": [r["mask_mean"] for r in records],
        "rgb_msssim_score": [r.get("rgb_msssim_score") for r in records],
        "overexposure_lb": records[0]["overexposure_lb"],
        "rgb_xyz_matrix": np.asarray(gt.rgb_xyz_matrix, dtype=float).tolist(),
        "is_bayer": bool(gt.is_bayer),
    }


def _mosaic_tiles(item, gt: RawImage, noisy: list[RawImage], pairs: list[PairMetadata], tile: int) -> Iterator[tuple[str, dict]]:
    height, width = gt.data.shape
    for image, (path, _) in zip(noisy, item["noisy"], strict=True):
        if image.data.shape != gt.data.shape or image.pattern.shape != gt.pattern.shape:
            raise InputError(f"{path}: mosaic {image.data.shape} {image.pattern.shape} does not match the clean "
                             f"capture's {gt.data.shape} {gt.pattern.shape}")
    records = [pair.record for pair in pairs]
    halo = HALO[gt.is_bayer]
    # Bayer keeps the RGGB phase (even shift); X-Trans is read as RGB only, so the exact shift
    shifts = [[_even(dy), _even(dx)] if gt.is_bayer else [dy, dx] for dy, dx in (r["best_alignment"] for r in records)]
    scene_meta = _pair_meta(item, records, gt)
    scene_meta.update({
        "layout": "mosaic",
        "image_size": [height, width],
        "cfa_pattern": gt.pattern.tolist(),  # channel indices at the image origin
        "colors": gt.colors,
        "black_level": [int(v) for v in gt.black_level],
        "white_level": int(gt.white_level),
        "noisy_black_level": [[int(v) for v in image.black_level] for image in noisy],
        "noisy_white_level": [int(image.white_level) for image in noisy],
        "noisy_shift": shifts,
        "bayer_alignment": shifts if gt.is_bayer else None,
        "halo": halo,
        "tile_rows": [top for top, _ in tile_spans(height, tile)],  # the scene's tile grid
        "tile_cols": [left for left, _ in tile_spans(width, tile)],
    })
    for top, tile_h in tile_spans(height, tile):
        for left, tile_w in tile_spans(width, tile):
            wy0, wy1 = max(top - halo, 0), min(top + tile_h + halo, height)
            wx0, wx1 = max(left - halo, 0), min(left + tile_w + halo, width)
            noisy_windows = np.zeros((len(noisy), wy1 - wy0, wx1 - wx0), dtype=np.uint16)
            masks = np.zeros((len(noisy), tile_h, tile_w), dtype=bool)
            valid_boxes = []
            for n, (image, pair) in enumerate(zip(noisy, pairs, strict=True)):
                dy, dx = shifts[n]
                window, valid = _window(image.data, wy0 - dy, wx0 - dx, wy1 - wy0, wx1 - wx0)
                noisy_windows[n] = window
                rows, cols = np.flatnonzero(valid.any(axis=1)), np.flatnonzero(valid.any(axis=0))
                valid_boxes.append([int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1] if len(rows) else [0, 0, 0, 0])
                in_tile = valid[top - wy0 : top - wy0 + tile_h, left - wx0 : left - wx0 + tile_w]
                masks[n] = pair.mask[top : top + tile_h, left : left + tile_w] & in_tile
            meta = dict(scene_meta, tile=[top, left], tile_size=[tile_h, tile_w], window=[wy0, wx0, wy1 - wy0, wx1 - wx0],
                        noisy_valid=valid_boxes, tile_mask_mean=[float(m.mean()) for m in masks])
            key = f"{item['cfa']}-{item['scene']}-{top:05d}-{left:05d}"
            yield key, {
                "clean": np.ascontiguousarray(gt.data[wy0:wy1, wx0:wx1]),
                "noisy": noisy_windows,
                "mask": np.packbits(masks.reshape(len(noisy), -1), axis=1),
                "meta": meta,
            }


def _scene_tiles(item, gt, noisy_rggb, pairs: list[PairMetadata], tile: int, store_dtype) -> Iterator[tuple[str, dict]]:
    """The legacy float layout (Bayer only)."""
    gt_rgb = cam_to_lin_rec2020(demosaic(gt.mono), gt.rgb_xyz_matrix)
    height, width = gt_rgb.shape[1:]
    tile_h, tile_w = min(tile, height) & ~3, min(tile, width) & ~3
    records = [pair.record for pair in pairs]
    bayer_shifts = [[_even(r["best_alignment"][0]), _even(r["best_alignment"][1])] for r in records]
    for top in tile_origins(height, tile_h):
        for left in tile_origins(width, tile_w):
            noisy_tiles = np.zeros((len(noisy_rggb), 4, tile_h // 2, tile_w // 2), dtype=np.float32)
            masks = np.zeros((len(noisy_rggb), tile_h, tile_w), dtype=bool)
            for n, (rggb, pair) in enumerate(zip(noisy_rggb, pairs)):
                dy, dx = bayer_shifts[n]
                window, valid = _window(rggb, (top - dy) // 2, (left - dx) // 2, tile_h // 2, tile_w // 2)
                noisy_tiles[n] = window
                full_valid = np.repeat(np.repeat(valid, 2, axis=0), 2, axis=1)
                masks[n] = pair.mask[top : top + tile_h, left : left + tile_w] & full_valid
            meta = {
                "scene": item["scene"],
                "cfa": item["cfa"],
                "test_reserve": bool(item["test_reserve"]),
                "tile": [top, left],
                "image_size": [height, width],
                "gt_file": os.path.basename(item["gt"][0]),
                "gt_sha1": item["gt"][1],
                "noisy_files": [os.path.basename(path) for path, _ in item["noisy"]],
                "noisy_sha1": [sha1 for _, sha1 in item["noisy"]],
                "best_alignment": [r["best_alignment"] for r in records],
                "bayer_alignment": bayer_shifts,
                "best_alignment_loss": [r["best_alignment_loss"] for r in records],
                "raw_gain": [r["raw_gain"] for r in records],
                "rgb_gain": [r["rgb_gain"] for r in records],
                "mask_mean": [r["mask_mean"] for r in records],
                "tile_mask_mean": [float(m.mean()) for m in masks],
                "overexposure_lb": records[0]["overexposure_lb"],
                "rgb_xyz_matrix": np.asarray(gt.rgb_xyz_matrix, dtype=float).tolist(),
                "is_bayer": True,
            }
            key = f"{item['cfa']}-{item['scene']}-{top:05d}-{left:05d}"
            yield key, {
                "gt_rgb": np.ascontiguousarray(gt_rgb[:, top : top + tile_h, left : left + tile_w]).astype(store_dtype),
                "noisy_bayer": noisy_tiles.astype(store_dtype),
                "mask": masks,
                "meta": meta,
            }


class RawNINDSource(Source):
    id = "rawnind"
    fingerprint = "stat"  # raw captures are tens of MB each: content hashing would read them twice

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--tile-size", dest="tile_size", type=int, default=DEFAULT_TILE,
                            help=f"tile edge in raw pixels, a multiple of 4 (default {DEFAULT_TILE})")
        parser.add_argument("--layout", choices=LAYOUTS, default="mosaic",
                            help="mosaic: the recorded uint16 mosaics, targets made at read time (default); "
                                 "legacy: float32 Rec.2020/RGGB tiles (Bayer only)")
        parser.add_argument("--store-dtype", dest="store_dtype", choices=STORE_DTYPES, default="float32",
                            help="legacy layout: dtype of the stored image tiles (float16 halves the shards)")
        parser.add_argument("--no-metadata-cache", dest="metadata_cache", action="store_false",
                            help="do not read or write metadata_cache.jsonl in the input directory")

    def check_options(self, options: dict) -> None:
        check_options(options)

    def plan(self, input: str, ctx: PlanContext) -> Plan:
        options = ctx.options
        root = os.path.abspath(input)
        index_path = os.path.join(root, INDEX_FILENAME)
        if not os.path.isfile(index_path):
            raise InputError(f"{index_path}: no index (run `wdsprep fetch rawnind {input} ...` first)")
        layout = options.get("layout") or "mosaic"
        scenes = build_scenes(load_index(index_path), None)
        by_split: dict[str, list[tuple[dict, int]]] = {"train": [], "test": []}
        for scene in scenes:
            if scene.cfa.lower() != "bayer" and layout == "legacy":
                ctx.report_bad(scene.key, "the legacy layout holds Bayer scenes only; not converted")  # a layout limit
                continue
            paths = {image.filename: _locate(root, image) for image in scene.images}
            missing = [name for name, path in paths.items() if path is None]
            if missing:
                ctx.skip_or_raise(scene.key, f"incomplete on disk, missing {', '.join(missing)}")
                continue
            if not scene.noisy:
                ctx.report_bad(scene.key, "no noisy capture")  # nothing to pair: no bad input
                continue
            item = scene_item(root, scene, {name: os.path.relpath(path, root) for name, path in paths.items()})
            size = sum(os.path.getsize(paths[image.filename]) for image in [scene.clean[0], *scene.noisy])
            by_split["test" if scene.test_reserve else "train"].append((item, size))
        if not any(by_split.values()):
            raise InputError(f"{input}: no complete scene to convert ({len(ctx.problems)} skipped: "
                             + "; ".join(f"{p['item']}: {p['message']}" for p in ctx.problems[:3]) + ")")
        # legacy float32 tiles: ~ (12 + 5 N) bytes per pixel vs 2 (1 + N) in the raw files
        expansion = 1 if layout == "mosaic" else 4 if options.get("store_dtype", "float32") == "float32" else 2
        units: list[Unit] = []
        for split, entries in by_split.items():
            groups = group_by_size([entry for entry, _ in entries], [size * expansion for _, size in entries],
                                   int(options.get("shard_bytes", 256 * 10**6)))
            for number, group in enumerate(groups):
                sizes = {id(entry): size for entry, size in entries}
                units.append(Unit(split, number, group, sum(sizes[id(entry)] for entry in group)))
        config = conversion_config(options)
        return Plan(units=units, config=config,
                    input_bytes=sum(unit.input_bytes for unit in units))

    def inputs(self, item: dict) -> list[str]:
        """A scene tile item reads its clean reference and its noisy captures."""
        return [os.path.join(item["root"], relpath) for relpath, _ in [item["gt"], *item["noisy"]]]

    def build(self, unit: Unit, ctx: UnitContext) -> Iterator[tuple[str, dict]]:
        options = ctx.options
        tile = int(options.get("tile_size") or DEFAULT_TILE)
        store_dtype = np.dtype(options.get("store_dtype", "float32"))
        for item in unit.items:
            root = item["root"]
            gt_path = os.path.join(root, item["gt"][0])
            noisy = [(os.path.join(root, path), sha1) for path, sha1 in item["noisy"]]
            cache = None
            if options.get("metadata_cache", True) and os.access(root, os.W_OK):
                cache = MetadataCache(root)
            try:
                pairs, _ = scene_metadata(gt_path, item["gt"][1], noisy, cache)
                gt = read_raw(gt_path)
                noisy_images = [read_raw(path) for path, _ in noisy]
            except InputError as error:
                ctx.skip_or_raise(f"{item['cfa']}/{item['scene']}", error)
                continue
            _add_pairs_table(item, pairs, ctx)
            if (options.get("layout") or "mosaic") == "mosaic":
                yield from _mosaic_tiles(item, gt, noisy_images, pairs, tile)
            else:
                noisy_rggb = [mono_to_rggb(image.mono) for image in noisy_images]
                yield from _scene_tiles(item, gt, noisy_rggb, pairs, tile, store_dtype)

    def finalize(self, plan: Plan, unit_tables) -> dict:
        return merge_pairs(unit_tables)

    def synth(self, directory: str, seed: int = 0, size: str = "small") -> None:
        from .synth import synth

        synth(directory, seed, size)

    def prepare_input(self, pipeline: dict, workdir: str) -> str:
        """synth a Dataverse directory -> serve it on 127.0.0.1 -> fetch through it -> the fetched dir.

        The pipeline's `[prepare]` table: `server_dir` (default `<workdir>/rawnind_dataverse`),
        `seed`, `size`, `concurrency`. A fetched directory whose report shows no failure is reused.
        """
        from .fetch import FetchOptions, fetch
        from .server import DataverseServer
        from .synth import synth

        settings = dict(pipeline.get("prepare", {}))
        dest = pipeline["input"]
        server_dir = settings.get("server_dir") or os.path.join(workdir, "rawnind_dataverse")
        if not os.path.isabs(server_dir):
            server_dir = os.path.join(os.path.dirname(os.path.abspath(workdir)), server_dir)
        if not os.path.exists(os.path.join(server_dir, "dataverse_dataset.json")):
            print(f"[rawnind] synthesizing a Dataverse directory in {server_dir}", flush=True)
            synth(server_dir, int(settings.get("seed", 0)), settings.get("size", "small"))
        with DataverseServer(server_dir) as server:
            print(f"[rawnind] serving {server_dir} at {server.url}; fetching into {dest}", flush=True)
            report = fetch(FetchOptions(
                dest=dest, dataverse=server.url, doi=server.doi,
                concurrency=int(settings.get("concurrency", 5)), progress="log", log_interval=5.0,
            ))
        if report["failed"]:
            raise RuntimeError(f"rawnind fetch failed for {len(report['failed'])} files: "
                               + json.dumps(report["failed"][:3]))
        return dest

    def commands(self) -> dict[tuple[str, str], Command]:
        from . import cli  # argparse only: the fetch and serve machinery loads when a command runs

        return {
            ("fetch", "rawnind"): Command(cli.add_fetch_arguments, cli.fetch_main, "DEST ...", "download RawNIND from a Dataverse server"),
            ("serve", "dataverse"): Command(cli.add_serve_arguments, cli.serve_main, "DIR", "a local Dataverse-compatible server"),
        }


SOURCE = RawNINDSource()
