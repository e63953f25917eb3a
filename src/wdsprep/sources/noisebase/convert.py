"""sampleset_v1 sequences -> shards: one shard sample per frame, a sequence's frames contiguous.

A unit is a run of whole sequences (grouped by `shard_bytes`), so a sequence never straddles two
units and its frames are consecutive samples of one unit (over several parts when it is bigger
than a shard). The manifest's `sequences` table says, per sequence, its source index and file,
frame count, unit and first sample within the unit: enough for the loader to reproduce
noisebase's split and shuffles and to open exactly the frames it needs.

Arrays are stored losslessly with their source dtypes (RGBE colour stays uint8, normals and
diffuse stay float16). Per-sample arrays are stored sample-major, `[S, C, H, W]` instead of the
source's `[C, H, W, S]`, so a reader that wants the first `samples` samples decompresses only a
prefix of each member. Camera values, the exposure, the rendering size and the previous frame's
camera go to `meta.mp` (float32 values are exact in msgpack's float64), so a frame sample is
self-contained: any reader, in any order, can build the training frame from it alone.

An entry beside the sequence files that is not one (`scene1.zip.part`, `notes.txt`) is reported,
not dropped without a word (`ctx.ignore`, the manifest's `problems`).
"""
from __future__ import annotations

import argparse
import os

import numpy as np

from ...errors import ConfigError, InputError
from ..base import Plan, PlanContext, Source, Unit, UnitContext, group_by_size
from . import native
from .native import CAMERA_ARRAYS, RENDERING_HEIGHT, RENDERING_WIDTH, SAMPLE_ARRAYS

FORMAT_VERSION = 1
PREV_CAMERA = ("camera_position", "camera_target", "camera_up", "proj_mat", "view_proj_mat", "crop_offset")


def frame_key(file: str, frame: int) -> str:
    stem = os.path.basename(file).split(".", 1)[0]
    return f"{stem}_f{frame:04d}"


class NoisebaseSource(Source):
    id = "noisebase"
    show_with = "wdsprep.sources.noisebase.show:show"  # `wdsprep show` draws the reader's sample (show.py)
    fingerprint = "stat"  # a sequence zip is hundreds of MB: content hashing would read it twice
    index_fields = ("meta.sequence", "meta.frame")  # the sample table's fields (selections)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--rendering-height", dest="rendering_height", type=int, default=RENDERING_HEIGHT,
                            help="height of the full rendered frame the crops come from (sampleset_v1: 1080)")
        parser.add_argument("--rendering-width", dest="rendering_width", type=int, default=RENDERING_WIDTH,
                            help="width of the full rendered frame (sampleset_v1: 1920)")

    def check_options(self, options: dict) -> None:
        for name in ("rendering_height", "rendering_width"):
            value = options.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"--{name.replace('_', '-')} must be a positive number of pixels (got {value!r})")

    # ------------------------------------------------------------------------------------ plan
    def plan(self, input: str, ctx: PlanContext) -> Plan:
        options = ctx.options
        root = os.path.abspath(input)
        height = int(options.get("rendering_height") or RENDERING_HEIGHT)
        width = int(options.get("rendering_width") or RENDERING_WIDTH)
        found = native.find_sequences(root, ctx.ignore)
        sequences, sizes = [], []
        shape = None
        for index, rel in found:
            path = os.path.join(root, rel)
            try:
                group, store = native.open_sequence(path)
                try:
                    facts = native.check_sequence(rel, group)
                finally:
                    store.close()
                if shape is None:
                    shape = (facts, rel)
                elif facts != shape[0]:
                    raise InputError(f"{rel}: {facts} differs from {shape[1]}: {shape[0]} (all sequences must agree)")
            except InputError as error:
                ctx.skip_or_raise(rel, error)
                continue
            size = os.path.getsize(path)
            sequences.append({"index": index, "file": rel.replace(os.sep, "/"), "frames": facts["frames"]})
            sizes.append(size)
        if not sequences:
            raise InputError(f"{input}: no valid sequences ({len(ctx.problems)} skipped)")
        facts = shape[0]
        if facts["crop"] > min(height, width):
            raise InputError(f"{shape[1]}: crop {facts['crop']} is larger than the {height}x{width} rendering")

        # estimated shard bytes of a sequence: its zip size (zstd on this data lands near blosc)
        groups = group_by_size(list(range(len(sequences))), sizes, ctx.core.shard_bytes)
        units = []
        for unit_index, members in enumerate(groups):
            first = 0
            items = []
            for position in members:
                entry = sequences[position]
                entry["unit"] = unit_index
                entry["first"] = first
                first += entry["frames"]
                items.append({"file": entry["file"], "index": entry["index"], "frames": entry["frames"],
                              "path": os.path.join(root, entry["file"]), "rendering": [height, width]})
            units.append(Unit("train", unit_index, items, input_bytes=sum(sizes[p] for p in members)))
        config = {
            "noisebase_format": FORMAT_VERSION,
            "rendering_height": height,
            "rendering_width": width,
        }
        sampleset = {
            "sequences": len(sequences),
            "frames_per_sequence": facts["frames"],
            "crop": facts["crop"],
            "samples": facts["samples"],
            "rendering_height": height,
            "rendering_width": width,
            "layout": "sample-major",
        }
        return Plan(units, config, input_bytes=sum(sizes),
                    tables={"sampleset": sampleset, "sequences": sequences})

    def inputs(self, item: dict) -> list[str]:
        return [item["path"]]

    # ----------------------------------------------------------------------------------- build
    def build(self, unit: Unit, ctx: UnitContext):
        for item in unit.items:
            group, store = native.open_sequence(item["path"])
            try:
                yield from _sequence_samples(item, group)
            finally:
                store.close()

    def finalize(self, plan: Plan, unit_tables) -> dict:
        return {}

    def synth(self, directory: str, seed: int = 0, size: str = "small") -> None:
        from .synth import synth

        synth(directory, seed=seed, size=size)


def _read(group, file: str, name: str, frame=None) -> np.ndarray:
    """One array (or one frame of it); a corrupt chunk becomes an InputError naming file and frame."""
    try:
        return np.asarray(group[name][:] if frame is None else group[name][frame])
    except InputError:  # the checked store's refusal names the file and the member
        raise
    except Exception as error:  # numcodecs/zarr raise assorted types for corrupt chunks
        where = f"{file}: {name}" + ("" if frame is None else f" frame {frame}")
        raise InputError(f"{where}: cannot be read ({type(error).__name__}: {error})") from None


def _sequence_samples(item: dict, group):
    file = item["file"]
    camera = {name: _read(group, file, name) for name in CAMERA_ARRAYS}
    for frame in range(item["frames"]):
        fields = {}
        for name in SAMPLE_ARRAYS:
            array = _read(group, file, name, frame)  # [C, H, W, S]
            fields[name] = np.ascontiguousarray(np.moveaxis(array, -1, 0))  # [S, C, H, W]
        fields["reference"] = np.ascontiguousarray(_read(group, file, "reference", frame))
        meta = {"sequence": item["index"], "frame": frame, "file": file, "rendering": item["rendering"]}
        for name in CAMERA_ARRAYS:
            meta[name] = camera[name][frame].tolist()
        # the previous frame's camera too, so that every frame sample stands on its own
        meta["prev"] = None if frame == 0 else {name: camera[name][frame - 1].tolist() for name in PREV_CAMERA}
        fields["meta"] = meta
        yield frame_key(file, frame), fields


SOURCE = NoisebaseSource()
