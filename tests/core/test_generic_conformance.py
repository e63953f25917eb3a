"""The generic source (the one the core's tests convert) against the source conformance suite
(wdsprep.testing.conformance): 40 + 10 samples of 16 KiB in 100 KB shards; an array file replaced by
junk; an array's values changed in place."""
import io
import json

import numpy as np

from wdsprep.testing.conformance import SourceTests

ARRAY = "train/sample000017.array.npy"


class TestGenericConformance(SourceTests):
    source = "generic"
    convert_args = ("--shard-bytes", "100KB")
    rebalance_shard_bytes = 100_000

    def make_rebalance_input(self, directory):
        """600 samples of a 64-float32 array and a small dict: tar headers and padding outweigh the
        input bytes the units are planned by, so every unit overruns (the issue's reproduction, scaled)."""
        rng = np.random.default_rng(2)
        (directory / "train").mkdir(parents=True)
        for i in range(600):
            np.save(directory / "train" / f"s{i:05d}.array.npy", rng.standard_normal(64).astype(np.float32))
            (directory / "train" / f"s{i:05d}.meta.json").write_text(json.dumps({"i": i, "label": i % 10}))
        return directory

    def make_input(self, directory):
        from wdsprep.sources.generic import SOURCE

        SOURCE.synth(str(directory), 0, "small", splits={"train": 40, "valid": 10})
        return directory

    def corrupt_input(self, native):
        path = native / ARRAY
        path.write_bytes(b"not an array")
        return str(path)

    def stray_entries(self, native):
        return ("README.txt", ".ipynb_checkpoints/", "train/preview.png", "train/k0.array.NPY", "train/old/")

    def edit_input(self, native):
        path = native / ARRAY
        buffer = io.BytesIO()
        np.save(buffer, -np.load(path))  # same dtype and shape: the same size
        return path, buffer.getvalue()
