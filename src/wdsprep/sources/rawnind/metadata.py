"""Per clean/noisy pair metadata (the MetadataArtificer stage): alignment, gains, masks; cached.

Follows `rawproc.get_best_alignment_compute_gain_and_make_loss_mask` (see the research notes A.5):
overexposure mask on the un-demosaiced clean image, `raw_gain = mean(gt)/mean(noisy)`, camRGB by
upstream's demosaic (`raw.demosaic_image`: OpenCV's EA for Bayer; LibRaw's VNG for X-Trans, where
upstream reads darktable's EXR), integer alignment by FFT cross-correlation of z-normalised grey
images (the fork's "auto" method) refined by the original's greedy search (a +-3 neighbourhood,
`NEIGHBORHOOD_SEARCH_WINDOW`), whose loss is upstream's `best_alignment_loss`: the mean L1 of the
3-channel camRGB images, the noisy one gain-matched, over their overlap as `shift_images` crops it
(an odd shift trims one more row/column). Then `rgb_gain` on camRGB and the loss mask (`x^(1/2.2)`
L1 map, threshold `min(0.4, q99.99)`, binary opening, times the shifted overexposure mask).

Pairs (`scene_pairs`, as `tools/prep_image_dataset.py`): every clean capture of a scene is a
reference, paired with every clean capture (itself included: the clean-clean pairs) and every
noisy capture.

Convention of a shift `(dy, dx)` (as `rawproc.shift_images`): `noisy[y, x]` shows what
`clean[y + dy, x + dx]` shows.
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import InputError
from ..base import parse_json, read_npy_file
from .raw import RawImage, cam_to_lin_rec2020, demosaic_image, read_raw

MAX_SHIFT = 128  # MAX_SHIFT_SEARCH of the original
SEARCH_WINDOW = 3  # NEIGHBORHOOD_SEARCH_WINDOW of the original
LOSS_THRESHOLD = 0.4
METADATA_VERSION = 3  # 2: rgb_msssim_score; 3: EA demosaic, RGB alignment loss, upstream's odd-shift overlap


def scene_pairs(clean_count: int, noisy_count: int) -> list[tuple[int, bool, int]]:
    """(reference clean index, y is clean, y index) of every pair of a scene, in upstream's order:
    for each clean capture, every clean capture (itself first among equals) then every noisy one."""
    return [(gt, y_clean, y) for gt in range(clean_count)
            for y_clean, count in ((True, clean_count), (False, noisy_count)) for y in range(count)]


def aligned_span(length: int, shift: int) -> tuple[int, int, int]:
    """(anchor start, target start, length) of the overlap `rawproc.shift_images` keeps along one
    axis of `length` pixels for `shift`: the clean (anchor) and noisy (target) images, full
    resolution. An odd shift trims one more pixel from both (the same for a Bayer target, whose
    half-resolution cut lands on the same full-resolution rows)."""
    odd = shift % 2
    if shift >= 0:
        return shift, 0, length - shift - odd
    return odd, -shift + odd, length + shift - odd


def match_gain(anchor: np.ndarray, other: np.ndarray) -> np.ndarray:
    return other * (anchor.mean() / other.mean())


def shift_images(anchor: np.ndarray, target: np.ndarray, shift: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Crop both images (same resolution) to the overlap `rawproc.shift_images` keeps (`aligned_span`)."""
    (ay, ty, h), (ax, tx, w) = (aligned_span(n, d) for n, d in zip(anchor.shape[-2:], shift))
    return anchor[..., ay : ay + h, ax : ax + w], target[..., ty : ty + h, tx : tx + w]


def anchor_region(shape: tuple[int, int], shift: tuple[int, int]) -> tuple[slice, slice]:
    """Where the overlap of `shift_images` lies in the anchor (clean) image."""
    (ay, _, h), (ax, _, w) = (aligned_span(n, d) for n, d in zip(shape, shift))
    return slice(ay, ay + h), slice(ax, ax + w)


def _znorm(image: np.ndarray) -> np.ndarray:
    image = image.astype(np.float32)
    return (image - image.mean()) / (image.std() + 1e-12)


