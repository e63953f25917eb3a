"""Synthetic DeepReg data in all three layouts and both formats, plus a `deepreg.yaml` naming them.

`DIR/<type>/<format>/<split>/...` exactly as DeepReg lays them out; `DIR/deepreg.yaml` lists the six
datasets under `datasets:` so that one `wdsprep convert deepreg DIR OUT` converts them all (splits
are then named `<type>_<format>_<split>`).
"""
from __future__ import annotations

import os

import numpy as np
import yaml

SIZES = {
    # (moving shape, fixed shape, pairs per split, images per unpaired split, group sizes)
    "small": ((12, 14, 10), (10, 12, 8), {"train": 4, "valid": 2, "test": 2}, {"train": 5, "valid": 2, "test": 2},
              {"train": [3, 2, 4], "valid": [2, 2], "test": [2, 3]}),
    "medium": ((64, 64, 60), (44, 59, 41), {"train": 24, "valid": 4, "test": 4},
               {"train": 24, "valid": 4, "test": 4}, {"train": [4, 3, 5, 4], "valid": [3, 3], "test": [2, 3]}),
}
AFFINE = np.diag([0.4, 0.4, 0.4, 1.0])
NUM_LABELS = 3


def _image(rng: np.random.Generator, shape) -> np.ndarray:
    grid = np.stack(np.meshgrid(*[np.linspace(-1, 1, s) for s in shape], indexing="ij"))
    centre = rng.uniform(-0.4, 0.4, size=(3, 1, 1, 1))
    blob = np.exp(-((grid - centre) ** 2).sum(0) / rng.uniform(0.1, 0.4))
    noise = rng.normal(0, 0.08, size=shape)
    return np.clip((blob + noise) * 255, 0, 255).astype(np.uint8)


def _label(rng: np.random.Generator, image: np.ndarray, channels: int) -> np.ndarray:
    thresholds = np.sort(rng.uniform(60, 200, size=max(channels, 1)))
    masks = [(image > t).astype(np.uint8) for t in thresholds]
    return masks[0] if channels == 0 else np.stack(masks, axis=-1)


def _write_nifti(path: str, array: np.ndarray) -> None:
    import nibabel as nib

    os.makedirs(os.path.dirname(path), exist_ok=True)
    nib.save(nib.Nifti1Image(array, AFFINE), path)


def _write_h5(path: str, arrays: dict) -> None:
    import h5py

    os.makedirs(os.path.dirname(path), exist_ok=True)
    with h5py.File(path, "w") as handle:
        for key in sorted(arrays):
            handle.create_dataset(key, data=arrays[key].astype(np.float32))


def synth(directory: str, seed: int = 0, size: str = "small") -> None:
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    moving_shape, fixed_shape, pair_counts, image_counts, group_sizes = SIZES[size]
    rng = np.random.default_rng(seed)
    datasets = {}
    for fmt in ("nifti", "h5"):
        # paired: label counts vary per pair (3, 2, or one 3-D label) like DeepReg's test set
        root = os.path.join(directory, "paired", fmt)
        for split, count in pair_counts.items():
            volumes: dict[str, dict] = {n: {} for n in ("moving_images", "fixed_images", "moving_labels", "fixed_labels")}
            for i in range(count):
                name = f"case{i:06d}"
                channels = (3, 2, 0)[i % 3]
                moving, fixed = _image(rng, moving_shape), _image(rng, fixed_shape)
                volumes["moving_images"][name] = moving
                volumes["fixed_images"][name] = fixed
                volumes["moving_labels"][name] = _label(rng, moving, channels)
                volumes["fixed_labels"][name] = _label(rng, fixed, channels)
            _write_all(os.path.join(root, split), fmt, volumes)
        datasets[f"paired_{fmt}"] = _section("paired", fmt, root, directory,
                                             moving_image_shape=[8, 8, 8], fixed_image_shape=[6, 6, 6])
        root = os.path.join(directory, "unpaired", fmt)
        for split, count in image_counts.items():
            volumes = {"images": {}, "labels": {}}
            for i in range(count):
                name = f"case{i:06d}"
                image = _image(rng, moving_shape)
                volumes["images"][name] = image
                volumes["labels"][name] = _label(rng, image, NUM_LABELS)
            _write_all(os.path.join(root, split), fmt, volumes)
        datasets[f"unpaired_{fmt}"] = _section("unpaired", fmt, root, directory, image_shape=[8, 8, 8])
        root = os.path.join(directory, "grouped", fmt)
        for split, sizes in group_sizes.items():
            volumes = {"images": {}, "labels": {}}
            for g, n in enumerate(sizes, start=1):
                for t in range(1, n + 1):
                    name = f"group-{g}-{t}" if fmt == "h5" else f"group{g}/time{t:02d}"
                    image = _image(rng, moving_shape)
                    volumes["images"][name] = image
                    volumes["labels"][name] = _label(rng, image, NUM_LABELS)
            _write_all(os.path.join(root, split), fmt, volumes)
        datasets[f"grouped_{fmt}"] = _section("grouped", fmt, root, directory, image_shape=[8, 8, 8],
                                              intra_group_prob=1, intra_group_option="forward",
                                              sample_image_in_group=True)
    with open(os.path.join(directory, "deepreg.yaml"), "w", encoding="utf-8") as handle:
        yaml.safe_dump({"datasets": datasets}, handle, sort_keys=True)


def _write_all(split_dir: str, fmt: str, volumes: dict[str, dict]) -> None:
    for top, arrays in volumes.items():
        if fmt == "h5":
            _write_h5(os.path.join(split_dir, top + ".h5"), arrays)
        else:
            for name, array in arrays.items():
                _write_nifti(os.path.join(split_dir, top, name + ".nii.gz"), array)


def _section(kind: str, fmt: str, root: str, directory: str, **reader) -> dict:
    section = {"type": kind, **reader}
    for split in ("train", "valid", "test"):
        section[split] = {"dir": os.path.relpath(os.path.join(root, split), directory), "format": fmt,
                          "labeled": True}
    return section
