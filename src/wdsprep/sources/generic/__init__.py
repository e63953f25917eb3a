"""Source `generic`: a directory of per-sample files, `<split>/<key>.<field>.npy|json`, to shards.

The unpacked form of a webdataset (one file per member); see `convert.py`.
"""
from .convert import SOURCE, GenericSource

__all__ = ["SOURCE", "GenericSource"]
