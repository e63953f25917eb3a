"""The objects a source's `Source.show` hook gets and gives: `ShowContext` in, `Shown` (a list of
`Panel`s and the fields they show) out. Plain data, no drawing, no imports of the rest of wdsprep,
so sources and the report both build on it."""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Panel:
    """One picture or text block of a sample. `image` is uint8 (H, W) grey or (H, W, 3) RGB at
    display size; `name` is stable across runs (the page's `data-panel`), `title` is shown."""

    name: str
    title: str
    image: np.ndarray | None = None
    text: str | None = None
    caption: str = ""
    scale: int = 1
    step: int = 1


@dataclass
class Shown:
    """What a source's `Source.show` hook gives for one shard sample: its panels, and the fields of
    the sample they show (the training sample its reader yields, where it has one) for the page's
    field table."""

    panels: list[Panel]
    fields: dict = field(default_factory=dict)
    title: str = ""


@dataclass
class ShowContext:
    """What `Source.show` gets besides the sample: the manifest (tables, config), the split, the
    sample's index in it, and the seed of the report (`rng` derives a generator for a source's
    own choices, e.g. which pair of an episode window to show, from all three)."""

    manifest: Any
    split: str
    index: int
    seed: int

    def rng(self, *parts: int) -> np.random.Generator:
        return np.random.default_rng(seed_sequence(self.seed, zlib.crc32(self.split.encode()), self.index, *parts))


def seed_sequence(seed: int, *parts: int) -> np.random.SeedSequence:
    """numpy's seed of (seed, *parts) for any Python int `seed`, never cut to 32 bits: a seed of 0 or
    more is the entropy's first number as it is (numpy takes every 32-bit word of a large int), so
    seeds below 2**32 draw what they always drew; a negative seed -s draws from s with a child key
    of its own, apart from the seed s."""
    seed = int(seed)
    if seed < 0:
        return np.random.SeedSequence([-seed, *parts], spawn_key=(1,))
    return np.random.SeedSequence([seed, *parts])
