"""Helpers of the show tests: data with known content in each source's native layout, `make shards`
into a temporary tree, running `wdsprep show`, and reading the page back without a browser.

The page is parsed with the standard library's HTMLParser and every picture decoded with Pillow,
so the tests look at the pixels the browser shows, not at the arrays the code drew them from.
A cell (r, c) of a picture with `data-scale` s and `data-step` 1 covers pixels [r*s, (r+1)*s) x
[c*s, (c+1)*s); its top-left pixel is never covered by a dot (dots sit in the cell's middle).
"""
from __future__ import annotations

import base64
import contextlib
import io
import os
import pathlib
import shutil
import tomllib
from html.parser import HTMLParser

import numpy as np

from tests.conftest import REPO
from wdsprep.cli import main


# ------------------------------------------------------------------------------------ running
def run_cli(*argv: str, capsys=None) -> tuple[int, str, str]:
    """`wdsprep ARGV` in-process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def show(location: str, out: pathlib.Path, *options: str) -> "Page":
    code, stdout, stderr = run_cli("show", str(location), "--out", str(out), "--quiet", *options)
    assert code == 0, f"wdsprep show exited {code}: {stdout}{stderr}"
    return Page(out.read_text())


def make_shards(source_id: str, root: pathlib.Path) -> pathlib.Path:
    """`wdsprep pipeline` with the repository's `pipelines/<id>.toml` (its options, synthetic input,
    the same steps as `make shards`), the tree rooted at `root`: returns the shard directory."""
    spec = (REPO / "pipelines" / f"{source_id}.toml").read_text()
    tomllib.loads(spec)  # the spec as it is, only placed elsewhere
    (root / "pipelines").mkdir(parents=True, exist_ok=True)
    path = root / "pipelines" / f"{source_id}.toml"
    path.write_text(spec)
    code, stdout, stderr = run_cli("pipeline", str(path), "--quiet")
    assert code == 0, f"pipeline {source_id}: {stdout}{stderr}"
    return root / tomllib.loads(spec)["output"]


# ------------------------------------------------------------------------------------ the page
class Page(HTMLParser):
    """The report's samples, pictures (decoded), text panels and `data-count` numbers."""

    def __init__(self, text: str):
        super().__init__()
        self.text = text
        self.samples: list[dict] = []
        self.counts: list[dict] = []
        self.pictures: list[dict] = []
        self.texts: list[dict] = []
        self._stack: list[dict] = []  # open elements' attributes
        self._count: dict | None = None
        self._pre: dict | None = None
        self.feed(text)

    def _context(self, name: str):
        for attributes in reversed(self._stack):
            if name in attributes:
                return attributes[name]
        return None

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if tag not in ("img", "br", "meta"):
            self._stack.append(attributes)
        if "data-count" in attributes:
            self._count = {"name": attributes["data-count"], "split": self._context("data-split"),
                           "field": self._context("data-field"), "table": self._context("data-kind"), "text": ""}
        if tag == "div" and "data-index" in attributes:
            self.samples.append({"split": attributes["data-split"], "index": int(attributes["data-index"]),
                                 "key": attributes["data-key"], "shard": attributes["data-shard"]})
        if tag == "img":
            src = attributes["src"]
            assert src.startswith("data:image/png;base64,"), src[:40]
            self.pictures.append({
                "panel": attributes["data-panel"], "scale": int(attributes["data-scale"]),
                "step": int(attributes["data-step"]), "width": int(attributes["width"]), "height": int(attributes["height"]),
                "split": self._context("data-split"), "index": int(self._context("data-index")),
                "key": self._context("data-key"), "png": base64.b64decode(src.split(",", 1)[1])})
        if tag == "pre" and "data-panel" in attributes:
            self._pre = {"panel": attributes["data-panel"], "key": self._context("data-key"),
                         "index": int(self._context("data-index")), "text": ""}

    def handle_endtag(self, tag):
        if tag not in ("img", "br", "meta") and self._stack:
            self._stack.pop()
        if self._count is not None and tag in ("span", "td"):
            self._count["value"] = int(self._count["text"])
            self.counts.append(self._count)
            self._count = None
        if tag == "pre" and self._pre is not None:
            self.texts.append(self._pre)
            self._pre = None

    def handle_data(self, data):
        if self._count is not None:
            self._count["text"] += data
        if self._pre is not None:
            self._pre["text"] += data

    # -- lookups
    def count(self, name: str, split: str | None = None) -> int:
        found = [c["value"] for c in self.counts if c["name"] == name and c["split"] == split]
        assert len(found) == 1, (name, split, found)
        return found[0]

    def picture(self, panel: str, key: str | None = None) -> tuple[np.ndarray, int]:
        """(RGB pixels, scale) of the one picture `panel` (of sample `key`)."""
        from PIL import Image

        found = [p for p in self.pictures if p["panel"] == panel and (key is None or p["key"] == key)]
        assert len(found) == 1, (panel, key, [(p["panel"], p["key"]) for p in self.pictures][:20])
        image = np.asarray(Image.open(io.BytesIO(found[0]["png"])).convert("RGB"))
        assert image.shape[:2] == (found[0]["height"], found[0]["width"])
        assert found[0]["step"] == 1
        return image, found[0]["scale"]

    def panel_text(self, panel: str, key: str | None = None) -> str:
        found = [t["text"] for t in self.texts if t["panel"] == panel and (key is None or t["key"] == key)]
        assert len(found) == 1, (panel, key)
        return found[0]


