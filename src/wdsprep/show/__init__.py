"""What `wdsprep show` draws with: a dataset's samples as pictures, in one self-contained HTML file.

    model.py     what a source's `Source.show` hook gets (`ShowContext`) and gives (`Shown`, `Panel`s)
    picture.py   arrays -> pictures at exact cell positions, PNG encoding (Pillow, the `show` extra)
    defaults.py  the default hook: every field by its rank (2-D image, 3-D mid-slices, 1-D plot, text)
    report.py    picking by seed, fetching only the picked samples, the field table, the page

Below the sources: each source's own pictures are in `sources/<id>/show.py` (reached through the
`Source.show` hook) and use these parts; nothing here imports a source or the registry. Which
source may draw a manifest's samples (the plugin gate) is the command's, `wdsprep.commands.show`.
"""
from __future__ import annotations

from .model import Panel, ShowContext, Shown

__all__ = ["Panel", "ShowContext", "Shown"]
