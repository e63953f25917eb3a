"""Reader stages: scene tiles -> the legacy `rawds` crop-pair samples.

`pairs(...)` reproduces `CleanProfiledRGBNoisyBayerImageCropsDataset.__getitem__` (and, with
`input="rgb"`, `CleanProfiledRGBNoisyProfiledRGBImageCropsDataset`): for each (tile, noisy capture)
that passes the construction filters (alignment loss, mask mean), draw `num_crops` random crops of
`crop_size` starting on even coordinates (Bayer phase), redrawing a crop up to 10 times while its
valid fraction is under `min_valid`, and yield
  x_crops        float32 [num_crops, 3, crop, crop]       clean, linear Rec.2020
  y_crops        float32 [num_crops, 4, crop/2, crop/2]   noisy RGGB ([num_crops, 3, crop, crop]
                                                          linear Rec.2020 with input="rgb")
  mask_crops     bool    [num_crops, 3, crop, crop]
  rgb_xyz_matrix float32 [4, 3]
  gain           float   raw_gain (rgb_gain for RGB input; 1.0 with match_gain=True, y_crops
                         then multiplied by it)
Both shard layouts are read (see `convert`). In the mosaic layout the targets are made here, over
each crop only: normalise `(x - black) / (white - black)` (each site's black level; channel 0's
with `legacy_values=True`, as the original and the legacy layout), demosaic the crop plus the
stored halo (Bayer: the bilinear demosaic of the whole image, exactly; X-Trans: LibRaw VNG), then
camRGB -> linear Rec.2020. Randomness comes from (seed, epoch, sample key, noisy index) only, so a
replay is exact. The epoch is `epoch=` when given, else each sample's `__epoch__` (stamped by
`wdsprep.dataset`), else the stage's own count of iterations (0 for the first pass, 1 for the next).
"""
from __future__ import annotations

import hashlib
import itertools
from typing import Iterable, Iterator

import numpy as np

from ...errors import ConfigError
from ...shards.codec import decode_sample
from .raw import cam_to_lin_rec2020_matrix, demosaic_libraw, demosaic_padded, mono_to_rggb, normalise

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
    match_gain: bool = False,
    to_torch: bool = True,
    gain_key: str | None = None,
    legacy_values: bool = False,
    input: str = "bayer",
    pairing: str = "x_y",
) -> dict | None:
    """The legacy sample of noisy capture `n` of a decoded tile; None if no crop set is valid."""
    mask = tile_mask(sample, n)
    if pairing != "x_y":
        mask = np.ones_like(mask)  # the legacy x_x / y_y pairings use an all-valid mask
    height, width = mask.shape
    if height < crop_size or width < crop_size:
        raise ConfigError(f"{sample.get('__key__')}: tile {height}x{width} is smaller than crop_size {crop_size}")
    origins = _draw_crops(rng, mask, crop_size, num_crops, min_valid)
    if origins is None:
        return None
    return crops_at(sample, n, origins, crop_size=crop_size, match_gain=match_gain, to_torch=to_torch,
                    gain_key=gain_key, legacy_values=legacy_values, input=input, pairing=pairing, mask=mask)


def is_mosaic(sample: dict) -> bool:
    return "clean" in sample


def tile_mask(sample: dict, n: int) -> np.ndarray:
    """bool [h, w] valid mask of noisy capture `n` over the tile (either layout)."""
    if not is_mosaic(sample):
        return sample["mask"][n]
    height, width = sample["meta"]["tile_size"]
    return np.unpackbits(sample["mask"][n], count=height * width).reshape(height, width).view(bool)


def _region(sample: dict, origins, shape: tuple[int, int], halo: int):
    """Per crop: the window rows/cols (with up to `halo` px around the crop) and the crop inside them."""
    meta = sample["meta"]
    wy, wx, wh, ww = meta["window"]
    top, left = meta["tile"]
    for y, x in origins:
        cy, cx = top - wy + y, left - wx + x
        r0, c0 = max(cy - halo, 0), max(cx - halo, 0)
        r1, c1 = min(cy + shape[0] + halo, wh), min(cx + shape[1] + halo, ww)
        yield (r0, r1, c0, c1), (cy - r0, cx - c0)


def _capture(sample: dict, n: int | None):
    """(mosaic window, black levels, white level, valid box or None) of the clean (None) or noisy n."""
    meta = sample["meta"]
    if n is None:
        return sample["clean"], meta["black_level"], meta["white_level"], None
    return sample["noisy"][n], meta["noisy_black_level"][n], meta["noisy_white_level"][n], meta["noisy_valid"][n]


