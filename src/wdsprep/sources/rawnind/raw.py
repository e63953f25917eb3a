"""Raw files (Bayer and X-Trans) to the arrays RawNIND works on (after
`raw.raw_fpath_to_mono_img_and_metadata`).

`read_raw` keeps the recorded uint16 mosaic (`data`, margins cropped; Bayer trimmed by one
row/column at both ends when needed so it starts on R, H and W cropped to multiples of 4) with its
CFA pattern, black/white levels and matrix, and `mono` `[1,H,W]` float32 normalised as
`(x - black[0]) / (white - black[0])`; `normalise` does this for any window (each site's own black
level unless `legacy`). `rggb` is the 4-channel half-resolution form; `demosaic_ea` the Bayer
demosaic upstream uses (`raw.demosaic`: OpenCV's edge-aware `COLOR_BayerRGGB2RGB_EA` on a uint16
copy scaled by the image's own range, see `ea_scale`), `demosaic` the bilinear Bayer demosaic (the
legacy float layout's), `demosaic_libraw` LibRaw's for any CFA (X-Trans), and `cam_to_lin_rec2020`
the profiled target the legacy loaders train on.

Local = whole: OpenCV's EA demosaic of a window that starts on an R site and reaches `EA_HALO`
pixels beyond a region (or the image edge) equals the whole image's demosaic over that region,
bit for bit, when both use the whole capture's `ea_scale` (tests/rawnind/test_rawnind_upstream.py).
That is what lets the reader demosaic each crop alone.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import InputError

# XYZ (D65) -> linear Rec.2020
XYZ_TO_LIN_REC2020 = np.array(  # the same coefficients as rawnind's raw.py, so targets agree
    [
        [1.71666343, -0.35567332, -0.25336809],
        [-0.66667384, 1.61645574, 0.0157683],
        [0.01764248, -0.04277698, 0.94224328],
    ],
    dtype=np.float64,
)


# A capture's mosaic as its header declares it (raw_height x raw_width uint16 sites): the largest
# cameras record ~100 million; a header declaring more is refused before LibRaw unpacks (allocates) it.
MAX_RAW_PIXELS = 1 << 28


@dataclass
class RawImage:
    mono: np.ndarray  # float32 [1, H, W]: Bayer in RGGB phase, X-Trans as the sensor's mosaic
    rgb_xyz_matrix: np.ndarray  # float32 [4, 3] as LibRaw gives it
    overexposure_lb: float
    black_level: list[int]  # per channel index of `pattern` (LibRaw's black_level_per_channel)
    white_level: int
    iso: float | None = None
    data: np.ndarray | None = None  # uint16 [H, W]: the recorded mosaic, cropped like `mono`
    pattern: np.ndarray | None = None  # channel index at each site of the repeat, at (0, 0)
    colors: str = "RGBG"  # colour letter of each channel index

    @property
    def is_bayer(self) -> bool:
        return self.pattern is None or self.pattern.shape == (2, 2)


def read_raw(path: str) -> RawImage:
    """Read a Bayer or X-Trans raw file with rawpy; InputError names the file when it is not usable.

    Bayer mosaics are cropped to RGGB phase and multiples of 4 (as the original); X-Trans mosaics
    (6x6 repeat) to multiples of 4 only, their pattern rolled to the crop.
    """
    try:
        import rawpy
    except ImportError as error:  # pragma: no cover - dependency missing
        raise InputError(f"{path}: reading raw files needs rawpy ({error})") from None
    try:
        with rawpy.RawPy() as raw:
            raw.open_file(path)  # the header only: what rawpy.imread does before it unpacks
            declared = raw.sizes.raw_height * raw.sizes.raw_width
            if declared > MAX_RAW_PIXELS:
                raise InputError(f"{path}: its header declares a {raw.sizes.raw_width}x{raw.sizes.raw_height} mosaic, "
                                 f"more than a capture may hold ({MAX_RAW_PIXELS} sites)")
            raw.unpack()
            pattern = np.asarray(raw.raw_pattern)
            colors = raw.color_desc.decode("ascii", "replace")
            if pattern.shape not in ((2, 2), (6, 6)):
                raise InputError(f"{path}: CFA pattern {pattern.shape} is neither a 2x2 Bayer nor a 6x6 X-Trans mosaic")
            sizes = raw.sizes
            image = np.array(raw.raw_image, dtype=np.uint16)
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
    if pattern.shape == (2, 2):
        image, pattern = _rggb_phase(path, image, pattern, colors)
    height, width = image.shape
    image = image[: height - height % 4, : width - width % 4]
    # scale_img_to_bw_points runs its per-channel loop over the mono image's single channel, so
    # channel 0's black level applies to every photosite (equal on most cameras)
    span = float(white - black[0])
    mono = (image.astype(np.float32) - black[0]) / span
    overexposure_lb = 1.0
    if camera_white is not None:
        overexposure_lb = min(1.0, (camera_white[0] - black[0]) / span)
    return RawImage(
        mono=mono[None], rgb_xyz_matrix=rgb_xyz, overexposure_lb=float(overexposure_lb), black_level=black,
        white_level=white, iso=iso, data=image, pattern=pattern.astype(np.uint8), colors=colors,
    )


def _rggb_phase(path: str, image: np.ndarray, pattern: np.ndarray, colors: str) -> tuple[np.ndarray, np.ndarray]:
    """Crop a 2x2 mosaic to start on R (like mono_any_to_mono_rggb); the pattern rolled to match."""
    names = [colors[int(index)] for index in pattern.flatten()]
    offset = None
    for dy in (0, 1):
        for dx in (0, 1):
            at = lambda y, x: names[((y + dy) % 2) * 2 + (x + dx) % 2]  # noqa: E731
            if at(0, 0) == "R" and at(1, 1) == "B":
                offset = (dy, dx)
    if offset is None:
        raise InputError(f"{path}: CFA pattern {''.join(names)} cannot be cropped to RGGB")
    # like mono_any_to_mono_rggb: a row/column shift trims one row/column at *both* ends
    if offset[0]:
        image = image[1:-1]
    if offset[1]:
        image = image[:, 1:-1]
    return image, np.roll(pattern, (-offset[0], -offset[1]), axis=(0, 1))


def read_bayer(path: str) -> RawImage:
    """`read_raw` for the Bayer-only paths; an X-Trans file is an InputError naming it."""
    image = read_raw(path)
    if not image.is_bayer:
        raise InputError(f"{path}: CFA pattern {image.pattern.shape} is not a 2x2 Bayer mosaic (X-Trans?)")
    return image


def normalise(data: np.ndarray, pattern: np.ndarray, black: list[int], white: int, origin=(0, 0), legacy: bool = False) -> np.ndarray:
    """uint16 mosaic window -> float32 `(x - black) / (white - black)`.

    `legacy`: channel 0's black level for every site (the original's loop, see `read_raw`);
    otherwise each site's own channel black level. `origin`: the window's position in the mosaic.
    """
    if legacy or len(set(black[int(index)] for index in pattern.flatten())) == 1:
        level = black[0] if legacy else black[int(pattern.flat[0])]
        return (data.astype(np.float32) - level) / float(white - level)
    period_y, period_x = pattern.shape
    height, width = data.shape
    rows = (np.arange(height) + origin[0]) % period_y
    cols = (np.arange(width) + origin[1]) % period_x
    levels = np.asarray(black, dtype=np.float32)[pattern[rows[:, None], cols[None, :]]]
    return (data.astype(np.float32) - levels) / (np.float32(white) - levels)


def mono_to_rggb(mono: np.ndarray) -> np.ndarray:
    """`[1,H,W]` RGGB mosaic -> `[4,H/2,W/2]` (R, G1, G2, B), like rawproc's mono_to_rggb_img."""
    plane = mono[0]
    return np.stack([plane[0::2, 0::2], plane[0::2, 1::2], plane[1::2, 0::2], plane[1::2, 1::2]])


