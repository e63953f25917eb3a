"""Picking and fetching: samples are drawn by the seed, found by the manifest's counts, and only
their bytes are read, locally, over HTTP and from S3; one clear line for what does not exist.

Expected byte ranges come from Python's own `tarfile` reading the shards (an independent reader),
the request logs from the test servers (`wdsprep.testing`).
"""
from __future__ import annotations

import io
import json
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wdsprep.commands.show import build_report
from wdsprep.show.report import pick
from wdsprep.testing import RangeHTTPServer

from .showdata import run_cli, shard_layout, show

pytest.importorskip("PIL")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """60 + 9 generic samples in shards of about 4 samples."""
    from wdsprep.sources.generic import SOURCE

    root = tmp_path_factory.mktemp("show_fetch")
    SOURCE.synth(str(root / "input"), seed=5, samples=60, splits={"train": 60, "valid": 9})
    code, out, err = run_cli("convert", "generic", str(root / "input"), str(root / "shards"), "--shard-bytes", "64KB", "--quiet")
    assert code == 0, err
    return root / "shards"


def _layouts(shards, split):
    """Per shard of the split (manifest order): (name, [(key, first byte, end byte)], size)."""
    manifest = json.loads((shards / "manifest.json").read_text())
    return [(row["name"], shard_layout(str(shards / row["name"])), row["bytes"], row.get("index_offset"))
            for row in manifest["splits"][split]["shards"]]


def _expected_requests(shards, split, numbers):
    """The Range headers a reader of only these samples sends: each touched shard's index tail, and
    each sample's own bytes."""
    expected, keys, flat = set(), {}, []
    for name, layout, size, index_offset in _layouts(shards, split):
        for key, first, end in layout:
            flat.append((name, key, first, end, index_offset, size))
    for number in numbers:
        name, key, first, end, index_offset, size = flat[number]
        keys[number] = (key, name)
        expected.add((name, f"bytes={index_offset}-{size - 1}"))
        expected.add((name, f"bytes={first}-{end - 1}"))
    return expected, keys


def test_http_fetches_the_index_and_the_drawn_samples_only(shards, tmp_path):
    with RangeHTTPServer(shards) as server:
        page = show(f"{server.url}/manifest.json", tmp_path / "report.html", "--split", "train", "--samples", "5", "--seed", "7")
        log = list(server.requests)
    drawn = sorted(sample["index"] for sample in page.samples)
    assert len(drawn) == 5
    expected, keys = _expected_requests(shards, "train", drawn)
    assert [(r["name"], r["range"]) for r in log if not r["name"].endswith(".tar")] == [("manifest.json", None)]
    got = [(r["name"], r["range"]) for r in log if r["name"].endswith(".tar")]
    assert sorted(got) == sorted(expected)  # each once: one index read per shard, one read per sample
    assert all(r["status"] in (200, 206) for r in log)
    for sample in page.samples:
        assert (sample["key"], sample["shard"]) == keys[sample["index"]]
    index_tails = {(name, f"bytes={index_offset}-{size - 1}") for name, _, size, index_offset in _layouts(shards, "train")}
    asked = sum(int(b) - int(a) + 1 for request in got if request not in index_tails for a, b in [request[1][6:].split("-")])
    sample_bytes = sum(end - first for _, layout, _, _ in _layouts(shards, "train") for key, first, end in layout
                       if key in {k for k, _ in keys.values()})
    assert asked == sample_bytes


def test_s3_fetches_the_index_and_the_drawn_samples_only(shards, tmp_path, s3_server, monkeypatch):
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    bucket = s3_server.create_bucket("show-fetch")
    code, out, err = run_cli("upload", str(shards), f"s3://{bucket}/data", "--quiet")
    assert code == 0, err
    s3_server.clear_log()
    page = show(f"s3://{bucket}/data", tmp_path / "report.html", "--split", "train", "--samples", "4", "--seed", "11")
    gets = [(r["key"].rsplit("/", 1)[-1], r["range"]) for r in s3_server.requests if r["method"] == "GET" and r["key"]]
    drawn = sorted(sample["index"] for sample in page.samples)
    expected, keys = _expected_requests(shards, "train", drawn)
    assert sorted(g for g in gets if g[0].endswith(".tar")) == sorted(expected)
    assert [g for g in gets if not g[0].endswith(".tar")] == [("manifest.json", None)]
    local = show(str(shards), tmp_path / "local.html", "--split", "train", "--samples", "4", "--seed", "11")
    assert page.samples == local.samples  # the same samples, wherever the shards are
    assert [p["png"] for p in page.pictures] == [p["png"] for p in local.pictures]


def test_the_seed_draws_the_samples(shards, tmp_path):
    first = show(str(shards), tmp_path / "a.html", "--samples", "5", "--seed", "1")
    again = show(str(shards), tmp_path / "b.html", "--samples", "5", "--seed", "1")
    other = show(str(shards), tmp_path / "c.html", "--samples", "5", "--seed", "2")
    assert first.text == again.text  # the same page, byte for byte
    picked = lambda page, split: [s["index"] for s in page.samples if s["split"] == split]  # noqa: E731
    assert picked(first, "train") != picked(other, "train")
    assert picked(first, "train") != list(range(5))
    assert sorted(picked(first, "train")) == picked(first, "train") and len(set(picked(first, "train"))) == 5
    assert picked(first, "valid") != picked(first, "train")  # each split its own draw
    # every picked sample is the one at that place in the split (tarfile's order of the shards)
    flat = [key for _, layout, _, _ in _layouts(shards, "train") for key, _, _ in layout]
    for sample in first.samples:
        if sample["split"] == "train":
            assert sample["key"] == flat[sample["index"]]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=12), st.integers(0, 40), st.integers(0, 2**32 - 1))
