"""A user's own source, defined outside wdsprep (`plugin_source.py` beside this file, on PYTHONPATH),
goes through every command with no change to the package: synth, convert (on a process pool, whose
workers load the plugin too), inspect, verify, its own extra command, bad-input handling, and
streaming back with `wdsprep.dataset`. Expected values come from reading the native text files here."""
import json
import os
import pathlib
import subprocess
import sys

import wdsprep
from tests.timeouts import SUBPROCESS

PLUGIN = "plugin_source:SOURCE"
HERE = pathlib.Path(__file__).resolve().parent
CLI = [sys.executable, "-m", "wdsprep"]


def run(*args, expect=0) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    result = subprocess.run([*CLI, *map(str, args)], env=env, capture_output=True, text=True, timeout=SUBPROCESS)
    assert result.returncode == expect, (args, result.stdout, result.stderr)
    return result


def native_samples(directory: pathlib.Path, scale: int = 1) -> dict[str, dict[str, list[int]]]:
    """split -> key -> values, parsed from the native `<split>.txt` files with plain Python."""
    splits = {}
    for path in sorted(directory.glob("*.txt")):
        rows = [line.split() for line in path.read_text().splitlines()]
        splits[path.stem] = {row[0]: [int(v) * scale for v in row[1:]] for row in rows}
    return splits


def streamed_samples(manifest: str, split: str) -> dict[str, list[int]]:
    samples = [(s["__key__"], s["values"].tolist())
               for s in wdsprep.dataset(manifest, split, shuffle_shards=False).compose(wdsprep.decode(strip=True))]
    keys = [key for key, _ in samples]
    assert len(keys) == len(set(keys)), "a sample streamed twice"
    return dict(samples)


def test_a_plugin_source_goes_through_every_command(tmp_path):
    native, out = tmp_path / "native", tmp_path / "out"
    run("synth", PLUGIN, native, "--seed", "3")
    expected = native_samples(native, scale=3)
    assert sorted(expected) == ["train", "valid"] and len(expected["train"]) == 40

    run("convert", PLUGIN, native, out, "--scale", "3", "--shard-bytes", "1KB", "--workers", "2", "--quiet")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["source"] == PLUGIN and manifest["config"]["scale"] == 3
    assert len(manifest["splits"]["train"]) > 1, "several shards, built by the pool's workers"

    shown = run("inspect", out).stdout
    assert f"source {PLUGIN}" in shown
    assert "train:" in shown and " 40 samples" in shown and " 7 samples" in shown
    assert "0 bad" in run("verify", out).stdout

    for split, samples in expected.items():
        assert streamed_samples(str(out / "manifest.json"), split) == samples

    assert run("count", PLUGIN, native).stdout.split() == ["train", "40", "valid", "7"]


def test_a_plugin_source_bad_line_stops_or_is_skipped(tmp_path):
    native = tmp_path / "native"
    run("synth", PLUGIN, native, "--seed", "1")
    kept = native_samples(native)  # before the bad line
    with open(native / "valid.txt", "a") as handle:
        handle.write("valid9999 1 two 3\n")
    bad = f"{native / 'valid.txt'}:8"
    failed = run("convert", PLUGIN, native, tmp_path / "strict", "--quiet", expect=1)
    assert failed.stderr.strip() == f"wdsprep: error: {bad}: values must be integers"
    assert not (tmp_path / "strict" / "manifest.json").exists()

    run("convert", PLUGIN, native, tmp_path / "out", "--on-error", "skip", "--quiet")
    manifest = wdsprep.stream.load_manifest(str(tmp_path / "out"))
    assert manifest.problems == [{"item": bad, "message": "values must be integers"}]
    for split, samples in kept.items():
        assert streamed_samples(str(tmp_path / "out" / "manifest.json"), split) == samples


def test_a_plugin_object_that_is_no_source_is_refused_in_one_line(tmp_path):
    """A source the command line names that does not load is a bad argument: one line, exit status 2."""
    failed = run("synth", "plugin_source:LINE_BYTES", tmp_path / "x", expect=2)
    assert failed.stderr.strip() == (
        "wdsprep: error: wdsprep synth: plugin_source:LINE_BYTES is int, not an instance of a "
        "wdsprep.sources.base.Source subclass (wdsprep synth --help shows its options)")
    assert not (tmp_path / "x").exists()
    failed = run("convert", "plugin_source:NOPE", tmp_path, tmp_path / "out", expect=2)
    assert "cannot load source plugin 'plugin_source:NOPE'" in failed.stderr


def test_a_plugin_source_gets_the_base_rules_for_split_names_and_empty_splits(tmp_path):
    """One rule, in the base class (`check_plan`), for every source: the plugin only names its splits."""
    native = tmp_path / "native"
    run("synth", PLUGIN, native, "--seed", "1")
    (native / "test.txt").write_text("")  # a split with no sample beside full ones
    done = run("convert", PLUGIN, native, tmp_path / "out", "--quiet")
    assert done.stderr.strip() == f"wdsprep: warning: {native / 'test.txt'}: split 'test' has no sample to convert; it is left out of the manifest"
    assert sorted(json.loads((tmp_path / "out" / "manifest.json").read_text())["splits"]) == ["train", "valid"]
    (native / "test.txt").unlink()
    (native / "v1.0.txt").write_text("k0 1 2\n")
    refused = run("convert", PLUGIN, native, tmp_path / "out2", "--quiet", expect=1)
    assert refused.stderr.strip().startswith(f"wdsprep: error: {native / 'v1.0.txt'}: 'v1.0' is not a split name")
    assert not (tmp_path / "out2" / "manifest.json").exists()
