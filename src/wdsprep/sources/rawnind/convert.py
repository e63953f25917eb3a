"""Fetched RawNIND scenes -> shards of clean/noisy scene tiles, in one of two layouts.

`--layout mosaic` (the default) stores what the cameras recorded. One sample per (scene, tile); a
sample holds every capture of the scene over the tile, unshifted, and the pairs as metadata:
  clean   uint16 [C, h+2m, w+2m]  every clean capture over the tile plus a margin `m` (the
                                  scene's largest shift + halo + 1, clipped at the image edges)
  noisy   uint16 [N, h+2a, w+2a]  every noisy capture over the tile plus a halo `a` (clipped)
  mask    uint8  [P, ceil(h*w/8)] per pair the bool mask over the tile in the pair's frame (loss
                                  mask x overexposure x overlap), bit-packed row-major
  meta    msgpack                 geometry (tile, windows), CFA pattern and colours, per capture
                                  files, SHA-1s, black/white levels and value ranges; per pair
                                  its reference, its y capture, alignment, gains, losses
and the reader makes the float targets (normalise, demosaic, colour transform, gain) for each crop
only, so shards are about the size of the raw files.

Pairs are upstream's (`metadata.scene_pairs`): every clean capture is a reference, paired with
every clean capture (itself included) and every noisy one. A pair's frame is its y capture's
(the noisy one's): a crop at an even position of the tile takes y there (its Bayer phase kept) and
the clean target at that position plus the exact shift, odd or even, as `rawproc.shift_images`
registers them. The clean margin covers that shift and the demosaic's halo (2 px Bayer: OpenCV's
EA demosaic of a window then equals the whole image's; 6 px X-Trans).

Tiles: the train split is cut into non-overlapping tiles of about T x T (`--tile-size`,
`tile_spans`); the test split into upstream's pre-crops (`precrop_regions`: 2048 px on a stride of
1536, as `tools/crop_datasets.py`), whatever `--tile-size`, so the validation and test loaders take
their crops where upstream takes them (the whole image when upstream makes no pre-crop).

`--layout legacy` (Bayer only) is the earlier float layout, kept for users whose code reads it (first
clean capture only, bilinear demosaic, shifts rounded down to even):
  gt_rgb       float32 [3, T, T]        clean, demosaiced, linear Rec.2020
  noisy_bayer  float32 [N, 4, T/2, T/2] every noisy capture, RGGB, aligned to the clean tile
  mask         bool    [N, T, T]        per noisy capture: loss mask x overexposure x overlap
  meta         msgpack                  scene, files, alignments, gains, mask means, matrix
on overlapping T x T tiles (`tile_origins`). Scenes in `test_reserve` go to the `test` split, the
others to `train`.

`RawNINDSource` (`SOURCE`) is what the core talks to: plan/build above, `synth` (a Dataverse
directory of synthetic captures) and the command `wdsprep fetch rawnind` (`acquire/cli.py`).
"""
from __future__ import annotations

import argparse
import os
import re
from typing import Iterator

import numpy as np

from ...errors import InputError
from ...command import Command
from ..base import Plan, PlanContext, Source, Unit, UnitContext, group_by_size
from .index import INDEX_FILENAME, build_scenes, load_index
from .metadata import MetadataCache, PairMetadata, scene_metadata, scene_pairs
from .raw import EA_HALO, RawImage, cam_to_lin_rec2020, demosaic, mono_to_rggb, read_raw, value_range
from .units import DEFAULT_TILE, LAYOUTS, STORE_DTYPES, check_options, conversion_config, merge_pairs, scene_item

ISO_IN_NAME = re.compile(r"_ISO(\d+)")  # a capture's ISO in its Dataverse name
HALO = {True: EA_HALO, False: 6}  # by is_bayer: OpenCV's EA reads 2 px (measured); LibRaw's VNG 2-3
# tools/crop_datasets.py: pre-crops of PREPROCESS_RAW_SIZE half-resolution (RGGB) pixels on a
# stride of PREPROCESS_RAW_SIZE - TRAIN_SIZE, while a TRAIN_SIZE crop and MAX_SHIFT_SEARCH still fit
PRECROP_RAW_SIZE, PRECROP_TRAIN_SIZE, PRECROP_MAX_SHIFT = 1024, 256, 128


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


