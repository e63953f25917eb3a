"""Helpers shared by the deepreg tests: write a NIfTI volume, read a converted split back."""
import nibabel as nib
import numpy as np
import webdataset as wds

import wdsprep


def write_nifti(path, array, slope=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    image = nib.Nifti1Image(array, np.diag([0.5, 0.6, 0.7, 1.0]))
    if slope is not None:
        image.header.set_slope_inter(*slope)
    image.to_filename(path)


def samples(output, split):
    urls = wdsprep.urls(str(output / "manifest.json"), split)
    return [wdsprep.decode_sample(s) for s in wds.WebDataset(urls, shardshuffle=False)]
