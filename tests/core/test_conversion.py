"""Conversion: worker-independent bytes, resume that skips verified shards, kill -9 safety, verify."""
import filecmp
import json
import os
import signal
import subprocess
import sys

import pytest

import wdsprep
import wdsprep.stream.verify
from tests.timeouts import EVENT, SUBPROCESS, wait_for
from wdsprep.conversion import convert
from wdsprep.shards.manifest import comparable

CLI = [sys.executable, "-m", "wdsprep"]


def _shards(directory):
    return sorted(p for p in os.listdir(directory) if p.endswith(".tar"))


def test_workers_do_not_change_bytes(tmp_path, generic_input):
    one = convert("generic", generic_input, str(tmp_path / "one"), shard_bytes="300KB", workers=1)
    two = convert("generic", generic_input, str(tmp_path / "two"), shard_bytes="300KB", workers=2)
    assert _shards(tmp_path / "one") == _shards(tmp_path / "two") and len(_shards(tmp_path / "one")) > 4
    for name in _shards(tmp_path / "one"):
        assert filecmp.cmp(tmp_path / "one" / name, tmp_path / "two" / name, shallow=False)
    assert comparable(one) == comparable(two)


def test_resume_skips_verified_shards_and_redoes_bad_ones(tmp_path, generic_input):
    out = tmp_path / "out"
    first = convert("generic", generic_input, str(out), shard_bytes="300KB")
    assert first.timing["units_reused"] == 0
    again = convert("generic", generic_input, str(out), shard_bytes="300KB")
    assert again.timing["units_built"] == 0
    victim = out / first.splits["train"][1]["name"]
    data = bytearray(victim.read_bytes())
    data[1000] ^= 0xFF
    victim.write_bytes(bytes(data))
    (out / first.splits["train"][3]["name"]).unlink()
    repaired = convert("generic", generic_input, str(out), shard_bytes="300KB")
    assert repaired.timing["units_built"] == 2
    assert comparable(repaired) == comparable(first)
    assert wdsprep.stream.verify.verify(str(out)).bad == []


def test_changed_config_rebuilds_and_manifest_never_lies(tmp_path, generic_input):
    out = tmp_path / "out"
    convert("generic", generic_input, str(out), shard_bytes="300KB")
    changed = convert("generic", generic_input, str(out), shard_bytes="300KB", zstd_level=5)
    assert changed.timing["units_reused"] == 0
    listed = {row["name"] for rows in changed.splits.values() for row in rows}
    assert set(_shards(out)) == listed


STALLING_SOURCE = '''
import os
import time
from wdsprep.sources.generic import GenericSource

class Stalling(GenericSource):
    """Unit train/2 stops half-way through its shard (announced by a marker file) until killed;
    once the marker exists (the re-run), every unit builds normally."""

    def build(self, unit, ctx):
        marker = os.environ["STALL_MARKER"]
        stall = unit.split == "train" and unit.index == 2 and not os.path.exists(marker)
        for position, sample in enumerate(super().build(unit, ctx)):
            if stall and position == len(unit.items) // 2:
                open(marker, "w").close()
                time.sleep(3600)
            yield sample

SOURCE = Stalling()
'''


