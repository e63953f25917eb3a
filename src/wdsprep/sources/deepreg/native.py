"""Finding and reading DeepReg's native files, with DeepReg's construction-time checks.

Index rules follow DeepReg's file loaders (see docs/deepreg.md):
- NIfTI: every `<dir>/<name>/**/*.nii.gz|*.nii` of every dir of a split, in ONE global sort of
  (dir string as written, relative path); the data index is the position in that sort.
- H5: `<dir>/<name>.h5`, keys sorted as strings per file, dirs concatenated in config order.
- Grouped: a group is (dir, leaf folder) or (dir, X of key `group-X-Y`); groups are sorted by that
  pair of strings, images within a group keep the data-index order.

What DeepReg's globs pass over is reported, not dropped without a word (`ignore(path, reason)`, the
plan's `ctx.ignore`): an entry of a split directory that is none of the type's folders or H5 files,
and a file of an image or label folder that is not `.nii`/`.nii.gz`. Every error of h5py and
nibabel on a file is an InputError naming the file (and the H5 key).
"""
from __future__ import annotations

import glob
import math
import os
import warnings
from dataclasses import dataclass, field

import numpy as np

from ...errors import InputError

NIFTI_SUFFIXES = ("nii.gz", "nii")  # DeepReg's DATA_FILE_SUFFIX, longest first
# One volume (image or label) as its header declares it: DeepReg loads whole volumes, and real ones
# are 128**3 to 512**3 voxels (a 512x512x600 int16 CT is 300 MiB). A header declaring more is
# refused before any data is read (a .nii.gz or an H5 chunk of zeros inflates ~1000:1, an H5
# dataset's unwritten chunks cost nothing on disk), and so is a .nii whose header declares more data
# than the file holds.
MAX_VOLUME_BYTES = 1 << 30


@dataclass(frozen=True)
class VolumeRef:
    """Where one stored volume lives: a NIfTI file, or a key of an H5 file."""

    path: str
    key: str | None = None  # H5 dataset key; None for NIfTI

    def describe(self) -> str:
        return f"{self.path}[{self.key}]" if self.key is not None else self.path


@dataclass
class VolumeInfo:
    shape: tuple
    dtype: str
    nbytes: int


@dataclass
class Obs:
    """One observation: an image (and its label) with DeepReg's data index."""

    index: int
    dir: str  # dir string as written in the config
    name: str  # DeepReg's ID: relative path without suffix (NIfTI) or the H5 key
    group: str | None = None  # grouped only
    refs: dict = field(default_factory=dict)  # role -> VolumeRef (image/label or moving_image/...)


def _nifti_splits(dirs: list[str], paths: list[str], name: str, grouped: bool, ignore) -> list[tuple]:
    splits = []
    for dir_string, path in zip(dirs, paths):
        top = os.path.join(path, name)
        if not os.path.isdir(top):
            raise InputError(f"{top}: directory does not exist (DeepReg expects a {name}/ folder here)")
        for root, folders, files in os.walk(top):
            folders.sort()
            for file in sorted(files):
                hidden = any(part.startswith(".") for part in os.path.relpath(os.path.join(root, file), top).split(os.sep))
                if hidden or not file.endswith(tuple("." + suffix for suffix in NIFTI_SUFFIXES)):
                    ignore(os.path.join(root, file), "hidden" if hidden else "not a .nii or .nii.gz image")
        seen: dict[str, str] = {}
        for suffix in NIFTI_SUFFIXES:
            for file in sorted(glob.glob(os.path.join(glob.escape(top), "**", "*." + suffix), recursive=True)):
                relative = os.path.relpath(file, top)[: -len(suffix) - 1]
                if suffix == "nii" and file.endswith(".nii.gz"):
                    continue
                if relative in seen:
                    raise InputError(f"{file}: duplicate observation {relative!r} (also {seen[relative]})")
                seen[relative] = file
                splits.append((dir_string, relative.replace(os.sep, "/"), suffix, file))
    if not splits:
        raise InputError(f"{', '.join(os.path.join(p, name) for p in paths)}: No data collected from {name}, "
                         f"please verify the path is correct (no .nii/.nii.gz files)")
    if grouped:  # DeepReg sorts grouped splits as (dir, group folder, file name, suffix)
        splits.sort(key=lambda s: (s[0], *_split_group(s[1]), s[2]))
    else:
        splits.sort(key=lambda s: s[:3])
    return splits


