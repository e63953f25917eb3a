"""wdsprep: research datasets to deterministic WebDataset shards, streamed into PyTorch.

Public API: `urls`, `dataset`, `mix`, `Part`, `MapDataset`, `decode`, `decode_sample`, `zst_handler`, `unpack`
and `unpack_rows` (plain readers of packed shards: webdataset, Hugging Face datasets), `Loader`,
`index` (adopt existing WebDataset tars where they are: `wdsprep index`'s Python form), every
exception of `wdsprep.errors`, and one
namespace per source (`wdsprep.voxels`, `wdsprep.minecraft`, `wdsprep.deepreg`, `wdsprep.rawnind`,
`wdsprep.noisebase`), imported on first use. For tools that drive a conversion themselves (not in
`__all__`): `wdsprep.Conversion`, the step-by-step driver, and `wdsprep.ConvertOptions`, its options;
`wdsprep.ReadOptions`, the read side's settings (`read_options=` of `dataset`, `mix`, `MapDataset`);
and `wdsprep.register_source`, which lets manifests naming a plugin source be drawn with it
(a manifest alone never makes wdsprep import code).

`import wdsprep` itself is light (the exceptions, the version, the list of sources): every name
above is imported on first use, and the registrations with webdataset (its URL schemes, its `.zst`
decoder) run when webdataset is imported (`importhooks`). So the `wdsprep` command (`__main__.py`)
takes over Ctrl-C before its heavy imports begin.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

from .errors import (
    ConfigError,
    ConversionError,
    DeepRegSamplingError,
    DownloadError,
    FetchError,
    FormatError,
    InputError,
    ManifestError,
    OutputError,
    ShardError,
    UnitFailedError,
    UploadError,
    WdsprepError,
)
from ._version import __version__  # noqa: F401 (wdsprep.__version__)
from .importhooks import when_imported
from .sources.registry import NAMESPACES as SOURCE_IDS  # the one list of built-in sources


def _register_schemes() -> None:
    from .storage.gopen import register_webdataset_schemes

    register_webdataset_schemes()


def _register_decoder() -> None:
    from .shards.interop import register_webdataset_decoder

    register_webdataset_decoder()


when_imported("webdataset.gopen", _register_schemes)  # plain `wds.WebDataset("s3://...")` works after `import wdsprep`
when_imported("webdataset.autodecode", _register_decoder)  # plain `wds.WebDataset(urls).decode()` decodes `.npy.zst` too


__all__ = [
    "urls",
    "dataset",
    "mix",
    "Part",
    "MapDataset",
    "decode",
    "decode_sample",
    "zst_handler",
    "unpack",
    "unpack_rows",
    "Loader",
    "index",
    "WdsprepError",
    "InputError",
    "OutputError",
    "ConversionError",
    "UnitFailedError",
    "FormatError",
    "ShardError",
    "ManifestError",
    "ConfigError",
    "UploadError",
    "FetchError",
    "DownloadError",
    "DeepRegSamplingError",
    *SOURCE_IDS,
]

# Each lazy name is taken from the module that defines it, never through a package attribute: a
# package attribute can be rebound by a later submodule import (`wdsprep.stream.dataset` the
# function vs. the module of the same name).
_LAZY = {
    "urls": ("wdsprep.stream.manifests", "urls"),
    "dataset": ("wdsprep.stream.dataset", "dataset"),
    "Loader": ("wdsprep.stream.loader", "Loader"),
    "mix": ("wdsprep.mixfile", "mix"),
    "Part": ("wdsprep.stream.mix", "Part"),
    "MapDataset": ("wdsprep.stream.mapdataset", "MapDataset"),
    "index": ("wdsprep.adopt", "adopt"),
    "decode": ("wdsprep.stream.decode", "decode"),
    "decode_sample": ("wdsprep.shards.codec", "decode_sample"),
    "zst_handler": ("wdsprep.shards.interop", "zst_handler"),
    "unpack": ("wdsprep.shards.packed", "unpack"),
    "unpack_rows": ("wdsprep.shards.packed", "unpack_rows"),
    # the conversion driver, for code that runs a conversion step by step (handed to rawnind's fetch --convert):
    # public for such tools, outside `__all__` (what `from wdsprep import *` gives is the training side)
    "Conversion": ("wdsprep.conversion", "Conversion"),
    "ConvertOptions": ("wdsprep.options", "ConvertOptions"),
    # the read side's settings, for `read_options=` of dataset, mix and MapDataset: outside `__all__` too
    "ReadOptions": ("wdsprep.readoptions", "ReadOptions"),
    # plugin sources that manifests may name (wdsprep show): outside `__all__` as well
    "register_source": ("wdsprep.sources.registry", "register_source"),
}


class _SourceAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes `wdsprep.<source>` an alias of `wdsprep.sources.<source>`, also for `from ... import`."""

    def find_spec(self, fullname, path=None, target=None):
        prefix, _, name = fullname.partition(".")
        if prefix == "wdsprep" and name in SOURCE_IDS:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        module = importlib.import_module(f"wdsprep.sources.{spec.name.split('.', 1)[1]}")
        self._original_spec = module.__spec__
        return module

    def exec_module(self, module):
        module.__spec__ = self._original_spec  # the import system stamped the alias spec on it


if not any(isinstance(finder, _SourceAlias) for finder in sys.meta_path):
    sys.meta_path.append(_SourceAlias())

_SUBMODULES = ("stream", "shards", "sources", "storage", "conversion", "options", "sizes", "executors", "cli", "upload", "progress")


def __getattr__(name: str):
    if name in SOURCE_IDS:
        module = importlib.import_module(f"wdsprep.sources.{name}")
        globals()[name] = module
        return module
    if name in _LAZY:
        module_name, attribute = _LAZY[name]
        value = getattr(importlib.import_module(module_name), attribute)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"wdsprep.{name}")
    raise AttributeError(f"module 'wdsprep' has no attribute {name!r}")