def _mosaic_rec2020(sample: dict, n: int | None, origins, shape: tuple[int, int], legacy: bool) -> np.ndarray:
    """Linear Rec.2020 crops [k, 3, h, w] of the clean (n None) or noisy capture n, made over each
    crop only: normalise and demosaic the crop plus its border, then camRGB -> Rec.2020."""
    meta = sample["meta"]
    pattern = np.asarray(meta["cfa_pattern"], dtype=np.uint8)
    mosaic, black, white, valid = _capture(sample, n)
    matrix = cam_to_lin_rec2020_matrix(np.asarray(meta["rgb_xyz_matrix"], dtype=np.float32)).astype(np.float32)
    wy, wx = meta["window"][:2]
    bayer = pattern.shape == (2, 2)
    height, width = shape
    out = np.empty((len(origins), 3, height, width), dtype=np.float32)
    for k, ((r0, r1, c0, c1), (oy, ox)) in enumerate(_region(sample, origins, shape, 1 if bayer else meta["halo"])):
        origin = (wy + r0, wx + c0)
        if bayer:
            mono = normalise(mosaic[r0:r1, c0:c1], pattern, black, white, origin, legacy)
            if valid is not None:
                _zero_outside(mono, valid, r0, c0)
            # the 1 px border: the stored neighbours, or the image edge's mirror where the window ends
            border = [(int(oy == 0), int(r1 - r0 - oy == height)), (int(ox == 0), int(c1 - c0 - ox == width))]
            plane = mono.astype(np.float64)
            rgb = demosaic_padded(np.pad(plane, border, mode="reflect") if any(map(any, border)) else plane)
        else:
            rolled = np.roll(pattern, (-origin[0], -origin[1]), axis=(0, 1))
            rgb = demosaic_libraw(mosaic[r0:r1, c0:c1], rolled, meta["colors"], black[int(rolled.flat[0])], white)
            rgb = np.ascontiguousarray(rgb[:, oy : oy + height, ox : ox + width])
        np.matmul(matrix, rgb.reshape(3, -1), out=out[k].reshape(3, -1))
    return out


def _zero_outside(mono: np.ndarray, box, r0: int, c0: int) -> None:
    """Zero a normalised noisy region outside its capture (the legacy layout stores zeros there)."""
    y0, y1, x0, x1 = box
    keep = np.zeros(mono.shape, dtype=bool)
    keep[max(y0 - r0, 0) : max(y1 - r0, 0), max(x0 - c0, 0) : max(x1 - c0, 0)] = True
    mono[~keep] = 0


