"""The report of `wdsprep show`: pick samples by seed, fetch only them, draw them, one self-contained HTML page.

Picking. Per split, `pick(total, count, seed, split)` draws `count` distinct sample numbers of the
split (0 .. total-1, in manifest order) with a generator seeded by (seed, crc32(split)), sorted:
the same seed gives the same samples on any machine, another seed other samples. The seed is any
Python int, never cut to 32 bits (`model.seed_sequence`).

Fetching. By the one checked random read, `wdsprep.MapDataset` over the split (stream/mapdataset.py,
stream/reading/access.py): a split number located with the manifest's per-shard counts (no shard
read), each touched shard's index read once (one read of its tail: one bounded Range request
remotely), then each picked sample alone (one bounded read of exactly its bytes, checked against the
index's digests). Nothing else of the shard is read, locally or over http(s)/s3. (A local shard
without an index, from an older manifest, is hashed whole against its row first and indexed in
memory; a remote one is refused with the line naming `wdsprep reindex`.)

Drawing. Each raw sample goes to the drawing hook the caller chose for the manifest's source
(`build_report`'s `hook_for`: `wdsprep.commands.show` gives the source's own `Source.show` when the
plugin gate allows it, else the default hook of `defaults.py`, by rank, with a note the page shows;
this package never loads a source itself). An array with no element is drawn as text. A sample
that cannot be drawn is shown as a problem box naming it, and `wdsprep show` exits non-zero. The
field table's integer statistics are exact (Python ints; the mean a fraction, shown correctly
rounded).

The page. Inline CSS, pictures as `data:image/png;base64` URIs, no script, no external reference:
it opens offline and can be attached to a ticket. Counts carry `data-count` attributes and
pictures `data-panel`, `data-scale`, `data-step` (see `picture`), so tests read them off the page.
Written atomically (`storage.files.write_atomically`: a temporary name beside `out`, renamed when
complete); an `out` that exists and is not a regular file (a device, a FIFO, a symlink) is refused
before any work, never replaced.
"""
from __future__ import annotations

import base64
import decimal
import html
import json
import os
import zlib
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable, Iterator

import numpy as np

from ..errors import ConfigError
from ..progress import Progress, human_bytes
from .model import Panel, ShowContext, Shown, seed_sequence
from .picture import as_numpy, png_bytes, require_pillow


# ------------------------------------------------------------------------------------ picking
def pick(total: int, count: int, seed: int, split: str) -> list[int]:
    """`min(count, total)` distinct sample numbers of a split, drawn by (seed, split), sorted."""
    if count <= 0 or total <= 0:
        return []
    rng = np.random.default_rng(seed_sequence(seed, zlib.crc32(split.encode())))
    return sorted(int(i) for i in rng.choice(total, size=min(count, total), replace=False))


def _picks(manifest, split: str, count: int, seed: int, selection) -> list[int]:
    """The split numbers drawn: `pick` over the split, or over the samples a selection keeps."""
    if selection is None:
        return pick(manifest.samples(split), count, seed, split)
    from ..stream.planning.catalog import Catalog

    kept = Catalog(manifest, split, selection).positions()
    return [int(kept[i]) for i in pick(len(kept), count, seed, split)]


def fetch(manifest, split: str, numbers: list[int]) -> Iterator[tuple[int, str, dict]]:
    """(split number, shard url, raw sample) of each picked number, reading only those samples: each
    alone, by the one checked random read (`wdsprep.MapDataset` over the whole split, raw)."""
    from ..stream.mapdataset import MapDataset

    data = MapDataset(manifest, split, decode=False)
    try:
        for number in numbers:
            raw = data.read([number])[0]
            yield number, raw["__url__"], raw
    finally:
        data.close()


# ------------------------------------------------------------------------------------ field table
SUM_CHUNK = 1 << 31  # elements summed at once: the 32-bit halves of 2**31 int64s cannot overflow


