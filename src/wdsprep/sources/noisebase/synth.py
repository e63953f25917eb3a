"""Synthetic sampleset_v1 sequences: real format, physically consistent geometry.

A camera moves (and turns slightly) through a static scene (a back wall, a floor and a slowly
moving sphere). For every crop pixel and sample, a ray through a jittered point of that pixel hits
the scene; position, normal, albedo and radiance come from the hit, `motion` is the world-space
previous-minus-current position of the same surface point (zero for static geometry), and the crop
offset follows a world anchor point, so it is motion-compensated like the real data. Files are
zarr v2 groups in ZipStores with Blosc lz4hc level 9 chunks of one frame and 4 samples.
"""
from __future__ import annotations

import os

import numpy as np

from .native import FILE_PATTERN, RENDERING_HEIGHT, RENDERING_WIDTH, encode_rgbe, zip_store

SIZES = {
    # sequences, frames, crop, samples
    "small": dict(sequences=6, frames=4, crop=16, samples=8),
    "medium": dict(sequences=16, frames=16, crop=64, samples=16),
}
NEAR, FAR, FOCAL_Y = 0.1, 1000.0, 1.75


def projection_matrix(height: int, width: int) -> np.ndarray:
    """DirectX-style perspective (column-vector form, as stored in `proj_mat`)."""
    p = np.zeros((4, 4), np.float64)
    p[0, 0] = FOCAL_Y * height / width
    p[1, 1] = FOCAL_Y
    p[2, 2] = FAR / (FAR - NEAR)
    p[2, 3] = -NEAR * FAR / (FAR - NEAR)
    p[3, 2] = 1.0
    return p


def camera_basis(position, target, up):
    forward = target - position
    forward /= np.linalg.norm(forward)
    side = np.cross(forward, up)
    side /= np.linalg.norm(side)
    vertical = np.cross(side, forward)
    vertical /= np.linalg.norm(vertical)
    return side, vertical, forward  # view x, y, z axes (noisebase's U, V, W)


def view_projection(position, target, up, proj) -> np.ndarray:
    """Row-vector view-projection matrix like the format's `view_proj_mat`."""
    u, v, w = camera_basis(position, target, up)
    view = np.eye(4)
    view[:3, :3] = np.stack([u, v, w])
    view[:3, 3] = -view[:3, :3] @ position
    return (proj @ view).T.astype(np.float32)


def _project(point, position, target, up, proj, height, width) -> np.ndarray:
    u, v, w = camera_basis(position, target, up)
    rel = point - position
    x, y, z = rel @ u, rel @ v, rel @ w
    ndc = np.array([proj[0, 0] * x / z, proj[1, 1] * y / z])
    return np.array([(1 - ndc[1]) * height / 2, (ndc[0] + 1) * width / 2])  # (i, j) pixels


