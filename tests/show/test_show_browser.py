"""Each source's `make shards` output (its pipelines/*.toml, run by `wdsprep pipeline` into a
temporary tree), reported by `wdsprep show` and opened in a real headless Chromium (Debian's
`chromium`, over the DevTools protocol): no console error or exception, no request other than the
file itself and its data: pictures, every picture decoded (natural size > 0, equal to its declared
size), the counts on the page equal to the manifest's, and a screenshot written next to the report.
Skips, saying why, only where no browser can run.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from wdsprep.sources.registry import NAMESPACES

from .browser import Browser, BrowserError, unavailable
from .showdata import make_shards, show

SAMPLES = 3


@pytest.fixture(scope="module")
def browser():
    reason = unavailable()
    if reason:
        pytest.skip(f"no browser can run here: {reason}")
    instance = Browser()
    try:
        instance.start()
    except BrowserError as error:
        instance.close()
        pytest.skip(f"no browser can run here: {error}")
    yield instance
    instance.close()


@pytest.mark.parametrize("source_id", NAMESPACES)  # every built-in source with a pipeline
def test_report_of_make_shards_output_in_chromium(source_id, browser, tmp_path):
    pytest.importorskip("PIL")
    shards = make_shards(source_id, tmp_path)
    manifest = json.loads((shards / "manifest.json").read_text())
    report = tmp_path / f"report-{source_id}.html"
    page = show(shards, report, "--samples", str(SAMPLES))
    loaded = browser.open(str(report))
    assert loaded.errors() == []
    requests = loaded.requests()
    assert requests[0] == f"file://{report}"
    assert all(url.startswith("data:image/png;base64,") for url in requests[1:]), [u for u in requests if not u.startswith("data:")]
    images = loaded.images()
    assert len(images) == len(page.pictures) > 0
    declared = {(p["panel"], str(p["index"])): (p["width"], p["height"]) for p in page.pictures}
    for image in images:
        assert image["complete"] and image["naturalWidth"] > 0 and image["naturalHeight"] > 0, image
        assert (image["naturalWidth"], image["naturalHeight"]) == declared[image["panel"], image["sample"]]
    counts = {(c["name"], c["split"]): c["value"] for c in loaded.counts() if c["field"] is None}
    assert counts["splits", None] == len(manifest["splits"])
    assert counts["shards", None] == manifest["totals"]["shards"]
    assert counts["samples", None] == manifest["totals"]["samples"]
    assert counts["bytes", None] == manifest["totals"]["bytes"]
    assert counts["problems", None] == len(manifest["problems"])
    for split, entry in manifest["splits"].items():
        assert counts["split-shards", split] == len(entry["shards"])
        assert counts["split-samples", split] == entry["samples"]
        assert counts["split-bytes", split] == entry["bytes"]
        assert counts["drawn", split] == min(SAMPLES, entry["samples"])
    drawn = loaded.samples()
    assert len(drawn) == sum(min(SAMPLES, entry["samples"]) for entry in manifest["splits"].values())
    assert all(sample["problems"] == 0 for sample in drawn)
    screenshot = report.with_suffix(".png")
    browser.screenshot(str(screenshot))
    from PIL import Image

    with Image.open(screenshot) as shot:
        pixels = np.asarray(shot.convert("RGB"))
    assert pixels.shape[:2] == (1600, 1280)
    assert len(np.unique(pixels.reshape(-1, 3)[::7], axis=0)) > 20  # text and pictures, not a blank page
