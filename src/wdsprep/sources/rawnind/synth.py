"""Synthetic RawNIND: Bayer and X-Trans DNG captures of synthetic scenes, the index YAML and a Dataverse listing.

Each scene is a textured linear camRGB canvas. The clean capture (ISO100, low noise) sees the
canvas at the origin; each noisy capture sees it moved by a known integer shift `(dy, dx)` (so
`noisy[y, x] = clean[y + dy, x + dx]`, the alignment convention), with the exposure divided by a
known gain and Poisson-Gaussian noise growing with ISO. The files are 16-bit DNGs of cameras
LibRaw knows (RGGB Sony, 6x6 X-Trans Fujifilm), so rawpy reads them like camera files.

Layout written (a directory the Dataverse server can serve):
  dataverse_dataset.json   the dataset JSON, as `/api/datasets/:persistentId` returns it
  dataset.yaml             the index (its Dataverse file name); dataset_index.yaml is a copy
  files/<name>             the captures, named `<CFA>_[TEST_]<scene>_[GT_]ISO<n>_sha1=<hex>.dng`
  synth_truth.json         the shifts, gains and ISOs used (for tests; not part of the format)
"""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import yaml

from .dng import write_dng
from .index import DATAVERSE_INDEX_NAME, INDEX_FILENAME

SYNTH_DOI = "doi:10.5072/FK2/RAWSYN"  # 10.5072 is the DataCite test prefix
BLACK_LEVEL = 512
WHITE_LEVEL = 16383
MARGIN = 16
SIZES = {
    # size: (Bayer scenes, height, width, noisy captures per scene, X-Trans scenes)
    "tiny": (2, 256, 384, (2, 2), 0),
    "bench": (5, 256, 384, (3, 2, 3, 3, 3), 0),  # 20 small files: download-concurrency benchmark
    "small": (4, 512, 768, (2, 3, 2, 2), 1),
    "medium": (8, 1024, 1536, (3, 4, 3, 3, 4, 3, 3, 4), 2),
    "xtrans": (1, 256, 384, (2,), 1),  # one scene of each sensor, for the X-Trans tests
    "precrop": (2, 800, 2336, (2, 2), 0),  # the smallest captures upstream cuts into two pre-crops
}
SCENE_NAMES = ["plants", "book_shelf", "MuseeL-toys", "Laura_Lemons_platformer", "kitchen", "chess", "fabrics2", "stairs"]
XTRANS_NAMES = ["Fuji_flowers", "Fuji_bookcase", "Fuji_toys"]
# the X-Trans 6x6 colour filter (0 red, 1 green, 2 blue): 20 green, 8 red, 8 blue sites
XTRANS_PATTERN = np.array([
    [1, 2, 1, 1, 0, 1],
    [0, 1, 0, 2, 1, 2],
    [1, 2, 1, 1, 0, 1],
    [1, 0, 1, 1, 2, 1],
    [2, 1, 2, 0, 1, 0],
    [1, 0, 1, 1, 2, 1],
], dtype=np.uint8)
XTRANS_CAMERA = {"make": "FUJIFILM", "model": "X-T2",  # a camera LibRaw knows, so rgb_xyz_matrix is set
                 "color_matrix": (8058, -3223, -847, -4014, 11882, 2318, -667, 1491, 5763)}


