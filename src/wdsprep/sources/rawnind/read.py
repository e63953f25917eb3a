"""Reader stages: scene tiles -> the legacy `rawds` Bayer crop-pair samples.

`pairs(...)` reproduces `CleanProfiledRGBNoisyBayerImageCropsDataset.__getitem__`: for each
(tile, noisy capture) that passes the construction filters (alignment loss, mask mean), draw
`num_crops` random crops of `crop_size` starting on even coordinates (Bayer phase), redrawing a
crop up to 10 times while its valid fraction is under `min_valid`, and yield
  x_crops        float32 [num_crops, 3, crop, crop]       clean, linear Rec.2020
  y_crops        float32 [num_crops, 4, crop/2, crop/2]   noisy RGGB
  mask_crops     bool    [num_crops, 3, crop, crop]
  rgb_xyz_matrix float32 [4, 3]
  gain           float   raw_gain (1.0 with match_gain=True, y_crops then multiplied by it)
Randomness comes from (seed, epoch, sample key, noisy index) only, so a replay is exact. The
epoch is `epoch=` when given, else each sample's `__epoch__` (stamped by `wdsprep.dataset`), else
the stage's own count of iterations (0 for the first pass over a source, 1 for the next, ...).
"""
from __future__ import annotations

import hashlib
import itertools
from typing import Iterable, Iterator

import numpy as np

from ...errors import ConfigError
from ...shards.codec import decode_sample

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
    gain_key: str = "raw_gain",
) -> dict | None:
    """The legacy sample of noisy capture `n` of a decoded tile; None if no crop set is valid."""
    gt, noisy, masks, meta = sample["gt_rgb"], sample["noisy_bayer"], sample["mask"], sample["meta"]
    height, width = gt.shape[1:]
    if height < crop_size or width < crop_size:
        raise ConfigError(f"{sample.get('__key__')}: tile {height}x{width} is smaller than crop_size {crop_size}")
    origins = _draw_crops(rng, masks[n], crop_size, num_crops, min_valid)
    if origins is None:
        return None
    half = crop_size // 2
    x_crops = np.stack([gt[:, y : y + crop_size, x : x + crop_size] for y, x in origins]).astype(np.float32)
    y_crops = np.stack([noisy[n, :, y // 2 : y // 2 + half, x // 2 : x // 2 + half] for y, x in origins]).astype(np.float32)
    mask_crops = np.stack([np.broadcast_to(masks[n, y : y + crop_size, x : x + crop_size], (3, crop_size, crop_size))
                           for y, x in origins])
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


def pair_passes(meta: dict, n: int, max_alignment_loss: float | None, min_mask_mean: float | None) -> bool:
    """The legacy constructor's filters (`alignment_max_loss`, `mask_mean_min`)."""
    if max_alignment_loss is not None and meta["best_alignment_loss"][n] > max_alignment_loss:
        return False
    return min_mask_mean is None or meta["mask_mean"][n] >= min_mask_mean


def _check_crop_size(crop_size: int) -> None:
    if crop_size % 4 or crop_size <= 0:
        raise ConfigError(f"crop_size {crop_size} must be a positive multiple of 4 (Bayer crops are crop/2)")


def _sample_epoch(sample: dict, iteration: int) -> int:
    """`__epoch__` of a `wdsprep.dataset` sample; the stage's iteration count without one."""
    value = sample.get("__epoch__")
    if value is None:
        return iteration
    return int(value.decode() if isinstance(value, (bytes, bytearray)) else value)


def _pairs(
    source: Iterable[dict],
    crop_size: int,
    num_crops: int,
    min_valid: float,
    match_gain: bool,
    max_alignment_loss: float | None,
    min_mask_mean: float | None,
    seed: int,
    epoch: int | None,
    to_torch: bool,
    gain_key: str,
    iteration: int = 0,
) -> Iterator[dict]:
    _check_crop_size(crop_size)
    for raw in source:
        sample = decode_sample(raw)
        key = sample["__key__"]
        sample_epoch = epoch if epoch is not None else _sample_epoch(sample, iteration)
        for n in range(sample["noisy_bayer"].shape[0]):
            if not pair_passes(sample["meta"], n, max_alignment_loss, min_mask_mean):
                continue
            out = crop_pair(sample, n, _rng(seed, sample_epoch, key, n), crop_size=crop_size, num_crops=num_crops,
                            min_valid=min_valid, match_gain=match_gain, to_torch=to_torch, gain_key=gain_key)
            if out is None:
                continue  # the legacy loader drops such a crop and retries another item
            out["__key__"] = f"{key}-{n}"
            if "__url__" in sample:
                out["__url__"] = sample["__url__"]
            yield out


def pairs(
    crop_size: int = 256,
    num_crops: int = 4,
    min_valid: float = 0.5,
    match_gain: bool = False,
    max_alignment_loss: float | None = 0.035,
    min_mask_mean: float | None = 0.8,
    seed: int = 0,
    epoch: int | None = None,
    to_torch: bool = True,
    gain_key: str = "raw_gain",
):
    """Curried stage: `wds.WebDataset(urls).compose(wdsprep.rawnind.pairs(crop_size=256))`.

    Defaults are the legacy loader's (`crop_size: 256`, `num_crops_per_image: 4`, alignment loss
    <= 0.035, mask mean >= 0.8, 0.5 valid per crop). Pass None to a filter to disable it.

    Crops change every epoch: with `epoch=None` (the default) a sample's epoch is its `__epoch__`
    (set by `wdsprep.dataset`), and without one the number of earlier iterations of this stage
    (plain `wds.WebDataset`: 0, 1, 2, ... per pass). An explicit `epoch=` fixes the draws. A
    DataLoader without `persistent_workers` copies the stage afresh each epoch, so there pass
    `epoch=` (or read through `wdsprep.dataset`) to get new crops.
    """
    iterations = itertools.count()

    def stage(source: Iterable[dict]) -> Iterator[dict]:
        return _pairs(source, crop_size, num_crops, min_valid, match_gain, max_alignment_loss,
                      min_mask_mean, seed, epoch, to_torch, gain_key, next(iterations))

    return stage


def tiles():
    """Curried stage: decoded scene tiles (`gt_rgb`, `noisy_bayer`, `mask`, `meta`) as stored."""

    def stage(source: Iterable[dict]) -> Iterator[dict]:
        for raw in source:
            yield decode_sample(raw)

    return stage
