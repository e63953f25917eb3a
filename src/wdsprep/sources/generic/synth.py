"""Synthetic `generic` data: random samples, a 16 KiB float32 array and a small dict each (the benchmark's shape)."""
from __future__ import annotations

import json
import os

import numpy as np


def synth(directory: str, seed: int = 0, size: str = "small", *, samples: int | None = None,
          splits: dict | None = None) -> None:
    """`<split>/<key>.array.npy` and `<split>/<key>.meta.json`; `splits` maps split -> sample count."""
    rng = np.random.default_rng(seed)
    counts = splits or {"train": samples or (200 if size == "small" else 20000), "valid": 20}
    for split, count in counts.items():
        os.makedirs(os.path.join(directory, split), exist_ok=True)
        for i in range(count):
            key = f"sample{i:06d}"
            np.save(os.path.join(directory, split, f"{key}.array.npy"), rng.standard_normal(4096).astype(np.float32))
            with open(os.path.join(directory, split, f"{key}.meta.json"), "w") as handle:
                json.dump({"index": i, "label": int(rng.integers(10)), "name": key}, handle)
