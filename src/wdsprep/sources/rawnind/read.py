"""Reader stages: scene tiles -> the legacy `rawds` crop-pair samples.

`pairs(...)` reproduces `CleanProfiledRGBNoisyBayerImageCropsDataset.__getitem__` (and, with
`input="rgb"`, `CleanProfiledRGBNoisyProfiledRGBImageCropsDataset`): for each (tile, pair) that
passes the construction filters (alignment loss, mask mean, MS-SSIM; the pairs are upstream's,
clean-clean and second-reference ones included), draw `num_crops` random crops of `crop_size`
starting on even coordinates of the pair's frame (its y capture's: the Bayer phase), redrawing a
crop up to 10 times while its valid fraction is under `min_valid`, and yield
  x_crops        float32 [num_crops, 3, crop, crop]       clean, linear Rec.2020, at the crop
                                                          position plus the pair's exact shift
  y_crops        float32 [num_crops, 4, crop/2, crop/2]   y RGGB ([num_crops, 3, crop, crop]
                                                          linear Rec.2020 with input="rgb")
  mask_crops     bool    [num_crops, 3, crop, crop]
  rgb_xyz_matrix float32 [4, 3]
  gain           float   raw_gain (rgb_gain for RGB input; 1.0 with match_gain=True, y_crops
                         then multiplied by it)
Both shard layouts are read (see `convert`). In the mosaic layout the targets are made here, over
each crop only: normalise `(x - black) / (white - black)` (each site's black level; channel 0's
with `legacy_values=True`, as the original), demosaic the crop plus its halo (Bayer: upstream's
OpenCV EA demosaic with the whole capture's scale, equal to the whole image's; X-Trans: LibRaw
VNG), then camRGB -> linear Rec.2020. `validation` and `evaluation` take upstream's validation and
test crops from the test split's pre-crop tiles. Randomness comes from (seed, epoch, sample key,
pair index) only, so a replay is exact. The epoch is `epoch=` when given, else each sample's
`__epoch__` (stamped by `wdsprep.dataset`), else the stage's own count of iterations (0 for the
first pass, 1 for the next).
"""
from __future__ import annotations

import hashlib
import itertools
from typing import Callable, Iterable, Iterator

import numpy as np

from ...errors import ConfigError
from ...shards.codec import decode_sample
from .metadata import aligned_span
from .raw import EA_HALO, cam_to_lin_rec2020_matrix, demosaic_ea, demosaic_libraw, ea_scale, mono_to_rggb, normalise

CROP_RETRIES = 10  # MAX_RANDOM_CROP_ATTEMPS: redraws after the first draw


