"""`wdsprep show --out X` replaces X only when X is a regular file: a FIFO, a device node (made here,
skipped where that is not permitted) or a symlink to a file elsewhere is refused with one line,
before anything is fetched (the HTTP server's request log is empty), and left exactly as it was."""
from __future__ import annotations

import pytest

from tests.special_files import KIND_TEXT, make_special
from wdsprep.testing import RangeHTTPServer

from .showdata import run_cli

pytest.importorskip("PIL")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    from wdsprep.sources.generic import SOURCE

    root = tmp_path_factory.mktemp("show_out")
    SOURCE.synth(str(root / "input"), seed=3, samples=8, splits={"train": 8})
    code, _, err = run_cli("convert", "generic", str(root / "input"), str(root / "shards"), "--quiet")
    assert code == 0, err
    return root / "shards"


@pytest.mark.parametrize("kind", ["fifo", "device", "symlink"])
def test_show_out_refuses_what_is_not_a_regular_file(shards, tmp_path, kind):
    out = tmp_path / "report.html"
    unchanged = make_special(out, kind, tmp_path / "elsewhere.html")
    with RangeHTTPServer(shards) as server:
        code, stdout, stderr = run_cli("show", f"{server.url}/manifest.json", "--out", str(out), "--quiet")
        requests = list(server.requests)
    assert code == 1 and stdout == ""
    assert stderr == (f"wdsprep: error: {out}: exists and is {KIND_TEXT[kind]}, not a regular file; "
                      "wdsprep replaces only regular files (remove it or choose another output)\n")
    assert requests == []  # refused before any work
    assert unchanged()
    assert [p.name for p in tmp_path.iterdir()] in (["report.html", "elsewhere.html"], ["elsewhere.html", "report.html"])


def test_show_out_replaces_a_regular_file(shards, tmp_path):
    out = tmp_path / "report.html"
    out.write_text("an older report")
    code, _, err = run_cli("show", str(shards), "--out", str(out), "--quiet")
    assert code == 0, err
    assert out.read_text().startswith("<!DOCTYPE html>")


def test_write_report_checks_again_when_the_page_is_written(shards, tmp_path):
    """The Python API refuses too, even when the name turned into a link after the report was built."""
    import os

    from wdsprep import OutputError
    from wdsprep.commands.show import build_report
    from wdsprep.show.report import write_report

    report = build_report(str(shards), count=1, quiet=True)
    out = tmp_path / "report.html"
    (tmp_path / "elsewhere.html").write_text("mine")
    os.symlink(tmp_path / "elsewhere.html", out)
    with pytest.raises(OutputError, match="exists and is a symbolic link"):
        write_report(report, str(out))
    assert out.is_symlink() and (tmp_path / "elsewhere.html").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere.html", "report.html"]  # no temporary left