def test_pick_against_brute_force(counts, count, seed):
    total = sum(counts)
    numbers = pick(total, count, seed, "train")
    assert numbers == sorted(set(numbers)) and len(numbers) == min(count, total)
    assert all(0 <= n < total for n in numbers)
    assert numbers == pick(total, count, seed, "train")


def test_pick_draws_all_when_asked_for_more():
    assert pick(7, 100, 3, "x") == list(range(7))
    assert pick(0, 5, 3, "x") == [] and pick(9, 0, 3, "x") == []


def test_progress_line_on_a_terminal(shards):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    report = build_report(str(shards), ["train"], 3, 0, stream=stream)
    assert len(report.drawn) == 3
    lines = stream.getvalue()
    assert "show [" in lines and "3/3" in lines


@pytest.mark.parametrize("where, message", [
    ("{tmp}/nowhere", "nowhere/manifest.json: cannot read manifest"),
    ("{http}/missing/manifest.json", "missing/manifest.json: cannot read manifest"),
])
def test_a_location_that_does_not_exist_is_one_line(where, message, shards, tmp_path):
    with RangeHTTPServer(shards) as server:
        location = where.format(tmp=tmp_path, http=server.url)
        code, out, err = run_cli("show", location, "--out", str(tmp_path / "r.html"))
    assert code == 1
    assert err.count("\n") == 1 and err.startswith("wdsprep: error: ") and message in err, err
    assert "Traceback" not in err and not (tmp_path / "r.html").exists()


def test_a_split_that_does_not_exist_is_one_line(shards, tmp_path):
    code, out, err = run_cli("show", str(shards), "--split", "nope", "--out", str(tmp_path / "r.html"))
    assert code == 1
    assert err.count("\n") == 1 and "no split 'nope'" in err and "train, valid" in err, err
    assert not (tmp_path / "r.html").exists()


def test_without_pillow_it_says_which_extra_to_install(shards, tmp_path, monkeypatch):
    for name in [name for name in sys.modules if name == "PIL" or name.startswith("PIL.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "PIL", None)  # `import PIL` raises ImportError, as when it is not installed
    code, out, err = run_cli("show", str(shards), "--out", str(tmp_path / "r.html"))
    assert code == 1
    assert err.count("\n") == 1 and "pip install 'wdsprep[show]'" in err and "Pillow" in err, err
    assert not (tmp_path / "r.html").exists()


def test_a_sample_that_cannot_be_drawn_is_shown_and_fails_the_command(shards, tmp_path, monkeypatch):
    from wdsprep.sources.base import Source

    original = Source.show

    def flaky(self, sample, context):
        if context.index == 2:
            raise ValueError("broken member")
        return original(self, sample, context)

    monkeypatch.setattr(Source, "show", flaky)
    code, out, err = run_cli("show", str(shards), "--split", "valid", "--samples", "9", "--out", str(tmp_path / "r.html"))
    assert code == 1
    assert "could not draw" in err and "broken member" in err and "sample 'sample000002'" in err
    text = (tmp_path / "r.html").read_text()
    assert text.count('class="problem"') == 1 and text.count("class=sample ") == 9


def test_field_table_over_the_shown_samples(shards, tmp_path):
    page = show(str(shards), tmp_path / "r.html", "--split", "valid", "--samples", "9")
    arrays = [np.load(shards.parent / "input" / "valid" / f"sample{i:06d}.array.npy") for i in range(9)]
    text = page.text
    row = text[text.index('data-kind="training"'):]
    row = row[row.index('<tr data-field="array">'):row.index("</tr>", row.index('<tr data-field="array">'))]
    cells = [c.split(">", 1)[1] for c in row.split("</td>")[:-1]]
    assert cells[1] == "float32" and cells[2] == "(4096,)"
    values = np.concatenate(arrays).astype(np.float64)
    assert float(cells[3]) == pytest.approx(values.min(), rel=1e-5)
    assert float(cells[4]) == pytest.approx(values.max(), rel=1e-5)
    assert float(cells[5]) == pytest.approx(values.mean(), rel=1e-4, abs=1e-6)
    assert cells[6] == "9"


def test_a_bounded_range_read_resumes_within_its_range_after_a_drop(shards, monkeypatch):
    from wdsprep.storage import read_range, resuming

    monkeypatch.setattr(resuming, "MAX_DELAY", 0.05)
    name = json.loads((shards / "manifest.json").read_text())["splits"]["train"]["shards"][1]["name"]
    data = (shards / name).read_bytes()
    with RangeHTTPServer(shards) as server:
        server.drop_once(name, 700)
        got = read_range(server.url_of(name), 1000, 5000)
        assert got == data[1000:6000]
        ranges = [r["range"] for r in server.requests]
        assert ranges == ["bytes=1000-5999", "bytes=1700-5999"]  # the rest of the range, no more
        assert read_range(server.url_of(name), len(data) - 10, 100) == data[-10:]  # past the end: what there is
    assert read_range(str(shards / name), 1000, 5000) == data[1000:6000]
