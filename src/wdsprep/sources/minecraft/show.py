"""`wdsprep show` for minecraft: one (frame t, action t, frame t+1) pair of an episode window.

The shard sample (an episode window) goes through the reader stage (`pairs(task="frame_prediction")`);
the report's seed picks one of the window's pairs. Drawn as upstream's `show_data.py` colours
blocks, but flat: each frame seen from above (axis 1 is y, up; each (x, z) column shows its
topmost block that is not air; rows = x, columns = z), the two frames side by side, the action as
text (`action_to_text`), the 5x5x5 centre as the text the language model reads (`voxel_to_text`),
and the colour of each block on the page.

Block colours: upstream's `datasets/minecraft/color.json` where it names the block; any other
block gets a colour from a hash of its name (the same on every run). A column of air only is
drawn `EMPTY`.
"""
from __future__ import annotations

import zlib

import numpy as np

from ...show.model import ShowContext, Shown
from ...show.picture import EMPTY, as_numpy, picture, text_panel

# upstream datasets/minecraft/color.json (yhbcode000/nlp701-final-project)
BLOCK_COLOURS = {
    "coal ore": "#1f77b4", "dirt": "#8b5a2b", "flower": "#ff69b4", "grass": "#4caf50", "grass block": "#4caf50",
    "gravel": "#98df8a", "iron ore": "#d62728", "leaves": "#2e8b57", "mushroom": "#9467bd", "plant": "#c5b0d5",
    "sand": "#d2b48c", "sandstone": "#c49c94", "stone": "#7d7d7d", "water": "#1e90ff", "wood": "#a67c52",
}
AIR = "air"


def block_colour(name: str) -> tuple[int, int, int]:
    text = BLOCK_COLOURS.get(name)
    if text is None:
        mixed = zlib.crc32(name.encode())
        return (64 + (mixed & 0x7F), 64 + ((mixed >> 8) & 0x7F), 64 + ((mixed >> 16) & 0x7F))
    return (int(text[1:3], 16), int(text[3:5], 16), int(text[5:7], 16))


def top_view(voxel: np.ndarray, names) -> tuple[np.ndarray, set]:
    """uint8 (X, Z, 3): per (x, z) the colour of the topmost non-air block (largest y); the names seen."""
    ids = np.asarray(voxel).astype(np.int64)
    solid = np.array([name != AIR for name in names], bool)[ids]  # (x, y, z)
    height = ids.shape[1]
    top = height - 1 - np.argmax(solid[:, ::-1, :], axis=1)  # (x, z): the largest y that is solid
    block = np.take_along_axis(ids, top[:, None, :], axis=1)[:, 0, :]
    palette = np.array([block_colour(name) for name in names], np.uint8).reshape(-1, 3)
    image = palette[block]
    image[~solid.any(axis=1)] = EMPTY
    return image, {names[i] for i in np.unique(block[solid.any(axis=1)])}


def show(sample: dict, context: ShowContext) -> Shown:
    from .read import Vocabulary, action_to_text, pairs, voxel_to_text

    vocabulary = Vocabulary(context.manifest.tables["blocks"])
    made = list(pairs(task="frame_prediction")([sample]))
    if not made:
        return Shown([text_panel("summary", "episode window", "no pair: the window holds a single frame")], {})
    chosen = int(context.rng().integers(len(made)))
    pair = made[chosen]
    panels, seen = [], set()
    for name, frame, label in (("voxel", pair["voxel"], f"frame t = {pair['t']}"),
                               ("target", pair["target"], f"frame t+1 = {pair['t'] + 1} (target)")):
        image, names = top_view(as_numpy(frame), vocabulary.names)
        seen |= names
        side = as_numpy(frame).shape
        panels.append(picture(f"{name}/top", f"{label}, from above", image,
                              f"{side[0]}x{side[1]}x{side[2]} blocks; topmost non-air block per column; rows = x, columns = z"))
    panels.append(text_panel("action", "action t", action_to_text(pair["action"])))
    size = min(5, as_numpy(pair["voxel"]).shape[0])
    panels.append(text_panel("voxel/text", f"frame t, centre {size}³ as text", voxel_to_text(pair["voxel"], vocabulary, size)))
    panels.append(text_panel("legend", "block colours", "\n".join(
        f"{name:<12} #{''.join(f'{c:02x}' for c in block_colour(name))}" for name in sorted(seen)) or "(air only)"))
    return Shown(panels, pair, f"{pair['episode']}: pair {chosen + 1} of {len(made)} in this episode window "
                               f"(the reader's frame_prediction pair; which one is drawn by the seed)")
