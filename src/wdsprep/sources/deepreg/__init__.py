"""DeepReg paired / unpaired / grouped 3-D registration data (NIfTI or H5), with DeepReg's sampling.

Convert:  `wdsprep convert deepreg CONFIG.yaml OUT` (DeepReg's `dataset:` section) or
          `wdsprep convert deepreg DIR OUT [--type paired|unpaired|grouped] [--format nifti|h5]`.
Read:     `wds.WebDataset(urls).compose(wdsprep.deepreg.pairs("paired", moving_image_shape=...,
          fixed_image_shape=...)).batched(4, collation_fn=wdsprep.deepreg.collate)`.
The reader and the sampling rules load on first use; the converter does not need them.
"""
from __future__ import annotations

from .. import lazy_exports
from .convert import SOURCE, DeepRegSource, load_datasets

__all__ = [
    "SOURCE",
    "pairs",
    "collate",
    "normalize",
    "resize",
    "to_float32",
    "load_datasets",
    "paired_order",
    "unpaired_order",
    "grouped_sampled",
    "grouped_enumerated",
    "grouped_iterated",
]

__getattr__ = lazy_exports(__name__, {
    **dict.fromkeys(["collate", "normalize", "pairs", "resize", "to_float32"], ".read"),
    **dict.fromkeys(["grouped_enumerated", "grouped_iterated", "grouped_sampled",
                     "paired_order", "unpaired_order"], "._sampling"),
})
