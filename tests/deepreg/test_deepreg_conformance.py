"""deepreg against the source conformance suite (wdsprep.conformance): six paired NIfTI
cases in 5 KB shards (about one case a unit); a moving image truncated; its voxels changed in place;
a moving image as a .nii.gz of 4 GiB of zeros (4 MB on disk); one whose header declares 1 GiB that
the file does not hold. And eight unpaired H5 volumes in one file, format and type detected; a
volume of 1.5 GiB of gzip-compressed zeros; one declaring 4 GiB with no chunk written."""
import gzip

import h5py
import nibabel as nib
import numpy as np
import pytest

from wdsprep.conformance import Hostile, SourceTests

from .deepreg_testdata import write_nifti

CASE = "train/moving_images/case3.nii"


class TestDeepRegConformance(SourceTests):
    source = "deepreg"
    convert_args = ("--shard-bytes", "5KB")
    rebalance_shard_bytes = 5_000  # whole units (pairing needs a case in one shard): each stays one shard

    def make_input(self, directory):
        rng = np.random.default_rng(0)
        for i in range(6):
            for role in ("moving_images", "fixed_images"):
                volume = rng.integers(0, 4, (8, 8, 8)).astype(np.float32)  # compressible: the codec level shows
                write_nifti(directory / "train" / role / f"case{i}.nii", volume)
        return directory

    def stray_entries(self, native):
        return ("validation/", "train/notes.txt", "train/moving_images/case3.mha", "train/fixed_images/.DS_Store")

    def corrupt_input(self, native):
        path = native / CASE
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        return str(path)

    def bomb_input(self, native):
        (native / CASE).unlink()
        path = native / (CASE + ".gz")
        shape = (1024, 1024, 1024)  # float32: 4 GiB
        block = gzip.compress(bytes(16 << 20), compresslevel=9)  # gzip members concatenate into one stream
        with open(path, "wb") as handle:
            handle.write(gzip.compress(_nifti_header(shape)))
            for _ in range(4 * 1024 // 16):
                handle.write(block)
        return Hostile(str(path), 4 << 30)

    def malformed_input(self, native):
        path = native / CASE
        path.write_bytes(_nifti_header((1024, 1024, 256)) + bytes(2048))  # declares 1 GiB of float32, holds 2 KB
        return Hostile(str(path), 1 << 30)

    def edit_input(self, native):
        path = native / CASE
        edited = (np.asarray(nib.load(path).dataobj) + 1).astype(np.float32)
        data = path.read_bytes()
        return path, data[: len(data) - edited.nbytes] + edited.tobytes(order="F")  # the voxels end the file

    def stream(self, manifest, split, seed, epoch):
        import wdsprep

        return wdsprep.dataset(manifest, split, seed=seed, epoch=epoch, equalize=None).compose(
            wdsprep.deepreg.pairs("paired", epoch=epoch, moving_image_shape=(4, 4, 4), fixed_image_shape=(4, 4, 4),
                                  labeled=False))


class TestDeepRegH5Conformance(SourceTests):
    """deepreg on one unpaired `train/images.h5` of eight volumes, format and type detected (the
    H5 reader's errors must name the file too); one volume's checksummed chunk damaged."""

    source = "deepreg"
    convert_args = ("--shard-bytes", "5KB")
    rebalance_shard_bytes = 5_000  # whole units, as above: each stays one indexed shard

    def make_input(self, directory):
        rng = np.random.default_rng(1)
        (directory / "train").mkdir(parents=True)
        with h5py.File(directory / "train" / "images.h5", "w") as handle:
            for i in range(8):  # chunked with fletcher32: a damaged chunk is an error, not other values
                handle.create_dataset(f"case{i}", data=rng.integers(0, 4, (8, 8, 8)).astype(np.float32),
                                      chunks=(8, 8, 8), fletcher32=True)
        return directory

    def stray_entries(self, native):
        return ("train/images.nii.gz", "train/labels/", "README")

    def corrupt_input(self, native):
        path = native / "train" / "images.h5"
        with h5py.File(path, "r") as handle:
            offset = handle["case5"].id.get_chunk_info(0).byte_offset
        data = bytearray(path.read_bytes())
        data[offset + 100] ^= 0x01
        path.write_bytes(bytes(data))
        return str(path)

    def bomb_input(self, native):
        path = native / "train" / "images.h5"
        with h5py.File(path, "a") as handle:
            del handle["case5"]
            volume = handle.create_dataset("case5", shape=(384, 1024, 1024), dtype=np.float32, chunks=(16, 1024, 1024),
                                           compression="gzip", compression_opts=9)
            for start in range(0, 384, 16):
                volume[start:start + 16] = np.full((16, 1024, 1024), 1.0, np.float32)  # not the fill value: written
        return Hostile(str(path), 384 * 1024 * 1024 * 4)

    def malformed_input(self, native):
        path = native / "train" / "images.h5"
        with h5py.File(path, "a") as handle:
            del handle["case5"]
            handle.create_dataset("case5", shape=(1024, 1024, 1024), dtype=np.float32, chunks=(64, 64, 64))  # no chunk written
        return Hostile(str(path), 4 << 30)

    def test_an_equal_size_edit_rebuilds_exactly_the_units_it_changes(self):
        pytest.skip("one H5 file feeds every unit of its split: an edit rebuilds them all (the NIfTI class checks the rule)")


def _nifti_header(shape) -> bytes:
    """A float32 NIfTI-1 header declaring `shape`, with the 4 bytes of (no) extension before the data."""
    image = nib.Nifti1Image(np.zeros((1, 1, 1), np.float32), np.eye(4))
    image.header.set_data_shape(shape)
    image.header["vox_offset"] = 352
    return image.header.binaryblock + bytes(4)
