"""DeepReg native data -> shard samples (plan / build / finalize).

One shard sample per pair (paired), per image (unpaired) or per group (grouped). Volumes keep the
files' values (NIfTI scaling kept aside in `meta`), and `meta` carries what is needed to rebuild
DeepReg's integer indices: the data index, obs name, dir, group index and in-group order, plus the
NIfTI affine and zooms.

Layout `deepreg/2`: every sample of a split has the same members, dtypes and ranks, so Arrow
readers (HF datasets, Ray Data) take a split as one table:
- a role's volumes have one dtype per split: the files' own when they agree, else the smallest
  dtype that holds all of them (`np.result_type`, value-preserving; the field table says so);
- labels are always 4-D `(X, Y, Z, C)`: a single 3-D label is stored with C = 1 (DeepReg squeezes
  a trailing 1, and so does the reader);
- a group is two members, `images` and `labels`: the group's volumes stacked along a new first
  axis when every volume of that role in the split has one shape, else (`ragged`) each volume
  raveled in C order and concatenated, its shape in `meta.volumes[i].<role>.shape`;
- every NIfTI volume's meta has `scale` ([1.0, 0.0] when the file has none).
The older layout (one `image_<i>`/`label_<i>` member per group position, 3-D single labels) still reads.
"""
from __future__ import annotations

import argparse
import os
import re
from typing import Iterator

import numpy as np

from ...errors import ConfigError, InputError
from ...shards.manifest import FieldRecorder
from ..base import Plan, PlanContext, Source, Unit, UnitContext, group_by_size
from . import native
from ._config import SPLITS, DatasetConfig, check_options, load_config, parse_section, read_yaml

LAYOUT = "deepreg/2"
CONFIG_NAME = "deepreg.yaml"
MEMBER_OVERHEAD = 4096  # tar header + padding + zstd frame + msgpack meta share, per member  # a directory holding this file is converted from it
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
ROLES = {
    "paired": (("moving_images", "moving_image"), ("fixed_images", "fixed_image")),
    "unpaired": (("images", "image"),),
    "grouped": (("images", "image"),),
}
LABEL_ROLES = {
    "paired": (("moving_labels", "moving_label"), ("fixed_labels", "fixed_label")),
    "unpaired": (("labels", "label"),),
    "grouped": (("labels", "label"),),
}


def safe_name(text: str, limit: int = 48) -> str:
    return _UNSAFE.sub("_", text).strip("_")[:limit] or "x"


def load_datasets(input: str, options: dict) -> list[tuple[str, DatasetConfig]]:
    """[(dataset name or "", config)]: a YAML with `dataset:` or `datasets: {name: section}`, or a dir."""
    path = input
    if os.path.isdir(input) and os.path.isfile(os.path.join(input, CONFIG_NAME)):
        path = os.path.join(input, CONFIG_NAME)
    if os.path.isfile(path):
        document = read_yaml(path)
        if isinstance(document, dict) and isinstance(document.get("datasets"), dict):
            base = os.path.dirname(os.path.abspath(path))
            result = []
            for name, section in document["datasets"].items():
                if not re.fullmatch(r"[A-Za-z0-9]+(?:_[A-Za-z0-9]+)*", str(name)):
                    raise ConfigError(f"{path}: dataset name {name!r} must be letters, digits and single underscores")
                result.append((str(name), parse_section(section, base, f"{path}: datasets.{name}")))
            return result
    return [("", load_config(path, options))]


def _relative(ref: native.VolumeRef, split) -> str:
    """The file as `<dir as written>/<path inside it>` (+ `:key` for H5): no machine-specific paths."""
    for dir_string, base in zip(split.dirs, split.paths):
        if os.path.commonpath([base, ref.path]) == base:
            inner = os.path.relpath(ref.path, base).replace(os.sep, "/")
            text = f"{dir_string.rstrip('/')}/{inner}"
            return f"{text}:{ref.key}" if ref.key is not None else text
    return ref.describe()


def _estimated_bytes(ref: native.VolumeRef, info: native.VolumeInfo) -> int:
    """Bytes a volume will take in a shard: raw size, or for gzip files a bound from their size
    (zstd does about as well as gzip on these volumes)."""
    if ref.key is None and ref.path.endswith(".gz"):
        return min(info.nbytes, 3 * os.path.getsize(ref.path))
    return info.nbytes


