"""`--executor ray` gives the same bytes as `--executor local`, for several sources.

Each case converts the same input twice: with the local process pool (2 workers) and with Ray
(2 CPUs), and compares every shard byte for byte and the manifests apart from `timing`.
"""
from __future__ import annotations

import io
import sys

import pytest

from wdsprep.conversion import convert
from wdsprep.sources.registry import load_source

from .wdsprep_ray_helpers import assert_same_output, ray_cluster, run_cli  # noqa: F401 (fixture)


def _both(source_id, input, tmp_path, **options):
    local = tmp_path / "local"
    on_ray = tmp_path / "ray"
    convert(source_id, str(input), str(local), executor="local", workers=2, **options)
    manifest = convert(source_id, str(input), str(on_ray), executor="ray", workers=2, **options)
    assert manifest.timing["units_built"] > 1
    assert_same_output(local, on_ray)
    return local, on_ray


def test_generic_ray_matches_local(ray_cluster, tmp_path):
    load_source("generic").synth(str(tmp_path / "in"), seed=3, samples=90)
    _both("generic", tmp_path / "in", tmp_path, shard_bytes="100KB", zstd_level=5)


def test_generic_codec_none_ray_matches_local(ray_cluster, tmp_path):
    load_source("generic").synth(str(tmp_path / "in"), seed=4, samples=40)
    _both("generic", tmp_path / "in", tmp_path, shard_bytes="64KB", codec="none")


def test_minecraft_synth_ray_matches_local(ray_cluster, tmp_path):
    load_source("minecraft").synth(str(tmp_path / "in"), 0, "small")
    local, _ = _both("minecraft", tmp_path / "in", tmp_path, shard_bytes="8KB", window_frames=8, window_overlap=2)
    assert len(list(local.glob("*.tar"))) >= 10


def test_minecraft_real_zip_ray_matches_local(ray_cluster, shared_data, tmp_path):
    archive = shared_data / "minecraft" / "data.zip"
    if not archive.is_file():
        pytest.skip(f"{archive} not found")
    _both("minecraft", archive, tmp_path, shard_bytes="8KB")


def test_progress_reported_as_for_local(ray_cluster, tmp_path, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    load_source("generic").synth(str(tmp_path / "in"), seed=5, samples=30)
    lines = {}
    for executor in ("local", "ray"):
        terminal = Terminal()
        monkeypatch.setattr(sys, "stderr", terminal)
        convert("generic", str(tmp_path / "in"), str(tmp_path / executor), executor=executor, workers=2,
                shard_bytes="64KB", quiet=False)
        lines[executor] = terminal.getvalue().rsplit("\r", 1)[-1]
    monkeypatch.undo()
    units = len(list((tmp_path / "local").glob("*.tar")))
    for executor, line in lines.items():
        assert line.startswith("convert generic ["), (executor, line)
        assert f" {units}/{units} " in line, (executor, line)
        assert "#" * 24 in line, (executor, line)


def test_cli_joins_cluster_by_address(ray_cluster, tmp_path, monkeypatch):
    """`wdsprep convert ... --executor ray --ray-address ADDRESS` (another process) joins the cluster.

    Paths are relative to the driver's directory, which is not the Ray workers' directory.
    """
    monkeypatch.chdir(tmp_path)
    load_source("generic").synth("in", seed=6, samples=40)
    convert("generic", "in", "local", shard_bytes="64KB")
    result = run_cli("convert", "generic", "in", "ray", "--executor", "ray",
                     "--ray-address", ray_cluster, "--shard-bytes", "64KB", "--quiet", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert_same_output(tmp_path / "local", tmp_path / "ray")


def test_output_straight_to_s3(ray_cluster, tmp_path, monkeypatch):
    """Ray tasks publish their shards to s3:// (a moto server); same objects as a local conversion."""
    from wdsprep.testing import S3Server

    load_source("generic").synth(str(tmp_path / "in"), seed=7, samples=30)
    convert("generic", str(tmp_path / "in"), str(tmp_path / "local"), shard_bytes="64KB")
    with S3Server() as s3:
        for name, value in s3.env.items():
            monkeypatch.setenv(name, value)
        bucket = s3.create_bucket("ray-out")
        convert("generic", str(tmp_path / "in"), f"s3://{bucket}/generic", executor="ray", workers=2,
                shard_bytes="64KB", executor_options={"runtime_env": {"env_vars": dict(s3.env)}})
        client = s3.client()
        listed = client.list_objects_v2(Bucket=bucket, Prefix="generic/")["Contents"]
        fetched = tmp_path / "fetched"
        fetched.mkdir()
        for entry in listed:
            body = client.get_object(Bucket=bucket, Key=entry["Key"])["Body"].read()
            (fetched / entry["Key"].split("/", 1)[1]).write_bytes(body)
    assert_same_output(tmp_path / "local", fetched)
