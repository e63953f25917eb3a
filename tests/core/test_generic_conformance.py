"""The generic source (the one the core's tests convert) against the source conformance suite
(wdsprep.conformance): 40 + 10 samples of 16 KiB in 100 KB shards; an array file replaced by
junk; an array's values changed in place; a 2 GiB JSON field (a sparse file); an array whose header
declares 4 GiB followed by 16 bytes."""
import io
import json

import numpy as np

from wdsprep.conformance import Hostile, SourceTests

ARRAY = "train/sample000017.array.npy"


class TestGenericConformance(SourceTests):
    source = "generic"
    convert_args = ("--shard-bytes", "100KB")
    rebalance_shard_bytes = 100_000

    def make_rebalance_input(self, directory):
        """600 samples of a 64-float32 array and a dict of 200 short floats: msgpack writes each `0.5`
        (5 bytes of JSON with its separator) as a 9-byte float64, so every unit overruns the estimate
        it was planned by (tar headers and padding, which issue 40 counts, no longer do)."""
        rng = np.random.default_rng(2)
        (directory / "train").mkdir(parents=True)
        for i in range(600):
            np.save(directory / "train" / f"s{i:05d}.array.npy", rng.standard_normal(64).astype(np.float32))
            (directory / "train" / f"s{i:05d}.meta.json").write_text(json.dumps({"i": i, "label": i % 10, "weights": [0.5] * 200}))
        return directory

    def make_input(self, directory):
        from wdsprep.sources.generic import SOURCE

        SOURCE.synth(str(directory), 0, "small", splits={"train": 40, "valid": 10})
        return directory

    def corrupt_input(self, native):
        path = native / ARRAY
        path.write_bytes(b"not an array")
        return str(path)

    def bomb_input(self, native):
        path = native / "train" / "sample000017.notes.json"
        with open(path, "wb") as handle:
            handle.write(b'{"notes": "')
            handle.truncate(2 << 30)  # a sparse file: 2 GiB on read, nothing on disk
        return Hostile(str(path), 2 << 30)

    def malformed_input(self, native):
        path = native / ARRAY
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (2**29,)})
        path.write_bytes(header.getvalue() + bytes(16))
        return Hostile(str(path), 2**29 * 8)

    def stray_entries(self, native):
        return ("README.txt", ".ipynb_checkpoints/", "train/preview.png", "train/k0.array.NPY", "train/old/")

    def edit_input(self, native):
        path = native / ARRAY
        buffer = io.BytesIO()
        np.save(buffer, -np.load(path))  # same dtype and shape: the same size
        return path, buffer.getvalue()
