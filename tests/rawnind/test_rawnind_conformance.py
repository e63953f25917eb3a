"""rawnind against the source conformance suite (wdsprep.conformance): the tiny synthetic
Dataverse directory (two scenes: one train unit, one test unit) in 128-pixel tiles; a noisy capture
replaced by junk; every pixel of one capture brightened in place; a 2 GiB index (a sparse file); a
capture whose header declares a 30000x30000 mosaic."""
import struct

import numpy as np
import rawpy

from wdsprep.conformance import Hostile, SourceTests

from .rawnind_testdata import truth


class TestRawNINDConformance(SourceTests):
    source = "rawnind"
    convert_args = ("--tile-size", "128")
    rebalance_shard_bytes = 400_000  # a scene's six ~90 KB tiles: 4 + 2 rolled over, balanced to 3 + 3
    synth_seed, synth_size = 1, "tiny"

    def plan_files(self, native):
        return ("dataset_index.yaml",)

    def corrupt_input(self, native):
        victim = sorted((native / "files").glob("*ISO*.dng"))[-1]
        victim.write_bytes(b"not a raw file")
        return str(victim)

    def bomb_input(self, native):
        path = native / "dataset_index.yaml"
        with open(path, "r+b") as handle:
            handle.truncate(2 << 30)  # 2 GiB on read (the index, then NULs), nothing on disk
        return Hostile(str(path), 2 << 30)

    def malformed_input(self, native):
        victim = sorted((native / "files").glob("*ISO*.dng"))[-1]
        data = victim.read_bytes()
        for tag in (256, 257):  # ImageWidth, ImageLength: LONG values inside the IFD entry
            entry = data.index(struct.pack("<HHI", tag, 4, 1))
            data = data[: entry + 8] + struct.pack("<I", 30000) + data[entry + 12 :]
        victim.write_bytes(data)
        return Hostile(str(victim), 30000 * 30000 * 2)

    def edit_input(self, native):
        scene = truth(native)["scenes"]["Bayer/plants"]  # the train split's one scene
        path = native / "files" / sorted(scene["noisy"])[0]
        data = path.read_bytes()
        with rawpy.imread(str(path)) as raw:
            pixels, white = raw.raw_image.copy(), raw.white_level
        start = len(data) - pixels.nbytes  # the pixels end the synthetic DNG: uint16, little-endian
        assert np.array_equal(np.frombuffer(data[start:], "<u2").reshape(pixels.shape), pixels)
        return path, data[:start] + np.minimum(pixels.astype(np.uint32) + 1, white).astype("<u2").tobytes()

    def stream(self, manifest, split, seed, epoch):
        import wdsprep

        return wdsprep.dataset(manifest, split, seed=seed, epoch=epoch).compose(wdsprep.rawnind.tiles())
