"""Names and rules of the native voxel-dataset-generator layout (shared by synth, convert and tests).

```
<input>/dataset/                         splits.json, metadata.json, objects/, subvolumes/
<input>/ray_dataset_hierarchical/        level_L/<key[:2]>/<key>_rays.npz
```
"""
from __future__ import annotations

import hashlib
import pathlib

import numpy as np

DATASET_DIR = "dataset"
RAY_DIR = "ray_dataset_hierarchical"
RAY_SUFFIX = "_rays.npz"
SPLITS = ("train", "val", "test")
# An array of a voxel or ray file: a 128**3 grid is 2 MiB (512**3: 128 MiB) and a ray file of
# sphere_divisions 4 holds 44 * (samples_per_view // 3) rays of ~40 bytes. A member declaring more
# is refused before it is inflated (a decompression bomb), and so is one whose .npy header declares
# other than the bytes the member holds.
MAX_NPZ_MEMBER_BYTES = 256 << 20

# Face ids of the ray generator: 0:-X 1:+X 2:-Y 3:+Y 4:-Z 5:+Z (x = array axis 2, z = axis 0).
FACE_NORMALS = np.array(
    [[-1, 0, 0], [1, 0, 0], [0, -1, 0], [0, 1, 0], [0, 0, -1], [0, 0, 1]], dtype=np.float64
)


def content_hash(voxels: np.ndarray) -> str:
    """Upstream subvolume id: sha256 of the C-order bool bytes (no shape or level mixed in)."""
    return hashlib.sha256(np.ascontiguousarray(voxels, dtype=bool).tobytes()).hexdigest()


def object_voxel_path(dataset_dir: pathlib.Path, object_id: str) -> pathlib.Path:
    return dataset_dir / "objects" / f"object_{object_id}" / "level_0.npz"


def subvolume_path(dataset_dir: pathlib.Path, level: int, hash_: str) -> pathlib.Path:
    return dataset_dir / "subvolumes" / f"level_{level}" / hash_[:2] / f"{hash_}.npz"


def ray_path(ray_dir: pathlib.Path, level: int, key: str) -> pathlib.Path:
    """`key` is the object id (level 0) or the subvolume hash (levels >= 1)."""
    return ray_dir / f"level_{level}" / key[:2] / f"{key}{RAY_SUFFIX}"


def sample_hash(level: int, key: str) -> str:
    """The `hash` a training sample reports: "object_XXXX" at level 0, the hex hash above."""
    return f"object_{key}" if level == 0 else key


def shard_key(level: int, key: str) -> str:
    """Tar sample key: dot-free, short (<= 68 chars), unique within a split."""
    return f"l{level}_{sample_hash(level, key)}"
