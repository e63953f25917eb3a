"""The pictures are right, not just present: data with known content goes through the user's path
(native files -> `wdsprep convert` -> `wdsprep show`) and the decoded pixels of the page's pictures
are compared with what the known content must look like. A blank, transposed, mirrored or
unoutlined picture fails.

Orientation (the report's one rule): the mid-slice across axis 0 has rows = axis 1, columns =
axis 2; across axis 1 rows = axis 0, columns = axis 2; across axis 2 rows = axis 0, columns =
axis 1. Minecraft's view from above has rows = x, columns = z.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("PIL")

from .showdata import (CUBE, LABEL_BOX, Page, cells, deepreg_with_a_label, light, minecraft_with_known_blocks, run_cli,
                       show, voxels_with_a_cube)

HIT_RED = lambda rgb: (rgb[..., 0] > 180) & (rgb[..., 1] < 90) & (rgb[..., 2] < 90)  # noqa: E731
YELLOW = lambda rgb: (rgb[..., 0] > 200) & (rgb[..., 1] > 150) & (rgb[..., 2] < 80)  # noqa: E731


def _expected_slice(grid: np.ndarray, axis: int) -> np.ndarray:
    """The mid-slice by the orientation rule, written out per axis (no np.take, no moveaxis)."""
    middle = grid.shape[axis] // 2
    return {0: grid[middle, :, :], 1: grid[:, middle, :], 2: grid[:, :, middle]}[axis]


@pytest.fixture(scope="module")
def voxel_page(tmp_path_factory):
    monkeypatch = pytest.MonkeyPatch()
    root = tmp_path_factory.mktemp("show_voxels")
    try:
        grid = voxels_with_a_cube(root / "native", monkeypatch)
    finally:
        monkeypatch.undo()
    code, out, err = run_cli("convert", "voxels", str(root / "native"), str(root / "shards"), "--quiet")
    assert code == 0, err
    page = show(root / "shards", root / "report.html", "--samples", "1000")
    return grid, page, json.loads((root / "shards" / "manifest.json").read_text())


def test_voxel_cube_mid_slices_dense_and_coo(voxel_page):
    grid, page, manifest = voxel_page
    objects = [sample for sample in page.samples if sample["key"].startswith("l0_")]
    assert len(objects) == 1, page.samples  # the one level-0 object (16^3), every sample drawn
    key = objects[0]["key"]
    for kind in ("dense", "coo"):
        for axis in range(3):
            image, scale = page.picture(f"{kind}/axis{axis}", key)
            assert scale == 16  # 256 px for 16 cells
            expected = _expected_slice(grid, axis)
            assert expected.any() and not expected.all()
            np.testing.assert_array_equal(light(cells(image, scale)), expected, err_msg=f"{kind} axis {axis}")


def test_voxel_hits_lie_on_occupied_cells_and_are_drawn(voxel_page):
    grid, page, _ = voxel_page
    key = next(sample["key"] for sample in page.samples if sample["key"].startswith("l0_"))
    image, scale = page.picture("hits/axis0", key)
    projection = grid.any(axis=0)
    np.testing.assert_array_equal(light(cells(image, scale)), projection)
    red = HIT_RED(image)
    assert red.sum() > 0, "no first hit drawn"
    rows, cols = np.nonzero(red)
    assert projection[rows // scale, cols // scale].all(), "a hit drawn on an empty cell"
    # the first hits of rays coming from every side cover each visible face of the box: hits fall on
    # the projection's boundary rows and columns as well as inside it
    hit_cells = np.zeros_like(projection)
    hit_cells[rows // scale, cols // scale] = True
    assert hit_cells.sum() >= 10
    for axis in range(3):  # in-slice hits: on occupied cells of that slice
        image, scale = page.picture(f"dense/axis{axis}", key)
        rows, cols = np.nonzero(HIT_RED(image))
        assert _expected_slice(grid, axis)[rows // scale, cols // scale].all()


def test_voxel_summary_counts_the_graph(voxel_page):
    grid, page, _ = voxel_page
    key = next(sample["key"] for sample in page.samples if sample["key"].startswith("l0_"))
    text = page.panel_text("summary", key)
    d, h, w = (s.stop - s.start for s in CUBE)
    # 6-connectivity, both directions: 2 x (edges along d + along h + along w) of a solid box
    edges = 2 * ((d - 1) * h * w + d * (h - 1) * w + d * h * (w - 1))
    assert f"{edges} edges" in text
    assert f"occupied   {int(grid.sum())} voxels" in text


def test_minecraft_known_blocks_seen_from_above(tmp_path):
    minecraft_with_known_blocks(tmp_path / "native")
    code, out, err = run_cli("convert", "minecraft", str(tmp_path / "native"), str(tmp_path / "shards"), "--quiet")
    assert code == 0, err
    page = show(tmp_path / "shards", tmp_path / "report.html")
    assert len(page.samples) == 1
    water, stone, wood = (30, 144, 255), (125, 125, 125), (166, 124, 82)  # upstream color.json
    for panel, water_x in (("voxel/top", 3), ("target/top", 4)):  # the pair's two frames
        image, scale = page.picture(panel)
        top = cells(image, scale)
        assert top.shape[:2] == (21, 21)
        expected = np.empty((21, 21, 3), np.uint8)
        expected[...] = stone
        expected[water_x, 15] = water  # rows = x, columns = z
        expected[10, 2] = wood
        np.testing.assert_array_equal(top, expected, err_msg=panel)
    assert page.panel_text("action") == "straight: forward\npan: right\njump: noop\n"
    assert "water" in page.panel_text("legend") and "#1e90ff" in page.panel_text("legend")


def _ring(mask: np.ndarray) -> np.ndarray:
    """Cells of the mask with a 4-neighbour outside it, by an explicit loop (an independent outline)."""
    out = np.zeros_like(mask, dtype=bool)
    rows, cols = mask.shape
    for r in range(rows):
        for c in range(cols):
            if mask[r, c]:
                neighbours = [(r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)]
                out[r, c] = any(not (0 <= i < rows and 0 <= j < cols) or not mask[i, j] for i, j in neighbours)
    return out


def test_deepreg_label_outline_has_the_label_extent(tmp_path):
    moving, label = deepreg_with_a_label(tmp_path / "native")
    code, out, err = run_cli("convert", "deepreg", str(tmp_path / "native"), str(tmp_path / "shards"), "--quiet")
    assert code == 0, err
    page = show(tmp_path / "shards", tmp_path / "report.html")
    assert len(page.samples) == 1
    for axis in range(3):
        image, scale = page.picture(f"moving/axis{axis}")
        top = cells(image, scale)
        ring = _ring(_expected_slice(label, axis) > 0)
        assert ring.sum() > 4
        np.testing.assert_array_equal(YELLOW(top), ring, err_msg=f"outline, axis {axis}")
        # every other cell is the image, min/max-normalised to grey
        grey = ~ring
        assert (top[grey][:, 0] == top[grey][:, 1]).all() and (top[grey][:, 1] == top[grey][:, 2]).all()
        plane = _expected_slice(moving.astype(np.float64), axis)
        level = np.round((plane - moving.min()) / (moving.max() - moving.min()) * 255)
        np.testing.assert_allclose(top[..., 0][grey], level[grey], atol=1)
    box = [s.stop - s.start for s in LABEL_BOX]
    assert box == [6, 7, 6]


def test_default_pictures_by_rank_for_a_source_without_its_own(tmp_path):
    """generic draws through the base class's default hook: 2-D image, 3-D mid-slices, 1-D plot, text."""
    split = tmp_path / "native" / "train"
    split.mkdir(parents=True)
    image = np.zeros((6, 9), np.float32)
    image[1, 7] = 5.0  # one bright cell, off the diagonal
    volume = np.zeros((5, 7, 9), np.int16)
    volume[2, 1:3, 6:8] = 9
    volume[:, 3, 4] = 4
    np.save(split / "a.picture.npy", image)
    np.save(split / "a.volume.npy", volume)
    np.save(split / "a.series.npy", np.linspace(0, 1, 50, dtype=np.float32))
    (split / "a.meta.json").write_text(json.dumps({"label": "cat", "size": 3}))
    code, out, err = run_cli("convert", "generic", str(tmp_path / "native"), str(tmp_path / "shards"), "--quiet")
    assert code == 0, err
    page = show(tmp_path / "shards", tmp_path / "report.html")
    shown, scale = page.picture("picture")
    expected = np.zeros((6, 9), bool)
    expected[1, 7] = True
    np.testing.assert_array_equal(light(cells(shown, scale)), expected)
    for axis in range(3):
        shown, scale = page.picture(f"volume/axis{axis}")
        grey = cells(shown, scale)[..., 0].astype(int)
        expected = np.round(_expected_slice(volume.astype(float), axis) / 9 * 255)  # one scale per volume
        np.testing.assert_allclose(grey, expected, atol=1)
    plot, _ = page.picture("series")
    assert len(np.unique(plot.reshape(-1, 3), axis=0)) >= 3  # background, frame, line
    assert json.loads(page.panel_text("meta")) == {"label": "cat", "size": 3}


