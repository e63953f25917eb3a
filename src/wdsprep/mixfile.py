"""`wdsprep.mix(...)`, and a mix file: the parts and options of a mix in one TOML file (docs/mixing.md).

The mix itself (`MixDataset`, its rules and states) is `wdsprep.stream.mix`; this module stands above
the sources because a mix file names a part's stage (and `outputs_per_sample`) as a reader function
of a built-in source, `{ name = "<source>.<function>", ...arguments }`, looked up among the functions
the source's `read` module defines and nothing else: a mix file names, it never imports. Relative
locations and key files are relative to the file; options given to `mix` win over the file's; a bad
part or option is one line naming the file.
"""
from __future__ import annotations

import os
import tomllib
from typing import Any, Sequence

from .errors import ConfigError, ManifestError
from .stream.mix import MixDataset, Part


def mix(parts: Sequence[Part | dict] | str | os.PathLike, **options) -> MixDataset:
    """Several datasets as one stream: `parts` (a list of `wdsprep.Part` or dicts with its fields),
    or the path of a mix file (TOML: the options at the top, one `[[part]]` table per part; see
    docs/mixing.md). Options: mode ("weighted" | "epochized"), samples_per_epoch, stop ("first" |
    "all"), schedule (weights that change inside the epoch: [(start, weights), ...], start a sample
    position or a fraction of the epoch, weights one per part or a dict of part names; in a file, one
    `[[phase]]` table per phase with `start` and `weights`), and wdsprep.dataset's seed, epoch, shuffle_shards, shuffle_buffer, equalize, rank,
    world_size, handler, and the read side's settings (prefetch_bytes, max_connections, cache_dir, ...:
    docs/objectstore.md#settings)."""
    if not isinstance(parts, (str, os.PathLike)):
        return MixDataset(parts, **options)
    path = os.fspath(parts)
    parts, file_options = read_mix_file(path)
    try:
        return MixDataset(parts, **{**file_options, **options})
    except (ConfigError, ManifestError) as error:  # name the file the bad part or option is in
        raise type(error)(f"{path}: {error}") from None


FILE_OPTIONS = ("mode", "samples_per_epoch", "stop", "seed", "shuffle_shards", "shuffle_buffer", "equalize")


def read_mix_file(path: str) -> tuple[list[dict], dict]:
    """(the parts, the options) of a mix file; `[[phase]]` tables (start, weights) are the option
    `schedule`. A part's stage is named, never imported from the file: `stage = {name = "minecraft.pairs", history_length = 4}` names a reader stage of a built-in
    source (`wdsprep.<source>.<function>`), and `outputs_per_sample` likewise (`minecraft.pair_counts`)."""
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the mix file ({error.strerror or error})") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML ({error})") from None
    parts = data.pop("part", None)
    if not isinstance(parts, list) or not parts:
        raise ConfigError(f"{path}: a mix file needs one [[part]] table per part")
    phases = data.pop("phase", None)
    unknown = set(data) - set(FILE_OPTIONS)
    if unknown:
        raise ConfigError(f"{path}: unknown option(s) {', '.join(sorted(unknown))} (known: {', '.join(FILE_OPTIONS)}; "
                          "and the tables [[part]], [[phase]])")
    if phases is not None:
        if not isinstance(phases, list) or not all(isinstance(phase, dict) for phase in phases):
            raise ConfigError(f"{path}: a schedule is one [[phase]] table per phase (start, weights)")
        for k, phase in enumerate(phases):
            unknown = set(phase) - {"start", "weights"}
            if unknown:
                raise ConfigError(f"{path}: phase {k}: unknown field(s) {', '.join(sorted(unknown))} (start, weights)")
        data["schedule"] = phases
    base = os.path.dirname(os.path.abspath(path))
    loaded = []
    for index, part in enumerate(parts):
        part = dict(part)
        location = part.get("location")
        if isinstance(location, str) and "://" not in location and not os.path.isabs(location):
            part["location"] = os.path.join(base, location)  # relative to the mix file
        if "stage" in part:
            part["stages"] = (_named_callable(part.pop("stage"), f"{path}: part {index}: stage"),)
        if isinstance(part.get("outputs_per_sample"), dict):
            part["outputs_per_sample"] = _named_callable(part["outputs_per_sample"], f"{path}: part {index}: outputs_per_sample")
        if isinstance(part.get("keys"), str) and not os.path.isabs(part["keys"]):
            part["keys"] = os.path.join(base, part["keys"])
        loaded.append(part)
    return loaded, data


def _named_callable(spec: Any, where: str) -> Any:
    """`{name = "<source>.<function>", ...arguments}`: that reader function of a built-in source's
    namespace (one its `read` module defines: a stage or an output count, never a fetch, a server or
    a synth), called with the arguments. Nothing else is looked up: a mix file names, it never imports."""
    from .sources.registry import NAMESPACES

    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ConfigError(f"{where}: a table with name = \"<source>.<function>\" and its arguments")
    arguments = dict(spec)
    source, _, function = arguments.pop("name").partition(".")
    namespace = None
    if source in NAMESPACES:
        import importlib

        namespace = importlib.import_module(f"wdsprep.{source}")
    value = getattr(namespace, function, None) if namespace is not None and not function.startswith("_") else None
    if not callable(value) or getattr(value, "__module__", None) != f"wdsprep.sources.{source}.read":
        raise ConfigError(f"{where}: {spec['name']!r} is not a reader function of a built-in source "
                          f"(<source>.<function>, source one of {', '.join(NAMESPACES)})")
    try:
        return value(**arguments)
    except TypeError as error:
        raise ConfigError(f"{where}: {spec['name']}: {error}") from None
