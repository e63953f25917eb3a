"""Finds a source package by id. The core knows sources only through this lookup."""
from __future__ import annotations

import importlib

from ..errors import ConfigError

KNOWN = ("voxels", "minecraft", "deepreg", "rawnind", "noisebase", "generic")


def load_source(source_id: str):
    """A built-in source by id, or a plugin given as `package.module:OBJECT`."""
    if ":" in source_id:
        module_name, _, attribute = source_id.partition(":")
        try:
            return getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as error:
            raise ConfigError(f"cannot load source plugin {source_id!r}: {error}") from None
    if source_id not in KNOWN:
        raise ConfigError(f"unknown source {source_id!r} (known: {', '.join(KNOWN)})")
    try:
        module = importlib.import_module(f"wdsprep.sources.{source_id}")
    except ModuleNotFoundError as error:
        if error.name and error.name.startswith(f"wdsprep.sources.{source_id}"):
            raise ConfigError(f"source {source_id!r} is not available in this installation") from None
        raise ConfigError(f"source {source_id!r} needs a package that is not installed: {error.name}") from None
    source = getattr(module, "SOURCE", None)
    if source is None:
        raise ConfigError(f"wdsprep.sources.{source_id} defines no SOURCE")
    return source
