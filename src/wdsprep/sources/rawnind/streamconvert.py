"""Fetch straight into shards: each scene becomes its own unit as soon as its files are verified.

`fetch --convert OUTPUT` hands every complete scene to `SceneConverter.convert`, which builds the
scene's shards with the core's `build_unit` (the same code and bytes as `wdsprep convert`), and the
fetcher removes the scene's raw files afterwards, so local disk holds the raws of a bounded number
of scenes only (see `fetch.FetchOptions.max_raw_bytes`).

Invariants:
- one unit per scene: split `test` (test_reserve) or `train`, index = the scene's ordinal in its
  split over the selected scenes in index order, so shard names and bytes depend neither on the
  order scenes complete in nor on interruptions;
- per scene, in this order: shards published to the store -> checked there (size and sha256) ->
  record `_scene-<split>-<index>.json` written -> raws removed. A run killed between two steps is
  repaired by the next: no record means the scene is rebuilt from the raws still on disk (they
  are removed only after the record), a record means the scene is done and leftover raws go;
- the manifest is written last, only when every selected scene has a record.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict

from ...conversion import UnitResult, build_unit, unit_digest, unverified_shards
from ...errors import ConversionError
from ...options import CORE_DEFAULTS, check_core_options
from ...shards.manifest import MANIFEST_NAME, Manifest
from ...storage import open_store
from ..base import Unit
from .index import SceneInfo
from .units import DEFAULT_TILE, check_options, conversion_config, merge_pairs, scene_item


class SceneConverter:
    """Units, records and the manifest of a fetch that converts as it goes."""

    def __init__(self, output: str, dest: str, scenes: list[SceneInfo], options: dict | None = None):
        options = check_core_options({"tile_size": DEFAULT_TILE, "layout": "mosaic", **(options or {})})
        check_options(options)  # a bad option fails before any download
        self.options = options
        self.store = open_store(output)
        self.store.clean_temporaries()  # a shard a killed run was writing
        self.config = dict(conversion_config(options), **{name: options[name] for name in CORE_DEFAULTS})
        self.units: dict[str, Unit] = {}
        counts = {"train": 0, "test": 0}
        fingerprint = hashlib.sha256()
        for scene in scenes:
            if not scene.noisy:
                continue
            split = "test" if scene.test_reserve else "train"
            item = scene_item(os.path.abspath(dest), scene, {image.filename: image.relpath for image in scene.images})
            size = sum(image.size or 0 for image in [scene.clean[0], *scene.noisy])
            self.units[scene.key] = Unit(split, counts[split], [item], size)
            counts[split] += 1
            fingerprint.update(json.dumps([item["gt"], item["noisy"], size]).encode())
        fingerprint.update(json.dumps(conversion_config(options), sort_keys=True).encode())
        self.fingerprint = fingerprint.hexdigest()
        # the captures are identified by the SHA-1s the fetch verified: they are the inputs' fingerprint
        self.digests = {key: unit_digest(_portable(unit), self.config, _sha1s(unit)) for key, unit in self.units.items()}

    def converts(self, scene: SceneInfo) -> bool:
        return scene.key in self.units

    @staticmethod
    def record_name(unit: Unit) -> str:
        return f"_scene-{unit.split}-{unit.index:05d}.json"

    def record(self, scene: SceneInfo) -> UnitResult | None:
        """The scene's finished unit when its record matches this conversion and its shards check out."""
        unit = self.units[scene.key]
        raw = self.store.read_bytes(self.record_name(unit))
        if raw is None:
            return None
        try:
            result = UnitResult(**json.loads(raw))
        except (ValueError, TypeError):
            return None
        if result.digest != self.digests[scene.key] or unverified_shards(self.store, result.rows, full=True):
            return None
        return result

    def convert(self, scene: SceneInfo) -> UnitResult:
        """Build, check and record one scene's shards (runs in a worker thread)."""
        unit = self.units[scene.key]
        digest = self.digests[scene.key]
        result = build_unit("rawnind", unit, self.options, self.store.url, digest)
        bad = unverified_shards(self.store, result.rows, full=True)
        if bad:
            raise ConversionError(f"{scene.key}: shard(s) {', '.join(bad)} not found at {self.store.url} with the size "
                                  "and sha256 written")
        self.store.write_bytes(self.record_name(unit), json.dumps(asdict(result), sort_keys=True).encode())
        return result

    def finish(self, scenes: list[SceneInfo], started: float) -> Manifest | None:
        """Write the manifest when every scene has a record; None (and no manifest) otherwise."""
        results = []
        for scene in scenes:
            if not self.converts(scene):
                continue
            result = self.record(scene)
            if result is None:
                return None
            results.append(result)
        splits: dict[str, list[dict]] = {}
        for result in sorted(results, key=lambda r: (r.split, r.index)):
            splits.setdefault(result.split, []).extend(dict(row, unit_digest=result.digest) for row in result.rows)
        manifest = Manifest(
            source="rawnind", config=self.config, fingerprint=self.fingerprint, splits=splits,
            tables=merge_pairs([r.tables for r in sorted(results, key=lambda r: (r.split, r.index))]),
            problems=[p for r in results for p in r.problems], input_bytes=sum(r.input_bytes for r in results),
            timing={"seconds": round(time.time() - started, 3), "units_built": len(results)},
        )
        self.store.write_bytes(MANIFEST_NAME, manifest.dumps())
        manifest.url = f"{self.store.url.rstrip('/')}/{MANIFEST_NAME}"
        return manifest


def _sha1s(unit: Unit) -> str:
    return json.dumps([[item["gt"][1], [sha1 for _, sha1 in item["noisy"]]] for item in unit.items])


def _portable(unit: Unit) -> Unit:
    """The unit without the local root, so its digest names the same work on any machine."""
    items = [{name: value for name, value in item.items() if name != "root"} for item in unit.items]
    return Unit(unit.split, unit.index, items, unit.input_bytes)