def _split_items(kind: str, split, out_split: str, dataset: str, ignore) -> tuple[list[dict], list[int], dict]:
    """The items (one per shard sample) of a split, their raw sizes, and the split's table."""
    observations = native.scan_split(split, kind, ignore)
    roles = list(ROLES[kind]) + (list(LABEL_ROLES[kind]) if split.labeled else [])
    label_counts: dict[str, int] = {}  # role -> C seen first (unpaired/grouped: one C per split)
    first_label_file: dict[str, str] = {}
    described = []
    role_infos: dict[str, list] = {}
    for obs in observations:
        volumes, size, counts = {}, 0, {}
        infos = {}
        for folder, role in roles:
            ref = obs.refs[folder]
            info = native.volume_info(ref)
            infos[role] = (ref, info)
            role_infos.setdefault(role, []).append(info)
            if role.endswith("image"):
                native.check_image_shape(ref, info, role.replace("_", " "))
            else:
                counts[role] = native.check_label_shape(ref, info, role.replace("_", " "))
            volumes[role] = {"path": ref.path, "key": ref.key, "rel": _relative(ref, split)}
            size += _estimated_bytes(ref, info)
        if split.labeled:
            for image_role in [r for _, r in ROLES[kind]]:
                label_role = image_role.replace("image", "label")
                native.warn_shape_mismatch(*infos[image_role], *infos[label_role])
        if kind == "paired" and split.labeled and counts["moving_label"] != counts["fixed_label"]:
            moving, fixed = infos["moving_label"][0], infos["fixed_label"][0]
            raise InputError(f"{moving.describe()} vs {fixed.describe()}: moving and fixed labels have different "
                             f"numbers of labels. moving: {counts['moving_label']}, fixed: {counts['fixed_label']}")
        if kind != "paired" and split.labeled:
            ref = infos["label"][0]
            if "label" not in label_counts:
                label_counts["label"], first_label_file["label"] = counts["label"], ref.describe()
            elif counts["label"] != label_counts["label"]:
                raise InputError(f"{ref.describe()}: has {counts['label']} labels but {first_label_file['label']} has "
                                 f"{label_counts['label']}; any two images may be paired, and DeepReg needs moving "
                                 f"and fixed images to have the same number of labels")
        described.append((obs, volumes, size, counts.get("moving_label", counts.get("label", 0))))

    table = {
        "dataset": dataset,
        "split": split.name,
        "type": kind,
        "format": split.format,
        "labeled": bool(split.labeled),
        "dirs": split.dirs,
        "obs": [[obs.index, obs.dir, obs.name] for obs, *_ in described],
    }
    common = {"dataset": dataset, "split": split.name, "type": kind, "format": split.format,
              "stored": {role: stored_as(role, infos) for role, infos in sorted(role_infos.items())}}
    table["stored"] = common["stored"]
    if kind != "grouped":
        items = [
            dict(common, key=f"{obs.index:05d}_{safe_name(obs.name)}", index=obs.index, name=obs.name, dir=obs.dir,
                 volumes=volumes, num_labels=count)
            for obs, volumes, size, count in described
        ]
        table["num_samples"] = len(items) if kind == "paired" else len(items) // 2
        return items, [size for _, _, size, _ in described], table

    structure = native.group_structure([obs for obs, *_ in described])
    by_index = {obs.index: (obs, volumes, size, count) for obs, volumes, size, count in described}
    items, sizes = [], []
    for group_index, ((dir_string, group), data_indices) in enumerate(structure):
        members = [by_index[i] for i in data_indices]
        items.append(dict(
            common,
            key=f"g{group_index:04d}_{safe_name(group or 'root')}",
            group_index=group_index,
            group=group,
            dir=dir_string,
            names=[obs.name for obs, *_ in members],
            data_indices=list(data_indices),
            volumes=[volumes for _, volumes, _, _ in members],
            num_labels=members[0][3],
            num_groups=len(structure),
        ))
        sizes.append(sum(size for _, _, size, _ in members))
    table["group_struct"] = [indices for _, indices in structure]
    table["groups"] = [[d, g] for (d, g), _ in structure]
    table["num_groups"] = len(structure)
    return items, sizes, table


def _stored_shape(role: str, shape: tuple) -> tuple:
    return (*shape, 1) if role.endswith("label") and len(shape) == 3 else tuple(shape)


def stored_as(role: str, infos: list) -> dict:
    """How a role's volumes are stored in a split: one dtype (the files' own, or the smallest one
    holding every file's values), the files' dtypes, and whether all have one shape (`stack`)."""
    dtypes = sorted({np.dtype(info.dtype).newbyteorder("=").str for info in infos})
    shapes = {_stored_shape(role, info.shape) for info in infos}
    return {"dtype": np.result_type(*dtypes).str, "file_dtypes": dtypes, "stack": len(shapes) == 1}


