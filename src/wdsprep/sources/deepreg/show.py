"""`wdsprep show` for deepreg: moving and fixed images as mid-slices on the three axes, label outlined.

A paired sample goes through the reader stage (`pairs("paired", shuffle=False)`, which reads
nothing beyond the sample); images are min/max-normalised as DeepReg does, and the label channel
the reader picks is outlined (its boundary cells, value > 0.5, in `OUTLINE`) over each slice.
Pictures are at the stored resolution; the field table holds the training sample the reader
yields with the dataset's own `reader` config (e.g. `moving_image_shape`, resized), as training
sees it. Unpaired and grouped samples hold one side of a pair (an image, or a group's images):
each is drawn the same way (the reader pairs them across samples; the first label channel is
outlined), and the field table holds them normalised as the reader does.
"""
from __future__ import annotations

import numpy as np

from ...show.model import Panel, ShowContext, Shown
from ...show.picture import AXIS_VIEWS, OUTLINE, grey, mid_slice, outline, picture, text_panel

MAX_GROUP_IMAGES = 3


def volume_panels(name: str, title: str, image: np.ndarray, label: np.ndarray | None) -> list[Panel]:
    """Three mid-slices of a 3-D image, the label's outline drawn over each."""
    panels = []
    for axis, how in AXIS_VIEWS:
        cells = grey(mid_slice(image, axis), 0.0, 1.0)
        caption = f"{'x'.join(map(str, image.shape))}; {how}"
        if label is not None:
            edge = outline(mid_slice(label, axis) > 0.5)
            cells[edge] = OUTLINE
            caption += f"; label outline ({int(edge.sum())} cells)"
        panels.append(picture(f"{name}/axis{axis}", f"{title}, axis {axis} mid-slice", cells, caption))
    return panels


def _reader_config(context: ShowContext, meta: dict) -> dict:
    datasets = context.manifest.config.get("datasets", {})
    return dict(datasets.get(meta.get("dataset") or "", {}).get("reader", {}))


def _first_channel(label):
    if label is None:
        return None
    return label if label.ndim == 3 else label[..., 0]


def show(sample: dict, context: ShowContext) -> Shown:
    from ...shards.codec import decode_sample
    from .read import _Item, normalize, pairs, stored_label, to_float32

    decoded = decode_sample(sample)
    meta = decoded["meta"]
    kind = meta["type"]
    reader = _reader_config(context, meta)
    if kind == "paired":
        labeled = "moving_label" in decoded and "fixed_label" in decoded
        shapes = {name: reader.get(name) for name in ("moving_image_shape", "fixed_image_shape")}
        drawn = next(iter(pairs("paired", labeled=labeled, shuffle=False)([sample])))
        trained = next(iter(pairs("paired", labeled=labeled, shuffle=False, **shapes)([sample])))
        panels = volume_panels("moving", "moving image", drawn["moving_image"], drawn.get("moving_label"))
        panels += volume_panels("fixed", "fixed image", drawn["fixed_image"], drawn.get("fixed_label"))
        label = f", label channel {int(drawn['indices'][-1])} outlined" if labeled else ", no labels"
        panels.append(text_panel("summary", "pair", "\n".join([
            f"name     {meta.get('name')}",
            f"index    {meta.get('index')}",
            f"moving   {list(drawn['moving_image'].shape)} stored -> {list(trained['moving_image'].shape)} trained",
            f"fixed    {list(drawn['fixed_image'].shape)} stored -> {list(trained['fixed_image'].shape)} trained",
            f"labels   {meta.get('num_labels')}"])))
        return Shown(panels, trained, f"paired: the reader's sample (DeepReg's normalisation{label}); "
                                      f"the field table at the configured shapes {shapes}")
    volumes = meta["volumes"]
    if kind == "unpaired":
        items = [("image", "label", volumes.get("image"), volumes.get("label"), "image",
                  decoded["image"], decoded.get("label"))]
    else:  # a group's volumes, from its `images`/`labels` members (or the older per-position ones)
        group = _Item(decoded)
        items = [(f"image_{i:04d}", f"label_{i:04d}", volumes[i].get("image"), volumes[i].get("label"),
                  f"group {meta.get('group_index')}, image {i}", group.grouped("image", i),
                  group.grouped("label", i) if volumes[i].get("label") else None)
                 for i in range(min(len(volumes), MAX_GROUP_IMAGES))]
    panels, fields = [], {}
    for image_name, label_name, image_meta, label_meta, title, image, label in items:
        image = normalize(to_float32(image, image_meta))
        label = None if label is None else to_float32(_first_channel(stored_label(label)), label_meta)
        panels += volume_panels(image_name, title, image, label)
        fields[image_name] = image
        if label is not None:
            fields[label_name] = label
    more = f" (first {MAX_GROUP_IMAGES} of {len(volumes)})" if kind == "grouped" and len(volumes) > MAX_GROUP_IMAGES else ""
    return Shown(panels, fields, f"{kind}: one side of the reader's pairs{more}, normalised as DeepReg does; "
                                 f"first label channel outlined")
