"""Arrays -> pictures for `wdsprep show`: the panel model and the drawing helpers every source uses.

Everything is drawn in numpy at *cell* resolution (one array element = one cell), then enlarged by
an integer factor (`scale`, nearest neighbour) or thinned by an integer `step` (every step-th
cell), so a cell's place on the picture is exact: cell (r, c) covers display pixels
[r*scale, (r+1)*scale) x [c*scale, (c+1)*scale). Each panel records `scale` and `step`, and the
HTML carries them (`data-scale`, `data-step`), so a test can find any cell's pixels. Pillow is
used only to encode PNG (`png_bytes`); `require_pillow` names the extra to install when it is
missing.

Orientation rules (one for every source): a 2-D array is drawn rows down, columns across; the
mid-slice across axis k of a 3-D volume keeps the other two axes in order (axis 0: rows = axis 1,
columns = axis 2; axis 1: rows = axis 0, columns = axis 2; axis 2: rows = axis 0, columns = axis 1).
"""
from __future__ import annotations

import io
from typing import Any, Sequence

import numpy as np

from ..errors import ConfigError
from .model import Panel

TARGET = 256  # the longer side of a picture, in display pixels, that small arrays are enlarged to
MAX_SCALE = 16
MAX_SIDE = 512  # larger arrays are thinned (every step-th cell) to at most this
SHOW_EXTRA = "show"

# colours shared by the sources (RGB)
EMPTY = (16, 16, 16)
FILLED = (205, 205, 205)
HIT = (230, 40, 40)
OUTLINE = (255, 200, 0)


def require_pillow():
    """The `PIL.Image` module, or a ConfigError saying which extra installs it."""
    try:
        from PIL import Image
    except ImportError:
        raise ConfigError(f"wdsprep show draws its pictures with Pillow, which is not installed: "
                          f"pip install 'wdsprep[{SHOW_EXTRA}]' (or pip install Pillow)") from None
    return Image


# ------------------------------------------------------------------------------ array helpers
def as_numpy(value: Any) -> Any:
    """A torch tensor as a numpy array (without importing torch); anything else as it is."""
    if type(value).__module__.startswith("torch") and hasattr(value, "numpy"):
        return value.detach().cpu().numpy()
    return value


