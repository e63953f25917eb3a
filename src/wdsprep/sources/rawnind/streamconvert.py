"""Fetch straight into shards: each scene becomes its own unit as soon as its files are verified.

`fetch --convert OUTPUT` hands every complete scene to `SceneConverter.convert`, and the fetcher
removes the scene's raw files afterwards, so local disk holds the raws of a bounded number of
scenes only (see `fetch.FetchOptions.max_raw_bytes`). This module only makes the plan (one unit per
scene) and hands it to the core's conversion driver, which it is handed in turn (`driver`:
`wdsprep.conversion.Conversion`, public as `wdsprep.Conversion`; `wdsprep fetch rawnind` passes it,
and a source never imports the driver's module): reuse of the scenes an earlier run converted,
building (the same code and bytes as `wdsprep convert`), the check of the shards in the store, the
`_units.json` journal and the manifest are all the driver's.

Invariants:
- one unit per scene: split `test` (test_reserve) or `train`, index = the scene's ordinal in its
  split over the selected scenes in index order, so shard names and bytes depend neither on the
  order scenes complete in nor on interruptions;
- a unit's digest names its items without the local destination root and its captures by the
  SHA-1s the fetch verified (its inputs' fingerprint), so it means the same work on any machine;
- per scene, in this order: shards published to the store -> checked there (size and sha256) ->
  recorded in `_units.json` (durably, `Conversion.build`) -> raws removed. A run killed between two
  steps is repaired by the next: no record means the scene is rebuilt from the raws still on disk
  (they are removed only after the record), a record means the scene is done and leftover raws go;
- the manifest is written last, only when every selected scene is done.
"""
from __future__ import annotations

import json
import os

from ...options import ConvertOptions
from ...shards.manifest import Manifest
from ...storage import open_store
from ..base import Plan, Unit
from .index import SceneInfo
from .units import DEFAULT_TILE, check_options, conversion_config, scene_item


class SceneConverter:
    """The plan of a fetch that converts as it goes (one unit per scene), and its driver (`driver`:
    the core's `Conversion` class, handed in)."""

    def __init__(self, driver, output: str, dest: str, scenes: list[SceneInfo], options: dict | None = None):
        core, own = ConvertOptions.split({"tile_size": DEFAULT_TILE, "layout": "mosaic", **(options or {})})
        core = core.checked()
        check_options(own)  # a bad option fails before any download
        self.store = open_store(output)
        self.units: dict[str, Unit] = {}
        counts = {"train": 0, "test": 0}
        for scene in scenes:
            if not scene.noisy:
                continue
            split = "test" if scene.test_reserve else "train"
            item = scene_item(os.path.abspath(dest), scene, {image.filename: image.relpath for image in scene.images})
            size = sum(image.size or 0 for image in [scene.clean[0], *scene.noisy])
            self.units[scene.key] = Unit(split, counts[split], [item], size)
            counts[split] += 1
        units = sorted(self.units.values(), key=lambda unit: (unit.split, unit.index))
        plan = Plan(units, conversion_config(own), input_bytes=sum(unit.input_bytes for unit in units))
        # the captures are identified by the SHA-1s the fetch verified: they are the inputs' fingerprint
        self.conversion = driver("rawnind", os.path.abspath(dest), self.store, plan, core, own,
                                     [_sha1s(unit) for unit in units], input_mode="sha1",
                                     identities=[_portable(unit) for unit in units])

    def converts(self, scene: SceneInfo) -> bool:
        return scene.key in self.units

    def record(self, scene: SceneInfo):
        """The scene's finished unit when an earlier run (or this one) converted it, else None."""
        return self.conversion.done(self.units[scene.key])

    def convert(self, scene: SceneInfo):
        """Build, check and record one scene's shards (runs in a worker thread)."""
        return self.conversion.build(self.units[scene.key])

    def finish(self, scenes: list[SceneInfo], started: float) -> Manifest | None:
        """Write the manifest when every scene is done; None (and no manifest) otherwise."""
        if not self.conversion.complete:
            self.conversion.flush()
            return None
        return self.conversion.finish(started)


def _sha1s(unit: Unit) -> str:
    return json.dumps([[item["gt"][1], [sha1 for _, sha1 in item["noisy"]]] for item in unit.items])


def _portable(unit: Unit) -> Unit:
    """The unit without the local root, so its digest names the same work on any machine."""
    items = [{name: value for name, value in item.items() if name != "root"} for item in unit.items]
    return Unit(unit.split, unit.index, items, unit.input_bytes)
