"""Fetched RawNIND scenes -> shards of aligned clean/noisy tiles.

Layout: one shard sample per (scene, tile). A tile is a `T x T` window of the scene's reference
clean capture (the first clean image, as the loaders use), holding
  gt_rgb       float32 [3, T, T]        clean, demosaiced, linear Rec.2020
  noisy_bayer  float32 [N, 4, T/2, T/2] every noisy capture, RGGB, aligned to the clean tile
  mask         bool    [N, T, T]        per noisy capture: loss mask x overexposure x overlap
  meta         msgpack                  scene, files, alignments, gains, mask means, matrix
so the clean tile is stored once for all its noisy captures and the reader can draw the legacy
loader's random crops from any (tile, noisy) pair without touching another sample.

Alignment keeps the Bayer phase: a noisy capture is sampled at `clean - shift` with the shift
rounded down to even numbers (the original trims one extra row/column for an odd shift; both
leave at most one pixel of misalignment). Windows outside the noisy capture are zero, and masked.
Scenes in `test_reserve` go to the `test` split, the others to `train`.
"""
from __future__ import annotations

import argparse
import os
from typing import Iterator

import numpy as np

from ...errors import InputError
from ..base import Plan, Unit, UnitContext, group_by_size
from .index import INDEX_FILENAME, build_scenes, load_index
from .metadata import MetadataCache, PairMetadata, scene_metadata
from .raw import cam_to_lin_rec2020, demosaic, mono_to_rggb, read_bayer

DEFAULT_TILE = 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tile-size", dest="tile_size", type=int, default=DEFAULT_TILE,
                        help=f"tile edge in raw pixels, a multiple of 4 (default {DEFAULT_TILE})")
    parser.add_argument("--store-dtype", dest="store_dtype", choices=["float32", "float16"], default="float32",
                        help="dtype of the stored image tiles (float16 halves the shards, as the legacy crops)")
    parser.add_argument("--no-metadata-cache", dest="metadata_cache", action="store_false",
                        help="do not read or write metadata_cache.jsonl in the input directory")


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


def item_inputs(item: dict) -> list[str]:
    """A scene tile item reads its clean reference and its noisy captures."""
    return [os.path.join(item["root"], relpath) for relpath, _ in [item["gt"], *item["noisy"]]]


def plan(input: str, options: dict) -> Plan:
    root = os.path.abspath(input)
    index_path = os.path.join(root, INDEX_FILENAME)
    if not os.path.isfile(index_path):
        raise InputError(f"{index_path}: no index (run `wdsprep fetch rawnind {input} ...` first)")
    tile = int(options.get("tile_size") or DEFAULT_TILE)
    if tile < 8 or tile % 4:
        raise InputError(f"{input}: --tile-size {tile} must be a multiple of 4, at least 8")
    scenes = build_scenes(load_index(index_path), None)
    problems: list[dict] = []
    by_split: dict[str, list[tuple[dict, int]]] = {"train": [], "test": []}
    for scene in scenes:
        if scene.cfa.lower() != "bayer":
            problems.append({"item": scene.key, "message": "X-Trans scenes need darktable; not converted"})
            continue
        paths = {image.filename: _locate(root, image) for image in scene.images}
        missing = [name for name, path in paths.items() if path is None]
        if missing:
            problems.append({"item": scene.key, "message": f"incomplete on disk, missing {', '.join(missing)}"})
            continue
        if not scene.noisy:
            problems.append({"item": scene.key, "message": "no noisy capture"})
            continue
        reference = scene.clean[0]
        item = {
            "root": root,
            "cfa": scene.cfa,
            "scene": scene.name,
            "test_reserve": scene.test_reserve,
            "gt": [os.path.relpath(paths[reference.filename], root), reference.sha1],
            "noisy": [[os.path.relpath(paths[image.filename], root), image.sha1] for image in scene.noisy],
        }
        size = sum(os.path.getsize(paths[image.filename]) for image in [reference, *scene.noisy])
        by_split["test" if scene.test_reserve else "train"].append((item, size))
    if not any(by_split.values()):
        raise InputError(f"{input}: no complete Bayer scene to convert ({len(problems)} skipped: "
                         + "; ".join(f"{p['item']}: {p['message']}" for p in problems[:3]) + ")")
    # shards hold float32 tiles: ~ (12 + 5 N) bytes per pixel vs 2 (1 + N) in the raw files
    expansion = 4 if options.get("store_dtype", "float32") == "float32" else 2
    units: list[Unit] = []
    for split, entries in by_split.items():
        groups = group_by_size([entry for entry, _ in entries], [size * expansion for _, size in entries],
                               int(options.get("shard_bytes", 256 * 10**6)))
        for number, group in enumerate(groups):
            sizes = {id(entry): size for entry, size in entries}
            units.append(Unit(split, number, group, sum(sizes[id(entry)] for entry in group)))
    config = {
        "tile_size": tile,
        "store_dtype": options.get("store_dtype", "float32"),
        "reference": "first clean capture",
        "layout": "scene tile: gt_rgb [3,T,T], noisy_bayer [N,4,T/2,T/2], mask [N,T,T], meta",
        "target": "lin_rec2020 (bilinear demosaic)",
    }
    return Plan(units=units, config=config,
                input_bytes=sum(unit.input_bytes for unit in units), problems=problems)


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


def _even(value: int) -> int:
    return value - (value % 2)


def build(unit: Unit, ctx: UnitContext) -> Iterator[tuple[str, dict]]:
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
            gt = read_bayer(gt_path)
            noisy_rggb = [mono_to_rggb(read_bayer(path).mono) for path, _ in noisy]
        except InputError as error:
            if options.get("on_error") == "skip":
                ctx.report_bad(f"{item['cfa']}/{item['scene']}", str(error))
                continue
            raise
        yield from _scene_tiles(item, gt, noisy_rggb, pairs, tile, store_dtype, ctx)


def _scene_tiles(item, gt, noisy_rggb, pairs: list[PairMetadata], tile: int, store_dtype, ctx) -> Iterator[tuple[str, dict]]:
    gt_rgb = cam_to_lin_rec2020(demosaic(gt.mono), gt.rgb_xyz_matrix)
    height, width = gt_rgb.shape[1:]
    tile_h, tile_w = min(tile, height) & ~3, min(tile, width) & ~3
    records = [pair.record for pair in pairs]
    bayer_shifts = [[_even(r["best_alignment"][0]), _even(r["best_alignment"][1])] for r in records]
    scene_key = f"{item['cfa']}/{item['scene']}"
    for position, (path, sha1) in enumerate(item["noisy"]):
        ctx.add_table_entry("pairs", {
            "scene": scene_key, "split": "test" if item["test_reserve"] else "train",
            "gt_file": os.path.basename(item["gt"][0]), "noisy_file": os.path.basename(path),
            **{name: value for name, value in records[position].items() if name != "rgb_xyz_matrix"},
        })
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


def finalize(plan_: Plan, unit_tables) -> dict:
    pairs = [entry for tables in unit_tables for entry in tables.get("pairs", [])]
    return {"pairs": pairs}