def fit(shape: Sequence[int]) -> tuple[int, int]:
    """(scale, step) for a picture of `shape` cells: enlarge small ones towards TARGET pixels, thin
    large ones to at most MAX_SIDE."""
    longer = max(int(shape[0]), int(shape[1]), 1)
    if longer > MAX_SIDE:
        return 1, -(-longer // MAX_SIDE)
    return max(1, min(MAX_SCALE, TARGET // longer)), 1


def enlarge(cells: np.ndarray, scale: int, step: int) -> np.ndarray:
    """Every step-th cell, each repeated scale x scale times."""
    out = cells[::step, ::step]
    if scale > 1:
        out = np.repeat(np.repeat(out, scale, axis=0), scale, axis=1)
    return np.ascontiguousarray(out)


def normalise(array: np.ndarray, low: float | None = None, high: float | None = None) -> np.ndarray:
    """float32 in [0, 1] by the finite min/max (or the given bounds); a constant array gives 0."""
    values = np.asarray(array, dtype=np.float64)
    finite = values[np.isfinite(values)]
    if low is None:
        low = float(finite.min()) if finite.size else 0.0
    if high is None:
        high = float(finite.max()) if finite.size else 1.0
    if not high > low:
        return np.zeros(values.shape, np.float32)
    out = (values - low) / (high - low)
    return np.clip(np.nan_to_num(out, nan=0.0, posinf=1.0, neginf=0.0), 0, 1).astype(np.float32)


def grey(array: np.ndarray, low: float | None = None, high: float | None = None) -> np.ndarray:
    """uint8 (H, W, 3) grey cells of a 2-D array, normalised by `normalise`."""
    level = np.round(normalise(array, low, high) * 255).astype(np.uint8)
    return np.repeat(level[..., None], 3, axis=2)


def rgb8(image: np.ndarray) -> np.ndarray:
    """uint8 (H, W, 3) of a float (H, W, 3) image in [0, 1] (clipped)."""
    return np.round(np.clip(np.nan_to_num(np.asarray(image, np.float64)), 0, 1) * 255).astype(np.uint8)


def srgb(linear: np.ndarray) -> np.ndarray:
    """The sRGB transfer curve of linear values in [0, 1] (display gamma)."""
    linear = np.clip(np.nan_to_num(np.asarray(linear, np.float64)), 0, 1)
    return np.where(linear <= 0.0031308, 12.92 * linear, 1.055 * np.power(linear, 1 / 2.4) - 0.055)


def occupancy(mask: np.ndarray, on=FILLED, off=EMPTY) -> np.ndarray:
    """uint8 (H, W, 3) cells: `on` where the 2-D mask is true, `off` elsewhere."""
    out = np.empty(mask.shape + (3,), np.uint8)
    out[...] = off
    out[np.asarray(mask, bool)] = on
    return out


def mid_slice(volume: np.ndarray, axis: int) -> np.ndarray:
    """The 2-D slice through the middle of `axis` (index size // 2), the other axes kept in order."""
    return np.take(volume, volume.shape[axis] // 2, axis=axis)


AXIS_VIEWS = ((0, "rows = axis 1, columns = axis 2"), (1, "rows = axis 0, columns = axis 2"),
              (2, "rows = axis 0, columns = axis 1"))


def outline(mask: np.ndarray) -> np.ndarray:
    """The boundary cells of a 2-D mask: in the mask, with a 4-neighbour outside it (or the edge)."""
    inside = np.asarray(mask, bool)
    padded = np.pad(inside, 1, constant_values=False)
    interior = padded[:-2, 1:-1] & padded[2:, 1:-1] & padded[1:-1, :-2] & padded[1:-1, 2:]
    return inside & ~interior


def empty_text(array: np.ndarray) -> str:
    """What an array with no element is drawn as: `empty array, int64 (5, 0)`."""
    return f"empty array, {array.dtype} {tuple(array.shape)}"


def picture(name: str, title: str, cells: np.ndarray, caption: str = "",
            dots: np.ndarray | None = None, dot_colour=HIT) -> Panel:
    """A panel of uint8 (H, W, 3) (or (H, W)) cells, enlarged or thinned by `fit`. `dots` ((K, 2)
    cell rows/columns) are drawn after enlarging, as a square in the middle of each cell, so the
    cell's own colour stays visible around it. Cells with no row or no column (a picture of an
    empty array) are a text panel saying so: a PNG cannot be 0 pixels wide."""
    if 0 in cells.shape[:2]:
        return text_panel(name, title, f"nothing to draw: {cells.shape[0]} x {cells.shape[1]} cells", caption)
    scale, step = fit(cells.shape)
    image = enlarge(cells, scale, step)
    if dots is not None and len(dots):
        if image.ndim == 2:
            image = np.repeat(image[..., None], 3, axis=2)
        size = max(1, scale // 2)
        margin = (scale - size + 1) // 2  # at scale 2 the dot is the lower right pixel: the cell's corner stays its colour
        rows, cols = np.asarray(dots, np.int64).T
        keep = (rows % step == 0) & (cols % step == 0)
        for r, c in zip(rows[keep] // step, cols[keep] // step):
            top, left = r * scale + margin, c * scale + margin
            image[top : top + size, left : left + size] = dot_colour
    return Panel(name, title, image=image, caption=caption, scale=scale, step=step)


def text_panel(name: str, title: str, text: str, caption: str = "", limit: int = 4000) -> Panel:
    if len(text) > limit:
        text = text[:limit] + f"\n... ({len(text) - limit} more characters)"
    return Panel(name, title, text=text, caption=caption)


def line_plot(values: np.ndarray, width: int = 320, height: int = 120) -> np.ndarray:
    """uint8 (height, width, 3): a 1-D series as a polyline over its index (min at the bottom)."""
    values = np.asarray(values, np.float64).reshape(-1)
    image = np.full((height, width, 3), 250, np.uint8)
    image[[0, -1], :] = 200  # a frame
    image[:, [0, -1]] = 200
    if values.size == 0:
        return image
    level = normalise(values)
    xs = np.linspace(2, width - 3, num=max(values.size, 2)) if values.size > 1 else np.array([width / 2])
    ys = (height - 3) - level * (height - 5)
    # sample each segment densely enough that consecutive points touch
    if values.size > 1:
        steps = int(max(width, height) * 2)
        t = np.linspace(0, values.size - 1, num=max(steps, values.size))
        px = np.interp(t, np.arange(values.size), xs)
        py = np.interp(t, np.arange(values.size), ys)
    else:
        px, py = xs, ys
    image[np.round(py).astype(int), np.round(px).astype(int)] = (30, 90, 200)
    return image


def png_bytes(image: np.ndarray) -> bytes:
    """The picture as PNG (Pillow), byte-identical for the same pixels."""
    Image = require_pillow()
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8)).save(buffer, format="PNG", optimize=False, compress_level=6)
    return buffer.getvalue()
