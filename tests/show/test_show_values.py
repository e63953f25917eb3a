"""`wdsprep show` on awkward values: empty arrays (docs/format.md's way to write an absent value)
drawn as text, integer statistics exact, and any Python int as the seed. Expected numbers come from
Python's own integers and `fractions.Fraction`, never from the report's code."""
from __future__ import annotations

import zlib
from fractions import Fraction

import numpy as np
import pytest

from wdsprep.show.model import ShowContext
from wdsprep.show.report import pick

from .showdata import run_cli, show

pytest.importorskip("PIL")


def _convert(tmp_path, fields: dict[str, list[np.ndarray]]):
    """A generic dataset, one sample per list entry, converted by the CLI; returns the shard directory."""
    split = tmp_path / "native" / "train"
    split.mkdir(parents=True)
    for name, values in fields.items():
        for i, value in enumerate(values):
            np.save(split / f"s{i:03d}.{name}.npy", value)
    code, _, err = run_cli("convert", "generic", str(tmp_path / "native"), str(tmp_path / "shards"), "--quiet")
    assert code == 0, err
    return tmp_path / "shards"


def _field_row(text: str, kind: str, name: str) -> list[str]:
    """The cells of field `name` in the page's table `kind` ("training" or "stored")."""
    table = text[text.index(f'data-kind="{kind}"'):]
    start = table.index(f'<tr data-field="{name}">')
    row = table[start:table.index("</tr>", start)]
    return [cell.split(">", 1)[1] for cell in row.split("</td>")[:-1]]


def test_empty_arrays_are_drawn_as_text(tmp_path):
    shapes = {"absent": (5, 0), "none": (0,), "flat": (3, 0, 4), "deep": (2, 0, 3, 4)}
    shards = _convert(tmp_path, {name: [np.zeros(shape, np.int64)] for name, shape in shapes.items()}
                      | {"image": [np.arange(12, dtype=np.float32).reshape(3, 4)]})
    code, out, err = run_cli("show", str(shards), "--out", str(tmp_path / "r.html"), "--quiet")
    assert code == 0 and err == "", err
    from .showdata import Page

    page = Page((tmp_path / "r.html").read_text())
    for name, shape in shapes.items():
        assert page.panel_text(name) == f"empty array, int64 {shape}"
        cells = _field_row(page.text, "training", name)
        assert cells[1] == "int64" and cells[2] == "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"
        assert cells[3:6] == ["", "", ""]  # no value: no min, max or mean
    assert [p["panel"] for p in page.pictures] == ["image"]  # the other field still drawn


def test_a_source_picture_of_no_cells_is_text():
    from wdsprep.show.picture import picture

    panel = picture("p", "title", np.zeros((0, 7, 3), np.uint8), "caption")
    assert panel.image is None and panel.text == "nothing to draw: 0 x 7 cells" and panel.caption == "caption"


INT64_EXTREMES = [-2**63, 0, 2**63 - 1, 5]


@pytest.mark.parametrize("values, dtype, mean, mean_text", [
    ([INT64_EXTREMES], np.int64, Fraction(1), "1"),                               # float64 says 1.25
    ([[2**63 - 1, 2**63 - 1], [-2**63, -2**63, 1]], np.int64, Fraction(-1, 5), "-0.2"),  # float64 says 0.2
    ([[2**64 - 1, 2**64 - 1]], np.uint64, Fraction(2**64 - 1), str(2**64 - 1)),  # float64 says 1.84467e+19
    ([[2**62, 2**62 + 1]], np.int64, Fraction(2**63 + 1, 2), "4.61169e+18"),      # 4611686018427387904.5, 6 digits
])
def test_integer_statistics_are_exact(tmp_path, values, dtype, mean, mean_text):
    shards = _convert(tmp_path, {"big": [np.array(v, dtype) for v in values]})
    page = show(str(shards), tmp_path / "r.html", "--samples", str(len(values)))
    every = [int(v) for sample in values for v in sample]
    assert Fraction(sum(every), len(every)) == mean  # the reference, in Python ints
    for kind, field in (("training", "big"), ("stored", "big.npy.zst")):
        cells = _field_row(page.text, kind, field)
        assert cells[1] == np.dtype(dtype).name
        assert (int(cells[3]), int(cells[4])) == (min(every), max(every))
        assert cells[5] == mean_text


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    root = tmp_path_factory.mktemp("show_seed")
    return _convert(root, {"x": [np.array([i]) for i in range(60)]})


def _picked(page) -> list[int]:
    return [sample["index"] for sample in page.samples]


@pytest.mark.parametrize("seed, other", [(5, 5 + 2**32), (5, 5 + 2**40), (-3, 2**32 - 3), (-7, 7), (2**70, 2**70 + 2**64), (-2**100, 2**100)])
def test_seeds_that_differ_above_32_bits_or_in_sign_draw_differently(many, tmp_path, seed, other):
    first = show(str(many), tmp_path / "a.html", "--samples", "6", "--seed", str(seed))
    second = show(str(many), tmp_path / "b.html", "--samples", "6", "--seed", str(other))
    assert _picked(first) != _picked(second)
    assert f"seed {seed}" in first.text and f"seed {other}" in second.text
    again = show(str(many), tmp_path / "c.html", "--samples", "6", "--seed", str(seed))
    assert _picked(again) == _picked(first)


def test_seeds_below_2_to_the_32_draw_as_before():
    """A seed in [0, 2**32) seeds numpy with [seed, crc32(split)], as earlier releases did."""
    for seed in (0, 1, 124, 2**32 - 1):
        rng = np.random.default_rng([seed, zlib.crc32(b"train")])
        assert pick(1000, 7, seed, "train") == sorted(int(i) for i in rng.choice(1000, size=7, replace=False))


def test_a_source_rng_takes_any_seed():
    draws = {seed: ShowContext(None, "train", 3, seed).rng().integers(2**62) for seed in (1, -1, 1 + 2**32, 2**80)}
    assert len(set(draws.values())) == 4
    assert ShowContext(None, "train", 3, -1).rng().integers(2**62) == draws[-1]