class _Scene:
    def __init__(self, rng: np.random.Generator):
        self.wall_z = rng.uniform(8, 12)
        self.floor_y = -rng.uniform(1.5, 2.5)
        self.sphere0 = np.array([rng.uniform(-1, 1), rng.uniform(-0.5, 0.5), rng.uniform(5, 7)])
        self.sphere_velocity = rng.uniform(-0.05, 0.05, 3)
        self.radius = rng.uniform(0.8, 1.5)
        self.tint = rng.uniform(0.3, 1.0, (3, 3))

    def sphere_center(self, frame: int) -> np.ndarray:
        return self.sphere0 + self.sphere_velocity * frame

    def trace(self, origin, dirs, frame):
        """Nearest hit of rays [..., 3]: (position, normal, material id, motion)."""
        shape = dirs.shape[:-1]
        t = np.full(shape, np.inf)
        normal = np.zeros(dirs.shape)
        material = np.zeros(shape, np.int64)
        with np.errstate(divide="ignore", invalid="ignore"):
            t_wall = (self.wall_z - origin[2]) / dirs[..., 2]
            hit = (t_wall > 0) & (t_wall < t)
            t = np.where(hit, t_wall, t)
            normal[hit] = (0, 0, -1)
            material[hit] = 0
            t_floor = (self.floor_y - origin[1]) / dirs[..., 1]
            hit = (t_floor > 0) & (t_floor < t)
            t = np.where(hit, t_floor, t)
            normal[hit] = (0, 1, 0)
            material[hit] = 1
            center = self.sphere_center(frame)
            oc = origin - center
            b = np.einsum("...k,k->...", dirs, oc)
            c = oc @ oc - self.radius**2
            disc = b * b - c
            t_sphere = -b - np.sqrt(np.maximum(disc, 0))
            hit = (disc > 0) & (t_sphere > 0) & (t_sphere < t)
            t = np.where(hit, t_sphere, t)
            material[hit] = 2
        position = origin + dirs * t[..., None]
        sphere = material == 2
        normal[sphere] = (position[sphere] - center) / self.radius
        motion = np.zeros(dirs.shape)
        motion[sphere] = -self.sphere_velocity  # prev - current of the same surface point
        return position, normal, material, motion

    def albedo(self, position, material):
        checker = (np.floor(position[..., 0] * 2) + np.floor(position[..., 1] * 2) + np.floor(position[..., 2] * 2)) % 2
        base = self.tint[material]
        return base * (0.5 + 0.5 * checker[..., None])


