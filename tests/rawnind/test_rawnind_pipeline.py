"""The `make shards` path: prepare_input (synth -> serve -> fetch) then convert, and the CLI."""
import json
import subprocess
import sys
import tomllib
import urllib.request

import webdataset as wds

import wdsprep
from tests.timeouts import EVENT, SUBPROCESS, wait_for
from wdsprep.conversion import convert
from wdsprep.commands.pipeline import prepare_input


def test_pipeline_spec_and_prepare_input(repo_root, tmp_path):
    spec = tomllib.loads((repo_root / "pipelines" / "rawnind.toml").read_text())
    assert spec["source"] == "rawnind" and "synth" not in spec
    assert spec["prepare"]["size"] == "small" and spec["options"]["tile_size"] == 512
    pipeline = dict(spec, input=str(tmp_path / "fetched"), prepare=dict(spec["prepare"], size="tiny", server_dir=str(tmp_path / "dv")))
    fetched = prepare_input(pipeline, str(tmp_path / "data"))
    assert fetched == str(tmp_path / "fetched")
    report = json.loads((tmp_path / "fetched" / "fetch_report.json").read_text())
    assert report["failed"] == [] and report["scenes"]["complete"] == 2 and len(report["verified"]) == 7
    manifest = convert("rawnind", fetched, str(tmp_path / "shards"), shard_bytes="8MB", tile_size=256)
    samples = list(wds.WebDataset(wdsprep.urls(manifest.url, "train"), shardshuffle=False)
                   .compose(wdsprep.rawnind.pairs(crop_size=128, max_alignment_loss=None, min_mask_mean=None)))
    assert len(samples) == 2 * 3  # 256x384 tiles of 256 -> 2 tiles, x 3 pairs (clean-clean, 2 noisy) of the train scene
    # a second prepare reuses every verified file
    prepare_input(pipeline, str(tmp_path / "data"))
    again = json.loads((tmp_path / "fetched" / "fetch_report.json").read_text())
    assert again["verified"] == [] and len(again["skipped"]) == 7


def test_serve_cli_subprocess_with_range(synth_tiny, tmp_path):
    log = tmp_path / "requests.jsonl"
    command = [sys.executable, "-m", "wdsprep", "serve", "dataverse", str(synth_tiny), "--port", "0", "--log", str(log)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("serving ") and " at http://127.0.0.1:" in line
        url = line.strip().rsplit(" at ", 1)[1]
        listing = json.loads(urllib.request.urlopen(f"{url}/api/datasets/:persistentId?persistentId=doi:10.5072/FK2/RAWSYN", timeout=5).read())
        first = listing["data"]["latestVersion"]["files"][0]["dataFile"]
        request = urllib.request.Request(f"{url}/api/access/datafile/{first['id']}", headers={"Range": "bytes=10-19"})
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status == 206
            assert response.headers["Content-Range"] == f"bytes 10-19/{first['filesize']}"
            assert response.read() == (synth_tiny / "files" / first["filename"]).read_bytes()[10:20]
        by_pid = urllib.request.urlopen(f"{url}/api/access/datafile/:persistentId?persistentId={first['persistentId']}", timeout=5)
        assert by_pid.read() == (synth_tiny / "files" / first["filename"]).read_bytes()
        wait_for(lambda: log.exists() and len(log.read_text().splitlines()) >= 3, "three requests in the server log")
        entries = [json.loads(line) for line in log.read_text().splitlines()]
        ranged = [entry for entry in entries if entry["range"]]
        assert [(entry["range"], entry["status"], entry["bytes"]) for entry in ranged] == [("bytes=10-19", 206, 10)]
    finally:
        process.terminate()
        process.wait(timeout=EVENT)


def test_wdsprep_cli_delegates(synth_tiny, tmp_path):
    result = subprocess.run([sys.executable, "-m", "wdsprep", "fetch", "rawnind", str(tmp_path / "d"), "--dry-run",
                             "--index", str(synth_tiny / "dataset_index.yaml"),
                             "--listing", str(synth_tiny / "dataverse_dataset.json")],
                            capture_output=True, text=True, timeout=SUBPROCESS)
    assert result.returncode == 0, result.stderr
    assert "scenes: 2" in result.stdout and "files to fetch: 7" in result.stdout
    assert "index entries with no Dataverse id: 1" in result.stdout