def _rng(seed: int, epoch: int, key: str, noisy_index: int) -> np.random.Generator:
    digest = hashlib.sha256(f"{seed}:{epoch}:{key}:{noisy_index}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:16], "little"))


def _draw_crops(rng: np.random.Generator, mask: np.ndarray, crop_size: int, num_crops: int, min_valid: float):
    """Even (y, x) crop origins; None when a crop stays under `min_valid` after the retries."""
    height, width = mask.shape
    origins = []
    for _ in range(num_crops):
        for _attempt in range(1 + CROP_RETRIES):
            y = int(rng.integers(0, (height - crop_size) // 2 + 1)) * 2
            x = int(rng.integers(0, (width - crop_size) // 2 + 1)) * 2
            if mask[y : y + crop_size, x : x + crop_size].mean() >= min_valid:
                origins.append((y, x))
                break
        else:
            return None
    return origins


def crop_pair(
    sample: dict,
    n: int,
    rng: np.random.Generator,
    *,
    crop_size: int = 256,
    num_crops: int = 4,
    min_valid: float = 0.5,
    pairing: str = "x_y",
    **options,
) -> dict | None:
    """The legacy sample of pair `n` of a decoded tile; None if no crop set is valid. `options`:
    the rest of `crops_at`'s (match_gain, to_torch, gain_key, legacy_values, input)."""
    mask = tile_mask(sample, n)
    if pairing != "x_y":
        mask = np.ones_like(mask)  # the legacy x_x / y_y pairings use an all-valid mask
    height, width = mask.shape
    if height < crop_size or width < crop_size:
        raise ConfigError(f"{sample.get('__key__')}: tile {height}x{width} is smaller than crop_size {crop_size}")
    origins = _draw_crops(rng, mask, crop_size, num_crops, min_valid)
    if origins is None:
        return None
    return crops_at(sample, n, origins, crop_size=crop_size, pairing=pairing, mask=mask, **options)


def is_mosaic(sample: dict) -> bool:
    return "clean" in sample


def tile_mask(sample: dict, n: int) -> np.ndarray:
    """bool [h, w] valid mask of noisy capture `n` over the tile (either layout)."""
    if not is_mosaic(sample):
        return sample["mask"][n]
    height, width = sample["meta"]["tile_size"]
    return np.unpackbits(sample["mask"][n], count=height * width).reshape(height, width).view(bool)


def _capture(sample: dict, y_clean: bool, index: int):
    """(mosaic window, its origin in the image, black levels, white level, value range) of clean
    capture `index` (`y_clean`) or noisy capture `index`."""
    meta = sample["meta"]
    kind = "clean" if y_clean else "noisy"
    ranges = meta[f"{kind}_range"]
    return (sample[kind][index], meta[f"{kind}_window"][:2], meta[f"{kind}_black_level"][index],
            meta[f"{kind}_white_level"][index], None if ranges is None else ranges[index])


def _mosaic_rec2020(sample: dict, capture, starts, shape: tuple[int, int], legacy: bool) -> np.ndarray:
    """Linear Rec.2020 crops [k, 3, h, w] of a capture at image positions `starts` (any parity),
    made over each crop only: normalise and demosaic the crop plus its halo (a Bayer window starts
    on an R site and is scaled by the whole capture's range: the whole image's EA demosaic, bit for
    bit), then camRGB -> Rec.2020. Pixels outside the image (a target beyond the edge, masked) are 0."""
    meta = sample["meta"]
    pattern = np.asarray(meta["cfa_pattern"], dtype=np.uint8)
    mosaic, (wy, wx), black, white, ranges = capture
    matrix = cam_to_lin_rec2020_matrix(np.asarray(meta["rgb_xyz_matrix"], dtype=np.float32)).astype(np.float32)
    image_h, image_w = meta["image_size"]
    bayer = pattern.shape == (2, 2)
    halo = EA_HALO if bayer else meta["halo"]
    height, width = shape
    out = np.zeros((len(starts), 3, height, width), dtype=np.float32)
    for k, (y, x) in enumerate(starts):
        r0, c0 = max(y - halo, 0), max(x - halo, 0)
        if bayer:
            r0, c0 = r0 - r0 % 2, c0 - c0 % 2
        r1, c1 = min(y + height + halo, image_h), min(x + width + halo, image_w)
        if not (wy <= r0 and wx <= c0 and r1 <= wy + mosaic.shape[0] and c1 <= wx + mosaic.shape[1]):
            raise ConfigError(f"{sample.get('__key__')}: crop at {(y, x)} needs mosaic outside the stored window")
        inside_y0, inside_y1 = max(y, 0), min(y + height, image_h)
        inside_x0, inside_x1 = max(x, 0), min(x + width, image_w)
        if inside_y0 >= inside_y1 or inside_x0 >= inside_x1:
            continue
        window = mosaic[r0 - wy : r1 - wy, c0 - wx : c1 - wx]
        if bayer:
            mono = normalise(window, pattern, black, white, (r0, c0), legacy)
            rgb = demosaic_ea(mono, ea_scale(*(ranges[2:] if legacy else ranges[:2])))
        else:
            rolled = np.roll(pattern, (-r0, -c0), axis=(0, 1))
            rgb = demosaic_libraw(window, rolled, meta["colors"], black[int(rolled.flat[0])], white)
        part = np.ascontiguousarray(rgb[:, inside_y0 - r0 : inside_y1 - r0, inside_x0 - c0 : inside_x1 - c0])
        converted = (matrix @ part.reshape(3, -1)).reshape(part.shape)
        out[k, :, inside_y0 - y : inside_y1 - y, inside_x0 - x : inside_x1 - x] = converted
    return out


def _mosaic_rggb(sample: dict, capture, starts, shape: tuple[int, int], legacy: bool) -> np.ndarray:
    """RGGB crops [k, 4, h/2, w/2] of a capture at even image positions `starts` (inside the image)."""
    meta = sample["meta"]
    if len(meta["cfa_pattern"]) != 2:
        raise ConfigError(f"{sample.get('__key__')}: an X-Trans mosaic has no RGGB form (use input='rgb')")
    pattern = np.asarray(meta["cfa_pattern"], dtype=np.uint8)
    mosaic, (wy, wx), black, white, _ = capture
    out = np.empty((len(starts), 4, shape[0] // 2, shape[1] // 2), dtype=np.float32)
    for k, (y, x) in enumerate(starts):
        mono = normalise(mosaic[y - wy : y - wy + shape[0], x - wx : x - wx + shape[1]], pattern, black, white, (y, x), legacy)
        out[k] = mono_to_rggb(mono[None])
    return out


PAIRINGS = ("x_y", "x_x", "y_y")  # the legacy `data_pairing`: clean/noisy, clean/clean, noisy/noisy


def crops_at(
    sample: dict,
    n: int,
    origins: list[tuple[int, int]],
    *,
    crop_size: int | tuple[int, int] = 256,
    match_gain: bool = False,
    to_torch: bool = True,
    gain_key: str | None = None,
    legacy_values: bool = False,
    input: str = "bayer",
    pairing: str = "x_y",
    mask: np.ndarray | None = None,
) -> dict:
    """The legacy sample of pair `n` at the given even tile-relative crop origins.

    In the mosaic layout an origin is in the pair's frame (its y capture's): y is cropped there
    (its Bayer phase kept) and the clean target at the origin plus the pair's exact shift, as
    `rawproc.shift_images` aligns them. `crop_size` is an int or (height, width). `pairing` as the
    legacy `data_pairing`: "x_y" clean target / y input; "x_x" the pair's clean capture as both
    (the clean-clean variants); "y_y" its y capture as both; the last two are not shifted and have
    an all-valid mask, as the legacy loaders.
    """
    meta = sample["meta"]
    height, width = (crop_size, crop_size) if isinstance(crop_size, int) else tuple(crop_size)
    if pairing not in PAIRINGS:
        raise ConfigError(f"pairing={pairing!r} is not one of {', '.join(PAIRINGS)}")
    gain_key = gain_key or ("raw_gain" if input == "bayer" else "rgb_gain")
    if is_mosaic(sample):
        top, left = meta["tile"]
        starts = [(top + y, left + x) for y, x in origins]
        gt = _capture(sample, True, meta["pair_gt"][n])
        y_capture = _capture(sample, meta["pair_y_clean"][n], meta["pair_y"][n])
        if pairing == "x_y":
            dy, dx = meta["best_alignment"][n]
            x_source, x_starts, y_source = gt, [(y + dy, x + dx) for y, x in starts], y_capture
        else:
            x_source = y_source = gt if pairing == "x_x" else y_capture
            x_starts = starts
        x_crops = _mosaic_rec2020(sample, x_source, x_starts, (height, width), legacy_values)
        if input == "bayer":
            y_crops = _mosaic_rggb(sample, y_source, starts, (height, width), legacy_values)
        else:
            y_crops = _mosaic_rec2020(sample, y_source, starts, (height, width), legacy_values)
    else:
        if input != "bayer" or pairing != "x_y":
            raise ConfigError(f"{sample.get('__key__')}: the legacy layout holds clean RGB and noisy RGGB tiles only "
                              "(input='bayer', pairing='x_y')")
        gt, noisy = sample["gt_rgb"], sample["noisy_bayer"]
        x_crops = np.stack([gt[:, y : y + height, x : x + width] for y, x in origins]).astype(np.float32)
        y_crops = np.stack([noisy[n, :, y // 2 : (y + height) // 2, x // 2 : (x + width) // 2] for y, x in origins]).astype(np.float32)
    if pairing == "x_y":
        mask = tile_mask(sample, n) if mask is None else mask
        mask_crops = np.stack([np.broadcast_to(mask[y : y + height, x : x + width], (3, height, width)) for y, x in origins])
    else:
        mask_crops = np.ones((len(origins), 3, height, width), dtype=bool)
    gain = float(meta[gain_key][n])
    if match_gain:
        y_crops *= np.float32(gain)
        gain = 1.0
    out = {
        "x_crops": x_crops,
        "y_crops": y_crops,
        "mask_crops": np.ascontiguousarray(mask_crops),
        "rgb_xyz_matrix": np.asarray(meta["rgb_xyz_matrix"], dtype=np.float32),
        "gain": gain,
    }
    if to_torch:
        import torch

        for name in ("x_crops", "y_crops", "mask_crops", "rgb_xyz_matrix"):
            out[name] = torch.from_numpy(out[name])
    return out


def pair_passes(meta: dict, n: int, max_alignment_loss: float | None, min_mask_mean: float | None,
                min_msssim_score: float | None = None, max_msssim_score: float | None = None,
                clean_clean: bool = True, second_references: bool = True) -> bool:
    """The legacy constructor's filters (`alignment_max_loss`, `mask_mean_min`, and its MS-SSIM
    bounds: a pair goes when `min > score`, or when `max` is set, not 1.0 and `max < score`), and
    this reader's two: `clean_clean=False` leaves out pairs whose y is a clean capture,
    `second_references=False` pairs whose reference is not the scene's first clean capture."""
    if not clean_clean and meta.get("pair_y_clean", {n: False})[n]:
        return False
    if not second_references and meta.get("pair_gt", {n: 0})[n] > 0:
        return False
    if max_alignment_loss is not None and meta["best_alignment_loss"][n] > max_alignment_loss:
        return False
    if min_mask_mean is not None and meta["mask_mean"][n] < min_mask_mean:
        return False
    if min_msssim_score or (max_msssim_score and max_msssim_score != 1.0):
        scores = meta.get("rgb_msssim_score")
        if scores is None or scores[n] is None:
            raise ConfigError(f"{meta.get('scene')}: pair {n} has no rgb_msssim_score (needed by the MS-SSIM filter; "
                              "convert with this version's mosaic layout)")
        if min_msssim_score and min_msssim_score > scores[n]:
            return False
        if max_msssim_score and max_msssim_score != 1.0 and max_msssim_score < scores[n]:
            return False
    return True


def _check_crop_size(crop_size: int) -> None:
    if crop_size % 4 or crop_size <= 0:
        raise ConfigError(f"crop_size {crop_size} must be a positive multiple of 4 (Bayer crops are crop/2)")


def _sample_epoch(sample: dict, iteration: int) -> int:
    """`__epoch__` of a `wdsprep.dataset` sample; the stage's iteration count without one."""
    value = sample.get("__epoch__")
    if value is None:
        return iteration
    return int(value.decode() if isinstance(value, (bytes, bytearray)) else value)


def pair_files(meta: dict, n: int) -> tuple[str, str]:
    """(reference file, y file) of pair `n` (either layout)."""
    if "y_files" in meta:
        return meta["gt_files"][n], meta["y_files"][n]
    return meta["gt_file"], meta["noisy_files"][n]


def pair_count(sample: dict) -> int:
    """Pairs of a tile: every (reference, y) pair in the mosaic layout, every noisy capture in the legacy one."""
    return len(sample["meta"]["best_alignment_loss"])


def _pairs(source: Iterable[dict], options: dict, filters: dict, seed: int, epoch: int | None, iteration: int) -> Iterator[dict]:
    _check_crop_size(options["crop_size"])
    for raw in source:
        sample = decode_sample(raw)
        key = sample["__key__"]
        if options["input"] == "bayer" and not sample["meta"].get("is_bayer", True):
            continue  # X-Trans scenes have no RGGB input (upstream trains them as RGB -> RGB)
        sample_epoch = epoch if epoch is not None else _sample_epoch(sample, iteration)
        for n in range(pair_count(sample)):
            if not pair_passes(sample["meta"], n, **filters):
                continue
            out = crop_pair(sample, n, _rng(seed, sample_epoch, key, n), **options)
            if out is None:
                continue  # the legacy loader drops such a crop and retries another item
            out["__key__"] = f"{key}-{n}"  # and no bookkeeping: a user's collate batches only the pair
            yield out


INPUTS = ("bayer", "rgb")


def pairs(
    crop_size: int = 256,
    num_crops: int = 4,
    min_valid: float = 0.5,
    match_gain: bool = False,
    max_alignment_loss: float | None = 0.035,
    min_mask_mean: float | None = 0.8,
    min_msssim_score: float | None = 0.0,
    max_msssim_score: float | None = 1.0,
    seed: int = 0,
    epoch: int | None = None,
    to_torch: bool = True,
    gain_key: str | None = None,
    legacy_values: bool = False,
    input: str = "bayer",
    pairing: str = "x_y",
    clean_clean: bool = True,
    second_references: bool = True,
):
    """Curried stage: `wds.WebDataset(urls).compose(wdsprep.rawnind.pairs(crop_size=256))`.

    Defaults are the legacy loader's (`crop_size: 256`, `num_crops_per_image: 4`, alignment loss
    <= 0.035, mask mean >= 0.8, 0.5 valid per crop, MS-SSIM bounds 0 and 1 i.e. off). Pass None to
    a filter to disable it.
    `input="bayer"`: RGGB noisy crops of Bayer scenes (CleanProfiledRGBNoisyBayer...); `"rgb"`:
    linear Rec.2020 noisy crops of every scene, X-Trans included (...NoisyProfiledRGB...).
    `pairing` is the legacy `data_pairing` ("x_y", or "x_x" / "y_y": the clean or the noisy capture
    as both x and y, with an all-valid mask; mosaic layout only).
    `legacy_values=True`: channel 0's black level for every site, as the original code.
    The pairs are upstream's: every clean capture of a scene is a reference, paired with every
    clean capture (itself included) and every noisy one; `clean_clean=False` leaves out the pairs
    whose y is clean, `second_references=False` those whose reference is not the first clean
    capture (upstream's way is the MS-SSIM bound: a self pair scores 1.0).

    Crops change every epoch: with `epoch=None` (the default) a sample's epoch is its `__epoch__`
    (set by `wdsprep.dataset`), and without one the number of earlier iterations of this stage
    (plain `wds.WebDataset`: 0, 1, 2, ... per pass). An explicit `epoch=` fixes the draws. A
    DataLoader without `persistent_workers` copies the stage afresh each epoch, so there pass
    `epoch=` (or read through `wdsprep.dataset`) to get new crops.
    """
    if input not in INPUTS:
        raise ConfigError(f"input={input!r} is not one of {', '.join(INPUTS)}")
    if pairing not in PAIRINGS:
        raise ConfigError(f"pairing={pairing!r} is not one of {', '.join(PAIRINGS)}")
    iterations = itertools.count()
    options = dict(crop_size=crop_size, num_crops=num_crops, min_valid=min_valid, match_gain=match_gain,
                   to_torch=to_torch, gain_key=gain_key, legacy_values=legacy_values, input=input, pairing=pairing)
    filters = dict(max_alignment_loss=max_alignment_loss, min_mask_mean=min_mask_mean,
                   min_msssim_score=min_msssim_score, max_msssim_score=max_msssim_score,
                   clean_clean=clean_clean, second_references=second_references)

    def stage(source: Iterable[dict]) -> Iterator[dict]:
        return _pairs(source, options, filters, seed, epoch, next(iterations))

    return stage


def _evaluation_items(source: Iterable[dict], filters: dict, input: str, middle_only: bool):
    """(decoded tile, pair index) of the pairs an evaluation loader reads, in stream order."""
    for raw in source:
        sample = decode_sample(raw)
        meta = sample["meta"]
        if not is_mosaic(sample) or meta.get("tiling") != "precrop":
            raise ConfigError(f"{sample.get('__key__')}: validation/test readers need the test split's pre-crop tiles "
                              "(mosaic layout)")
        if input == "bayer" and not meta["is_bayer"]:
            continue
        if middle_only:
            # the legacy validation loader takes the middle of the pre-crops sorted by (x, y)
            tiles = meta["scene_tiles"]
            if tiles[len(tiles) // 2][:2] != meta["tile"]:
                continue
        for n in range(pair_count(sample)):
            if pair_passes(meta, n, **filters):
                yield sample, n


def aligned_precrop(meta: dict, n: int, pairing: str = "x_y") -> tuple[int, int, int, int]:
    """(y, x, height, width) of pair `n`'s part of a pre-crop tile, tile-relative in the pair's
    frame: where `rawproc.shift_images` leaves the noisy pre-crop once aligned (the whole pre-crop
    for the unshifted x_x / y_y pairings)."""
    height, width = meta["tile_size"]
    if pairing != "x_y":
        return 0, 0, height, width
    (_, y, h), (_, x, w) = (aligned_span(length, d) for length, d in zip((height, width), meta["best_alignment"][n]))
    return y, x, h, w


def _evaluation_sample(sample, n, origin, shape, options, batch: bool) -> dict:
    out = crops_at(sample, n, [origin], crop_size=shape, **options)
    to_torch = options["to_torch"]
    for name in ("x_crops", "y_crops", "mask_crops"):
        out[name] = out[name] if batch else out[name][0]
    if batch:
        out["rgb_xyz_matrix"] = out["rgb_xyz_matrix"][None]
    if to_torch:
        import torch

        out["gain"] = torch.tensor(out["gain"])
    meta = sample["meta"]
    top, left = meta["tile"]
    position = [top + origin[0], left + origin[1]]
    dy, dx = meta["best_alignment"][n] if options["pairing"] == "x_y" else (0, 0)
    out.update(__key__=f"{sample['__key__']}-{n}-{origin[0]:05d}-{origin[1]:05d}", gt_file=meta["gt_files"][n],
               y_file=meta["y_files"][n], position=position, gt_position=[position[0] + dy, position[1] + dx])
    return out


def _trim_256(height: int, width: int) -> tuple[int, int]:
    """The legacy `crop_size=0`: the whole aligned pre-crop, trimmed to multiples of 256."""
    return height - height % 256, width - width % 256


def _evaluation_stage(settings: dict, middle_only: bool, crops) -> Callable:
    """The curried stage of an evaluation loader (`validation`, `evaluation`), from its keyword
    `settings` (checked here: the pairing) and `crops(sample, n, aligned pre-crop (y0, x0, height,
    width), options)`, the items of pair `n` of a tile, for each pair passing the filters."""
    if settings["pairing"] not in PAIRINGS:
        raise ConfigError(f"pairing={settings['pairing']!r} is not one of {', '.join(PAIRINGS)}")
    options = {name: settings[name] for name in ("match_gain", "to_torch", "legacy_values", "input", "pairing")}
    filters = {name: settings[name] for name in ("max_alignment_loss", "min_mask_mean", "min_msssim_score",
                                                 "max_msssim_score", "clean_clean", "second_references")}

    def stage(source: Iterable[dict]) -> Iterator[dict]:
        for sample, n in _evaluation_items(source, filters, options["input"], middle_only=middle_only):
            yield from crops(sample, n, aligned_precrop(sample["meta"], n, options["pairing"]), options)

    return stage


def validation(crop_size: int = 256, match_gain: bool = False, max_alignment_loss: float | None = 0.035,
               min_mask_mean: float | None = 0.8, input: str = "bayer", pairing: str = "x_y",
               legacy_values: bool = False, to_torch: bool = True, min_msssim_score: float | None = 0.0,
               max_msssim_score: float | None = 1.0, clean_clean: bool = True, second_references: bool = True):
    """Curried stage: the legacy `...ImageCropsValidationDataset` items (the test split, mosaic layout).

    Per pair passing the filters, the middle pre-crop of its scene (sorted by (x, y) as the legacy
    loader sorts them) aligned as `shift_images` aligns it (`aligned_precrop`), and in it the
    centre crop (`h//2 - crop//2`, rounded down to even); `crop_size=0`: the whole aligned
    pre-crop trimmed to multiples of 256. No batch dimension. `position` is the y crop's origin in
    the image, `gt_position` the clean target's.
    """
    settings = dict(locals())

    def centre(sample: dict, n: int, precrop: tuple, options: dict) -> Iterator[dict]:
        y0, x0, height, width = precrop
        if crop_size == 0:
            shape, origin = _trim_256(height, width), (y0, x0)
        else:
            shape = (crop_size, crop_size)
            cy, cx = height // 2 - crop_size // 2, width // 2 - crop_size // 2
            origin = (y0 + cy - cy % 2, x0 + cx - cx % 2)
        if min(shape) == 0 or shape[0] > height or shape[1] > width:
            return  # the legacy loader drops a pre-crop too small for the crop
        yield _evaluation_sample(sample, n, origin, shape, options, batch=False)

    return _evaluation_stage(settings, True, centre)


def evaluation(crop_size: int = 256, match_gain: bool = False, max_alignment_loss: float | None = 0.035,
               min_mask_mean: float | None = 0.8, input: str = "bayer", pairing: str = "x_y",
               legacy_values: bool = False, to_torch: bool = True, min_msssim_score: float | None = 0.0,
               max_msssim_score: float | None = 1.0, clean_clean: bool = True, second_references: bool = True):
    """Curried stage: the legacy `...ImageCropsTestDataloader.get_images()` items (the test split,
    mosaic layout).

    For every pre-crop of every pair passing the filters, aligned (`aligned_precrop`): the crops of
    a grid stepping by `crop_size` from its origin that fit in it, or with `crop_size=0` the whole
    aligned pre-crop trimmed to multiples of 256; each with a batch dimension of 1.
    """
    settings = dict(locals())

    def grid(sample: dict, n: int, precrop: tuple, options: dict) -> Iterator[dict]:
        y0, x0, height, width = precrop
        if crop_size == 0:
            shape = _trim_256(height, width)
            if min(shape):
                yield _evaluation_sample(sample, n, (y0, x0), shape, options, batch=True)
            return
        for y in range(0, height - crop_size + 1, crop_size):
            for x in range(0, width - crop_size + 1, crop_size):
                yield _evaluation_sample(sample, n, (y0 + y, x0 + x), (crop_size, crop_size), options, batch=True)

    return _evaluation_stage(settings, False, grid)


def _overexposure_mask(sample: dict, input: str, legacy: bool, x_tile: np.ndarray | None) -> np.ndarray:
    """`CleanCleanImageDataset.get_mask` over the tile: bool [3, h, w] of the first clean capture."""
    meta = sample["meta"]
    bound = meta["overexposure_lb"]
    if input == "rgb":
        return x_tile < bound  # after the colour transform, per channel
    height, width = meta["tile_size"]
    rggb = _mosaic_rggb(sample, _capture(sample, True, 0), [tuple(meta["tile"])], (height, width), legacy)[0]
    # nearest x2 upsampling of the RGGB channels, then their max: per 2x2 block of sites
    block = rggb.max(axis=0) < bound
    return np.broadcast_to(np.repeat(np.repeat(block, 2, axis=0), 2, axis=1), (3, height, width))


def clean_pairs(crop_size: int = 256, num_crops: int = 4, min_valid: float = 0.5, input: str = "bayer",
                seed: int = 0, epoch: int | None = None, legacy_values: bool = False, to_torch: bool = True):
    """Curried stage: `CleanProfiledRGBCleanBayerImageCropsDataset` (input="bayer": x clean Rec.2020,
    y the clean capture's RGGB) or `CleanProfiledRGBCleanProfiledRGBImageCropsDataset` (input="rgb":
    x only), one output per tile of the reference clean captures (mosaic layout).

    The mask is the legacy overexposure mask (`get_mask`): for Bayer, a 2x2 block of sites is valid
    when its largest value is under `overexposure_lb`; for RGB, each channel of x under it. Crops
    start on even coordinates and are redrawn up to 10 times while under `min_valid` valid values;
    gain is 1.0. Draws depend on (seed, epoch, key) only.
    """
    _check_crop_size(crop_size)
    if input not in INPUTS:
        raise ConfigError(f"input={input!r} is not one of {', '.join(INPUTS)}")
    iterations = itertools.count()

    def stage(source: Iterable[dict]) -> Iterator[dict]:
        iteration = next(iterations)
        for raw in source:
            sample = decode_sample(raw)
            meta = sample["meta"]
            if not is_mosaic(sample):
                raise ConfigError(f"{sample.get('__key__')}: clean_pairs needs the mosaic layout")
            if input == "bayer" and not meta["is_bayer"]:
                continue
            height, width = meta["tile_size"]
            if height < crop_size or width < crop_size:
                raise ConfigError(f"{sample['__key__']}: tile {height}x{width} is smaller than crop_size {crop_size}")
            clean = _capture(sample, True, 0)
            top, left = meta["tile"]
            x_tile = _mosaic_rec2020(sample, clean, [(top, left)], (height, width), legacy_values)[0] if input == "rgb" else None
            mask = _overexposure_mask(sample, input, legacy_values, x_tile)
            sample_epoch = epoch if epoch is not None else _sample_epoch(sample, iteration)
            origins = _draw_crops(_rng(seed, sample_epoch, sample["__key__"], -1), mask.mean(axis=0), crop_size, num_crops, min_valid)
            if origins is None:
                continue
            mask_crops = np.stack([mask[:, y : y + crop_size, x : x + crop_size] for y, x in origins])
            if input == "rgb":
                out = {"x_crops": np.stack([x_tile[:, y : y + crop_size, x : x + crop_size] for y, x in origins])}
            else:
                starts = [(top + y, left + x) for y, x in origins]
                out = {"x_crops": _mosaic_rec2020(sample, clean, starts, (crop_size, crop_size), legacy_values),
                       "y_crops": _mosaic_rggb(sample, clean, starts, (crop_size, crop_size), legacy_values),
                       "rgb_xyz_matrix": np.asarray(meta["rgb_xyz_matrix"], dtype=np.float32)}
            out["mask_crops"] = np.ascontiguousarray(mask_crops)
            if to_torch:
                import torch

                out = {name: torch.from_numpy(value) for name, value in out.items()}
            out.update(gain=1.0, __key__=sample["__key__"], origins=origins)
            yield out

    return stage


def tiles():
    """Curried stage: decoded scene tiles as stored (`clean`, `noisy`, `mask`, `meta` in the mosaic
    layout; `gt_rgb`, `noisy_bayer`, `mask`, `meta` in the legacy one)."""

    def stage(source: Iterable[dict]) -> Iterator[dict]:
        for raw in source:
            yield decode_sample(raw)

    return stage