def test_page_counts_equal_the_manifest(voxel_page):
    _, page, manifest = voxel_page
    assert page.count("splits") == len(manifest["splits"])
    assert page.count("shards") == manifest["totals"]["shards"]
    assert page.count("samples") == manifest["totals"]["samples"]
    assert page.count("bytes") == manifest["totals"]["bytes"]
    assert page.count("input-bytes") == manifest["input_bytes"]
    assert page.count("problems") == len(manifest["problems"])
    for split, entry in manifest["splits"].items():
        assert page.count("split-shards", split) == len(entry["shards"])
        assert page.count("split-samples", split) == entry["samples"]
        assert page.count("split-bytes", split) == entry["bytes"]
        assert page.count("drawn", split) == entry["samples"]  # --samples 1000: every sample
        assert sorted(s["index"] for s in page.samples if s["split"] == split) == list(range(entry["samples"]))


def test_the_page_is_self_contained(voxel_page):
    _, page, _ = voxel_page
    text = page.text.lower()
    assert "<script" not in text and "http://" not in text and "https://" not in text and "<link" not in text
    assert all(picture["png"].startswith(b"\x89PNG") for picture in page.pictures)
    assert isinstance(page, Page)


def test_a_plugin_source_is_drawn_by_the_base_class_default(tmp_path):
    plugin = "tests.core.plugin_source:SOURCE"
    assert run_cli("synth", plugin, str(tmp_path / "native"), "--seed", "3")[0] == 0
    code, out, err = run_cli("convert", plugin, str(tmp_path / "native"), str(tmp_path / "shards"), "--quiet")
    assert code == 0, err
    page = show(tmp_path / "shards", tmp_path / "report.html", "--split", "train", "--samples", "2", "--plugin", plugin)
    assert "<th>note</th>" not in page.text  # the plugin the user named draws: nothing to note
    lines = {line.split()[0]: [int(v) for v in line.split()[1:]]
             for line in (tmp_path / "native" / "train.txt").read_text().splitlines()}
    for sample in page.samples:
        plot, _ = page.picture("values", sample["key"])
        blue = (plot[..., 2] > 150) & (plot[..., 0] < 100)
        assert blue.any(), "no line drawn"
        values = lines[sample["key"]]
        if max(values) > min(values):  # the line spans the plot's height: min at the bottom, max at the top
            rows = np.nonzero(blue.any(axis=1))[0]
            assert rows.min() <= 3 and rows.max() >= plot.shape[0] - 4
        assert "line" in json.loads(page.panel_text("meta", sample["key"]))
    # without --plugin the manifest's plugin is not loaded: drawn by rank all the same, and the page says so
    unnamed = show(tmp_path / "shards", tmp_path / "unnamed.html", "--split", "train", "--samples", "2")
    assert "<th>note</th>" in unnamed.text and f"--plugin {plugin}" in unnamed.text
    assert [p["png"] for p in unnamed.pictures] == [p["png"] for p in page.pictures]
    # a manifest whose source is not installed here: drawn by rank, the page says so
    manifest = json.loads((tmp_path / "shards" / "manifest.json").read_text())
    manifest["source"] = "not_installed_here:SOURCE"
    (tmp_path / "shards" / "manifest.json").write_text(json.dumps(manifest))
    page = show(tmp_path / "shards", tmp_path / "other.html", "--split", "train", "--samples", "2")
    assert "--plugin not_installed_here:SOURCE" in page.text
    assert len([p for p in page.pictures if p["panel"] == "values"]) == 2


def test_every_builtin_source_with_a_pipeline_draws_its_own():
    from wdsprep.sources.base import Source
    from wdsprep.sources.registry import NAMESPACES, load_source

    from tests.conftest import REPO

    assert Source.show_with is None  # the base class's default: every field by its rank
    for source_id in NAMESPACES:
        source = load_source(source_id)
        assert source.show_with == f"wdsprep.sources.{source_id}.show:show", source_id
        assert (REPO / "src" / "wdsprep" / "sources" / source_id / "show.py").is_file()