def exact_sum(array: np.ndarray) -> int:
    """The exact sum of an integer or boolean array, as a Python int (numpy's own sum wraps at 64
    bits): each 64-bit value is split into its high and low 32 bits, summed apart, then joined."""
    flat, total = array.reshape(-1), 0
    for start in range(0, flat.size, SUM_CHUNK):
        part = flat[start : start + SUM_CHUNK]
        if part.dtype == bool or part.dtype.itemsize < 8:
            total += int(part.sum(dtype=np.int64))
        else:
            total += (int((part >> 32).sum(dtype=part.dtype)) << 32) + int((part & 0xFFFFFFFF).sum(dtype=np.uint64))
    return total


@dataclass
class FieldStats:
    """One field over the shown samples: kinds (dtype or type), shapes, numeric min/max/mean.

    Integers and booleans are counted exactly, as Python ints (min, max, sum; the mean a `Fraction`):
    an int64 field holding -2**63 and 2**63-1 has its true mean, not a float64 rounding of it.
    Floats are taken in float64 over their finite values."""

    present: int = 0
    kinds: list = field(default_factory=list)
    shapes: list = field(default_factory=list)
    low: int | float | None = None
    high: int | float | None = None
    integer_total: int = 0
    float_total: float = 0.0
    values: int = 0
    floats: bool = False  # some values were floats: the mean is a float

    def add(self, value: Any) -> None:
        value = as_numpy(value)
        self.present += 1
        shape = None
        if isinstance(value, np.ndarray):
            names = value.dtype.names
            kind, shape = (f"record({', '.join(names)})" if names else str(value.dtype)), tuple(value.shape)
            if value.dtype.kind in "biu":
                self._add_integers(value)
            elif value.dtype.kind == "f":
                self._add_floats(value)
        elif isinstance(value, (bool, int, np.integer, np.bool_)):
            kind, shape = type(value).__name__, ()
            self._extend(int(value), int(value), 1)
            self.integer_total += int(value)
        elif isinstance(value, (float, np.floating)):
            kind, shape = type(value).__name__, ()
            self._add_floats(np.asarray([value], np.float64))
        else:
            kind = type(value).__name__
        if kind not in self.kinds:
            self.kinds.append(kind)
        if shape is not None:
            self.shapes.append(shape)

    def _add_integers(self, data: np.ndarray) -> None:
        if data.size:
            self._extend(int(data.min()), int(data.max()), data.size)
            self.integer_total += exact_sum(data)

    def _add_floats(self, data: np.ndarray) -> None:
        finite = data[np.isfinite(data)].astype(np.float64)
        if finite.size:
            self._extend(float(finite.min()), float(finite.max()), finite.size)
            self.float_total += float(finite.sum())
            self.floats = True

    def _extend(self, low, high, count: int) -> None:
        self.low = low if self.low is None else min(self.low, low)
        self.high = high if self.high is None else max(self.high, high)
        self.values += int(count)

    def shape_text(self) -> str:
        """`(1, 16..128, 16..128)`: per axis the range over the samples; ranks that differ listed."""
        if not self.shapes:
            return ""
        texts = []
        for rank in sorted({len(shape) for shape in self.shapes}):
            if rank == 0:
                texts.append("()")
                continue
            shapes = np.array([shape for shape in self.shapes if len(shape) == rank], dtype=np.int64).reshape(-1, rank)
            axes = [str(low) if low == high else f"{low}..{high}" for low, high in zip(shapes.min(0), shapes.max(0))]
            texts.append("(" + ", ".join(axes) + ("," if rank == 1 else "") + ")")
        return " | ".join(texts)

    @property
    def mean(self) -> Fraction | float | None:
        if not self.values:
            return None
        if self.floats:
            return (self.float_total + self.integer_total) / self.values
        return Fraction(self.integer_total, self.values)


