"""`fetch --convert`: a synthetic Dataverse with injected faults fetched straight into shards on
the S3 test server under a small raw-byte bound, killed (SIGKILL) twice at random points and
finished, against an uninterrupted run."""
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from wdsprep.testing.dataverse import DataverseServer
from wdsprep.sources.rawnind.synth import synth
from wdsprep.stream.manifests import load_manifest

BOUND = 700_000  # bytes: one synthetic scene (3 files of ~197 kB), not two


@pytest.fixture(scope="module")
def dataverse(tmp_path_factory):
    root = tmp_path_factory.mktemp("rawnind_dv")
    synth(str(root), seed=4, size="xtrans")  # a Bayer scene (test) and an X-Trans scene (train)
    return root


def arm(server: DataverseServer, names: list[str]) -> None:
    """Faults for one sequence of runs: a 500, a connection dropped mid-body, a slow server."""
    server.faults.error_500 = {names[0]: 1}
    server.faults.drop_after = {names[1]: (60_000, 1)}
    server.faults.rate_limit = 600_000


class RawSampler:
    """Samples the bytes of raw files (final and partial) below a fetch destination."""

    def __init__(self, dest):
        self.dest, self.peak, self.samples = dest, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            total = 0
            for cfa in ("Bayer", "X-Trans"):
                for folder, _, names in os.walk(os.path.join(self.dest, cfa)):
                    for name in names:
                        try:
                            total += os.path.getsize(os.path.join(folder, name))
                        except FileNotFoundError:
                            pass
            self.peak = max(self.peak, total)
            self.samples += 1
            time.sleep(0.005)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=10)


def command(server, dest, output):
    return [sys.executable, "-m", "wdsprep", "fetch", "rawnind", str(dest), "--dataverse", server.url,
            "--doi", server.doi, "--convert", output, "--max-raw-bytes", str(BOUND), "--tile-size", "256",
            "--progress", "none", "--backoff", "0.05", "--timeout", "30", "--metadata-workers", "2"]


def run_to_end(args, env) -> tuple[float, subprocess.CompletedProcess]:
    began = time.monotonic()
    result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    return time.monotonic() - began, result


def wait_for_first_request(server, since: int, process, limit: float = 120.0) -> float:
    """Seconds until the run asks the server for anything (its start-up and imports are over)."""
    began = time.monotonic()
    while time.monotonic() - began < limit and process.poll() is None:
        if len(server.log) > since:
            return time.monotonic() - began
        time.sleep(0.01)
    return time.monotonic() - began


def full_fetches(log: list[dict], sizes: dict[str, int]) -> dict[str, int]:
    """Per capture file: requests that sent it whole (a 200 with every byte)."""
    counts: dict[str, int] = {}
    for entry in log:
        name = entry.get("file")
        if name in sizes and entry.get("status") == 200 and entry.get("bytes") == sizes[name]:
            counts[name] = counts.get(name, 0) + 1
    return counts


def shard_rows(manifest):
    return {split: [(row["name"], row["samples"], row["bytes"], row["sha256"]) for row in rows]
            for split, rows in manifest.splits.items()}