def fft_alignment(anchor_grey: np.ndarray, target_grey: np.ndarray, max_shift: int = MAX_SHIFT) -> tuple[int, int]:
    """Integer (dy, dx) maximising the cross-correlation, within +-max_shift."""
    from scipy.signal import fftconvolve

    anchor = _znorm(anchor_grey)
    target = _znorm(target_grey)
    correlation = fftconvolve(anchor, target[::-1, ::-1], mode="full")
    zero_y, zero_x = target.shape[0] - 1, target.shape[1] - 1
    # normalise by the overlap area so large shifts are not penalised for having less overlap
    height, width = anchor.shape
    lo_y, hi_y = max(zero_y - max_shift, 0), min(zero_y + max_shift + 1, correlation.shape[0])
    lo_x, hi_x = max(zero_x - max_shift, 0), min(zero_x + max_shift + 1, correlation.shape[1])
    window = correlation[lo_y:hi_y, lo_x:hi_x]
    shifts_y = np.arange(lo_y, hi_y) - zero_y
    shifts_x = np.arange(lo_x, hi_x) - zero_x
    overlap = (height - np.abs(shifts_y))[:, None] * (width - np.abs(shifts_x))[None, :]
    window = window / np.maximum(overlap, 1)
    best = np.unravel_index(int(np.argmax(window)), window.shape)
    return int(shifts_y[best[0]]), int(shifts_x[best[1]])


def l1_loss(anchor: np.ndarray, target: np.ndarray, shift: tuple[int, int]) -> float:
    shifted_anchor, shifted_target = shift_images(anchor, target, shift)
    return float(np.abs(shifted_anchor - shifted_target).mean())


def refine_alignment(anchor: np.ndarray, target: np.ndarray, start: tuple[int, int],
                     window: int = SEARCH_WINDOW) -> tuple[tuple[int, int], float]:
    """The original's greedy L1 neighbourhood search (`find_best_alignment`), started from the FFT
    estimate: move to the best shift of the +-`window` neighbourhood until it stays put; the loss
    is the best one seen. `target` is already gain-matched; a zero loss ends the search."""
    losses = {start: l1_loss(anchor, target, start)}
    best = start
    while losses[best] > 0 and abs(best[0]) + abs(best[1]) < MAX_SHIFT:
        for dy in range(-window, window + 1):
            for dx in range(-window, window + 1):
                shift = (best[0] + dy, best[1] + dx)
                if shift not in losses:
                    losses[shift] = l1_loss(anchor, target, shift)
        new = min(losses, key=losses.get)
        if new == best:
            break
        best = new
    return best, float(losses[best])


MSSSIM_WEIGHTS = (0.0448, 0.2856, 0.3001, 0.2363, 0.1333)