def field_table(samples: list[dict]) -> dict[str, FieldStats]:
    """Stats of every field (not `__...__`) over `samples`, in order of first appearance."""
    table: dict[str, FieldStats] = {}
    for sample in samples:
        for name, value in sample.items():
            if not name.startswith("__"):
                table.setdefault(name, FieldStats()).add(value)
    return table


# ------------------------------------------------------------------------------------ the report
@dataclass
class Drawn:
    split: str
    number: int
    key: str
    url: str
    shown: Shown | None
    stored: dict
    problem: str = ""


@dataclass
class Report:
    manifest: Any
    location: str
    seed: int
    count: int
    splits: list[str]
    picks: dict[str, list[int]]
    drawn: list[Drawn]
    source_note: str = ""
    selection: str = ""  # what the samples were drawn among (Selection.describe), "" for all

    @property
    def problems(self) -> list[Drawn]:
        return [item for item in self.drawn if item.problem]


def build_report(location: str, hook_for: Callable[[str], tuple[Callable, str]], splits: list[str] | None = None,
                 count: int = 4, seed: int = 0, quiet: bool = False, stream=None, selection=None) -> Report:
    """Pick, fetch and draw the samples of `location` (a shard directory or manifest URL) with the
    hook `hook_for(manifest's source id)` gives, with its note (`Report.source_note`, "" for none):
    which source may draw is the command's to decide (`wdsprep.commands.show`: the plugin gate).
    With a `selection` (`stream.planning.catalog.Selection`) the picks are drawn among the samples it keeps."""
    from ..shards.codec import decode_sample
    from ..stream import load_manifest

    require_pillow()
    if count < 0:
        raise ConfigError(f"--samples must be 0 or more (got {count})")
    manifest = load_manifest(location)
    chosen = list(dict.fromkeys(splits)) if splits else sorted(manifest.splits)
    for split in chosen:
        manifest.shards(split)  # an unknown split: one line naming the known ones
    hook, source_note = hook_for(manifest.source)
    picks = {split: _picks(manifest, split, count, seed, selection) for split in chosen}
    progress = Progress("show", sum(len(numbers) for numbers in picks.values()), quiet=quiet, stream=stream)
    drawn: list[Drawn] = []
    for split in chosen:
        for number, url, raw in fetch(manifest, split, picks[split]):
            key = str(raw.get("__key__"))
            nbytes = sum(len(value) for name, value in raw.items() if not name.startswith("__"))
            try:
                stored = {name: value for name, value in decode_sample(raw, strip=False).items() if not name.startswith("__")}
                shown = hook(raw, ShowContext(manifest, split, number, seed))
                drawn.append(Drawn(split, number, key, url, shown, stored))
            except Exception as error:  # noqa: BLE001 - one sample's drawing must not hide the others
                message = f"{url}: sample {key!r}: {type(error).__name__}: {error}"
                drawn.append(Drawn(split, number, key, url, None, {}, message.splitlines()[0]))
            progress.advance(1, nbytes)
    progress.close()
    return Report(manifest, location, seed, count, chosen, picks, drawn, source_note,
                  "" if selection is None else selection.describe())


STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.4em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:2px 8px;text-align:left;
font-size:.9em;vertical-align:top}th{background:#eee}td.n{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#fff;border:1px solid #ddd;padding:4px 6px;font-size:.8em;max-height:24em;overflow:auto;margin:0}
.sample{background:#fff;border:1px solid #ccc;border-radius:4px;margin:1em 0;padding:.6em}
.sample h3{font-size:1em;margin:0 0 .4em}.panels{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}
.panel{max-width:540px}.panel .t{font-weight:600;font-size:.85em}.panel .c{font-size:.75em;color:#555;overflow-wrap:anywhere}
.panel img{image-rendering:pixelated;display:block;border:1px solid #999}
.problem{background:#fee;border:1px solid #c66;padding:.4em;color:#700}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _number(value: int | float | Fraction | None) -> str:
    """An int in full; a fraction in full when whole, else correctly rounded to 6 significant digits
    (decimal division, no float in between); a float to 6 significant digits."""
    if value is None:
        return ""
    if isinstance(value, Fraction):
        if value.denominator == 1:
            return str(value.numerator)
        return format(decimal.Context(prec=6).divide(decimal.Decimal(value.numerator), decimal.Decimal(value.denominator)), "g")
    if isinstance(value, int):
        return str(value)
    return f"{value:.6g}"


def _table(headers: list[str], rows: list[str], attributes: str = "") -> str:
    head = f"<tr>{''.join(f'<th>{_e(h)}</th>' for h in headers)}</tr>" if headers else ""
    return f"<table{attributes}>{head}{''.join(rows)}</table>"


def _field_rows(table: dict[str, FieldStats], shown: int) -> list[str]:
    rows = []
    for name, stats in table.items():
        rows.append(
            f'<tr data-field="{_e(name)}"><td>{_e(name)}</td><td>{_e(", ".join(stats.kinds))}</td>'
            f"<td>{_e(stats.shape_text())}</td><td class=n>{_e(_number(stats.low))}</td>"
            f"<td class=n>{_e(_number(stats.high))}</td><td class=n>{_e(_number(stats.mean))}</td>"
            f'<td class=n data-count="field-samples">{stats.present}</td><td class=n>{shown}</td></tr>')
    return rows


FIELD_HEADERS = ["field", "dtype / type", "shape (range)", "min", "max", "mean", "samples with it", "of"]


def _panel_html(panel: Panel) -> str:
    caption = f'<div class="c">{_e(panel.caption)}</div>' if panel.caption else ""
    if panel.image is not None:
        data = base64.b64encode(png_bytes(panel.image)).decode("ascii")
        height, width = panel.image.shape[:2]
        body = (f'<img alt="{_e(panel.title)}" width="{width}" height="{height}" data-panel="{_e(panel.name)}" '
                f'data-scale="{panel.scale}" data-step="{panel.step}" src="data:image/png;base64,{data}">')
        size = f' style="width:{max(width, 160) + 2}px"'  # captions wrap at the picture's width
    else:
        body = f'<pre data-panel="{_e(panel.name)}">{_e(panel.text or "")}</pre>'
        size = ""
    return f'<div class="panel"{size}><div class="t">{_e(panel.title)}</div>{body}{caption}</div>'


def render_html(report: Report) -> str:
    """The whole page (a str), from a built report."""
    manifest = report.manifest
    total_bytes = manifest.bytes()
    out = ["<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
           f"<title>wdsprep show: {_e(manifest.source)} {_e(report.location)}</title><style>{STYLE}</style></head><body>",
           f"<h1>wdsprep show &mdash; {_e(manifest.source)}</h1>"]
    summary = [
        ("manifest", _e(manifest.url)),
        ("source", f'<span data-value="source">{_e(manifest.source)}</span>'),
        ("splits", f'<span data-count="splits">{len(manifest.splits)}</span>'),
        ("shards", f'<span data-count="shards">{sum(len(rows) for rows in manifest.splits.values())}</span>'),
        ("samples", f'<span data-count="samples">{manifest.samples()}</span>'),
        ("shard bytes", f'<span data-count="bytes">{total_bytes}</span> ({_e(human_bytes(total_bytes))})'),
    ]
    if manifest.input_bytes:
        ratio = manifest.input_bytes / max(total_bytes, 1)
        summary.append(("input bytes", f'<span data-count="input-bytes">{manifest.input_bytes}</span> '
                                       f"({_e(human_bytes(manifest.input_bytes))}): compression {ratio:.2f}x"))
    summary.append(("problems skipped at conversion", f'<span data-count="problems">{len(manifest.problems)}</span>'))
    summary.append(("samples drawn", f"{report.count} per split, seed {report.seed}"))
    if report.selection:
        summary.append(("drawn among", _e(f"the samples the selection keeps: {report.selection}")))
    if report.source_note:
        summary.append(("note", _e(report.source_note)))
    out.append(_table([], [f"<tr><th>{_e(name)}</th><td>{value}</td></tr>" for name, value in summary], " id=summary"))
    split_rows = [
        f'<tr data-split="{_e(split)}"><td>{_e(split)}</td><td class=n data-count="split-shards">{len(rows)}</td>'
        f'<td class=n data-count="split-samples">{sum(row["samples"] for row in rows)}</td>'
        f'<td class=n data-count="split-bytes">{sum(row["bytes"] for row in rows)}</td></tr>'
        for split, rows in sorted(manifest.splits.items())]
    out.append(_table(["split", "shards", "samples", "bytes"], split_rows, " id=splits"))
    out.append("<h2>source config</h2><pre id=config>" + _e(json.dumps(manifest.config, indent=1, sort_keys=True)) + "</pre>")
    if manifest.tables:
        names = ", ".join(f"{name} ({len(value) if hasattr(value, '__len__') else value})" for name, value in sorted(manifest.tables.items()))
        out.append(f"<p>tables: {_e(names)}</p>")
    if manifest.problems:
        rows = [f"<tr><td>{_e(problem.get('item'))}</td><td>{_e(problem.get('message'))}</td></tr>" for problem in manifest.problems[:200]]
        more = f"<p>... and {len(manifest.problems) - 200} more</p>" if len(manifest.problems) > 200 else ""
        out.append("<h2>problems skipped at conversion</h2>" + _table(["item", "problem"], rows, " id=problems") + more)
    for split in report.splits:
        items = [item for item in report.drawn if item.split == split]
        numbers = ", ".join(str(number) for number in report.picks[split])
        out.append(f'<section class=split data-split="{_e(split)}"><h2>split {_e(split)}</h2>'
                   f'<p><span data-count="drawn">{len(items)}</span> of {manifest.samples(split)} samples '
                   f"(numbers {_e(numbers) or 'none'})</p>")
        good = [item for item in items if item.shown is not None]
        if good:
            out.append("<h3>fields, as the reader yields them</h3>")
            out.append(_table(FIELD_HEADERS, _field_rows(field_table([item.shown.fields for item in good]), len(good)),
                              ' class="fields" data-kind="training"'))
            out.append("<h3>members, as stored</h3>")
            out.append(_table(FIELD_HEADERS, _field_rows(field_table([item.stored for item in good]), len(good)),
                              ' class="fields" data-kind="stored"'))
        for item in items:
            head = (f'<div class=sample data-split="{_e(split)}" data-index="{item.number}" data-key="{_e(item.key)}" '
                    f'data-shard="{_e(os.path.basename(item.url))}"><h3>#{item.number} {_e(item.key)} '
                    f"<small>({_e(os.path.basename(item.url))})</small></h3>")
            if item.shown is None:
                out.append(head + f'<div class="problem">{_e(item.problem)}</div></div>')
                continue
            title = f"<p>{_e(item.shown.title)}</p>" if item.shown.title else ""
            panels = "".join(_panel_html(panel) for panel in item.shown.panels)
            out.append(head + title + f'<div class="panels">{panels}</div></div>')
        out.append("</section>")
    out.append("</body></html>\n")
    return "".join(out)


def write_report(report: Report, out: str) -> None:
    """The page at `out`, written atomically by the one rule of local writes
    (`storage.files.write_atomically`): a temporary name beside it, renamed when complete; an `out`
    that exists and is not a regular file (a device, a FIFO, a symlink, ...) is refused, never replaced."""
    from ..storage.files import refuse_unless_regular, write_atomically

    refuse_unless_regular(out)  # before the page is drawn
    write_atomically(os.path.abspath(out), render_html(report).encode("utf-8"))
