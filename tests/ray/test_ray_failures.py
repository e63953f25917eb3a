"""Retries and failure reports of the Ray executor, with a source plugin that injects failures."""
from __future__ import annotations

import sys

import pytest

from wdsprep.conversion import ConversionError, convert
from wdsprep.errors import ConfigError
from wdsprep.executors import EXECUTORS, get_executor
from wdsprep.sources.registry import load_source
from wdsprep.stream import load_manifest

from . import wdsprep_ray_faults
from .wdsprep_ray_helpers import assert_same_output, ray_cluster, requires_ray, run_cli  # noqa: F401 (fixture)

FAULTY = "tests.ray.wdsprep_ray_faults:SOURCE"  # importable in Ray workers: run_cli puts the repo root on PYTHONPATH
OPTIONS = dict(shard_bytes="100KB")  # ~5 samples of ~16.5 KB per unit


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    root = tmp_path_factory.mktemp("generic_in")
    load_source("generic").synth(str(root), seed=11, samples=60)
    return root


@pytest.fixture(scope="module")
def reference(native, tmp_path_factory):
    """The plugin source converted in-process with no failure injected."""
    output = tmp_path_factory.mktemp("reference")
    convert(FAULTY, str(native), str(output), executor="local", workers=1, **OPTIONS)
    return output


def test_fail_once_is_retried_and_identical(ray_cluster, native, reference, tmp_path):
    fail_dir = tmp_path / "attempts"
    fail_dir.mkdir()
    manifest = convert(FAULTY, str(native), str(tmp_path / "out"), executor="ray", workers=2,
                       fail_unit="train-1", fail_mode="once", fail_dir=str(fail_dir), **OPTIONS)
    assert wdsprep_ray_faults.attempts(fail_dir, "train-1") == 2
    assert manifest.timing["units_built"] > 2
    assert_same_output(reference, tmp_path / "out")
    assert not list((tmp_path / "out").glob("*.tmp"))


def test_crashed_worker_is_retried_and_identical(ray_cluster, native, reference, tmp_path):
    fail_dir = tmp_path / "attempts"
    fail_dir.mkdir()
    convert(FAULTY, str(native), str(tmp_path / "out"), executor="ray", workers=2,
            fail_unit="train-4", fail_mode="crash", fail_dir=str(fail_dir), **OPTIONS)
    assert wdsprep_ray_faults.attempts(fail_dir, "train-4") == 2
    assert_same_output(reference, tmp_path / "out")
    assert not list((tmp_path / "out").glob("*.tmp"))


def test_retries_are_bounded(ray_cluster, native, tmp_path):
    fail_dir = tmp_path / "attempts"
    fail_dir.mkdir()
    with pytest.raises(ConversionError) as caught:
        convert(FAULTY, str(native), str(tmp_path / "out"), executor="ray", workers=2,
                executor_options={"retries": 0}, fail_unit="train-2", fail_mode="once",
                fail_dir=str(fail_dir), **OPTIONS)
    assert wdsprep_ray_faults.attempts(fail_dir, "train-2") == 1
    message = str(caught.value)
    assert "unit train-00002" in message and "InjectedFailure" in message and "failed once on Ray" in message
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_always_failing_unit_then_resume(ray_cluster, native, reference, tmp_path):
    """Reported after 1 + 2 retries, no manifest; a re-run without the fault completes identically."""
    fail_dir = tmp_path / "attempts"
    fail_dir.mkdir()
    out = tmp_path / "out"
    with pytest.raises(ConversionError):
        convert(FAULTY, str(native), str(out), executor="ray", workers=2,
                fail_unit="train-0", fail_mode="always", fail_dir=str(fail_dir), **OPTIONS)
    assert wdsprep_ray_faults.attempts(fail_dir, "train-0") == 3
    assert not (out / "manifest.json").exists()
    manifest = convert(FAULTY, str(native), str(out), executor="ray", workers=2, **OPTIONS)
    assert manifest.timing["units_built"] == 1  # only the failed unit is rebuilt
    assert_same_output(reference, out)


@requires_ray
def test_cli_always_failing_unit_exits_nonzero_without_manifest(native, reference, tmp_path):
    """Via the CLI, with no address: the process starts its own local Ray (2 CPUs) and stops it."""
    fail_dir = tmp_path / "attempts"
    fail_dir.mkdir()
    out = tmp_path / "out"
    result = run_cli("convert", FAULTY, native, out, "--executor", "ray", "--workers", "2",
                     "--shard-bytes", OPTIONS["shard_bytes"], "--quiet",
                     "--fail-unit", "train-3", "--fail-mode", "always", "--fail-dir", fail_dir)
    assert result.returncode == 1, result.stdout + result.stderr
    assert wdsprep_ray_faults.attempts(fail_dir, "train-3") == 3
    assert not (out / "manifest.json").exists()
    stderr = result.stderr
    assert "no manifest written" in stderr
    assert "unit train-00003" in stderr and "failed 3 times on Ray" in stderr and "injected failure" in stderr
    # the report names the unit's inputs, short: their count and the first (keys of train-00003 in the reference)
    rows = [row for row in load_manifest(str(reference)).shards("train") if row["unit"] == 3]
    keys = [key for row in rows for key in _keys_of(reference / row["name"])]
    assert keys and f"{len(keys)} items, first" in stderr and keys[0] in stderr and keys[1] not in stderr
    # the other units' shards were written and recorded for a resume
    assert len(list(out.glob("train-*.tar"))) >= 1


def _keys_of(tar_path) -> list[str]:
    import tarfile

    with tarfile.open(tar_path) as archive:  # sample keys: not the shard's `__wdsprep_index__` member
        return sorted({m.name.split(".", 1)[0] for m in archive.getmembers() if not m.name.startswith("__")})


@requires_ray
def test_executor_options_are_checked():
    with pytest.raises(ConfigError, match="unknown Ray executor option"):
        get_executor("ray", workers=2, adress="auto")
    with pytest.raises(ConfigError, match="retries"):
        get_executor("ray", workers=2, retries=-1)
    with pytest.raises(ConfigError, match="workers"):
        get_executor("ray", workers=0)


def test_without_ray_says_how_to_install(monkeypatch):
    import wdsprep

    assert "ray" in EXECUTORS  # always offered: Ray itself is imported only when chosen
    monkeypatch.delitem(sys.modules, "wdsprep.ray_executor", raising=False)
    monkeypatch.delattr(wdsprep, "ray_executor", raising=False)
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ConfigError, match=r"pip install 'wdsprep\[ray\]'"):
        get_executor("ray", workers=1)


@requires_ray
def test_cli_unreachable_address_fails_with_one_clear_error(native, tmp_path):
    import socket

    with socket.socket() as probe:  # a port nobody listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = run_cli("convert", "generic", native, tmp_path / "out", "--executor", "ray",
                     "--ray-address", f"127.0.0.1:{port}", "--quiet")
    assert result.returncode == 1
    assert f"cannot reach the Ray cluster at '127.0.0.1:{port}'" in result.stderr
    assert not (tmp_path / "out" / "manifest.json").exists()