def precrop_regions(height: int, width: int) -> list[tuple[int, int, int, int]]:
    """(top, left, height, width) in full-resolution pixels of upstream's pre-crops of a capture
    (`crop_datasets.create_raw_img_crops` on the RGGB image of `height/2 x width/2`), sorted by
    their coordinates `(x, y)` as the loaders sort them; `[whole image]` when it makes none."""
    raw_h, raw_w = height // 2, width // 2
    end_h, end_w = raw_h - raw_h % 16, raw_w - raw_w % 16
    regions = []
    x = 0
    while x + PRECROP_TRAIN_SIZE + PRECROP_MAX_SHIFT < end_w:
        y = 0
        while y + PRECROP_TRAIN_SIZE + PRECROP_MAX_SHIFT < end_h:
            y2, x2 = min(y + PRECROP_RAW_SIZE, end_h), min(x + PRECROP_RAW_SIZE, end_w)
            regions.append((2 * y, 2 * x, 2 * (y2 - y), 2 * (x2 - x)))
            y += PRECROP_RAW_SIZE - PRECROP_TRAIN_SIZE
        x += PRECROP_RAW_SIZE - PRECROP_TRAIN_SIZE
    return sorted(regions, key=lambda r: (r[1], r[0])) or [(0, 0, height, width)]


def _even(value: int) -> int:
    return value - (value % 2)


def _pair_files(item) -> list[tuple[str, str]]:
    """(reference file, y file) of every pair of a unit item, in `scene_pairs` order."""
    clean = [os.path.basename(path) for path, _ in item["clean"]]
    noisy = [os.path.basename(path) for path, _ in item["noisy"]]
    return [(clean[gt], (clean if y_clean else noisy)[y]) for gt, y_clean, y in scene_pairs(len(clean), len(noisy))]


def _add_pairs_table(item, pairs: list[PairMetadata], ctx, first_noisy_only: bool = False) -> None:
    """The manifest's rows for the pairs the shards hold (the legacy layout: the first clean capture's noisy pairs)."""
    scene_key = f"{item['cfa']}/{item['scene']}"
    for (gt_file, y_file), (gt, y_clean, _), pair in zip(_pair_files(item), _pair_kinds(item), pairs, strict=True):
        if first_noisy_only and (gt or y_clean):
            continue
        ctx.add_table_entry("pairs", {
            "scene": scene_key, "split": "test" if item["test_reserve"] else "train",
            "gt_file": gt_file, "noisy_file": y_file, "clean_clean": y_clean, "second_reference": gt > 0,
            **{name: value for name, value in pair.record.items() if name != "rgb_xyz_matrix"},
        })


def _pair_kinds(item) -> list[tuple[int, bool, int]]:
    return scene_pairs(len(item["clean"]), len(item["noisy"]))


def _ranges(image: RawImage) -> list[float]:
    """[min, max] of the normalised mosaic with each site's black level, then with channel 0's."""
    return [*value_range(image, legacy=False), *value_range(image, legacy=True)]


def _clip_window(top: int, left: int, height: int, width: int, margin_y: int, margin_x: int, shape) -> list[int]:
    """[y, x, h, w] of the tile grown by the margins, clipped to the image."""
    y0, x0 = max(top - margin_y, 0), max(left - margin_x, 0)
    y1, x1 = min(top + height + margin_y, shape[0]), min(left + width + margin_x, shape[1])
    return [y0, x0, y1 - y0, x1 - x0]


def scene_tiling(height: int, width: int, test: bool, tile: int) -> list[tuple[int, int, int, int]]:
    """(top, left, height, width) of a scene's tiles: upstream's pre-crops in the test split, else
    the `--tile-size` grid."""
    if test:
        return precrop_regions(height, width)
    return [(top, left, tile_h, tile_w) for top, tile_h in tile_spans(height, tile) for left, tile_w in tile_spans(width, tile)]