def _even_groups(items: list, sizes: list[int], target: int) -> list[list]:
    """Like group_by_size, but every group except the last holds an even number of images, so
    pairing within a shard drops at most one image per split (DeepReg drops one when N is odd)."""
    groups = group_by_size(items, sizes, target)
    result: list[list] = []
    carry: list = []
    for position, group in enumerate(groups):
        group = carry + group
        carry = []
        if len(group) % 2 and position < len(groups) - 1:
            carry = [group.pop()]
        if group:
            result.append(group)
    return result


def _at_least_two(units: list[list]) -> list[list]:
    """Grouped units hold two groups or more (when the split has two), so that inter-group pairs
    can be drawn within every shard."""
    result: list[list] = []
    for unit in units:
        if result and len(result[-1]) < 2:
            result[-1] = result[-1] + unit
        else:
            result.append(list(unit))
    if len(result) > 1 and len(result[-1]) < 2:
        last = result.pop()
        result[-1] = result[-1] + last
    return result


def _member_count(item: dict) -> int:
    volumes = item["volumes"]
    return 1 + (sum(len(v) for v in volumes) if isinstance(volumes, list) else len(volumes))


def _item_files(item: dict) -> list[str]:
    """The files one item reads (an H5 file once however many of its datasets the item uses)."""
    volume_sets = item["volumes"] if isinstance(item["volumes"], list) else [item["volumes"]]
    paths = [volumes[role]["path"] for volumes in volume_sets for role in sorted(volumes)]
    return list(dict.fromkeys(paths))


class DeepRegSource(Source):
    """The `deepreg` source: DeepReg paired / unpaired / grouped datasets, NIfTI or H5."""

    id = "deepreg"
    show_with = "wdsprep.sources.deepreg.show:show"  # `wdsprep show` draws the reader's sample (show.py)
    # pairs are drawn within a shard (a block), so a unit must never roll over into a second shard:
    # `_even_groups` / `_at_least_two` may plan a unit above the target size
    whole_units = True
    fingerprint = "stat"  # 3-D volumes are large: content hashing would read the input twice
    # the sample table's fields (selections): whether a sample holds labels (computed), how many
    index_fields = ("has_label", "meta.num_labels")

    def index_values(self, key: str, sample: dict) -> dict:
        return {"has_label": any(name.endswith(("label", "labels")) for name in sample)}

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--type", dest="deepreg_type", choices=["paired", "unpaired", "grouped"],
                            help="dataset type when INPUT is a directory (default: detected)")
        parser.add_argument("--format", dest="deepreg_format", choices=["nifti", "h5"],
                            help="file format when INPUT is a directory (default: detected)")
        parser.add_argument("--labeled", dest="deepreg_labeled", choices=["true", "false"],
                            help="whether labels are converted (default: the YAML's value, else when present)")

    def check_options(self, options: dict) -> None:
        check_options(options)

    def plan(self, input: str, ctx: PlanContext) -> Plan:
        options = ctx.options
        datasets = load_datasets(input, options)
        if os.path.isdir(input) and not os.path.isfile(os.path.join(input, CONFIG_NAME)):
            for name in sorted(os.listdir(input)):  # a directory input: its split folders only
                if name not in SPLITS:
                    path = os.path.join(input, name)
                    ctx.ignore(path + "/" * os.path.isdir(path), f"not one of the split folders {', '.join(SPLITS)}")
        units: list[Unit] = []
        tables: dict = {"splits": {}}
        total = 0
        for dataset, config in datasets:
            for split_name, split in config.splits.items():
                out_split = f"{dataset}_{split_name}" if dataset else split_name
                items, sizes, table = _split_items(config.type, split, out_split, dataset, ctx.ignore)
                table["reader"] = config.reader
                tables["splits"][out_split] = table
                # raw bytes + headers bound the written size, so a unit is near the target size
                # (`whole_units` keeps it one shard even when pairing rules push it over)
                sizes = [size + MEMBER_OVERHEAD * _member_count(item) for item, size in zip(items, sizes)]
                size_of = {item["key"]: size for item, size in zip(items, sizes)}
                if config.type == "unpaired":
                    groups = _even_groups(items, sizes, ctx.core.shard_bytes)
                elif config.type == "grouped":
                    groups = _at_least_two(group_by_size(items, sizes, ctx.core.shard_bytes))
                else:
                    groups = group_by_size(items, sizes, ctx.core.shard_bytes)
                for index, group in enumerate(groups):
                    for position, item in enumerate(group):  # the reader pairs within this block
                        item["block"] = [index, position, len(group)]
                    unit_bytes = sum(size_of[item["key"]] for item in group)
                    units.append(Unit(out_split, index, group, unit_bytes))
                    total += unit_bytes
        config_json = {"layout": LAYOUT, "datasets": {name or "": config.to_json() for name, config in datasets}}
        return Plan(units, config_json, total, tables)

    def inputs(self, item: dict) -> list[str]:
        return _item_files(item)

    def build(self, unit: Unit, ctx: UnitContext) -> Iterator[tuple[str, dict]]:
        handles: dict = {}
        recorder = FieldRecorder(ctx.options)
        try:
            for item in unit.items:
                try:
                    sample = _build_item(item, handles)
                except InputError as error:
                    ctx.skip_or_raise(item["key"], error)
                    continue
                recorder.add(unit.split, sample)
                yield item["key"], sample
        finally:
            for handle in handles.values():
                handle.close()
        recorder.report(ctx)

    def finalize(self, plan: Plan, unit_tables) -> dict:
        splits = plan.tables["splits"]
        return {"fields": {split: declare_fields(table, splits[split]) for split, table
                           in FieldRecorder.split_tables(unit_tables).items()}}

    def synth(self, directory: str, seed: int, size: str) -> None:
        from .synth import synth

        synth(directory, seed, size)