def test_kill_9_mid_shard_leaves_no_partial_shard_and_resumes(tmp_path, generic_input):
    (tmp_path / "stallingsource.py").write_text(STALLING_SOURCE)
    out, marker = tmp_path / "out", tmp_path / "stalled"
    env = dict(os.environ, STALL_MARKER=str(marker), PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    command = CLI + ["convert", "stallingsource:SOURCE", generic_input, str(out), "--shard-bytes", "300KB", "--quiet"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:  # no race: the kill comes while unit train/2 is provably inside its shard
        wait_for(lambda: marker.exists() and len(_shards(out)) >= 2 or process.poll() is not None,
                 "the conversion to stall mid-shard after two finished shards")
        assert process.poll() is None, process.stderr.read().decode()
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # the CLI and its pool workers (a session of their own)
        process.wait(timeout=EVENT)
    assert any(p.endswith(".tmp") for p in os.listdir(out)), "killed while writing a shard"
    assert not (out / "manifest.json").exists()
    for name in _shards(out):  # whatever has a final name is a complete tar
        assert (out / name).read_bytes().endswith(b"\0" * 1024)
        subprocess.run(["tar", "tf", str(out / name)], check=True, capture_output=True)
    finished = subprocess.run(command, env=env, capture_output=True, text=True, timeout=SUBPROCESS)
    assert finished.returncode == 0, finished.stderr
    manifest = wdsprep.stream.load_manifest(str(out))
    assert manifest.timing["units_reused"] >= 1
    assert not [p for p in os.listdir(out) if p.endswith(".tmp")]
    reference = convert("generic", generic_input, str(tmp_path / "reference"), shard_bytes="300KB")
    assert manifest.splits == reference.splits


def test_verify_names_flipped_and_truncated_shards(tmp_path, generic_input):
    out = tmp_path / "out"
    manifest = convert("generic", generic_input, str(out), shard_bytes="300KB")
    good = subprocess.run(CLI + ["verify", str(out), "--quiet"], capture_output=True, text=True)
    assert good.returncode == 0 and "0 bad" in good.stdout
    flipped, truncated = (manifest.splits["train"][i]["name"] for i in (0, 2))
    data = bytearray((out / flipped).read_bytes())
    data[len(data) // 2] ^= 0x01
    (out / flipped).write_bytes(bytes(data))
    whole = (out / truncated).read_bytes()
    (out / truncated).write_bytes(whole[: len(whole) // 2])
    bad = subprocess.run(CLI + ["verify", str(out), "--quiet"], capture_output=True, text=True)
    assert bad.returncode == 1
    assert flipped in bad.stderr and truncated in bad.stderr and "2 bad" in bad.stdout


def test_reading_a_truncated_shard_names_it_or_skips_with_a_warning(tmp_path, generic_input):
    out = tmp_path / "out"
    manifest = convert("generic", generic_input, str(out), shard_bytes="300KB")
    name = manifest.splits["train"][0]["name"]
    whole = (out / name).read_bytes()
    (out / name).write_bytes(whole[: len(whole) // 3])
    with pytest.raises(wdsprep.ShardError, match=name):
        list(wdsprep.dataset(str(out), "train", shuffle_shards=False))
    import webdataset as wds

    with pytest.warns(UserWarning, match=name):
        samples = list(wdsprep.dataset(str(out), "train", shuffle_shards=False, handler=wds.warn_and_continue))
    assert manifest.samples("train") - manifest.splits["train"][0]["samples"] <= len(samples) < manifest.samples("train")


def test_cli_errors_are_one_line(tmp_path):
    result = subprocess.run(CLI + ["convert", "generic", str(tmp_path / "missing"), str(tmp_path / "out")], capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [f"wdsprep: error: {tmp_path / 'missing'}: not a directory"]


def test_inspect_shows_splits_ratio_and_fields(tmp_path, generic_input):
    convert("generic", generic_input, str(tmp_path / "out"), shard_bytes="300KB")
    result = subprocess.run(CLI + ["inspect", str(tmp_path / "out")], capture_output=True, text=True, check=True)
    assert "train:" in result.stdout and "200 samples" in result.stdout and "compression" in result.stdout
    assert "array.npy.zst: float32[4096]" in result.stdout and "meta.mp: {index, label, name}" in result.stdout
    data = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert data["format"] == "wdsprep/2" and data["totals"]["samples"] == 220


def test_inspect_never_shows_a_corrupted_sample(tmp_path, generic_input):
    """The samples `inspect` shows are read checked: with one byte flipped in any member of them
    (no compression, so the flipped member decodes as well as the intact one), the command ends
    with one line naming the shard, rc 1, and that sample is not shown."""
    from tests.core.shardsets import each_member_flipped
    from wdsprep.conformance import run_cli, tar_samples

    out = tmp_path / "out"
    status, _, err = run_cli("convert", "generic", generic_input, out, "--codec", "none", "--quiet")
    assert status == 0, err
    status, intact, _ = run_cli("inspect", out, "--samples", "3")
    first = sorted(out.glob("train-*.tar"))[0]
    shown = [key for key, _ in tar_samples(first)[:3]]
    assert status == 0 and all(f"train/{key}: " in intact for key in shown)
    flipped = 0
    for path, key, member in each_member_flipped(out, first.name, keep=lambda key, member: key in shown):
        flipped += 1
        status, stdout, stderr = run_cli("inspect", out, "--samples", "3")
        assert status == 1 and stderr.count("\n") == 1 and path.name in stderr and f"{key}.{member}" in stderr, stderr
        assert f"train/{key}: " not in stdout and stdout.split("  train/")[0] == intact.split("  train/")[0]
    assert flipped == 3 * 2


def test_split_option_converts_only_that_split_and_keeps_other_shards(tmp_path, generic_input):
    out = tmp_path / "out"
    full = convert("generic", generic_input, str(out), shard_bytes="300KB")
    valid_names = {row["name"] for row in full.splits["valid"]}
    only_train = convert("generic", generic_input, str(out), shard_bytes="300KB", zstd_level=4, splits=["train"])
    assert set(only_train.splits) == {"train"}
    assert valid_names <= set(_shards(out))  # another split's shards are not this run's to delete
    with pytest.raises(wdsprep.ConfigError, match="no split"):
        convert("generic", generic_input, str(out), splits=["nope"])
