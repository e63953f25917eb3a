"""A manifest never makes `wdsprep show` import code: a dataset directory holding
`"source": "dsplugin:SOURCE"` and a `dsplugin.py` that leaves a marker file when imported, opened as a
stranger's download is opened (`cd dataset && python -m wdsprep show .`, which puts the directory on
`sys.path`), through the Python API and over HTTP. The marker is the independent witness: it exists
only if the file ran. The plugin is used only when the user allows it: `--plugin`,
`wdsprep.register_source`, or an installed `wdsprep.sources` entry point.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

import wdsprep
from wdsprep.sources import registry
from wdsprep.testing import RangeHTTPServer
from tests.timeouts import SUBPROCESS

from .showdata import Page, run_cli

pytest.importorskip("PIL")

# the plugin a stranger ships: it leaves MARKER when imported, and draws one text panel of its own
PLUGIN_CODE = """
import pathlib
pathlib.Path({marker!r}).write_text("imported")

from wdsprep.show.model import Shown
from wdsprep.show.picture import text_panel
from wdsprep.sources.generic.convert import GenericSource


class Drawing(GenericSource):
    def show(self, sample, context):
        return Shown([text_panel("plugin", "plugin", "drawn by the plugin")], {{}})


SOURCE = Drawing()
"""


def _dataset(root: pathlib.Path, module: str, source: str | None = None) -> tuple[pathlib.Path, pathlib.Path]:
    """Generic shards converted by the CLI into `root/dataset`, their manifest naming `source`
    (default `module:SOURCE`), and `module.py` beside them; returns (dataset, marker)."""
    from wdsprep.sources.generic import SOURCE

    SOURCE.synth(str(root / "native"), seed=2, samples=6, splits={"train": 6})
    code, _, err = run_cli("convert", "generic", str(root / "native"), str(root / "dataset"), "--quiet")
    assert code == 0, err
    dataset, marker = root / "dataset", root / f"{module}.imported"
    manifest = json.loads((dataset / "manifest.json").read_text())
    manifest["source"] = source or f"{module}:SOURCE"
    (dataset / "manifest.json").write_text(json.dumps(manifest))
    (dataset / f"{module}.py").write_text(PLUGIN_CODE.format(marker=str(marker)))
    return dataset, marker


def _show_in(directory: pathlib.Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m wdsprep show . --out report.html ARGS` run in `directory`, as a user there would."""
    return subprocess.run([sys.executable, "-m", "wdsprep", "show", ".", "--out", "report.html", "--quiet", *args],
                          cwd=directory, env=env, capture_output=True, text=True, timeout=SUBPROCESS)


def _drawn_by_plugin(page: Page) -> bool:
    return any(text["panel"] == "plugin" and text["text"] == "drawn by the plugin" for text in page.texts)


@pytest.fixture
def clean_registry(monkeypatch):
    monkeypatch.setattr(registry, "_registered", {}, raising=False)


def test_cli_in_the_dataset_directory_imports_nothing(tmp_path):
    dataset, marker = _dataset(tmp_path, "dsplugin")
    done = _show_in(dataset)
    assert done.returncode == 0, done.stderr
    assert not marker.exists(), "the manifest's plugin ran"
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("wdsprep: warning: "), done.stderr
    assert "'dsplugin:SOURCE'" in lines[0] and "--plugin dsplugin:SOURCE" in lines[0]
    page = Page((dataset / "report.html").read_text())
    assert not _drawn_by_plugin(page) and len(page.samples) == 4
    assert {picture["panel"] for picture in page.pictures} == {"array"}  # drawn by rank all the same
    assert "--plugin dsplugin:SOURCE" in page.text  # the page says so too


def test_cli_with_plugin_named_by_the_user_uses_it(tmp_path):
    dataset, marker = _dataset(tmp_path, "dsplugin")
    done = _show_in(dataset, "--plugin", "dsplugin:SOURCE")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert marker.exists()
    page = Page((dataset / "report.html").read_text())
    assert _drawn_by_plugin(page) and len(page.samples) == 4


def test_a_plugin_the_user_named_that_does_not_load_is_one_error_line(tmp_path):
    dataset, marker = _dataset(tmp_path, "dsplugin", source="dsplugin_absent:SOURCE")
    done = _show_in(dataset, "--plugin", "dsplugin_absent:SOURCE")
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(
        "wdsprep: error: cannot load source plugin 'dsplugin_absent:SOURCE'"), done.stderr
    assert not (dataset / "report.html").exists() and not marker.exists()


