"""`wdsprep show` for noisebase: one frame's colour, reference, normal, albedo and motion buffers.

The frame sample goes through the reader stage (`frames()`: every buffer, all stored samples per
pixel, no flip/rotate) and the per-sample buffers ([C, H, W, S]) are averaged over S:

- colour and reference (HDR radiance): Reinhard's x / (1 + x), then the sRGB curve;
- diffuse (albedo): clipped to [0, 1], the sRGB curve;
- normal (screen space, in [-1, 1]): (n + 1) / 2 as RGB;
- motion (screen-space pixel offset to the previous frame): red = 0.5 + dx / (2 m), green =
  0.5 + dy / (2 m), blue 0.5, m the largest |offset| of the frame (grey: no motion).
"""
from __future__ import annotations

import numpy as np

from ...show.model import ShowContext, Shown
from ...show.picture import as_numpy, picture, rgb8, srgb, text_panel


def _hwc(buffer) -> np.ndarray:
    """[C, H, W] or [C, H, W, S] (averaged over S) -> float64 [H, W, C]."""
    array = np.asarray(as_numpy(buffer), np.float64)
    if array.ndim == 4:
        array = array.mean(axis=3)
    return np.moveaxis(array, 0, -1)


def tonemap(radiance) -> np.ndarray:
    hdr = np.clip(np.nan_to_num(_hwc(radiance)), 0, None)
    return rgb8(srgb(hdr / (1.0 + hdr)))


def motion_colours(motion) -> np.ndarray:
    flow = _hwc(motion)[..., :2]
    largest = float(np.abs(flow).max()) if flow.size else 0.0
    out = np.full(flow.shape[:2] + (3,), 0.5)
    if largest > 0:
        out[..., :2] = 0.5 + flow / (2 * largest)
    return rgb8(out)


def show(sample: dict, context: ShowContext) -> Shown:
    from .read import frames

    frame = next(iter(frames()([sample])))
    samples = as_numpy(frame["color"]).shape[-1]
    panels = [
        picture("color", f"color (mean of {samples} samples)", tonemap(frame["color"]), "HDR, x/(1+x), sRGB"),
        picture("reference", "reference", tonemap(frame["reference"]), "HDR, x/(1+x), sRGB"),
        picture("normal", "normal (screen space)", rgb8((_hwc(frame["normal"]) + 1) / 2), "(n + 1) / 2"),
        picture("diffuse", "diffuse (albedo)", rgb8(srgb(_hwc(frame["diffuse"]))), "clipped, sRGB"),
        picture("motion", "motion", motion_colours(frame["motion"]),
                f"red dx, green dy around grey; largest |offset| {float(np.abs(as_numpy(frame['motion'])).max()):.3g} px"),
        text_panel("camera", "camera", "\n".join([
            f"file          {frame['file']}",
            f"frame         {frame['frame_index']}",
            f"position      {np.round(as_numpy(frame['camera_position']), 4).tolist()}",
            f"forward       {np.round(as_numpy(frame['camera_forward']), 4).tolist()}",
            f"crop offset   {as_numpy(frame['crop_offset']).tolist()}"])),
    ]
    fields = {name: value for name, value in frame.items() if not name.startswith("__")}
    return Shown(panels, fields, f"frame {frame['frame_index']} of {frame['file']}: the reader's frame "
                                 f"(every buffer, {samples} samples per pixel, no flip/rotate)")
