"""Camera and per-sample geometry, computed exactly like noisebase 1.1.1 (bit for bit).

Every float operation here mirrors the reference's operation order and dtypes (numpy float32
inputs, a float64 view matrix, float32 view-projection), because the loader promises batches that
are bit-identical to noisebase's. Do not "simplify" an expression without re-running the
comparison tests: a different reduction order changes the last bit.
"""
from __future__ import annotations

import numpy as np


def _unit(vector: np.ndarray) -> np.ndarray:
    return vector / np.linalg.norm(vector, axis=0, keepdims=True)


class Orientation:
    """One of the 8 axis-aligned flips/rotations (7 is the identity), for arrays and cameras.

    Bit 0 clear: mirror the width axis; bit 1 clear: mirror the height axis; bit 2 clear:
    transpose the image then mirror both axes (a rotation). The crop offset is re-expressed in
    the transformed full frame (it may become negative after a rotation of a non-square frame).
    """

    def __init__(self, code: int, height: int, width: int, crop: int):
        self.code = int(code)
        self.height = height
        self.width = width
        self.crop = crop

    @property
    def mirror_width(self) -> bool:
        return self.code % 2 < 1

    @property
    def mirror_height(self) -> bool:
        return self.code % 4 < 2

    @property
    def rotate(self) -> bool:
        return self.code % 8 < 4

    def camera(self, target, up, position, proj, offset):
        """(forward, up, left, position, crop_offset, view_proj) of the re-oriented camera."""
        forward = _unit(target - position)
        left = _unit(np.cross(forward, up))
        vertical = _unit(np.cross(left, forward))
        if self.mirror_width:
            left = -left
            offset[1] = self.width - offset[1] - self.crop
        if self.mirror_height:
            vertical = -vertical
            offset[0] = self.height - offset[0] - self.crop
        if self.rotate:
            left, vertical = vertical, left
            offset = (self.height + self.width) // 2 - self.crop - np.flip(offset)
        basis = np.pad(np.stack([left, vertical, forward], 0), [[0, 1], [0, 1]]) + np.diag([0.0, 0.0, 0.0, 1.0])
        translate = np.pad(-position[:, np.newaxis], [[0, 1], [3, 0]]) + np.diag([1.0, 1.0, 1.0, 1.0])
        view = np.matmul(basis, translate)
        view_proj = np.matmul(view.T, proj.T).astype(np.float32)  # row-vector (DirectX) convention
        return forward, vertical, left, position, offset, view_proj

    def array_view(self, array: np.ndarray) -> np.ndarray:
        """The re-oriented [C, H, W, ...] array as a view (no copy)."""
        if self.mirror_width:
            array = np.flip(array, 2)
        if self.mirror_height:
            array = np.flip(array, 1)
        if self.rotate:
            array = np.flip(np.transpose(array, [0, 2, 1] + list(range(3, array.ndim))), (1, 2))
        return array

    def array(self, array: np.ndarray, dtype=None) -> np.ndarray:
        """The re-oriented array, C-contiguous (converted to `dtype` in the same copy)."""
        view = self.array_view(array)
        if dtype is None:
            return np.ascontiguousarray(view)
        return np.asarray(view, dtype=dtype, order="C") if view.dtype != dtype else np.ascontiguousarray(view)


def screen_space_normal(w_normal, forward, up, left):
    """World-space normals [3, H, W, S] -> (n.forward, n.left, n.up)."""
    return np.einsum("ij, ihws -> jhws", np.stack([forward, left, up], axis=1), w_normal)


def screen_space_position(w_position, view_proj, height, width):
    """Per-sample pixel coordinates (i, j) in the full frame; degenerate points give 0."""
    homogeneous = np.concatenate((w_position, np.ones_like(w_position)[0:1]))
    projected = np.einsum("ij, ihws -> jhws", view_proj, homogeneous)
    projected = np.divide(projected[0:2], projected[3], out=np.zeros_like(projected[0:2]), where=projected[3] != 0)
    projected = projected * np.reshape([0.5 * width, -0.5 * height], (2, 1, 1, 1)).astype(np.float32) \
        + np.reshape([width / 2, height / 2], (2, 1, 1, 1)).astype(np.float32)
    return np.flip(projected, 0)


def motion_vectors(w_position, w_motion, view_proj, prev_view_proj, height, width):
    """Screen-space motion (di, dj) in pixels: where each sample was in the previous frame."""
    current = screen_space_position(w_position, view_proj, height, width)
    previous = screen_space_position(w_position + w_motion, prev_view_proj, height, width)
    return previous - current


def log_depth(w_position, camera_position):
    """log(1 + 1/distance): the log-disparity depth buffer, [1, H, W, S]."""
    distance = np.linalg.norm(w_position - np.reshape(camera_position, (3, 1, 1, 1)), axis=0, keepdims=True)
    return np.log(1 + 1 / distance)


def backproject_pixel_centers(motion, crop_offset, prev_crop_offset, as_grid: bool = False):
    """Where each pixel centre of the current crop was in the previous crop.

    `motion` is [N, 2, H, W] screen-space motion (pixels, ij); offsets are [N, 2]. Returns ij pixel
    positions [N, 2, H, W] in the previous crop, or with `as_grid` xy positions in [-1, 1],
    [N, H, W, 2], for `torch.nn.functional.grid_sample(..., align_corners=False)`.
    """
    import torch

    height, width = motion.shape[2], motion.shape[3]
    grid = torch.stack(torch.meshgrid(
        torch.arange(0, height, dtype=motion.dtype, device=motion.device),
        torch.arange(0, width, dtype=motion.dtype, device=motion.device),
        indexing="ij",
    ))
    position = grid + motion - prev_crop_offset[..., None, None] + crop_offset[..., None, None]
    if not as_grid:
        return position
    xy = torch.permute(torch.flip(position, (1,)), (0, 2, 3, 1)) + 0.5
    size = torch.tensor([width, height], dtype=position.dtype, device=position.device)
    return xy / size * 2 - 1