def test_python_api_imports_nothing_until_the_user_allows_it(tmp_path, monkeypatch, clean_registry):
    from wdsprep.commands.show import build_report

    dataset, marker = _dataset(tmp_path, "dsplugin_api")
    monkeypatch.chdir(dataset)
    monkeypatch.syspath_prepend(str(dataset))  # as `python -m` or an interactive session puts the directory first
    report = build_report(".", quiet=True)
    assert not marker.exists() and "dsplugin_api" not in sys.modules
    assert "'dsplugin_api:SOURCE'" in report.source_note and "register_source('dsplugin_api:SOURCE')" in report.source_note
    assert all(item.shown.panels[0].name == "array" for item in report.drawn)

    wdsprep.register_source("dsplugin_api:SOURCE")
    report = build_report(".", quiet=True)
    assert marker.exists() and report.source_note == ""
    assert [item.shown.panels[0].text for item in report.drawn] == ["drawn by the plugin"] * 4


def test_python_api_plugins_argument_and_a_registered_object(tmp_path, monkeypatch, clean_registry):
    from wdsprep.show.model import Shown
    from wdsprep.commands.show import build_report
    from wdsprep.sources.generic.convert import GenericSource

    dataset, marker = _dataset(tmp_path, "dsplugin_obj")
    monkeypatch.syspath_prepend(str(dataset))
    report = build_report(str(dataset), quiet=True, plugins=["dsplugin_obj:SOURCE"])
    assert marker.exists() and report.source_note == ""
    marker.unlink()

    class Mine(GenericSource):
        def show(self, sample, context):
            return Shown([], {"mine": 1})

    monkeypatch.delitem(sys.modules, "dsplugin_obj")
    wdsprep.register_source("dsplugin_obj:SOURCE", Mine())  # this object, nothing imported
    report = build_report(str(dataset), quiet=True)
    assert not marker.exists() and "dsplugin_obj" not in sys.modules
    assert [item.shown.fields for item in report.drawn] == [{"mine": 1}] * 4
    with pytest.raises(wdsprep.ConfigError, match="register_source"):
        wdsprep.register_source("no_colon")


def test_over_http_an_installed_module_named_by_the_manifest_is_not_imported(tmp_path):
    dataset, marker = _dataset(tmp_path, "dsplugin_http")
    installed = tmp_path / "site"  # the module is importable, as any installed module is
    installed.mkdir()
    (dataset / "dsplugin_http.py").rename(installed / "dsplugin_http.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(installed), os.environ.get("PYTHONPATH")])))
    with RangeHTTPServer(dataset) as server:
        done = subprocess.run([sys.executable, "-m", "wdsprep", "show", f"{server.url}/manifest.json", "--quiet",
                               "--out", str(tmp_path / "report.html")], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=SUBPROCESS)
        assert done.returncode == 0, done.stderr
        assert not marker.exists()
        assert done.stderr.count("\n") == 1 and "--plugin dsplugin_http:SOURCE" in done.stderr
        allowed = subprocess.run([sys.executable, "-m", "wdsprep", "show", f"{server.url}/manifest.json", "--quiet",
                                  "--out", str(tmp_path / "allowed.html"), "--plugin", "dsplugin_http:SOURCE"],
                                 cwd=tmp_path, env=env, capture_output=True, text=True, timeout=SUBPROCESS)
    assert allowed.returncode == 0 and allowed.stderr == "", allowed.stderr
    assert marker.exists() and _drawn_by_plugin(Page((tmp_path / "allowed.html").read_text()))


def test_an_installed_entry_point_is_allowed_by_name_and_by_value(tmp_path):
    """A package installed with `[project.entry-points."wdsprep.sources"] epsource = "dsplugin_ep:SOURCE"`:
    `wdsprep convert epsource` takes it by name, and show draws with it whichever way the manifest names it."""
    dataset, marker = _dataset(tmp_path, "dsplugin_ep")
    installed = tmp_path / "site"
    (installed / "dsplugin_ep-1.0.dist-info").mkdir(parents=True)
    (installed / "dsplugin_ep-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: dsplugin-ep\nVersion: 1.0\n")
    (installed / "dsplugin_ep-1.0.dist-info" / "entry_points.txt").write_text("[wdsprep.sources]\nepsource = dsplugin_ep:SOURCE\n")
    (dataset / "dsplugin_ep.py").rename(installed / "dsplugin_ep.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(installed), os.environ.get("PYTHONPATH")])))

    assert _show_in(dataset, env=env).returncode == 0  # the manifest names the entry point's value
    assert marker.exists() and _drawn_by_plugin(Page((dataset / "report.html").read_text()))
    marker.unlink()

    converted = tmp_path / "by_name"
    done = subprocess.run([sys.executable, "-m", "wdsprep", "convert", "epsource", str(tmp_path / "native"),
                           str(converted), "--quiet"], env=env, capture_output=True, text=True, timeout=SUBPROCESS)
    assert done.returncode == 0, done.stderr
    assert json.loads((converted / "manifest.json").read_text())["source"] == "epsource"
    marker.unlink()
    done = _show_in(converted, env=env)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert marker.exists() and _drawn_by_plugin(Page((converted / "report.html").read_text()))