def ms_ssim(image: np.ndarray, reference: np.ndarray, data_range: float = 1.0) -> float:
    """Multi-scale SSIM (Wang, Simoncelli, Bovik 2003) of two `[C,H,W]` images, mean over channels.

    The usual parameters: an 11-tap Gaussian (sigma 1.5) applied without padding, K1 0.01, K2 0.03,
    five scales with the standard weights, 2x2 average pooling between scales (an odd side padded
    by one), negative contrast-structure terms clipped to 0. Images must be over 160 px a side.
    """
    from scipy.ndimage import correlate1d

    taps = np.exp(-((np.arange(11) - 5) ** 2) / (2 * 1.5**2))
    taps /= taps.sum()

    def blur(x):  # separable Gaussian, 'valid' part only
        return correlate1d(correlate1d(x, taps, axis=-1, mode="constant")[..., 5:-5], taps, axis=-2, mode="constant")[..., 5:-5, :]

    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    x, y = np.asarray(image, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    if min(x.shape[-2:]) <= 160:
        raise ValueError(f"MS-SSIM needs images over 160 px a side, got {x.shape[-2:]}")
    terms = []
    for scale in range(len(MSSSIM_WEIGHTS)):
        mu_x, mu_y = blur(x), blur(y)
        sigma_x, sigma_y = blur(x * x) - mu_x**2, blur(y * y) - mu_y**2
        sigma_xy = blur(x * y) - mu_x * mu_y
        cs = (2 * sigma_xy + c2) / (sigma_x + sigma_y + c2)
        luminance = (2 * mu_x * mu_y + c1) / (mu_x**2 + mu_y**2 + c1)
        if scale == len(MSSSIM_WEIGHTS) - 1:
            terms.append((luminance * cs).mean(axis=(-2, -1)))
            break
        terms.append(np.maximum(cs.mean(axis=(-2, -1)), 0))
        pad = [(0, 0)] * (x.ndim - 2) + [(0, x.shape[-2] % 2), (0, x.shape[-1] % 2)]
        x, y = (np.pad(v, pad, mode="edge") for v in (x, y))
        x = (x[..., 0::2, 0::2] + x[..., 1::2, 0::2] + x[..., 0::2, 1::2] + x[..., 1::2, 1::2]) / 4
        y = (y[..., 0::2, 0::2] + y[..., 1::2, 0::2] + y[..., 0::2, 1::2] + y[..., 1::2, 1::2]) / 4
    terms[-1] = np.maximum(terms[-1], 0)
    per_channel = np.prod([term ** weight for term, weight in zip(terms, MSSSIM_WEIGHTS)], axis=0)
    return float(np.mean(per_channel))


def _gamma(image: np.ndarray) -> np.ndarray:
    out = image.copy()
    positive = out > 0
    out[positive] = out[positive] ** (1 / 2.2)
    return out


def loss_mask(anchor_rgb: np.ndarray, target_rgb: np.ndarray) -> np.ndarray:
    """Mask of pixels whose gamma-space L1 difference stays under the threshold (aligned inputs)."""
    from scipy.ndimage import binary_opening

    loss_map = np.abs(_gamma(anchor_rgb) - _gamma(match_gain(anchor_rgb, target_rgb))).sum(axis=0)
    threshold = min(LOSS_THRESHOLD, np.quantile(loss_map, 0.9999))  # a numpy scalar, compared as upstream
    if threshold == 0:
        threshold = 1.0
    return binary_opening(loss_map < threshold)


@dataclass
class PairMetadata:
    """What the loaders need per clean/noisy pair; `mask` is in clean-image coordinates."""

    record: dict[str, Any]
    mask: np.ndarray  # bool [H, W], False where the noisy image has no counterpart


def compute_pair(gt: RawImage, noisy: RawImage, gt_rgb: np.ndarray | None = None) -> PairMetadata:
    """Alignment, gains and masks of one pair, from images already read (`noisy` may be a clean capture)."""
    if gt.mono.shape != noisy.mono.shape:
        raise ValueError(f"clean image is {gt.mono.shape[1:]}, noisy image is {noisy.mono.shape[1:]}")
    overexposure = (gt.mono < gt.overexposure_lb).all(axis=0)
    raw_gain = float(gt.mono.mean() / noisy.mono.mean())
    if gt_rgb is None:
        gt_rgb = demosaic_image(gt)
    noisy_rgb = demosaic_image(noisy)
    matched = match_gain(gt_rgb, noisy_rgb)  # find_best_alignment works on the gain-matched RGB images
    estimate = fft_alignment(gt_rgb.mean(axis=0), matched.mean(axis=0))
    (dy, dx), alignment_loss = refine_alignment(gt_rgb, matched, estimate)
    rgb_gain = float(gt_rgb.mean() / noisy_rgb.mean())
    anchor_rgb, target_rgb = shift_images(gt_rgb, noisy_rgb, (dy, dx))
    # add_msssim_score_to_dataset_yaml_descriptor: aligned, gain-matched, linear Rec.2020
    try:
        msssim = ms_ssim(cam_to_lin_rec2020(target_rgb * np.float32(rgb_gain), gt.rgb_xyz_matrix),
                         cam_to_lin_rec2020(anchor_rgb, gt.rgb_xyz_matrix))
    except ValueError:
        msssim = None  # too small an overlap (upstream records None on its errors too)
    region = anchor_region(overexposure.shape, (dy, dx))
    mask_overlap = loss_mask(anchor_rgb, target_rgb) & overexposure[region]  # shift_mask, then the loss mask
    mask = np.zeros(overexposure.shape, dtype=bool)
    mask[region] = mask_overlap
    record = {
        "best_alignment": [int(dy), int(dx)],
        "best_alignment_loss": float(alignment_loss),
        "raw_gain": raw_gain,
        "rgb_gain": rgb_gain,
        "mask_mean": float(mask_overlap.mean()),
        "overexposure_lb": float(gt.overexposure_lb),
        "is_bayer": bool(gt.is_bayer),
        "rgb_xyz_matrix": np.asarray(gt.rgb_xyz_matrix, dtype=float).round(6).tolist(),
        "alignment_method": "fft+l1",
        "rgb_msssim_score": msssim,
    }
    return PairMetadata(record=record, mask=mask)


def pair_key(gt_sha1: str, noisy_sha1: str) -> str:
    return f"{gt_sha1}:{noisy_sha1}"


def mask_path(root: str, key: str) -> str:
    """Where the cache below `root` keeps the packed mask of pair `key`."""
    return os.path.join(root, "masks", key.replace(":", "_") + ".npy")


MAX_CACHE_LINE_BYTES = 1 << 20  # one pair's entry is ~1 KB: a longer line is damaged (a miss), never read whole


def _bounded_lines(handle, limit: int):
    """The lines of a binary file, a line longer than `limit` bytes skipped without holding it."""
    while True:
        line = handle.readline(limit + 1)
        if not line:
            return
        if len(line) > limit and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):  # the rest of the overlong line, in bounded pieces
                line = handle.readline(limit + 1)
            continue
        yield line


