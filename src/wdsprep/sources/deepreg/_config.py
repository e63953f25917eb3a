"""The conversion config: DeepReg's YAML `dataset:` section, or a directory plus options.

DeepReg reads `dataset.<split>.{dir, format, labeled}` and `dataset.type`; the reader-side keys
(`moving_image_shape`, `intra_group_prob`, ...) are kept in the manifest so `pairs()` users can
find them, but they do not change the shards.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from ...errors import ConfigError, InputError
from ..base import MAX_YAML_BYTES, parse_yaml, read_input_bytes

TYPES = ("paired", "unpaired", "grouped")
FORMATS = ("nifti", "h5")
SPLITS = ("train", "valid", "test")
# Keys of the `dataset:` section that only matter when reading (recorded, not used to convert).
READER_KEYS = (
    "moving_image_shape",
    "fixed_image_shape",
    "image_shape",
    "intra_group_prob",
    "intra_group_option",
    "sample_image_in_group",
    "sample_label",
    "seed",
)


@dataclass
class SplitConfig:
    name: str
    dirs: list[str]  # as written in the config: DeepReg sorts NIfTI paths by these strings
    paths: list[str]  # the same directories resolved for reading
    format: str
    labeled: bool | None  # None: decided from the files present


@dataclass
class DatasetConfig:
    type: str
    splits: dict[str, SplitConfig]
    reader: dict = field(default_factory=dict)
    source: str = ""  # the YAML file or directory it came from

    def to_json(self) -> dict:
        return {
            "type": self.type,
            "splits": {
                name: {"dir": s.dirs, "format": s.format, "labeled": s.labeled}
                for name, s in self.splits.items()
            },
            "reader": self.reader,
        }


def read_yaml(path: str):
    """The YAML document in `path` (at most MAX_YAML_BYTES; a key given twice or an alias bomb is
    refused); a syntax error is one ConfigError line naming the file."""
    return parse_yaml(read_input_bytes(path, MAX_YAML_BYTES, "a config"), path, ConfigError)


def _as_bool(value, where: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.lower() in ("true", "yes", "1")
    raise ConfigError(f"{where}: labeled must be true or false, got {value!r}")


def _resolve(directory: str, base: str, where: str) -> str:
    """A relative dir is looked up beside the YAML file first, then in the working directory."""
    if os.path.isabs(directory):
        candidates = [directory]
    else:
        candidates = [os.path.join(base, directory), os.path.abspath(directory)]
    for candidate in candidates:
        if os.path.isdir(candidate):
            return os.path.normpath(candidate)
    raise InputError(f"{where}: data_dir {directory} is not a directory or does not exist")


def parse_section(section: dict, base: str, where: str, overrides: dict | None = None) -> DatasetConfig:
    """One DeepReg `dataset:` section -> DatasetConfig (validates like `load.get_data_loader`)."""
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: the dataset section must be a mapping, got {type(section).__name__}")
    overrides = overrides or {}
    kind = overrides.get("type") or section.get("type")
    if kind not in TYPES:
        raise ConfigError(f"{where}: dataset type must be one of {list(TYPES)}, got {kind!r}")
    splits: dict[str, SplitConfig] = {}
    unknown = [k for k in section if k not in (*SPLITS, "type", "dir", "format", "labeled", *READER_KEYS)]
    if unknown:
        raise ConfigError(f"{where}: split must be one of {list(SPLITS)}, got {unknown[0]!r}")
    for split in SPLITS:
        entry = section.get(split)
        if entry is None:
            continue
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: dataset.{split} must be a mapping with dir/format/labeled")
        dirs = entry.get("dir")
        if dirs in (None, "", []):
            continue  # DeepReg: an empty dir gives no loader for that split
        if isinstance(dirs, str):
            dirs = [dirs]
        if not isinstance(dirs, list) or not all(isinstance(d, str) for d in dirs):
            raise ConfigError(f"{where}: dataset.{split}.dir must be a string or a list of strings, got {dirs!r}")
        if len(set(dirs)) != len(dirs):
            raise InputError(f"{where}: dataset.{split}.dir: dir_paths have repeated elements: {dirs}")
        fmt = overrides.get("format") or entry.get("format")
        if fmt is None:
            fmt = _detect_format([_resolve(d, base, where) for d in dirs])
        fmt = str(fmt).lower()
        if fmt not in FORMATS:
            raise ConfigError(f"{where}: dataset.{split}.format must be nifti or h5, got {fmt!r}")
        labeled = overrides.get("labeled")
        if labeled is None:
            labeled = _as_bool(entry.get("labeled"), f"{where}: dataset.{split}")
        paths = [_resolve(d, base, f"{where}: dataset.{split}") for d in dirs]
        splits[split] = SplitConfig(split, list(dirs), paths, fmt, labeled)
    if not splits:
        raise ConfigError(f"{where}: no split (train/valid/test) names an existing directory")
    reader = {k: section[k] for k in READER_KEYS if k in section}
    return DatasetConfig(kind, splits, reader, where)


def _detect_format(paths: list[str]) -> str:
    for path in paths:
        if any(name.endswith(".h5") for name in os.listdir(path)):
            return "h5"
    return "nifti"


def _detect_type(path: str, fmt: str) -> str:
    """paired if moving_images exist; grouped if every image sits in a group folder / group-X-Y key."""
    names = os.listdir(path)
    if "moving_images" in names or "moving_images.h5" in names:
        return "paired"
    if fmt == "h5" and "images.h5" in names:
        from .native import h5_keys

        keys = h5_keys(os.path.join(path, "images.h5"))
        return "grouped" if keys and all(k.startswith("group-") and k.count("-") == 2 for k in keys) else "unpaired"
    images = os.path.join(path, "images")
    if os.path.isdir(images):
        top = [n for n in os.listdir(images) if os.path.isfile(os.path.join(images, n))]
        subdirs = [n for n in os.listdir(images) if os.path.isdir(os.path.join(images, n))]
        return "grouped" if subdirs and not top else "unpaired"
    raise InputError(f"{path}: neither moving_images/ nor images/ found; cannot tell the dataset type")


def check_options(options: dict) -> None:
    """`--type`, `--format` and `--labeled`, checked before any work (see wdsprep.options)."""
    for name, option, allowed in (("deepreg_type", "--type", TYPES), ("deepreg_format", "--format", FORMATS)):
        if options.get(name) is not None and options[name] not in allowed:
            raise ConfigError(f"{option} must be one of {', '.join(allowed)} (got {options[name]!r})")
    _as_bool(options.get("deepreg_labeled"), "--labeled")


def load_config(input: str, options: dict) -> DatasetConfig:
    """INPUT is a DeepReg YAML (with a `dataset:` section, or the section itself) or a directory.

    A directory holds `train/`, `valid/`, `test/` split folders (at least one); type, format and
    labeled come from the options or are detected from the files.
    """
    overrides = {
        "type": options.get("deepreg_type"),
        "format": options.get("deepreg_format"),
        "labeled": options.get("deepreg_labeled"),
    }
    if isinstance(overrides["labeled"], str):
        overrides["labeled"] = _as_bool(overrides["labeled"], "--labeled")
    if os.path.isfile(input):
        document = read_yaml(input)
        if not isinstance(document, dict):
            raise ConfigError(f"{input}: expected a mapping with a `dataset:` section")
        section = document.get("dataset", document)
        return parse_section(section, os.path.dirname(os.path.abspath(input)), input, overrides)
    if not os.path.isdir(input):
        raise InputError(f"{input}: no such file or directory")
    present = [s for s in SPLITS if os.path.isdir(os.path.join(input, s))]
    if not present:
        raise InputError(f"{input}: expected train/, valid/ or test/ split folders (or a DeepReg YAML file)")
    fmt = overrides["format"] or _detect_format([os.path.join(input, s) for s in present])
    kind = overrides["type"] or _detect_type(os.path.join(input, present[0]), fmt)
    section = {"type": kind}
    for split in present:
        section[split] = {"dir": split, "format": fmt, "labeled": overrides["labeled"]}
    return parse_section(section, os.path.abspath(input), input, {**overrides, "type": kind, "format": fmt})
