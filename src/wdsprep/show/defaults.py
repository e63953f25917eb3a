"""The default pictures of a sample, by each field's kind: what `Source.show` draws for a source
(a plugin, `generic`) that has no drawing of its own, and what sources use for fields they do not
draw themselves.

    0-D array, number, str        text
    an array with no element      text: dtype and shape (docs/format.md's absent value, e.g. (5, 0))
    1-D numeric array             a line plot over the index
    2-D numeric array             a grey image (min..max over the array)
    3-D array (H, W, 3|4) uint8   an RGB image; (3, H, W) float/uint8 with H, W > 4: an RGB image
    other 3-D numeric array       three orthogonal mid-slices (see `picture.AXIS_VIEWS`)
    4-D and more                  index 0 of the leading axes until 3-D is left (said in the caption)
    dict, list, bytes, strings    text (JSON where it is JSON)
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

from .model import Panel, ShowContext, Shown
from .picture import AXIS_VIEWS, as_numpy, empty_text, grey, line_plot, mid_slice, picture, rgb8, text_panel


def default_show(sample: dict, context: ShowContext) -> Shown:
    """Every field of the decoded sample, drawn by `field_panels`."""
    from ..shards.codec import decode_sample

    decoded = decode_sample(sample)
    fields = {name: value for name, value in decoded.items() if not name.startswith("__")}
    panels = [panel for name, value in fields.items() for panel in field_panels(name, value)]
    return Shown(panels, fields)


def _text_of(value: Any) -> str:
    value = as_numpy(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"{len(value)} bytes"
    if isinstance(value, np.ndarray):
        return np.array2string(value, threshold=64, max_line_width=100)
    try:
        return json.dumps(value, indent=1, sort_keys=True, default=_json_default)
    except (TypeError, ValueError):
        return repr(value)


def _json_default(value: Any) -> Any:
    value = as_numpy(value)
    if isinstance(value, np.ndarray):
        return value.tolist() if value.size <= 64 else f"array {value.dtype}{list(value.shape)}"
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (bytes, bytearray)):
        return f"{len(value)} bytes"
    return repr(value)


def _numeric(array: np.ndarray) -> bool:
    return array.dtype.kind in "biuf"


def field_panels(name: str, value: Any) -> list[Panel]:
    """The default panels of one field (see the module docstring)."""
    value = as_numpy(value)
    if not isinstance(value, np.ndarray) or not _numeric(value) or value.ndim == 0:
        return [text_panel(name, name, _text_of(value))]
    if value.size == 0:
        return [text_panel(name, name, empty_text(value))]
    array, caption = value, f"{value.dtype} {list(value.shape)}"
    if array.ndim > 3 and all(size == 1 for size in array.shape[: array.ndim - 3]):
        array = array.reshape(array.shape[array.ndim - 3 :])
    while array.ndim > 3:
        array = array[0]
        caption += ", [0]"
    if array.dtype == bool:
        array = array.astype(np.uint8)
    if array.ndim == 1:
        low, high = (float(array.min()), float(array.max())) if array.size else (0.0, 0.0)
        return [picture(name, name, line_plot(array), f"{caption}; {low:.4g} .. {high:.4g}")]
    if array.ndim == 2:
        return [picture(name, name, grey(array), caption)]
    if array.shape[-1] in (3, 4) and array.dtype == np.uint8 and min(array.shape[:2]) > 4:
        return [picture(name, name, np.ascontiguousarray(array[..., :3]), caption)]
    if array.shape[0] in (3, 4) and min(array.shape[1:]) > 4 and array.ndim == 3:
        channels = np.moveaxis(array[:3], 0, -1)
        image = channels if array.dtype == np.uint8 else rgb8(_unit(channels))
        return [picture(name, name, image, caption + " (channels as RGB)")]
    low, high = float(np.nanmin(array)), float(np.nanmax(array))
    return [picture(f"{name}/axis{axis}", f"{name} mid-slice, axis {axis}", grey(mid_slice(array, axis), low, high),
                    f"{caption}; {how}") for axis, how in AXIS_VIEWS]


def _unit(image: np.ndarray) -> np.ndarray:
    """A float image in [0, 1] as it is; other ranges by their min/max."""
    finite = image[np.isfinite(image)]
    if finite.size and finite.min() >= 0 and finite.max() <= 1:
        return image
    from .picture import normalise

    return normalise(image)