def test_fetch_into_s3_shards_with_bounded_disk_survives_kill_9(dataverse, s3_server, tmp_path, monkeypatch):
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    bucket = s3_server.create_bucket(f"rawnind-{os.getpid()}")
    env = dict(os.environ, **s3_server.env)
    listing = json.loads((dataverse / "dataverse_dataset.json").read_text())["data"]["latestVersion"]["files"]
    sizes = {e["dataFile"]["filename"]: e["dataFile"]["filesize"] for e in listing if e["dataFile"]["filename"].endswith(".dng")}
    names = sorted(sizes)
    assert sum(sizes.values()) > 1.5 * BOUND  # the bound really binds

    with DataverseServer(str(dataverse)) as server:
        # 1. uninterrupted
        arm(server, names)
        with RawSampler(tmp_path / "a") as sampler:
            began = time.monotonic()
            process = subprocess.Popen(command(server, tmp_path / "a", f"s3://{bucket}/a"), env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            startup = wait_for_first_request(server, len(server.log), process)
            out, err = process.communicate(timeout=300)
            working = time.monotonic() - began - startup  # downloads, conversion, removal, manifest
        assert process.returncode == 0, err
        report = json.loads((tmp_path / "a" / "fetch_report.json").read_text())
        assert report["failed"] == [] and report["retries"] >= 2  # the 500 and the dropped connection
        assert report["convert"]["scenes_converted"] == 2 and report["convert"]["problems"] == []
        assert 0 < report["convert"]["raw_bytes_peak"] <= BOUND
        assert sampler.samples > 10 and 0 < sampler.peak <= BOUND
        uninterrupted = load_manifest(f"s3://{bucket}/a/manifest.json")

        # 2. the same, killed twice at random points, then finished
        arm(server, names)
        first_request = len(server.log)
        rng = random.Random(os.getpid())
        with RawSampler(tmp_path / "b") as sampler:
            for share in (0.6, 0.3):  # the second run has less left to do
                since = len(server.log)
                process = subprocess.Popen(command(server, tmp_path / "b", f"s3://{bucket}/b"), env=env,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                wait_for_first_request(server, since, process)
                time.sleep(rng.uniform(0.02, share) * working)  # a random point of its working phase
                process.send_signal(signal.SIGKILL)
                process.wait(timeout=60)
                on_disk = [n for cfa in ("Bayer", "X-Trans") for _, _, files in os.walk(tmp_path / "b" / cfa) for n in files]
                records = [k for k in s3_server.client().list_objects_v2(Bucket=bucket, Prefix="b/").get("Contents", [])]
                print(f"killed at a random point: files on disk {on_disk}, "
                      f"objects in s3 {[r['Key'] for r in records]}")
            _, result = run_to_end(command(server, tmp_path / "b", f"s3://{bucket}/b"), env)
        assert result.returncode == 0, result.stderr
        assert sampler.peak <= BOUND
        report = json.loads((tmp_path / "b" / "fetch_report.json").read_text())
        assert report["convert"]["raw_bytes_peak"] <= BOUND
        interrupted = load_manifest(f"s3://{bucket}/b/manifest.json")
        assert shard_rows(interrupted) == shard_rows(uninterrupted)
        assert interrupted.tables == uninterrupted.tables and interrupted.fingerprint == uninterrupted.fingerprint
        # nothing was fetched twice in full, across the killed runs and the last one
        log = server.log[first_request:]
        assert all(count == 1 for count in full_fetches(log, sizes).values())
        assert set(full_fetches(log, sizes)) | {e.get("file") for e in log if e.get("status") == 206} >= set(names)
        # the raws are gone once converted; a re-run fetches no capture at all
        leftovers = [name for cfa in ("Bayer", "X-Trans") for _, _, files in os.walk(tmp_path / "b" / cfa) for name in files]
        assert leftovers == []
        before = len(server.log)
        _, result = run_to_end(command(server, tmp_path / "b", f"s3://{bucket}/b"), env)
        assert result.returncode == 0, result.stderr
        assert not [e for e in server.log[before:] if e.get("file") in sizes]
        again = json.loads((tmp_path / "b" / "fetch_report.json").read_text())["convert"]
        assert sorted(again["scenes_converted_before"]) == ["Bayer/plants", "X-Trans/Fuji_flowers"]
    # the shards read back as training pairs
    import webdataset as wds

    import wdsprep

    samples = list(wds.WebDataset(interrupted.shard_urls("train"), shardshuffle=False)
                   .compose(wdsprep.rawnind.pairs(crop_size=64, input="rgb", max_alignment_loss=None,
                                                  min_mask_mean=None, to_torch=False)))
    assert len(samples) == 2 * 3  # X-Trans scene: 2 tiles x (the clean capture with itself + 2 noisy captures)


def test_keep_raw_and_local_output(dataverse, tmp_path):
    import wdsprep
    from wdsprep.sources.rawnind import FetchOptions, fetch

    with DataverseServer(str(dataverse)) as server:  # the Python API is handed the driver as the command is
        report = fetch(FetchOptions(dest=str(tmp_path / "raw"), dataverse=server.url, doi=server.doi, progress="none",
                                    convert=str(tmp_path / "out"), keep_raw=True, driver=wdsprep.Conversion,
                                    convert_options={"tile_size": 128, "shard_bytes": "560KB"}))
    assert report["convert"]["manifest"] == str(tmp_path / "out" / "manifest.json")
    # the shards a fetch converts are written like `convert`'s: the train scene's six ~107 KB tiles outgrow
    # 560KB after five, roll over and are balanced 3 + 3, and every shard carries its index (checked
    # against its bytes with tarfile + xxhash); the test split's one pre-crop tile makes one shard
    from wdsprep.conformance import assert_rows_index_their_shards, balanced_units

    assert assert_rows_index_their_shards(tmp_path / "out") == 3
    assert balanced_units(tmp_path / "out", 560_000) == ["train-00000"]
    kept = [name for _, _, files in os.walk(tmp_path / "raw" / "Bayer") for name in files]
    assert len(kept) == 3  # the Bayer scene's clean and 2 noisy captures stay
    assert report["convert"]["raw_bytes_peak"] >= sum((dataverse / "files" / name).stat().st_size for name in kept)