def rggb_to_mono(rggb: np.ndarray) -> np.ndarray:
    _, half_h, half_w = rggb.shape
    mono = np.empty((1, half_h * 2, half_w * 2), dtype=rggb.dtype)
    mono[0, 0::2, 0::2], mono[0, 0::2, 1::2], mono[0, 1::2, 0::2], mono[0, 1::2, 1::2] = rggb
    return mono


EA_HALO = 2  # pixels of mosaic around a region that OpenCV's EA demosaic reads (measured: 1 is not enough)


def ea_scale(low: float, high: float) -> tuple[np.float32, np.float32]:
    """(black_offset, max_value) of upstream's `raw.demosaic` for a mosaic whose normalised values
    span [low, high]: the offset lifts a negative minimum to 0, then the maximum (after the offset,
    in float32) scales the image into [0, 1] when it is above 1."""
    low, high = np.float32(low), np.float32(high)
    offset = np.float32(0.0) if low >= 0 else -low
    top = np.float32(high + offset)
    return offset, (np.float32(1.0) if top <= 1 else top)


def demosaic_ea(plane: np.ndarray, scale: tuple[np.float32, np.float32]) -> np.ndarray:
    """upstream's `raw.demosaic` of a float32 RGGB plane `[h, w]` ((0, 0) an R site) -> camRGB
    `[3, h, w]` float32: `(x + offset) / max * 65535` truncated to uint16, OpenCV's
    `COLOR_BayerRGGB2RGB_EA`, then back `/ 65535 * max - offset`, all in float32 as upstream.
    `scale` is the whole capture's `ea_scale`, so a window gives the whole image's values."""
    import cv2

    offset, top = scale
    work = plane.astype(np.float32, copy=True)
    work += offset
    work /= top
    work *= np.float32(65535)
    rgb = cv2.demosaicing(np.ascontiguousarray(work.astype(np.uint16)), cv2.COLOR_BayerRGGB2RGB_EA)
    out = rgb.transpose(2, 0, 1).astype(np.float32) / np.float32(65535.0)
    out *= top
    out -= offset
    return out