def _split_group(relative: str) -> tuple[str, str]:
    group, _, file_name = relative.rpartition("/")
    return group, file_name


def h5_keys(file: str) -> list[str]:
    """The keys of an H5 file, sorted as strings; any h5py error is an InputError naming the file."""
    import h5py

    try:
        with h5py.File(file, "r") as handle:
            return sorted(handle.keys())
    except Exception as error:  # h5py raises OSError, KeyError, RuntimeError... for a damaged file
        raise InputError(f"{file}: not a readable HDF5 file: {' '.join(str(error).split())}") from None


def _h5_keys(paths: list[str], name: str) -> list[tuple]:
    splits = []
    for index, path in enumerate(paths):
        file = os.path.join(path, name + ".h5")
        if not os.path.isfile(file):
            raise InputError(f"{file}: h5 file does not exist (DeepReg expects {name}.h5 here)")
        splits.extend((index, key, file) for key in h5_keys(file))
    if not splits:
        raise InputError(f"{', '.join(os.path.join(p, name + '.h5') for p in paths)}: No data collected from "
                         f"{name}, please verify the path is correct (empty h5 file)")
    return splits


def _group_of_key(key: str, file: str) -> tuple[str, str]:
    parts = key.split("-")
    if len(parts) != 3 or parts[0] != "group":
        raise InputError(f"{file}: h5_file keys must be of form group-X-Y, got {key!r}")
    return parts[1], parts[2]


def _collect(split, name: str, grouped: bool, ignore) -> list[Obs]:
    """All observations of one top folder/file (`images`, `moving_labels`, ...) in DeepReg's order."""
    observations = []
    if split.format == "nifti":
        for index, (dir_string, relative, _suffix, file) in enumerate(_nifti_splits(split.dirs, split.paths, name, grouped, ignore)):
            group = _split_group(relative)[0] if grouped else None
            observations.append(Obs(index, dir_string, relative, group, {name: VolumeRef(file)}))
    else:
        for index, (dir_index, key, file) in enumerate(_h5_keys(split.paths, name)):
            group = _group_of_key(key, file)[0] if grouped else None
            observations.append(Obs(index, split.dirs[dir_index], key, group, {name: VolumeRef(file, key)}))
    return observations


def _ids(observations: list[Obs]) -> list[tuple]:
    return [(o.dir, o.name) for o in observations]


def _check_identical(first: list[Obs], second: list[Obs], what: str, where: list[str]) -> None:
    """DeepReg's check_difference_between_two_lists: both folders must hold the same IDs."""
    a, b = _ids(first), _ids(second)
    if a != b:
        difference = sorted(set(a) ^ set(b))
        shown = [f"{d}:{n}" for d, n in difference[:10]]
        if not difference:
            shown = ["(same names, different order or duplicates)"]
        raise InputError(f"{' vs '.join(where)}: {what} are not identical\ndifference are {shown}")


def _top_locations(split, name: str) -> list[str]:
    suffix = ".h5" if split.format == "h5" else "/"
    return [os.path.join(p, name) + suffix for p in split.paths]


def scan_split(split, kind: str, ignore) -> list[Obs]:
    """Observations of a split with all roles attached, after DeepReg's ID checks; `ignore(path,
    reason)` hears of every entry of the split's directories that DeepReg would pass over."""
    roles = {
        "paired": ["moving_images", "fixed_images"],
        "unpaired": ["images"],
        "grouped": ["images"],
    }[kind]
    labels = {"paired": ["moving_labels", "fixed_labels"], "unpaired": ["labels"], "grouped": ["labels"]}[kind]
    labeled = split.labeled
    if labeled is None:  # not given: labeled when any label folder/file exists
        labeled = any(
            os.path.exists(os.path.join(p, n + (".h5" if split.format == "h5" else "")))
            for p in split.paths
            for n in labels
        )
        split.labeled = labeled
    names = roles + (labels if labeled else [])
    grouped = kind == "grouped"
    known = {name + (".h5" if split.format == "h5" else "") for name in roles + labels}
    for path in split.paths:
        for entry in sorted(os.listdir(path)):
            if entry not in known:
                full = os.path.join(path, entry)
                ignore(full + "/" * os.path.isdir(full), f"not one of {', '.join(sorted(known))}")
    collected = {name: _collect(split, name, grouped, ignore) for name in names}
    base = collected[names[0]]
    for name in names[1:]:
        _check_identical(base, collected[name], f"{names[0].replace('_', ' ')} and {name.replace('_', ' ')}",
                         _top_locations(split, names[0]) + _top_locations(split, name))
    for obs_index, obs in enumerate(base):
        for name in names[1:]:
            obs.refs.update(collected[name][obs_index].refs)
    if grouped and split.format == "nifti":
        _check_empty_groups(split)
    return base