def _mosaic_tiles(item, clean: list[RawImage], noisy: list[RawImage], pairs: list[PairMetadata], tile: int) -> Iterator[tuple[str, dict]]:
    gt = clean[0]
    height, width = gt.data.shape
    paths = [path for path, _ in item["clean"] + item["noisy"]]
    for image, path in zip(clean + noisy, paths, strict=True):
        if image.data.shape != gt.data.shape or image.pattern.shape != gt.pattern.shape:
            raise InputError(f"{path}: mosaic {image.data.shape} {image.pattern.shape} does not match the clean "
                             f"capture's {gt.data.shape} {gt.pattern.shape}")
    records = [pair.record for pair in pairs]
    kinds = _pair_kinds(item)
    halo = HALO[gt.is_bayer]
    shifts = [record["best_alignment"] for record in records]
    # the clean window covers every pair's target: the exact shift, the halo, and one more pixel to
    # start a Bayer demosaic on an R site
    margin_y = max(abs(dy) for dy, _ in shifts) + halo + 1
    margin_x = max(abs(dx) for _, dx in shifts) + halo + 1
    files = _pair_files(item)
    test = bool(item["test_reserve"])
    regions = scene_tiling(height, width, test, tile)
    scene_meta = {
        "scene": item["scene"],
        "cfa": item["cfa"],
        "test_reserve": test,
        "layout": "mosaic",
        "tiling": "precrop" if test else "grid",
        "image_size": [height, width],
        "cfa_pattern": gt.pattern.tolist(),  # channel indices at the image origin
        "colors": gt.colors,
        "is_bayer": bool(gt.is_bayer),
        "halo": halo,
        "rgb_xyz_matrix": np.asarray(gt.rgb_xyz_matrix, dtype=float).tolist(),
        "overexposure_lb": float(gt.overexposure_lb),
        "clean_files": [os.path.basename(path) for path, _ in item["clean"]],
        "clean_sha1": [sha1 for _, sha1 in item["clean"]],
        "noisy_files": [os.path.basename(path) for path, _ in item["noisy"]],
        "noisy_sha1": [sha1 for _, sha1 in item["noisy"]],
        "clean_black_level": [[int(v) for v in image.black_level] for image in clean],
        "clean_white_level": [int(image.white_level) for image in clean],
        "clean_range": [_ranges(image) for image in clean] if gt.is_bayer else None,
        "noisy_black_level": [[int(v) for v in image.black_level] for image in noisy],
        "noisy_white_level": [int(image.white_level) for image in noisy],
        "noisy_range": [_ranges(image) for image in noisy] if gt.is_bayer else None,
        # per pair, in scene_pairs order
        "pair_gt": [g for g, _, _ in kinds],
        "pair_y_clean": [y_clean for _, y_clean, _ in kinds],
        "pair_y": [y for _, _, y in kinds],
        "gt_files": [gt_file for gt_file, _ in files],
        "y_files": [y_file for _, y_file in files],
        "best_alignment": shifts,
        "best_alignment_loss": [r["best_alignment_loss"] for r in records],
        "raw_gain": [r["raw_gain"] for r in records],
        "rgb_gain": [r["rgb_gain"] for r in records],
        "mask_mean": [r["mask_mean"] for r in records],
        "rgb_msssim_score": [r.get("rgb_msssim_score") for r in records],
        "scene_tiles": [[top, left, tile_h, tile_w] for top, left, tile_h, tile_w in regions],
    }
    for top, left, tile_h, tile_w in regions:
        clean_window = _clip_window(top, left, tile_h, tile_w, margin_y, margin_x, (height, width))
        noisy_window = _clip_window(top, left, tile_h, tile_w, halo, halo, (height, width))
        cy, cx, ch, cw = clean_window
        ny, nx, nh, nw = noisy_window
        masks = np.zeros((len(pairs), tile_h, tile_w), dtype=bool)
        for p, (pair, (dy, dx)) in enumerate(zip(pairs, shifts, strict=True)):
            # the pair's frame is its y capture's: tile position t shows clean[t + shift]
            masks[p] = _window(pair.mask, top + dy, left + dx, tile_h, tile_w)[0]
        meta = dict(scene_meta, tile=[top, left], tile_size=[tile_h, tile_w], clean_window=clean_window,
                    noisy_window=noisy_window, tile_mask_mean=[float(m.mean()) for m in masks])
        key = f"{item['cfa']}-{item['scene']}-{top:05d}-{left:05d}"
        yield key, {
            "clean": np.ascontiguousarray(np.stack([image.data[cy : cy + ch, cx : cx + cw] for image in clean])),
            "noisy": np.ascontiguousarray(np.stack([image.data[ny : ny + nh, nx : nx + nw] for image in noisy])
                                          if noisy else np.zeros((0, nh, nw), dtype=np.uint16)),
            "mask": np.packbits(masks.reshape(len(pairs), -1), axis=1),
            "meta": meta,
        }