def _read(volume: dict, handles: dict, is_label: bool, stored: dict):
    ref = native.VolumeRef(volume["path"], volume["key"])
    array, meta = native.read_volume(ref, handles)
    meta["file"] = volume["rel"]
    if is_label:
        native.check_label_values(array, ref, meta)
        if array.ndim == 3:
            array = array[..., None]  # (X, Y, Z, 1): every label of a split has the same rank
    else:
        if array.ndim != 3 or 0 in array.shape:
            raise InputError(f"{ref.describe()}: image has shape {array.shape}; DeepReg: image shape should be 3D "
                             f"and non-empty")
    if array.dtype.str != stored["dtype"]:
        array = array.astype(stored["dtype"])  # value-preserving (np.result_type of the split's dtypes)
    if ref.key is None:
        meta.setdefault("scale", [1.0, 0.0])  # every NIfTI volume's meta has the same keys
    return array, meta


def _build_item(item: dict, handles: dict) -> dict:
    meta = {k: item[k] for k in ("dataset", "split", "type", "format", "dir", "num_labels")}
    block_id, position, size = item["block"]
    meta["block"] = {"id": block_id, "position": position, "size": size}
    stored = item["stored"]
    fields: dict = {}
    if item["type"] == "grouped":
        meta.update(group_index=item["group_index"], group=item["group"], names=item["names"],
                    num_groups=item["num_groups"],
                    data_indices=item["data_indices"], volumes=[])
        arrays: dict[str, list] = {}
        for volumes in item["volumes"]:
            entry = {}
            for role, volume in sorted(volumes.items()):
                array, volume_meta = _read(volume, handles, role == "label", stored[role])
                volume_meta["shape"] = list(array.shape)
                arrays.setdefault(role, []).append(array)
                entry[role] = volume_meta
            meta["volumes"].append(entry)
        for role, group in arrays.items():
            fields[role + "s"] = np.stack(group) if stored[role]["stack"] else np.concatenate([a.ravel() for a in group])
    else:
        meta.update(index=item["index"], name=item["name"], volumes={})
        for role, volume in sorted(item["volumes"].items()):
            array, volume_meta = _read(volume, handles, role.endswith("label"), stored[role])
            fields[role] = array
            meta["volumes"][role] = volume_meta
    fields["meta"] = meta
    return fields


LABEL_NOTE = "(X, Y, Z, C), one channel per label: a single 3-D label has C = 1"


def declare_fields(table: dict, split_table: dict) -> dict:
    """A split's observed field table plus what a reader must know: the label rank rule, dtypes
    promoted from several file dtypes, and how a group's volumes share one member."""
    stored = split_table["stored"]
    declared = {}
    for member, entry in table.items():
        entry = dict(entry)
        field = member.split(".", 1)[0]
        role = field[:-1] if split_table["type"] == "grouped" and field in ("images", "labels") else field
        if role in stored:
            if len(stored[role]["file_dtypes"]) > 1:
                entry["promoted_from"] = stored[role]["file_dtypes"]
            if role.endswith("label"):
                entry["note"] = LABEL_NOTE
            if role != field:
                entry["encoding"] = {"name": "stack", "axis": 0, "count": {"member": "meta.mp", "key": "names"}} \
                    if stored[role]["stack"] else \
                    {"name": "ragged", "order": "C", "shape": {"member": "meta.mp", "key": f"volumes[i].{role}.shape"},
                     "undo": "np.split(flat, np.cumsum(sizes)[:-1]) reshaped to each volume's shape"}
        declared[member] = entry
    return declared


SOURCE = DeepRegSource()