def _check_empty_groups(split) -> None:
    """A leaf folder of images/ without any image is an empty group (DeepReg: 'Groups ... are empty')."""
    for path in split.paths:
        top = os.path.join(path, "images")
        for root, dirs, files in os.walk(top):
            if root != top and not dirs and not any(f.endswith((".nii", ".nii.gz")) for f in files):
                raise InputError(f"{root}: group {os.path.relpath(root, top)!r} is empty; "
                                 f"DeepReg: Groups of ID [...] are empty (each group needs images)")


def group_structure(observations: list[Obs]) -> list[tuple[tuple[str, str], list[int]]]:
    """DeepReg's group_struct: [(group_id, [data indices])] with groups sorted by (dir, group)."""
    groups: dict[tuple[str, str], list[int]] = {}
    for obs in observations:
        groups.setdefault((obs.dir, obs.group), []).append(obs.index)
    return [(group_id, groups[group_id]) for group_id in sorted(groups)]


# ------------------------------------------------------------------------------------ reading
def volume_info(ref: VolumeRef) -> VolumeInfo:
    """Shape and dtype from the header only (cheap), with DeepReg's squeeze of a trailing 1."""
    if ref.key is None:
        import nibabel as nib

        try:
            image = nib.load(ref.path)
        except Exception as error:  # nibabel raises many types for broken files
            raise InputError(f"{ref.path}: not a readable NIfTI file: {error}") from None
        shape = tuple(int(s) for s in image.shape)
        dtype = np.dtype(image.get_data_dtype())
    else:
        import h5py

        try:
            with h5py.File(ref.path, "r") as handle:
                dataset = handle[ref.key]
                if not isinstance(dataset, h5py.Dataset):
                    raise InputError(f"{ref.describe()}: is an HDF5 group, not an array (DeepReg uses flat keys)")
                shape, dtype = tuple(int(s) for s in dataset.shape), dataset.dtype
        except InputError:
            raise
        except Exception as error:  # h5py raises OSError, KeyError, RuntimeError... for a damaged file
            raise InputError(f"{ref.describe()}: not a readable HDF5 dataset: {' '.join(str(error).split())}") from None
    nbytes = check_declared_size(ref, shape, dtype)  # the data's presence is checked when it is read (read_volume)
    if len(shape) == 4 and shape[-1] == 1:
        shape = shape[:3]
    return VolumeInfo(shape, dtype.str, nbytes)


def check_declared_size(ref: VolumeRef, shape: tuple, dtype: np.dtype, data_offset: int | None = None) -> int:
    """The bytes of the volume a header declares: at most MAX_VOLUME_BYTES, and for an uncompressed
    .nii (`data_offset`: where its data starts), present in the file; else an InputError naming the file."""
    nbytes = math.prod(int(n) for n in shape) * np.dtype(dtype).itemsize
    if nbytes > MAX_VOLUME_BYTES:
        raise InputError(f"{ref.describe()}: its header declares a {np.dtype(dtype)} volume of shape {tuple(shape)}, "
                         f"{nbytes} bytes, more than a volume may hold ({MAX_VOLUME_BYTES} bytes)")
    if data_offset is not None and not ref.path.endswith(".gz"):  # an uncompressed NIfTI: its data must be there
        present = os.path.getsize(ref.path) - data_offset
        if present < nbytes:
            raise InputError(f"{ref.describe()}: its header declares a {np.dtype(dtype)} volume of shape "
                             f"{tuple(shape)}, {nbytes} bytes from byte {data_offset}, but the file holds {max(present, 0)}")
    return nbytes


