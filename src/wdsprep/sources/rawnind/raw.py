"""Bayer raw files to the arrays RawNIND works on (after `raw.raw_fpath_to_mono_img_and_metadata`).

mono `[1,H,W]` float32 normalised as `(x - black[ch]) / (white - black[ch])`, margins cropped,
shifted by one row/column so the mosaic starts on R (RGGB), H and W cropped to multiples of 4.
`rggb` is the 4-channel half-resolution form, `demosaic` gives camRGB `[3,H,W]` and
`cam_to_lin_rec2020` the profiled target the legacy loaders train on.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import InputError

# XYZ (D65) -> linear Rec.2020
XYZ_TO_LIN_REC2020 = np.array(
    [
        [1.7166511880, -0.3556707838, -0.2533662814],
        [-0.6666843518, 1.6164812366, 0.0157685458],
        [0.0176398574, -0.0427706133, 0.9421031212],
    ],
    dtype=np.float64,
)


@dataclass
class RawImage:
    mono: np.ndarray  # float32 [1, H, W], RGGB phase
    rgb_xyz_matrix: np.ndarray  # float32 [4, 3] as LibRaw gives it
    overexposure_lb: float
    black_level: list[int]
    white_level: int
    iso: float | None = None

    @property
    def is_bayer(self) -> bool:
        return True


def read_bayer(path: str) -> RawImage:
    """Read a Bayer raw file with rawpy; InputError names the file when it is not usable."""
    try:
        import rawpy
    except ImportError as error:  # pragma: no cover - dependency missing
        raise InputError(f"{path}: reading raw files needs rawpy ({error})") from None
    try:
        with rawpy.imread(path) as raw:
            pattern = np.asarray(raw.raw_pattern)
            colors = raw.color_desc.decode("ascii", "replace")
            if pattern.shape != (2, 2):
                raise InputError(f"{path}: CFA pattern {pattern.shape} is not a 2x2 Bayer mosaic (X-Trans?)")
            sizes = raw.sizes
            image = np.array(raw.raw_image, dtype=np.float32)
            image = image[sizes.top_margin : sizes.top_margin + sizes.height, sizes.left_margin : sizes.left_margin + sizes.width]
            black = [int(value) for value in raw.black_level_per_channel]
            white = int(raw.white_level)
            camera_white = raw.camera_white_level_per_channel
            rgb_xyz = np.array(raw.rgb_xyz_matrix, dtype=np.float32)
            try:
                iso = None
                other = getattr(raw, "other", None)
                if other is not None:
                    iso = float(other.iso_speed)
            except Exception:  # noqa: BLE001 - ISO is informative only
                iso = None
    except InputError:
        raise
    except Exception as error:  # rawpy raises LibRawError subclasses and OSError
        raise InputError(f"{path}: not a readable raw file ({type(error).__name__}: {error})") from None
    if not np.any(rgb_xyz):
        raise InputError(f"{path}: rgb_xyz_matrix is all zero (camera unknown to LibRaw)")
    # channel index (into black levels) of each mosaic position, named by colour letter
    names = [colors[int(index)] for index in pattern.flatten()]
    # find the offset that puts R at (0,0) and B at (1,1)
    offset = None
    for dy in (0, 1):
        for dx in (0, 1):
            at = lambda y, x: names[((y + dy) % 2) * 2 + (x + dx) % 2]  # noqa: E731
            if at(0, 0) == "R" and at(1, 1) == "B":
                offset = (dy, dx)
    if offset is None:
        raise InputError(f"{path}: CFA pattern {''.join(names)} cannot be cropped to RGGB")
    channel_of = pattern.copy()
    image = image[offset[0] :, offset[1] :]
    channel_of = np.roll(np.roll(pattern, -offset[0], axis=0), -offset[1], axis=1)
    height, width = image.shape
    image = image[: height - height % 4, : width - width % 4]
    mono = np.empty_like(image)
    overexposure = []
    for y in (0, 1):
        for x in (0, 1):
            channel = int(channel_of[y, x])
            black_level = black[channel] if channel < len(black) else black[0]
            span = float(white - black_level)
            mono[y::2, x::2] = (image[y::2, x::2] - black_level) / span
            top = camera_white[channel] if camera_white is not None else white
            overexposure.append((top - black_level) / span)
    return RawImage(
        mono=mono[None],
        rgb_xyz_matrix=rgb_xyz,
        overexposure_lb=float(min(overexposure)),
        black_level=black,
        white_level=white,
        iso=iso,
    )


def mono_to_rggb(mono: np.ndarray) -> np.ndarray:
    """`[1,H,W]` RGGB mosaic -> `[4,H/2,W/2]` (R, G1, G2, B), like rawproc's mono_to_rggb_img."""
    plane = mono[0]
    return np.stack([plane[0::2, 0::2], plane[0::2, 1::2], plane[1::2, 0::2], plane[1::2, 1::2]])


def rggb_to_mono(rggb: np.ndarray) -> np.ndarray:
    _, half_h, half_w = rggb.shape
    mono = np.empty((1, half_h * 2, half_w * 2), dtype=rggb.dtype)
    mono[0, 0::2, 0::2], mono[0, 0::2, 1::2], mono[0, 1::2, 0::2], mono[0, 1::2, 1::2] = rggb
    return mono


def demosaic(mono: np.ndarray) -> np.ndarray:
    """Bilinear demosaic of an RGGB mosaic `[1,H,W]` -> camRGB `[3,H,W]` float32.

    (The original uses OpenCV's edge-aware Bayer conversion; bilinear keeps the dependency out.)
    """
    from scipy.ndimage import convolve

    plane = mono[0].astype(np.float32)
    height, width = plane.shape
    red = np.zeros_like(plane)
    green = np.zeros_like(plane)
    blue = np.zeros_like(plane)
    red[0::2, 0::2] = plane[0::2, 0::2]
    green[0::2, 1::2] = plane[0::2, 1::2]
    green[1::2, 0::2] = plane[1::2, 0::2]
    blue[1::2, 1::2] = plane[1::2, 1::2]
    kernel_rb = np.array([[0.25, 0.5, 0.25], [0.5, 1.0, 0.5], [0.25, 0.5, 0.25]], dtype=np.float32)
    kernel_g = np.array([[0.0, 0.25, 0.0], [0.25, 1.0, 0.25], [0.0, 0.25, 0.0]], dtype=np.float32)
    out = np.empty((3, height, width), dtype=np.float32)
    out[0] = convolve(red, kernel_rb, mode="mirror")
    out[1] = convolve(green, kernel_g, mode="mirror")
    out[2] = convolve(blue, kernel_rb, mode="mirror")
    return out


def cam_to_lin_rec2020_matrix(rgb_xyz_matrix: np.ndarray) -> np.ndarray:
    """camRGB -> linear Rec.2020: XYZ->Rec.2020 @ inverse(camera's XYZ->cam 3x3)."""
    cam_xyz = np.asarray(rgb_xyz_matrix, dtype=np.float64)[:3]
    return XYZ_TO_LIN_REC2020 @ np.linalg.inv(cam_xyz)


def cam_to_lin_rec2020(cam_rgb: np.ndarray, rgb_xyz_matrix: np.ndarray) -> np.ndarray:
    matrix = cam_to_lin_rec2020_matrix(rgb_xyz_matrix).astype(np.float32)
    channels, height, width = cam_rgb.shape
    return (matrix @ cam_rgb.reshape(channels, -1)).reshape(3, height, width)
