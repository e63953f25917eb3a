"""deepreg against the source conformance suite (wdsprep.testing.conformance): six paired NIfTI
cases in 5 KB shards (about one case a unit); a moving image truncated; its voxels changed in place."""
import nibabel as nib
import numpy as np

from wdsprep.testing.conformance import SourceTests

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

    def corrupt_input(self, native):
        path = native / CASE
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        return str(path)

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