def _texture(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A camRGB canvas with structure at several scales, values mostly in [0.03, 0.6]."""
    from scipy.ndimage import gaussian_filter

    canvas = np.zeros((3, height, width), dtype=np.float64)
    for sigma, weight in ((24.0, 1.0), (6.0, 0.6), (1.5, 0.35)):
        field = gaussian_filter(rng.normal(size=(height, width)), sigma)
        field /= field.std() + 1e-12
        colours = rng.uniform(0.5, 1.0, size=3)
        canvas += weight * colours[:, None, None] * field[None]
    canvas -= canvas.min()
    canvas /= canvas.max()
    canvas = 0.03 + 0.55 * canvas
    for _ in range(6):  # a few flat-coloured rectangles give hard edges
        y, x = int(rng.integers(0, height - 40)), int(rng.integers(0, width - 40))
        h, w = int(rng.integers(10, 40)), int(rng.integers(10, 40))
        canvas[:, y : y + h, x : x + w] = rng.uniform(0.05, 0.6, size=3)[:, None, None]
    canvas[1] *= 1.1  # green sees more light, as on a camera sensor
    return canvas


def _mosaic(rgb: np.ndarray, pattern: np.ndarray | None = None) -> np.ndarray:
    """CFA sampling of a `[3,H,W]` image -> `[H,W]`: RGGB, or the repeat `pattern` of colour indices."""
    if pattern is None:
        pattern = np.array([[0, 1], [1, 2]])
    height, width = rgb.shape[1:]
    rows, cols = np.arange(height) % pattern.shape[0], np.arange(width) % pattern.shape[1]
    colour = pattern[rows[:, None], cols[None, :]]
    return np.take_along_axis(rgb, colour[None].astype(np.intp), axis=0)[0]


def _capture(rng: np.random.Generator, linear: np.ndarray, iso: int) -> np.ndarray:
    """Linear mosaic (1.0 = white) -> uint16 raw DN with shot and read noise for `iso`."""
    span = WHITE_LEVEL - BLACK_LEVEL
    shot = 2.0e-6 * iso  # variance per unit signal, in normalised units
    read = (0.0006 * (iso / 100) ** 0.5) ** 2
    clipped = np.clip(linear, 0, None)
    noisy = linear + rng.normal(size=linear.shape) * np.sqrt(shot * clipped + read)
    raw = np.round(BLACK_LEVEL + noisy * span)
    return np.clip(raw, 0, WHITE_LEVEL).astype(np.uint16)


def _write_capture(files_dir: str, prefix: str, suffix: str, raw: np.ndarray, iso: int, **camera) -> tuple[str, str, int]:
    temporary = os.path.join(files_dir, f".{prefix}.tmp")
    size = write_dng(temporary, raw, black_level=BLACK_LEVEL, white_level=WHITE_LEVEL, iso=iso, **camera)
    with open(temporary, "rb") as handle:
        sha1 = hashlib.sha1(handle.read()).hexdigest()
    name = f"{prefix}_sha1={sha1}.{suffix}"
    os.replace(temporary, os.path.join(files_dir, name))
    return name, sha1, size


def _datafile_entry(file_id: int, name: str, path: str, content_type: str) -> dict:
    with open(path, "rb") as handle:
        md5 = hashlib.md5(handle.read()).hexdigest()
    persistent = f"{SYNTH_DOI}/F{file_id:05d}"
    return {
        "description": "",
        "label": name,
        "restricted": False,
        "version": 1,
        "datasetVersionId": 1,
        "dataFile": {
            "id": file_id,
            "persistentId": persistent,
            "pidURL": "https://doi.org/" + persistent[4:],
            "filename": name,
            "contentType": content_type,
            "friendlyType": content_type,
            "filesize": os.path.getsize(path),
            "description": "",
            "storageIdentifier": f"file://{name}",
            "rootDataFileId": -1,
            "md5": md5,
            "checksum": {"type": "MD5", "value": md5},
            "tabularData": False,
            "creationDate": "2025-01-01",
            "publicationDate": "2025-01-15",
            "fileAccessRequest": False,
        },
    }


def synth(directory: str, seed: int = 0, size: str = "small") -> dict:
    """Write a synthetic RawNIND Dataverse directory; returns the truth table."""
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r} (expected one of {', '.join(SIZES)})")
    scene_count, height, width, noisy_counts, xtrans_count = SIZES[size]
    files_dir = os.path.join(directory, "files")
    os.makedirs(files_dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    index: dict[str, dict] = {"Bayer": {}}
    truth: dict[str, dict] = {}
    entries: list[dict] = []
    next_id = 1001

    def add_entry(name: str, content_type: str) -> None:
        nonlocal next_id
        entries.append(_datafile_entry(next_id, name, os.path.join(files_dir, name), content_type))
        next_id += 1

    scene_list = [("Bayer", number) for number in range(scene_count)] + [("X-Trans", number) for number in range(xtrans_count)]
    for cfa, scene_number in scene_list:
        bayer = cfa == "Bayer"
        names = SCENE_NAMES if bayer else XTRANS_NAMES
        scene = names[scene_number % len(names)] + ("" if scene_number < len(names) else f"{scene_number}")
        test_reserve = bayer and scene_number == scene_count - 1
        tag = f"{cfa}_TEST_" if test_reserve else f"{cfa}_"
        pattern = None if bayer else XTRANS_PATTERN
        camera = {} if bayer else dict(XTRANS_CAMERA, cfa_pattern=XTRANS_PATTERN)
        canvas = _texture(rng, height + 2 * MARGIN, width + 2 * MARGIN)
        # a small overexposed patch in the clean capture (exercises the overexposure mask)
        py, px = MARGIN + height // 3, MARGIN + width // 3
        canvas[:, py : py + 12, px : px + 12] = 1.6
        clean_count = 2 if bayer and scene_number == 1 else 1
        scene_entry: dict = {"clean_images": [], "noisy_images": []}
        scene_truth: dict = {"clean": [], "noisy": {}}
        clean_view = canvas[:, MARGIN : MARGIN + height, MARGIN : MARGIN + width]
        for _ in range(clean_count):
            raw = _capture(rng, _mosaic(clean_view, pattern), 100)
            name, sha1, _ = _write_capture(files_dir, f"{tag}{scene}_GT_ISO100", "dng", raw, 100, **camera)
            scene_entry["clean_images"].append({"filename": name, "sha1": sha1})
            scene_truth["clean"].append(name)
            add_entry(name, "image/x-adobe-dng")
        isos = rng.choice([400, 800, 1600, 3200, 6400], size=noisy_counts[scene_number % len(noisy_counts)], replace=False)
        for iso in isos:
            dy, dx = (int(value) for value in rng.integers(-12, 13, size=2))
            gain = float(rng.uniform(1.0, 2.5))
            view = canvas[:, MARGIN + dy : MARGIN + dy + height, MARGIN + dx : MARGIN + dx + width] / gain
            raw = _capture(rng, _mosaic(view, pattern), int(iso))
            name, sha1, _ = _write_capture(files_dir, f"{tag}{scene}_ISO{int(iso)}", "dng", raw, int(iso), **camera)
            scene_entry["noisy_images"].append({"filename": name, "sha1": sha1})
            scene_truth["noisy"][name] = {"shift": [dy, dx], "gain": gain, "iso": int(iso)}
            add_entry(name, "image/x-adobe-dng")
        if bayer and scene_number == 0:
            # an XMP sidecar listed in the index but not on Dataverse, like the real LucieB scenes
            xmp = f'<x:xmpmeta xmlns:x="adobe:ns:meta/"><!-- {scene} --></x:xmpmeta>\n'.encode()
            sha1 = hashlib.sha1(xmp).hexdigest()
            scene_entry["clean_images"].append({"filename": f"{tag}{scene}_GT_ISO100_sha1={sha1}.xmp", "sha1": sha1})
        scene_entry["test_reserve"] = test_reserve
        scene_entry["unknown_sensor"] = False
        index.setdefault(cfa, {})[scene] = scene_entry
        truth[f"{cfa}/{scene}"] = scene_truth

    index_text = yaml.safe_dump(index, sort_keys=False, default_flow_style=False)
    for name in (DATAVERSE_INDEX_NAME,):
        with open(os.path.join(files_dir, name), "w", encoding="utf-8") as handle:
            handle.write(index_text)
        add_entry(name, "application/octet-stream")
    with open(os.path.join(directory, INDEX_FILENAME), "w", encoding="utf-8") as handle:
        handle.write(index_text)
    permissions = os.path.join(files_dir, "permissions.txt")
    with open(permissions, "w", encoding="utf-8") as handle:
        handle.write("Synthetic captures generated by wdsprep; no permissions needed.\n")
    add_entry("permissions.txt", "text/plain")

    identifier = SYNTH_DOI.split(":", 1)[1]
    authority, _, short = identifier.partition("/")
    listing = {
        "status": "OK",
        "data": {
            "id": 1,
            "identifier": short,
            "persistentUrl": f"https://doi.org/{identifier}",
            "protocol": "doi",
            "authority": authority,
            "publisher": "wdsprep synth",
            "publicationDate": "2025-01-15",
            "storageIdentifier": f"file://{identifier}",
            "latestVersion": {
                "id": 1,
                "datasetId": 1,
                "datasetPersistentId": SYNTH_DOI,
                "versionNumber": 1,
                "versionMinorNumber": 0,
                "versionState": "RELEASED",
                "files": entries,
            },
        },
    }
    with open(os.path.join(directory, "dataverse_dataset.json"), "w", encoding="utf-8") as handle:
        json.dump(listing, handle, indent=1)
    with open(os.path.join(directory, "synth_truth.json"), "w", encoding="utf-8") as handle:
        json.dump({"seed": seed, "size": size, "doi": SYNTH_DOI, "scenes": truth}, handle, indent=1, sort_keys=True)
    return truth
