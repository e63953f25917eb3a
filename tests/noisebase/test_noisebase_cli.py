"""`wdsprep synth noisebase`, the pipeline spec (`make shards`) and `wdsprep verify` on the result."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.timeouts import SUBPROCESS

pytest.importorskip("zarr")


def _wdsprep(*args, cwd=None):
    command = [sys.executable, "-m", "wdsprep", *map(str, args)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=SUBPROCESS, cwd=cwd)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result.stdout


def test_synth_cli_and_pipeline_spec(tmp_path, repo_root):
    _wdsprep("synth", "noisebase", tmp_path / "native", "--seed", "5")
    names = sorted(os.listdir(tmp_path / "native" / "sampleset_v1" / "train"))
    assert names == [f"scene{i:04d}.zip" for i in range(6)]

    # the repository's spec, run the way `make shards` runs it, from a scratch root
    (tmp_path / "pipelines").mkdir()
    shutil.copy(repo_root / "pipelines" / "noisebase.toml", tmp_path / "pipelines" / "noisebase.toml")
    _wdsprep("pipeline", tmp_path / "pipelines" / "noisebase.toml", "--quiet")
    manifest = json.loads((tmp_path / "shards" / "noisebase" / "manifest.json").read_text())
    assert manifest["source"] == "noisebase"
    assert manifest["config"]["rendering_height"] == 1080 and manifest["config"]["rendering_width"] == 1920
    assert manifest["splits"]["train"]["samples"] == 6 * 4
    assert len(manifest["tables"]["sequences"]) == 6
    _wdsprep("verify", tmp_path / "shards" / "noisebase")
