"""Shards whose sample i holds the value i: `train/s<i>.array.npy` (float32, every element i) and a
small `meta.json` (`label` = i % 5), converted by the `wdsprep convert generic` command line. What a
loader must deliver is then known from the key alone (an independent reference)."""
import json
import pathlib
import subprocess
import sys

import numpy as np

from ..timeouts import SUBPROCESS


def convert_value_shards(root: pathlib.Path, samples: int, elements: int, shard_bytes: str) -> str:
    """The manifest path of `samples` such samples converted under `root` at `--shard-bytes shard_bytes`."""
    train = root / "in" / "train"
    train.mkdir(parents=True)
    for i in range(samples):
        np.save(train / f"s{i:03d}.array.npy", np.full(elements, i, dtype=np.float32))
        (train / f"s{i:03d}.meta.json").write_text(json.dumps({"label": i % 5}))
    out = root / "shards"
    subprocess.run([sys.executable, "-m", "wdsprep", "convert", "generic", str(root / "in"), str(out),
                    "--shard-bytes", shard_bytes, "--quiet"], check=True, timeout=SUBPROCESS)
    return str(out / "manifest.json")
