"""Finds a source by id: the one list of built-in sources, and plugins named `package.module:OBJECT`.

A built-in source `<id>` is the object `SOURCE` of `wdsprep.sources.<id>.convert` (the same file in
every source package, see README "Adding a source"). Only that module is imported, so a
conversion worker never loads a source's readers (and torch). Every command that takes a source
(convert, synth, pipeline, and the sources' own commands) accepts a plugin spec as well.
"""
from __future__ import annotations

import importlib

from ..errors import ConfigError
from .base import Source

BUILTIN = ("voxels", "minecraft", "deepreg", "rawnind", "noisebase", "generic")
# the built-in ids with a public namespace `wdsprep.<id>`; `generic` backs tests and benchmarks
NAMESPACES = tuple(source_id for source_id in BUILTIN if source_id != "generic")


def is_plugin(source_id: str) -> bool:
    return ":" in source_id


def load_source(source_id: str) -> Source:
    """A built-in source by id, or a plugin given as `package.module:OBJECT` (a `Source` instance)."""
    if is_plugin(source_id):
        module_name, _, attribute = source_id.partition(":")
        try:
            source = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as error:
            raise ConfigError(f"cannot load source plugin {source_id!r}: {error}") from None
        where = source_id
    else:
        if source_id not in BUILTIN:
            raise ConfigError(f"unknown source {source_id!r} (known: {', '.join(BUILTIN)}, or package.module:OBJECT)")
        module_name = f"wdsprep.sources.{source_id}.convert"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name and error.name.startswith(f"wdsprep.sources.{source_id}"):
                raise ConfigError(f"source {source_id!r} is not available in this installation") from None
            raise ConfigError(f"source {source_id!r} needs a package that is not installed: {error.name}") from None
        source, where = module.__dict__.get("SOURCE"), f"{module_name}:SOURCE"
    if not isinstance(source, Source):
        raise ConfigError(f"{where} is {type(source).__name__}, not an instance of a wdsprep.sources.base.Source subclass")
    return source