def demosaic(mono: np.ndarray) -> np.ndarray:
    """Bilinear demosaic of an RGGB mosaic `[1,H,W]` (H, W even) -> camRGB `[3,H,W]` float32.

    The 3x3 bilinear kernels with mirrored edges, written as neighbour means per site class. The
    sums are exact in float64 (at most four float32 terms scaled by powers of two), so the result
    is the same float32 whatever the summation order: equal to the per-plane `ndimage.convolve`
    form this replaced (a test keeps that form as the reference). Only the legacy float layout uses
    it; the mosaic layout and the metadata use upstream's `demosaic_ea`.
    """
    return demosaic_padded(np.pad(mono[0].astype(np.float64), 1, mode="reflect"))  # numpy reflect = ndimage mirror


def demosaic_padded(plane: np.ndarray) -> np.ndarray:
    """`demosaic` of the interior of a float64 RGGB plane `[h+2, w+2]` that carries its 1 px border
    (real neighbours, or the mirror at an image edge) -> `[3, h, w]`; (1, 1) is an R site."""
    height, width = plane.shape[0] - 2, plane.shape[1] - 2

    def at(py: int, px: int, dy: int, dx: int) -> np.ndarray:  # neighbour (dy, dx) of sites (py, px)
        return plane[1 + py + dy : 1 + py + dy + height : 2, 1 + px + dx : 1 + px + dx + width : 2]

    def centre(py, px):
        return at(py, px, 0, 0)

    def horizontal(py, px):
        return (at(py, px, 0, -1) + at(py, px, 0, 1)) * 0.5

    def vertical(py, px):
        return (at(py, px, -1, 0) + at(py, px, 1, 0)) * 0.5

    def cross(py, px):
        return (at(py, px, -1, 0) + at(py, px, 1, 0) + at(py, px, 0, -1) + at(py, px, 0, 1)) * 0.25

    def diagonal(py, px):
        return (at(py, px, -1, -1) + at(py, px, -1, 1) + at(py, px, 1, -1) + at(py, px, 1, 1)) * 0.25

    out = np.empty((3, height, width), dtype=np.float32)
    rules = (  # per channel, its value at R (0,0), G on R rows (0,1), G on B rows (1,0), B (1,1)
        (centre, horizontal, vertical, diagonal),
        (cross, centre, centre, cross),
        (diagonal, vertical, horizontal, centre),
    )
    for channel, rule in enumerate(rules):
        for (py, px), value in zip(((0, 0), (0, 1), (1, 0), (1, 1)), rule):
            out[channel, py::2, px::2] = value(py, px)
    return out


