"""DeepReg paired / unpaired / grouped 3-D registration data (NIfTI or H5), with DeepReg's sampling.

Convert:  `wdsprep convert deepreg CONFIG.yaml OUT` (DeepReg's `dataset:` section) or
          `wdsprep convert deepreg DIR OUT [--type paired|unpaired|grouped] [--format nifti|h5]`.
Read:     `wds.WebDataset(urls).compose(wdsprep.deepreg.pairs("paired", moving_image_shape=...,
          fixed_image_shape=...)).batched(4, collation_fn=wdsprep.deepreg.collate)`.
"""
from .convert import DeepRegSource, load_datasets
from .read import collate, normalize, pairs, resize, to_float32
from ._sampling import (
    DeepRegSamplingError,
    grouped_enumerated,
    grouped_iterated,
    grouped_sampled,
    paired_order,
    unpaired_order,
)

SOURCE = DeepRegSource()

__all__ = [
    "SOURCE",
    "pairs",
    "collate",
    "normalize",
    "resize",
    "to_float32",
    "load_datasets",
    "DeepRegSamplingError",
    "paired_order",
    "unpaired_order",
    "grouped_sampled",
    "grouped_enumerated",
    "grouped_iterated",
]