def check_image_shape(ref: VolumeRef, info: VolumeInfo, role: str) -> None:
    if len(info.shape) != 3 or min(info.shape) <= 0:
        raise InputError(f"{ref.describe()}: {role} has shape {info.shape}; "
                         f"DeepReg: image shape should be 3D and non-empty")


def check_label_shape(ref: VolumeRef, info: VolumeInfo, role: str) -> int:
    """The label count C of a label volume (1 for a 3-D label)."""
    if len(info.shape) not in (3, 4) or min(info.shape) <= 0:
        raise InputError(f"{ref.describe()}: {role} has shape {info.shape}; DeepReg: label shape should be 3D or 4D")
    return 1 if len(info.shape) == 3 else info.shape[3]


def warn_shape_mismatch(image: VolumeRef, image_info: VolumeInfo, label: VolumeRef, label_info: VolumeInfo) -> None:
    if tuple(image_info.shape[:3]) != tuple(label_info.shape[:3]):
        warnings.warn(f"{label.describe()}: label shape {label_info.shape} differs from image shape "
                      f"{image_info.shape} ({image.describe()}); resizing may behave unexpectedly", stacklevel=2)


def read_volume(ref: VolumeRef, h5_handles: dict | None = None) -> tuple[np.ndarray, dict]:
    """The stored array in its on-disk dtype (native byte order) and its metadata.

    NIfTI scaling (scl_slope/scl_inter) is NOT applied: it is kept in the metadata and applied at
    load time, so the stored array is the file's exact data.
    """
    meta: dict = {"file": ref.describe()}
    if ref.key is None:
        import nibabel as nib

        try:
            image = nib.load(ref.path)
        except Exception as error:
            raise InputError(f"{ref.path}: cannot read NIfTI data: {' '.join(str(error).split())}") from None
        check_declared_size(ref, image.shape, image.get_data_dtype(), int(image.dataobj.offset))  # before reading it
        try:
            array = np.asanyarray(image.dataobj.get_unscaled())
        except Exception as error:
            reason = " ".join(str(error).split())  # nibabel's message for a short file spans two lines
            raise InputError(f"{ref.path}: cannot read NIfTI data: {reason}") from None
        slope, inter = image.dataobj.slope, image.dataobj.inter
        if not (slope == 1 and inter == 0):
            meta["scale"] = [float(slope), float(inter)]
        meta["affine"] = [[float(v) for v in row] for row in image.affine]
        meta["zooms"] = [float(z) for z in image.header.get_zooms()]
    else:
        if h5_handles is None:
            h5_handles = {}
        try:
            handle = h5_handles.get(ref.path)
            if handle is None:
                import h5py

                handle = h5_handles[ref.path] = h5py.File(ref.path, "r")
            dataset = handle[ref.key]
            check_declared_size(ref, dataset.shape, dataset.dtype)  # before reading (and inflating) it
            array = dataset[()]
        except InputError:
            raise
        except Exception as error:  # h5py raises OSError, KeyError, RuntimeError... for a damaged file
            raise InputError(f"{ref.describe()}: cannot read HDF5 data: {' '.join(str(error).split())}") from None
    array = np.asarray(array)
    if array.dtype.byteorder not in ("=", "|"):
        array = array.astype(array.dtype.newbyteorder("="))
    if array.ndim == 4 and array.shape[-1] == 1:
        array = array[..., 0]
    return np.ascontiguousarray(array), meta


def check_label_values(array: np.ndarray, ref: VolumeRef, meta: dict) -> None:
    """DeepReg: labels must lie in [0, 1] (one-hot channels, or soft labels); NaN passes as in DeepReg."""
    values = array
    if "scale" in meta:
        values = array.astype(np.float64) * meta["scale"][0] + meta["scale"][1]
    if values.size and (np.nanmin(values) < 0 or np.nanmax(values) > 1):
        raise InputError(f"{ref.describe()}: label values are not between [0, 1] "
                         f"(min {float(np.nanmin(values))}, max {float(np.nanmax(values))}); "
                         f"DeepReg needs binary or soft labels, one channel per class")
