"""A webdataset stage: raw frame samples -> noisebase training frames (no lockstep batching).

`wds.WebDataset(wdsprep.urls(url)).compose(wdsprep.noisebase.frames(buffers=[...], samples=8))`
yields one noisebase frame dict per shard sample, with the keys, shapes and dtypes of a
`TrainingSampleLoader` batch element (numpy arrays; `frame_index` an int). Every frame sample
carries its previous frame's camera, so the stage keeps no state between samples and works in any
shard order. Orientation (with `flip_rotate`) is derived from (seed, epoch, the sequence's source
index); the lockstep loader instead uses the sequence's position in the train split, as noisebase.
"""
from __future__ import annotations

from typing import Iterable, Iterator, Sequence

from ...errors import ConfigError, FormatError
from ...shards.codec import decode_sample
from .native import BUFFERS


def frames(*, buffers: Sequence[str] = BUFFERS, samples: int = 8, flip_rotate: bool = False, seed: int = 42,
           epoch: int = 0):
    """Curried stage (use with `.compose`): decode a frame sample and compute the buffers."""
    from .loader import SeedTree, build_frame  # numpy-only code paths; torch is imported there anyway
    from .projective import Orientation

    unknown = [b for b in buffers if b not in BUFFERS]
    if unknown:
        raise ConfigError(f"unknown buffer(s) {', '.join(map(repr, unknown))} (known: {', '.join(BUFFERS)})")
    if samples < 1:
        raise ConfigError(f"samples must be at least 1 (got {samples})")
    derived = SeedTree(seed).derive(epoch) if flip_rotate else None

    def stage(source: Iterable[dict]) -> Iterator[dict]:
        for raw in source:
            sample = decode_sample(raw)
            meta = sample.get("meta")
            if not isinstance(meta, dict) or "rendering" not in meta:
                raise FormatError(f"{sample.get('__url__', '?')}: sample {sample.get('__key__')!r} is not a "
                                  "noisebase frame (no meta.mp with a rendering size)")
            arrays = {}
            for name in ("color", "position", "motion", "normal", "diffuse"):
                if name in sample:
                    arrays[name] = sample[name][:samples]
            if "reference" in sample:
                arrays["reference"] = sample["reference"]
            crop = sample["reference"].shape[-1] if "reference" in sample else sample["color"].shape[-1]
            height, width = meta["rendering"]
            code = derived.integers(meta["sequence"], 0, 8) if derived is not None else 7
            frame = build_frame(arrays, meta, Orientation(code, height, width, crop), list(buffers),
                                int(meta["frame"]), meta["file"], height, width)
            frame["frame_index"] = int(meta["frame"])
            frame["__key__"] = sample["__key__"]
            yield frame

    return stage
