"""Fixture and helpers for the Ray executor tests.

`ray_cluster` is one local Ray (2 CPUs) per test module,
reused by every `--executor ray` conversion run in-process (the executor joins an initialized Ray
and leaves it running); CLI subprocesses either join it by address or start (and stop) their own.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.timeouts import SUBPROCESS

REPO = pathlib.Path(__file__).resolve().parents[2]
SRC = REPO / "src"

try:
    import ray
except ImportError:  # the `ray` extra is not installed: Ray tests skip, the install-hint test runs
    ray = None

requires_ray = pytest.mark.skipif(ray is None, reason="ray is not installed (pip install 'wdsprep[ray]')")


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray with 2 CPUs; yields its GCS address (for `--ray-address`)."""
    if ray is None:
        pytest.skip("ray is not installed (pip install 'wdsprep[ray]')")
    if ray.is_initialized():
        ray.shutdown()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             object_store_memory=128 * 1024 * 1024)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def shard_bytes_of(directory) -> dict[str, bytes]:
    directory = pathlib.Path(directory)
    return {path.name: path.read_bytes() for path in sorted(directory.glob("*.tar"))}


def manifest_without_timing(directory) -> dict:
    data = json.loads((pathlib.Path(directory) / "manifest.json").read_text())
    data.pop("timing", None)
    return data


def assert_same_output(a, b) -> None:
    """Byte-identical shards (same names, same bytes) and sample tables, and manifests equal apart
    from `timing`."""
    shards_a, shards_b = shard_bytes_of(a), shard_bytes_of(b)
    assert sorted(shards_a) == sorted(shards_b)
    assert len(shards_a) > 1
    for name in shards_a:
        assert shards_a[name] == shards_b[name], f"{name} differs"
    tables = [{path.name: path.read_bytes() for path in sorted(pathlib.Path(d).glob("*.samples"))} for d in (a, b)]
    assert tables[0] and tables[0] == tables[1], "sample tables differ"
    assert manifest_without_timing(a) == manifest_without_timing(b)


def run_cli(*args, env_extra=None, cwd=None, timeout=SUBPROCESS) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(SRC),  # REPO: `tests.ray.*` plugins import in Ray workers
                                     env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "wdsprep", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=timeout)