def cells(image: np.ndarray, scale: int) -> np.ndarray:
    """The top-left pixel of every cell: (rows, cols, 3)."""
    return image[::scale, ::scale]


def light(rgb: np.ndarray) -> np.ndarray:
    return np.asarray(rgb, np.int64).mean(axis=-1) > 128


# ------------------------------------------------------------------------------------ known content
CUBE = (slice(5, 12), slice(3, 9), slice(8, 14))  # (d, h, w) of a 16^3 grid: holds the middle (8) of each axis


def voxels_with_a_cube(directory: pathlib.Path, monkeypatch) -> np.ndarray:
    """Native voxel data whose one object is the box `CUBE` in a 16^3 grid (the project's own synth,
    with its shape generator replaced): returns the grid."""
    import importlib

    synth_module = importlib.import_module("wdsprep.sources.voxels.synth")  # the package binds the function `synth`
    grid = np.zeros((16, 16, 16), bool)
    grid[CUBE] = True
    monkeypatch.setattr(synth_module, "make_object", lambda kind, resolution, rng: grid.copy())
    synth_module.synth(str(directory), 0, "small", base_resolution=16, min_resolution=4, num_objects=1,
                       samples_per_view=300, train_ratio=1.0, val_ratio=0.0)
    return grid


MINECRAFT_SIDE = 21
GROUND = 5  # y 0..5 stone


def minecraft_frame(water_x: int) -> np.ndarray:
    """A 21^3 frame: stone up to y=5, air above, water on top of column (water_x, 15), a wood
    pillar (y 6..9) at (10, 2), a dirt block under the water (so only a top view shows water)."""
    voxel = np.full((MINECRAFT_SIDE,) * 3, "air", dtype="<U11")
    voxel[:, : GROUND + 1, :] = "stone"
    voxel[water_x, GROUND + 1, 15] = "dirt"
    voxel[water_x, GROUND + 2, 15] = "water"
    voxel[10, GROUND + 1 : GROUND + 5, 2] = "wood"
    return np.asfortranarray(voxel)


def minecraft_with_known_blocks(directory: pathlib.Path) -> None:
    """One episode of two frames (one pair): water at x=3 in frame 0, at x=4 in frame 1."""
    from wdsprep.sources.minecraft.synth import write_frame

    episode = directory / "data" / "creative:0"
    write_frame(str(episode / "000000.npy"), np.array([1, 2, 0], np.int64), minecraft_frame(3))
    write_frame(str(episode / "000001.npy"), np.array([0, 0, 1], np.int32), minecraft_frame(4))


LABEL_BOX = (slice(3, 9), slice(4, 11), slice(2, 8))  # of a 12 x 14 x 10 volume: holds each axis' middle


def deepreg_with_a_label(directory: pathlib.Path) -> tuple[np.ndarray, np.ndarray]:
    """A paired NIfTI dataset (train: one pair) whose moving label is the box `LABEL_BOX`."""
    import nibabel as nib

    rng = np.random.default_rng(3)
    moving = rng.integers(0, 200, size=(12, 14, 10)).astype(np.uint8)
    label = np.zeros((12, 14, 10), np.uint8)
    label[LABEL_BOX] = 1
    fixed = rng.integers(0, 200, size=(10, 12, 8)).astype(np.uint8)
    fixed_label = np.zeros((10, 12, 8), np.uint8)
    fixed_label[2:7, 3:9, 1:6] = 1
    for role, array in (("moving_images", moving), ("moving_labels", label), ("fixed_images", fixed),
                        ("fixed_labels", fixed_label)):
        path = directory / "train" / role / "case0.nii.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        nib.Nifti1Image(array, np.eye(4)).to_filename(path)
    return moving, label


def copy_tree(source: pathlib.Path, destination: pathlib.Path) -> pathlib.Path:
    shutil.copytree(source, destination)
    return destination


def shard_layout(path: str) -> list[tuple[str, int, int]]:
    """(key, first byte, end byte) of each sample of a shard, from Python's own tarfile (an
    independent reader): a sample spans its members' headers, data and padding."""
    import tarfile

    spans: dict[str, list[int]] = {}
    order: list[str] = []
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            name = os.path.basename(member.name)
            if name.startswith("__"):
                continue
            key = name.split(".", 1)[0]
            end = member.offset_data + -(-member.size // 512) * 512
            if key not in spans:
                order.append(key)
                spans[key] = [member.offset, end]
            spans[key][1] = end
    return [(key, *spans[key]) for key in order]
