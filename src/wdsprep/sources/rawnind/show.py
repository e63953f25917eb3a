"""`wdsprep show` for rawnind: a scene tile's clean target and noisy input crops, the mask, the gain.

The tile goes through the reader stage itself (`pairs`, seeded by the report's seed, epoch 0, one
crop per noisy capture, the construction filters off so every capture is shown with its numbers):
with `input="rgb"` for the pictures (the noisy capture demosaiced over the same crop, linear
Rec.2020; a Bayer training input is its RGGB mosaic, which is not a picture), and with the
default `input="bayer"` for the field table where the scene is Bayer (X-Trans scenes train on RGB).
The crop origins depend only on (seed, epoch, key, capture) and the mask, so both inputs cover the
same crop.

For display, linear Rec.2020 is converted to linear sRGB, scaled so that the clean crop's 99th
percentile is white (the noisy crop is multiplied by its gain, then scaled the same), and given the
sRGB curve. The mask is white where the pixel is valid.
"""
from __future__ import annotations

import numpy as np

from ...show.model import ShowContext, Shown
from ...show.picture import as_numpy, grey, picture, rgb8, srgb, text_panel

MAX_CAPTURES = 2
CROP = 256
# linear Rec.2020 -> linear sRGB (BT.2087)
REC2020_TO_SRGB = np.array([[1.6605, -0.5876, -0.0728], [-0.1246, 1.1329, -0.0083], [-0.0182, -0.1006, 1.1187]])
NO_FILTERS = dict(max_alignment_loss=None, min_mask_mean=None, min_msssim_score=None, max_msssim_score=None)


def display(rec2020: np.ndarray, exposure: float) -> np.ndarray:
    """uint8 (H, W, 3) of a linear Rec.2020 (3, H, W) crop, times `exposure`, with the sRGB curve."""
    linear = np.einsum("ij,jhw->hwi", REC2020_TO_SRGB, np.asarray(rec2020, np.float64)) * exposure
    return rgb8(srgb(linear))


def show(sample: dict, context: ShowContext) -> Shown:
    from ...shards.codec import decode_sample
    from .read import pairs

    meta = decode_sample(sample)["meta"]
    height, width = meta["tile_size"]
    crop = min(CROP, height, width) // 4 * 4
    common = dict(crop_size=crop, num_crops=1, seed=context.seed, epoch=0, to_torch=False, **NO_FILTERS)
    shown = list(pairs(input="rgb", **common)([sample]))[:MAX_CAPTURES]
    trained = list(pairs(**common)([sample]))[:1] if meta.get("is_bayer", True) else shown[:1]
    panels = []
    for out in shown:
        n = int(out["__key__"].rsplit("-", 1)[1])
        clean, noisy = as_numpy(out["x_crops"])[0], as_numpy(out["y_crops"])[0]
        bright = float(np.percentile(np.einsum("ij,jhw->ihw", REC2020_TO_SRGB, clean), 99))
        exposure = 1.0 / bright if bright > 0 else 1.0
        gain = float(out["gain"])
        mask = as_numpy(out["mask_crops"])[0][0]
        panels.append(picture(f"clean/{n}", f"clean target (capture {n}'s crop)", display(clean, exposure),
                              f"x_crops {crop}x{crop}, linear Rec.2020 shown as sRGB"))
        panels.append(picture(f"noisy/{n}", f"noisy input {n}, demosaiced, x gain", display(noisy * gain, exposure),
                              f"{meta['noisy_files'][n] if 'noisy_files' in meta else ''}; gain {gain:.4g}"))
        panels.append(picture(f"mask/{n}", f"mask {n}", grey(mask.astype(np.float32), 0.0, 1.0),
                              f"valid {mask.mean():.1%} of the crop"))
        panels.append(text_panel(f"capture/{n}", f"capture {n}", "\n".join([
            f"gain            {gain:.6g}",
            f"alignment loss  {meta['best_alignment_loss'][n]:.4g}",
            f"mask mean       {meta['mask_mean'][n]:.4g}",
            f"filters pass    {'yes' if _passes(meta, n) else 'no (the default reader skips it)'}"])))
    total = len(meta.get("noisy_files") or meta.get("mask_mean") or [])
    if not shown:
        panels.append(text_panel("summary", "tile", f"no crop of {crop}x{crop} with 50% valid pixels in any noisy capture"))
    note = (f"scene {meta.get('scene')}, tile {meta.get('tile')}: {len(shown)} of {total} noisy captures "
            f"(the reader's pairs with seed {context.seed}, epoch 0, one {crop}px crop each, filters off)")
    return Shown(panels, trained[0] if trained else {}, note)


def _passes(meta: dict, n: int) -> bool:
    """Whether the default reader (`pairs()` with its default filters) keeps capture n."""
    import inspect

    from .read import pair_passes, pairs

    defaults = {name: parameter.default for name, parameter in inspect.signature(pairs).parameters.items()}
    return pair_passes(meta, n, **{name: defaults[name] for name in NO_FILTERS})
