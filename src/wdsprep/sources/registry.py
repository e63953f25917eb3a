"""Finds a source by id: the one list of built-in sources, plugins, and the gate that keeps data
from choosing code.

A built-in source `<id>` is the object `SOURCE` of `wdsprep.sources.<id>.convert` (the same file in
every source package, see README "Adding a source"). Only that module is imported, so a
conversion worker never loads a source's readers (and torch). A plugin is a `Source` instance
named `package.module:OBJECT`, or the name of an installed entry point in the group
`wdsprep.sources` (`ENTRY_POINT_GROUP`) whose value is such an object.

Two ways in, one per kind of caller:

    load_source(id)              the USER named the source (convert, synth, pipeline, a source's
                                 own commands, `mounted_commands`, conversion workers): a plugin
                                 spec is imported
    manifest_source(id, plugins) DATA named it (a manifest's `source`, read by `wdsprep show`):
                                 loaded only when it is built in, an installed entry point (by name
                                 or by its `module:OBJECT`), registered (`register_source`), or in
                                 `plugins` (the command line's `--plugin`); anything else is a
                                 `ConfigError` saying how to allow it, and nothing is imported

So opening data never runs code the data names: a manifest that says `"source": "evil:SOURCE"`
imports nothing, wherever `evil.py` lies (the current directory, which `python -m` puts on
`sys.path`, included).
"""
from __future__ import annotations

import importlib
import re
from dataclasses import replace
from typing import TYPE_CHECKING, Iterable

from ..command import Command
from ..errors import ConfigError

if TYPE_CHECKING:  # imported where they are used: `import wdsprep` reads the list of ids alone
    from importlib import metadata

    from .base import Source

BUILTIN = ("voxels", "minecraft", "deepreg", "rawnind", "noisebase", "generic")
# the built-in ids with a public namespace `wdsprep.<id>`; `generic` backs tests and benchmarks
NAMESPACES = tuple(source_id for source_id in BUILTIN if source_id != "generic")
ENTRY_POINT_GROUP = "wdsprep.sources"

# what register_source allowed: id -> the Source to use, or None (import the `module:OBJECT` id)
_registered: dict[str, Source | None] = {}


_PLUGIN = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


def is_plugin(source_id: str) -> bool:
    """Whether `source_id` is a plugin's name, `package.module:OBJECT` (a URL is not)."""
    return _PLUGIN.fullmatch(source_id) is not None


def load_source(source_id: str) -> Source:
    """The source the user named: a built-in id, a plugin `package.module:OBJECT` (a `Source`
    instance), or the name of an installed `wdsprep.sources` entry point."""
    if is_plugin(source_id):
        return _import_plugin(source_id)
    if source_id in BUILTIN:
        return _load_builtin(source_id)
    entry = _entry_point(source_id)
    if entry is None:
        raise ConfigError(f"unknown source {source_id!r} (known: {', '.join(BUILTIN)}, "
                          f"a '{ENTRY_POINT_GROUP}' entry point, or package.module:OBJECT)")
    return _load_entry_point(entry)


def describe() -> str:
    """How a command line may name a source (the help of every command that takes one)."""
    return f"{', '.join(BUILTIN)}, an installed '{ENTRY_POINT_GROUP}' entry point, or a plugin package.module:OBJECT"


def mounted_commands(name: str | None = None) -> list[Command]:
    """The commands the built-in sources mount (`Source.commands()`), and those of the plugin the
    user named as `name`, mounted under that name (`VERB package.module:OBJECT`). A built-in source
    this installation lacks mounts nothing; a named plugin that does not load is a ConfigError."""
    ids = list(BUILTIN) + ([name] if name and is_plugin(name) else [])
    mounted = []
    for source_id in ids:
        try:
            commands = load_source(source_id).commands()
        except ConfigError:
            if source_id == name:
                raise
            continue  # a built-in source this installation lacks: its commands are absent too
        mounted += [replace(command, name=f"{command.verb} {name}") if source_id == name else command for command in commands]
    return mounted


def register_source(name: str, source: Source | None = None) -> None:
    """Let manifests that name `name` be drawn with it (`wdsprep show` and `build_report`): with a
    `source`, that object is used; without, `name` is a `package.module:OBJECT` imported when a
    manifest names it. The Python form of `wdsprep show --plugin NAME`, for the whole process."""
    if source is None and not is_plugin(name):
        raise ConfigError(f"register_source({name!r}): give a Source, or a name of the form package.module:OBJECT")
    from .base import Source

    if source is not None and not isinstance(source, Source):
        raise ConfigError(f"register_source({name!r}, ...): {type(source).__name__} is not a wdsprep.sources.base.Source")
    _registered[name] = source


def manifest_source(source_id: str, plugins: Iterable[str] = ()) -> Source:
    """The source a manifest names, loaded only when allowed (see the module docstring); else a
    `ConfigError` that says which plugin was not loaded and how to allow it."""
    if source_id in BUILTIN:
        return _load_builtin(source_id)
    if source_id in _registered:
        return _registered[source_id] or _import_plugin(source_id)
    if source_id in set(plugins):
        return load_source(source_id)
    entry = _entry_point(source_id)
    if entry is not None:
        return _load_entry_point(entry)
    raise ConfigError(
        f"the manifest names source {source_id!r}, which is not built in, registered or an installed "
        f"'{ENTRY_POINT_GROUP}' entry point, so it was not loaded (data never chooses the code wdsprep runs); "
        f"to use it: --plugin {source_id} (or wdsprep.register_source({source_id!r}))")


def _import_plugin(source_id: str) -> Source:
    module_name, _, attribute = source_id.partition(":")
    try:
        source = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ConfigError(f"cannot load source plugin {source_id!r}: {error}") from None
    return _checked(source, source_id)


def _load_builtin(source_id: str) -> Source:
    module_name = f"wdsprep.sources.{source_id}.convert"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name and error.name.startswith(f"wdsprep.sources.{source_id}"):
            raise ConfigError(f"source {source_id!r} is not available in this installation") from None
        raise ConfigError(f"source {source_id!r} needs a package that is not installed: {error.name}") from None
    return _checked(module.__dict__.get("SOURCE"), f"{module_name}:SOURCE")


def _entry_point(source_id: str) -> metadata.EntryPoint | None:
    """The installed `wdsprep.sources` entry point named `source_id` or whose value it is."""
    from importlib import metadata

    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if source_id in (entry.name, entry.value):
            return entry
    return None


def _load_entry_point(entry: metadata.EntryPoint) -> Source:
    try:
        source = entry.load()
    except (ImportError, AttributeError) as error:
        raise ConfigError(f"cannot load source plugin {entry.name!r} ({entry.value}, entry point): {error}") from None
    return _checked(source, entry.value)


def _checked(source, where: str) -> Source:
    from .base import Source

    if not isinstance(source, Source):
        raise ConfigError(f"{where} is {type(source).__name__}, not an instance of a wdsprep.sources.base.Source subclass")
    return source