class MetadataCache:
    """`metadata_cache.jsonl` (`{"key", "value"}` lines, as the fork) plus one mask file per pair.

    Appends are serialised by a lock; later lines win, so an interrupted write costs one entry.
    """

    def __init__(self, root: str):
        self.root = root
        self.path = os.path.join(root, "metadata_cache.jsonl")
        self.mask_dir = os.path.join(root, "masks")
        self._lock = threading.Lock()
        self._entries: dict[str, dict] = {}
        if os.path.exists(self.path):
            with open(self.path, "rb") as handle:  # a damaged line is a miss
                for line in _bounded_lines(handle, MAX_CACHE_LINE_BYTES):
                    try:
                        entry = parse_json(line, self.path)  # a key given twice: a damaged line
                        if entry.get("value", {}).get("version") == METADATA_VERSION:
                            self._entries[entry["key"]] = entry["value"]
                    except (InputError, KeyError, AttributeError, TypeError):
                        continue  # a torn last line from an interrupted run

    def mask_path(self, key: str) -> str:
        return mask_path(self.root, key)

    def get(self, key: str) -> PairMetadata | None:
        value = self._entries.get(key)
        if value is None or not os.path.exists(self.mask_path(key)):
            return None
        try:  # a damaged cache entry is a miss: the pair is computed again from the raw files
            packed = read_npy_file(self.mask_path(key))  # its header must declare what the file holds
            height, width = value["mask_shape"]
            mask = np.unpackbits(packed, count=height * width).reshape(height, width).astype(bool)
        except Exception:  # noqa: BLE001 - numpy raises many types for a damaged file
            return None
        record = {name: item for name, item in value.items() if name not in ("version", "mask_shape")}
        return PairMetadata(record=record, mask=mask)

    def put(self, key: str, metadata: PairMetadata) -> None:
        os.makedirs(self.mask_dir, exist_ok=True)
        path = self.mask_path(key)
        temporary = f"{path}.tmp{os.getpid()}.{threading.get_ident()}"
        with open(temporary, "wb") as handle:
            np.save(handle, np.packbits(metadata.mask.reshape(-1)), allow_pickle=False)
        os.replace(temporary, path)
        value = {**metadata.record, "version": METADATA_VERSION, "mask_shape": list(metadata.mask.shape)}
        with self._lock:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps({"key": key, "value": value}, sort_keys=True) + "\n")
            self._entries[key] = value

    def __contains__(self, key: str) -> bool:
        return key in self._entries


def scene_metadata(
    clean: list[tuple[str, str]],
    noisy: list[tuple[str, str]],
    cache: MetadataCache | None,
) -> tuple[list[PairMetadata], int]:
    """Metadata of every pair of a scene (`scene_pairs` order) from its clean and noisy captures
    `(path, sha1)`; returns (pairs, number computed now)."""
    captures = {True: clean, False: noisy}
    pairs = scene_pairs(len(clean), len(noisy))
    results: list[PairMetadata | None] = []
    missing: dict[int, list[int]] = {}  # reference -> positions to compute
    for position, (gt, y_clean, y) in enumerate(pairs):
        hit = cache.get(pair_key(clean[gt][1], captures[y_clean][y][1])) if cache is not None else None
        results.append(hit)
        if hit is None:
            missing.setdefault(gt, []).append(position)
    images: dict[int, RawImage] = {}  # clean captures are read once (references and y); noisy ones per use

    def image(y_clean: bool, index: int) -> RawImage:
        if not y_clean:
            return read_raw(captures[False][index][0])
        if index not in images:
            images[index] = read_raw(captures[True][index][0])
        return images[index]

    for gt, positions in missing.items():
        gt_path, gt_sha1 = clean[gt]
        gt_rgb = demosaic_image(image(True, gt))
        for position in positions:
            _, y_clean, y = pairs[position]
            path, sha1 = captures[y_clean][y]
            try:
                pair = compute_pair(image(True, gt), image(y_clean, y), gt_rgb)
            except ValueError as error:
                from ...errors import InputError

                raise InputError(f"{path}: cannot pair with {gt_path}: {error}") from None
            if cache is not None:
                cache.put(pair_key(gt_sha1, sha1), pair)
            results[position] = pair
    return results, sum(len(positions) for positions in missing.values())  # type: ignore[return-value]