def _scene_tiles(item, gt, noisy_rggb, pairs: list[PairMetadata], tile: int, store_dtype) -> Iterator[tuple[str, dict]]:
    """The legacy float layout (Bayer only); `pairs` are the first clean capture's noisy pairs."""
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
    show_with = "wdsprep.sources.rawnind.show:show"  # `wdsprep show` draws the reader's sample (show.py)
    fingerprint = "stat"  # raw captures are tens of MB each: content hashing would read them twice
    # the sample table's fields (selections): the mosaic (Bayer, X-Trans), and the lowest and highest
    # ISO of the tile's noisy captures (computed from their names, `..._ISO<n>_sha1=...`)
    index_fields = ("meta.cfa", "iso_min", "iso_max")

    def index_values(self, key: str, sample: dict) -> dict:
        isos = [int(match.group(1)) for name in sample["meta"].get("noisy_files", ())
                if (match := ISO_IN_NAME.search(name))]
        return {"iso_min": min(isos, default=None), "iso_max": max(isos, default=None)}

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
            size = sum(os.path.getsize(paths[image.filename]) for image in scene.images)
            by_split["test" if scene.test_reserve else "train"].append((item, size))
        if not any(by_split.values()):
            raise InputError(f"{input}: no complete scene to convert ({len(ctx.problems)} skipped: "
                             + "; ".join(f"{p['item']}: {p['message']}" for p in ctx.problems[:3]) + ")")
        # legacy float32 tiles: ~ (12 + 5 N) bytes per pixel vs 2 (1 + N) in the raw files
        expansion = 1 if layout == "mosaic" else 4 if options.get("store_dtype", "float32") == "float32" else 2
        units: list[Unit] = []
        for split, entries in by_split.items():
            groups = group_by_size([entry for entry, _ in entries], [size * expansion for _, size in entries],
                                   ctx.core.shard_bytes)
            for number, group in enumerate(groups):
                sizes = {id(entry): size for entry, size in entries}
                units.append(Unit(split, number, group, sum(sizes[id(entry)] for entry in group)))
        config = conversion_config(options)
        return Plan(units=units, config=config,
                    input_bytes=sum(unit.input_bytes for unit in units))

    def inputs(self, item: dict) -> list[str]:
        """A scene item reads its clean and noisy captures."""
        return [os.path.join(item["root"], relpath) for relpath, _ in [*item["clean"], *item["noisy"]]]

    def build(self, unit: Unit, ctx: UnitContext) -> Iterator[tuple[str, dict]]:
        options = ctx.options
        tile = int(options.get("tile_size") or DEFAULT_TILE)
        store_dtype = np.dtype(options.get("store_dtype", "float32"))
        for item in unit.items:
            root = item["root"]
            noisy = [(os.path.join(root, path), sha1) for path, sha1 in item["noisy"]]
            clean = [(os.path.join(root, path), sha1) for path, sha1 in item["clean"]]
            cache = None
            if options.get("metadata_cache", True) and os.access(root, os.W_OK):
                cache = MetadataCache(root)
            try:
                pairs, _ = scene_metadata(clean, noisy, cache)
                clean_images = [read_raw(path) for path, _ in clean]
                noisy_images = [read_raw(path) for path, _ in noisy]
            except InputError as error:
                ctx.skip_or_raise(f"{item['cfa']}/{item['scene']}", error)
                continue
            mosaic = (options.get("layout") or "mosaic") == "mosaic"
            _add_pairs_table(item, pairs, ctx, first_noisy_only=not mosaic)
            if mosaic:
                yield from _mosaic_tiles(item, clean_images, noisy_images, pairs, tile)
            else:
                first = [pair for (gt, y_clean, _), pair in zip(_pair_kinds(item), pairs) if gt == 0 and not y_clean]
                noisy_rggb = [mono_to_rggb(image.mono) for image in noisy_images]
                yield from _scene_tiles(item, clean_images[0], noisy_rggb, first, tile, store_dtype)

    def finalize(self, plan: Plan, unit_tables) -> dict:
        return merge_pairs(unit_tables)

    def synth(self, directory: str, seed: int = 0, size: str = "small") -> None:
        from .synth import synth

        synth(directory, seed, size)

    def commands(self) -> list[Command]:
        from .acquire.cli import COMMAND  # no httpx or trio: the fetcher loads when `fetch rawnind` runs

        return [COMMAND]


SOURCE = RawNINDSource()