def write_sequence(path: str, seed: int, frames: int, crop: int, samples: int,
                   height: int = RENDERING_HEIGHT, width: int = RENDERING_WIDTH) -> None:
    """One sequence as a zarr v2 ZipStore (written to a temporary name, then renamed)."""
    import zarr
    from numcodecs import Blosc

    rng = np.random.default_rng(seed)
    scene = _Scene(rng)
    proj = projection_matrix(height, width)
    start = np.array([rng.uniform(-1, 1), rng.uniform(-0.3, 0.3), 0.0])
    velocity = np.array([rng.uniform(-0.08, 0.08), rng.uniform(-0.02, 0.02), rng.uniform(0, 0.1)])
    yaw0, yaw_rate = rng.uniform(-0.2, 0.2), rng.uniform(-0.02, 0.02)
    up = np.array([0.0, 1.0, 0.0])
    # the crop tracks a point of the wall, picked through a random pixel of frame 0
    first_pixel = np.array([rng.uniform(crop, height - crop), rng.uniform(crop, width - crop)])

    arrays = {
        "color": np.zeros((frames, 4, crop, crop, samples), np.uint8),
        "position": np.zeros((frames, 3, crop, crop, samples), np.float32),
        "motion": np.zeros((frames, 3, crop, crop, samples), np.float32),
        "normal": np.zeros((frames, 3, crop, crop, samples), np.float16),
        "diffuse": np.zeros((frames, 3, crop, crop, samples), np.float16),
        "reference": np.zeros((frames, 3, crop, crop), np.float32),
        "exposure": np.zeros((frames, 2), np.float32),
        "camera_position": np.zeros((frames, 3), np.float32),
        "camera_target": np.zeros((frames, 3), np.float32),
        "camera_up": np.zeros((frames, 3), np.float32),
        "proj_mat": np.zeros((frames, 4, 4), np.float32),
        "view_proj_mat": np.zeros((frames, 4, 4), np.float32),
        "crop_offset": np.zeros((frames, 2), np.int32),
    }
    anchor = None
    for f in range(frames):
        position = start + velocity * f
        yaw = yaw0 + yaw_rate * f
        target = position + np.array([np.sin(yaw), 0.05 * np.sin(0.3 * f), np.cos(yaw)])
        # store float32 camera and derive everything from the stored values
        position, target = position.astype(np.float32).astype(np.float64), target.astype(np.float32).astype(np.float64)
        u, v, w = camera_basis(position, target, up)
        if anchor is None:
            anchor = _trace_pixels(scene, position, u, v, w, proj, height, width, first_pixel[None], f)[0][0]
        center = _project(anchor, position, target, up, proj, height, width)
        offset = np.clip(np.round(center - crop / 2), 0, [height - crop, width - crop]).astype(np.int32)
        jitter = rng.random((crop, crop, samples, 2))
        pixels = (np.stack(np.meshgrid(np.arange(crop), np.arange(crop), indexing="ij"), -1)[:, :, None, :]
                  + offset + jitter)  # [H, W, S, 2] (i, j) in the full frame
        hit, normal, material, motion = _trace_pixels(scene, position, u, v, w, proj, height, width, pixels, f)
        albedo = scene.albedo(hit, material)
        light = np.clip(np.einsum("...k,k->...", normal, np.array([0.3, 0.8, -0.5]) / np.linalg.norm([0.3, 0.8, -0.5])), 0.05, None)
        clean = albedo * light[..., None] * 2.0
        noise = rng.exponential(1.0, clean.shape[:-1])[..., None] * (rng.random(clean.shape[:-1]) > 0.05)[..., None]
        radiance = clean * noise
        rgbe, exposure = encode_rgbe(np.moveaxis(radiance, -1, 0).astype(np.float32), rng)
        arrays["color"][f] = rgbe
        arrays["exposure"][f] = exposure
        arrays["position"][f] = np.moveaxis(hit, -1, 0)
        arrays["motion"][f] = np.moveaxis(motion, -1, 0)
        arrays["normal"][f] = np.moveaxis(normal, -1, 0)
        arrays["diffuse"][f] = np.moveaxis(albedo, -1, 0)
        arrays["reference"][f] = np.moveaxis(clean.mean(axis=2), -1, 0)
        arrays["camera_position"][f] = position
        arrays["camera_target"][f] = target
        arrays["camera_up"][f] = up
        arrays["proj_mat"][f] = proj
        arrays["view_proj_mat"][f] = view_projection(position, target, up, proj)
        arrays["crop_offset"][f] = offset

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    temporary = path + ".part"
    if os.path.exists(temporary):
        os.remove(temporary)
    store = zip_store(temporary, "w")
    try:
        group = zarr.group(store=store)
        compressor = Blosc(cname="lz4hc", clevel=9, shuffle=Blosc.SHUFFLE)
        for name, array in arrays.items():
            if array.ndim == 5:
                chunks = (1, array.shape[1], crop, crop, min(4, samples))
            elif name == "reference":
                chunks = (1, 3, crop, crop)
            else:
                chunks = array.shape
            group.create_dataset(name, data=array, chunks=chunks, compressor=compressor)
    finally:
        store.close()
    os.replace(temporary, path)


def _trace_pixels(scene, position, u, v, w, proj, height, width, pixels, frame):
    ndc_x = pixels[..., 1] / (width / 2) - 1
    ndc_y = 1 - pixels[..., 0] / (height / 2)
    dirs = (ndc_x / proj[0, 0])[..., None] * u + (ndc_y / proj[1, 1])[..., None] * v + w
    dirs /= np.linalg.norm(dirs, axis=-1, keepdims=True)
    return scene.trace(position, dirs, frame)


def synth(directory: str, seed: int = 0, size: str = "small", **overrides) -> list[str]:
    """Write `sequences` sequences as `<directory>/sampleset_v1/train/scene{index:04d}.zip`."""
    if size not in SIZES:
        raise ValueError(f"unknown synth size {size!r} (expected one of {', '.join(SIZES)})")
    params = {**SIZES[size], **overrides}
    height = params.pop("height", RENDERING_HEIGHT)
    width = params.pop("width", RENDERING_WIDTH)
    paths = []
    for index in range(params["sequences"]):
        path = os.path.join(directory, FILE_PATTERN.format(index=index))
        write_sequence(path, seed=seed * 100_003 + index, frames=params["frames"], crop=params["crop"],
                       samples=params["samples"], height=height, width=width)
        paths.append(path)
    return paths