def cam_to_lin_rec2020_matrix(rgb_xyz_matrix: np.ndarray) -> np.ndarray:
    """camRGB -> linear Rec.2020: XYZ->Rec.2020 @ inverse(camera's XYZ->cam 3x3)."""
    cam_xyz = np.asarray(rgb_xyz_matrix, dtype=np.float64)[:3]
    return XYZ_TO_LIN_REC2020 @ np.linalg.inv(cam_xyz)


def cam_to_lin_rec2020(cam_rgb: np.ndarray, rgb_xyz_matrix: np.ndarray) -> np.ndarray:
    matrix = cam_to_lin_rec2020_matrix(rgb_xyz_matrix).astype(np.float32)
    channels, height, width = cam_rgb.shape
    return (matrix @ cam_rgb.reshape(channels, -1)).reshape(3, height, width)


# LibRaw's demosaics by name (rawpy.DemosaicAlgorithm). Its Markesteijn X-Trans code (AHD/PPG on
# a 6x6 mosaic) refuses images under 512x512, so crops use VNG, which handles X-Trans at any size.
LIBRAW_DEMOSAIC = ("vng", "linear", "markesteijn")


def demosaic_libraw(window: np.ndarray, pattern: np.ndarray, colors: str, black: int, white: int,
                    algorithm: str = "vng") -> np.ndarray:
    """A uint16 mosaic window (any CFA) demosaiced by LibRaw -> camRGB `[3,h,w]` float32 in [0, 1].

    The window goes to LibRaw as an in-memory DNG (`pattern` = channel indices at the window's
    origin) with black level 0, so LibRaw (unit white balance, no colour conversion) returns
    `x * 65535 / white` demosaiced without clipping the noise below black; the result is then
    mapped to `(x - black) / (white - black)`, as the Bayer path normalises (`adjust_maximum_thr=0`
    stops LibRaw from rescaling to the brightest pixel).
    """
    import io

    import rawpy

    from .dng import dng_bytes

    if algorithm not in LIBRAW_DEMOSAIC:
        raise ValueError(f"unknown LibRaw demosaic {algorithm!r} (expected one of {', '.join(LIBRAW_DEMOSAIC)})")
    rgb_index = {"R": 0, "G": 1, "B": 2}
    cfa = np.vectorize(lambda index: rgb_index[colors[int(index)]])(pattern).astype(np.uint8)
    payload = dng_bytes(np.ascontiguousarray(window, dtype=np.uint16), black_level=0,
                        white_level=int(white), iso=100, cfa_pattern=cfa)
    choice = {"vng": rawpy.DemosaicAlgorithm.VNG, "linear": rawpy.DemosaicAlgorithm.LINEAR,
              "markesteijn": rawpy.DemosaicAlgorithm.AHD}[algorithm]  # AHD on X-Trans = Markesteijn 3-pass
    with rawpy.imread(io.BytesIO(payload)) as raw:
        out = raw.postprocess(demosaic_algorithm=choice, output_color=rawpy.ColorSpace.raw, gamma=(1, 1),
                              no_auto_bright=True, output_bps=16, use_camera_wb=False, use_auto_wb=False,
                              user_wb=[1.0, 1.0, 1.0, 1.0], user_flip=0, adjust_maximum_thr=0.0)
    scaled = np.ascontiguousarray(np.moveaxis(out, -1, 0), dtype=np.float32) * np.float32(white / 65535)
    return (scaled - np.float32(black)) / np.float32(white - black)


def value_range(image: RawImage, legacy: bool) -> tuple[float, float]:
    """(min, max) of a capture's normalised mosaic (`normalise`, each site's black level unless
    `legacy`): what `ea_scale` needs to demosaic any window of it as the whole image."""
    values = normalise(image.data, image.pattern, image.black_level, image.white_level, legacy=legacy)
    return float(values.min()), float(values.max())


def demosaic_image(image: RawImage, algorithm: str = "vng") -> np.ndarray:
    """camRGB `[3,H,W]` of a whole capture: upstream's EA demosaic of the (legacy-normalised) mono
    image for Bayer, LibRaw otherwise."""
    if image.is_bayer:
        mono = image.mono[0]
        return demosaic_ea(mono, ea_scale(mono.min(), mono.max()))
    return demosaic_libraw(image.data, image.pattern, image.colors, image.black_level[int(image.pattern.flat[0])],
                           image.white_level, algorithm)
