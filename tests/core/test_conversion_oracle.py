"""Conversion re-runs judged from outside: while a re-run that will change the dataset is building, no
manifest is visible (a reader would trust it); when it ends, the directory holds exactly the shards
its new manifest lists, and they read back as exactly the input's samples."""
import os

import wdsprep
from wdsprep.conversion import convert

WATCHING_SOURCE = '''
import os
from wdsprep.sources.generic import GenericSource

class Watching(GenericSource):
    """Notes, each time a unit starts building, whether the output's manifest is visible then."""

    def build(self, unit, ctx):
        out = os.environ["WATCHED_OUTPUT"]
        seen = "visible" if os.path.exists(os.path.join(out, "manifest.json")) else "hidden"
        with open(os.environ["WATCH_LOG"], "a") as log:
            log.write(f"{unit.split}-{unit.index} {seen}\\n")
        yield from super().build(unit, ctx)

SOURCE = Watching()
'''


def _input_keys(root):
    return sorted({name.split(".", 1)[0] for name in os.listdir(os.path.join(root, "train"))})


def test_the_old_manifest_is_hidden_while_a_rerun_builds(tmp_path, generic_input, monkeypatch):
    (tmp_path / "watching.py").write_text(WATCHING_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    out, log = tmp_path / "out", tmp_path / "watch.log"
    monkeypatch.setenv("WATCHED_OUTPUT", str(out))
    monkeypatch.setenv("WATCH_LOG", str(log))
    convert("watching:SOURCE", generic_input, str(out), shard_bytes="300KB")
    first = log.read_text().splitlines()
    assert first and all(line.endswith(" hidden") for line in first)  # nothing there yet
    assert (out / "manifest.json").exists()
    log.unlink()
    convert("watching:SOURCE", generic_input, str(out), shard_bytes="300KB", zstd_level=7)  # every unit changes
    again = log.read_text().splitlines()
    assert len(again) == len(first)
    assert [line for line in again if not line.endswith(" hidden")] == []
    assert (out / "manifest.json").exists()


def test_a_rerun_with_fewer_shards_leaves_exactly_the_listed_ones(tmp_path, generic_input):
    out = tmp_path / "out"
    many = convert("generic", generic_input, str(out), shard_bytes="200KB")
    few = convert("generic", generic_input, str(out), shard_bytes="2MB")
    many_names = {row["name"] for rows in many.splits.values() for row in rows}
    few_names = {row["name"] for rows in few.splits.values() for row in rows}
    assert len(few_names) < len(many_names)  # the re-run really has stale shards to remove
    assert {name for name in os.listdir(out) if name.endswith(".tar")} == few_names
    assert not [name for name in os.listdir(out) if name.endswith(".tmp")]
    keys = sorted(s["__key__"] for s in wdsprep.dataset(str(out), "train", shuffle_shards=False, equalize=None))
    assert keys == _input_keys(generic_input)