def _mosaic_rggb(sample: dict, n: int | None, origins, shape: tuple[int, int], legacy: bool) -> np.ndarray:
    """RGGB crops [k, 4, h/2, w/2] of the clean (n None) or noisy capture n."""
    meta = sample["meta"]
    if len(meta["cfa_pattern"]) != 2:
        raise ConfigError(f"{sample.get('__key__')}: an X-Trans mosaic has no RGGB form (use input='rgb')")
    pattern = np.asarray(meta["cfa_pattern"], dtype=np.uint8)
    mosaic, black, white, valid = _capture(sample, n)
    wy, wx = meta["window"][:2]
    out = np.empty((len(origins), 4, shape[0] // 2, shape[1] // 2), dtype=np.float32)
    for k, ((r0, r1, c0, c1), _) in enumerate(_region(sample, origins, shape, 0)):
        mono = normalise(mosaic[r0:r1, c0:c1], pattern, black, white, (wy + r0, wx + c0), legacy)
        if valid is not None:
            _zero_outside(mono, valid, r0, c0)
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
    """The legacy sample of noisy capture `n` at the given even tile-relative crop origins.

    `crop_size` is an int or (height, width). `pairing` as the legacy `data_pairing`: "x_y" clean
    target / noisy input; "x_x" the clean capture as both (the clean-clean variants); "y_y" the
    noisy capture as both; the last two have an all-valid mask, as the legacy loaders.
    """
    meta = sample["meta"]
    height, width = (crop_size, crop_size) if isinstance(crop_size, int) else tuple(crop_size)
    if pairing not in PAIRINGS:
        raise ConfigError(f"pairing={pairing!r} is not one of {', '.join(PAIRINGS)}")
    gain_key = gain_key or ("raw_gain" if input == "bayer" else "rgb_gain")
    if is_mosaic(sample):
        x_source, y_source = {"x_y": (None, n), "x_x": (None, None), "y_y": (n, n)}[pairing]
        x_crops = _mosaic_rec2020(sample, x_source, origins, (height, width), legacy_values)
        if input == "bayer":
            y_crops = _mosaic_rggb(sample, y_source, origins, (height, width), legacy_values)
        else:
            y_crops = _mosaic_rec2020(sample, y_source, origins, (height, width), legacy_values)
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
                min_msssim_score: float | None = None, max_msssim_score: float | None = None) -> bool:
    """The legacy constructor's filters (`alignment_max_loss`, `mask_mean_min`, and its MS-SSIM
    bounds: a pair goes when `min > score`, or when `max` is set, not 1.0 and `max < score`)."""
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


def noisy_count(sample: dict) -> int:
    return len(sample["noisy"] if is_mosaic(sample) else sample["noisy_bayer"])


def _pairs(source: Iterable[dict], options: dict, filters: dict, seed: int, epoch: int | None, iteration: int) -> Iterator[dict]:
    _check_crop_size(options["crop_size"])
    for raw in source:
        sample = decode_sample(raw)
        key = sample["__key__"]
        if options["input"] == "bayer" and not sample["meta"].get("is_bayer", True):
            continue  # X-Trans scenes have no RGGB input (upstream trains them as RGB -> RGB)
        sample_epoch = epoch if epoch is not None else _sample_epoch(sample, iteration)
        for n in range(noisy_count(sample)):
            if not pair_passes(sample["meta"], n, **filters):
                continue
            out = crop_pair(sample, n, _rng(seed, sample_epoch, key, n), **options)
            if out is None:
                continue  # the legacy loader drops such a crop and retries another item
            out["__key__"] = f"{key}-{n}"
            if "__url__" in sample:
                out["__url__"] = sample["__url__"]
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
):
    """Curried stage: `wds.WebDataset(urls).compose(wdsprep.rawnind.pairs(crop_size=256))`.

    Defaults are the legacy loader's (`crop_size: 256`, `num_crops_per_image: 4`, alignment loss
    <= 0.035, mask mean >= 0.8, 0.5 valid per crop, MS-SSIM bounds 0 and 1 i.e. off). Pass None to
    a filter to disable it.
    `input="bayer"`: RGGB noisy crops of Bayer scenes (CleanProfiledRGBNoisyBayer...); `"rgb"`:
    linear Rec.2020 noisy crops of every scene, X-Trans included (...NoisyProfiledRGB...).
    `pairing` is the legacy `data_pairing` ("x_y", or "x_x" / "y_y": the clean or the noisy capture
    as both x and y, with an all-valid mask; mosaic layout only).
    `legacy_values=True`: the values of the earlier float layout (channel 0's black level for
    every site, as the original code), bit for bit on the mosaic layout's Bayer scenes.

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
                   min_msssim_score=min_msssim_score, max_msssim_score=max_msssim_score)

    def stage(source: Iterable[dict]) -> Iterator[dict]:
        return _pairs(source, options, filters, seed, epoch, next(iterations))

    return stage


def _evaluation_items(source: Iterable[dict], filters: dict, input: str, middle_only: bool):
    """(decoded tile, noisy index) of the pairs an evaluation loader reads, in stream order."""
    for raw in source:
        sample = decode_sample(raw)
        meta = sample["meta"]
        if not is_mosaic(sample):
            raise ConfigError(f"{sample.get('__key__')}: validation/test readers need the mosaic layout")
        if input == "bayer" and not meta["is_bayer"]:
            continue
        if middle_only:
            # the legacy validation loader takes the middle of the pre-crops sorted by (x, y)
            grid = sorted((left, top) for top in meta["tile_rows"] for left in meta["tile_cols"])
            if grid[len(grid) // 2] != (meta["tile"][1], meta["tile"][0]):
                continue
        for n in range(noisy_count(sample)):
            if pair_passes(meta, n, **filters):
                yield sample, n


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
    out.update(__key__=f"{sample['__key__']}-{n}-{origin[0]:05d}-{origin[1]:05d}", gt_file=meta["gt_file"],
               y_file=meta["noisy_files"][n], position=[top + origin[0], left + origin[1]])
    return out


def _whole_tile(meta: dict) -> tuple[int, int]:
    """The legacy `crop_size=0`: the whole pre-crop, trimmed to multiples of 256."""
    height, width = meta["tile_size"]
    return height - height % 256, width - width % 256


def validation(crop_size: int = 256, match_gain: bool = False, max_alignment_loss: float | None = 0.035,
               min_mask_mean: float | None = 0.8, input: str = "bayer", pairing: str = "x_y",
               legacy_values: bool = False, to_torch: bool = True, min_msssim_score: float | None = 0.0,
               max_msssim_score: float | None = 1.0):
    """Curried stage: the legacy `...ImageCropsValidationDataset` items (mosaic layout).

    Per pair passing the filters, the middle tile of its scene (tiles sorted by (left, top), as the
    legacy pre-crops by coordinates) and in it the centre crop (`h//2 - crop//2`, rounded down to
    even); `crop_size=0`: the whole tile trimmed to multiples of 256. No batch dimension.
    """
    options = dict(match_gain=match_gain, to_torch=to_torch, legacy_values=legacy_values, input=input, pairing=pairing)
    filters = dict(max_alignment_loss=max_alignment_loss, min_mask_mean=min_mask_mean,
                   min_msssim_score=min_msssim_score, max_msssim_score=max_msssim_score)

    def stage(source: Iterable[dict]) -> Iterator[dict]:
        for sample, n in _evaluation_items(source, filters, input, middle_only=True):
            height, width = sample["meta"]["tile_size"]
            if crop_size == 0:
                shape, origin = _whole_tile(sample["meta"]), (0, 0)
            else:
                shape = (crop_size, crop_size)
                origin = tuple(value - value % 2 for value in (height // 2 - crop_size // 2, width // 2 - crop_size // 2))
            if min(shape) == 0 or min(origin) < 0 or origin[0] + shape[0] > height or origin[1] + shape[1] > width:
                continue  # the legacy loader drops a pre-crop too small for the crop
            yield _evaluation_sample(sample, n, origin, shape, options, batch=False)

    return stage


def evaluation(crop_size: int = 256, match_gain: bool = False, max_alignment_loss: float | None = 0.035,
               min_mask_mean: float | None = 0.8, input: str = "bayer", pairing: str = "x_y",
               legacy_values: bool = False, to_torch: bool = True, min_msssim_score: float | None = 0.0,
               max_msssim_score: float | None = 1.0):
    """Curried stage: the legacy `...ImageCropsTestDataloader.get_images()` items (mosaic layout).

    For every tile of every pair passing the filters: the crops of a grid stepping by `crop_size`
    from (0, 0) that fit in the tile, or with `crop_size=0` the whole tile trimmed to multiples of
    256; each with a batch dimension of 1.
    """
    options = dict(match_gain=match_gain, to_torch=to_torch, legacy_values=legacy_values, input=input, pairing=pairing)
    filters = dict(max_alignment_loss=max_alignment_loss, min_mask_mean=min_mask_mean,
                   min_msssim_score=min_msssim_score, max_msssim_score=max_msssim_score)

    def stage(source: Iterable[dict]) -> Iterator[dict]:
        for sample, n in _evaluation_items(source, filters, input, middle_only=False):
            height, width = sample["meta"]["tile_size"]
            if crop_size == 0:
                shape = _whole_tile(sample["meta"])
                if min(shape):
                    yield _evaluation_sample(sample, n, (0, 0), shape, options, batch=True)
                continue
            for y in range(0, height - crop_size + 1, crop_size):
                for x in range(0, width - crop_size + 1, crop_size):
                    yield _evaluation_sample(sample, n, (y, x), (crop_size, crop_size), options, batch=True)

    return stage


def _overexposure_mask(sample: dict, input: str, legacy: bool, x_tile: np.ndarray | None) -> np.ndarray:
    """`CleanCleanImageDataset.get_mask` over the tile: bool [3, h, w] of the clean capture."""
    meta = sample["meta"]
    bound = meta["overexposure_lb"]
    if input == "rgb":
        return x_tile < bound  # after the colour transform, per channel
    height, width = meta["tile_size"]
    rggb = _mosaic_rggb_clean(sample, (height, width), legacy)
    # nearest x2 upsampling of the RGGB channels, then their max: per 2x2 block of sites
    block = rggb.max(axis=0) < bound
    return np.broadcast_to(np.repeat(np.repeat(block, 2, axis=0), 2, axis=1), (3, height, width))


def _mosaic_rggb_clean(sample, shape, legacy):
    return _mosaic_rggb(sample, None, [(0, 0)], shape, legacy)[0]


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
            x_tile = _mosaic_rec2020(sample, None, [(0, 0)], (height, width), legacy_values)[0] if input == "rgb" else None
            mask = _overexposure_mask(sample, input, legacy_values, x_tile)
            sample_epoch = epoch if epoch is not None else _sample_epoch(sample, iteration)
            origins = _draw_crops(_rng(seed, sample_epoch, sample["__key__"], -1), mask.mean(axis=0), crop_size, num_crops, min_valid)
            if origins is None:
                continue
            mask_crops = np.stack([mask[:, y : y + crop_size, x : x + crop_size] for y, x in origins])
            if input == "rgb":
                out = {"x_crops": np.stack([x_tile[:, y : y + crop_size, x : x + crop_size] for y, x in origins])}
            else:
                out = {"x_crops": _mosaic_rec2020(sample, None, origins, (crop_size, crop_size), legacy_values),
                       "y_crops": _mosaic_rggb(sample, None, origins, (crop_size, crop_size), legacy_values),
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
