"""The output side of a conversion: full disk, a second convert into the same directory, file modes."""
import errno
import os
import shutil
import signal
import stat
import subprocess
import sys
import tarfile

import pytest

import wdsprep.stream
from tests.timeouts import EVENT, SUBPROCESS, wait_for
from wdsprep.conversion import convert
from wdsprep.errors import OutputError
from wdsprep.shards import writer as writer_module

from .test_conversion import STALLING_SOURCE

CLI = [sys.executable, "-m", "wdsprep"]


def _temporaries(directory):
    return sorted(name for name in os.listdir(directory) if name.endswith(".tmp"))


# ------------------------------------------------------------------------------------ file modes
@pytest.mark.parametrize("umask, expected", [(0o022, 0o644), (0o002, 0o664)])
def test_written_files_get_ordinary_permissions(tmp_path, generic_input, umask, expected):
    previous = os.umask(umask)
    try:
        convert("generic", generic_input, str(tmp_path / "out"), shard_bytes="300KB")
        convert("generic", generic_input, str(tmp_path / "out"), shard_bytes="300KB", zstd_level=4)  # rewrites all
    finally:
        os.umask(previous)
    names = os.listdir(tmp_path / "out")
    assert "manifest.json" in names and "_units.json" in names and any(n.endswith(".tar") for n in names)
    modes = {name: stat.S_IMODE(os.stat(tmp_path / "out" / name).st_mode) for name in names}
    assert modes == {name: expected for name in names}


# ------------------------------------------------------------------------------------ full disk
class _FullDisk:
    """Files opened through it take `room` bytes in all, then every write fails with ENOSPC."""

    def __init__(self, room: int):
        self.room = room
        self.failures = 0

    def open(self, path, mode="r", *args, **kwargs):
        handle = open(path, mode, *args, **kwargs)
        disk = self

        class Limited:
            name = handle.name

            def write(self, data):
                if len(data) > disk.room:
                    disk.failures += 1
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
                disk.room -= len(data)
                return handle.write(data)

            def __getattr__(self, attribute):
                return getattr(handle, attribute)

        return Limited()


def test_a_full_disk_stops_at_the_first_enospc_and_leaves_no_temporaries(tmp_path, generic_input, monkeypatch):
    out = tmp_path / "out"
    disk = _FullDisk(room=700_000)  # about two shards of 300KB
    monkeypatch.setattr(writer_module, "open", disk.open, raising=False)
    with pytest.raises(OutputError) as caught:
        convert("generic", generic_input, str(out), shard_bytes="300KB")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(str(out / "train-00002-00.tar.tmp")) and "no space left" in message
    assert disk.failures == 1  # no unit was tried after the first failure
    assert _temporaries(out) == []
    assert not (out / "manifest.json").exists()
    monkeypatch.undo()
    resumed = convert("generic", generic_input, str(out), shard_bytes="300KB")
    assert resumed.timing["units_reused"] == 2  # the two shards written before the disk filled up


def test_a_full_disk_while_writing_the_manifest_is_one_line_and_leaves_no_temp_file(
        tmp_path, generic_input, monkeypatch):
    out = tmp_path / "out"
    real_fsync = os.fsync

    def fsync(fd):
        if ".manifest.json." in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OutputError, match=r"manifest\.json: no space left on the output device") as caught:
        convert("generic", generic_input, str(out), shard_bytes="300KB")
    assert "\n" not in str(caught.value)
    assert _temporaries(out) == [] and not (out / "manifest.json").exists()


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 1 MiB tmpfs (needs root and a kernel that lets this container mount; skipped otherwise)."""
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)],
                             capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    yield mount_point
    subprocess.run(["umount", str(mount_point)], check=True)


def test_a_real_full_disk_is_one_line_exit_1_and_no_temporaries(small_tmpfs, generic_input):
    out = small_tmpfs / "out"
    result = subprocess.run(CLI + ["convert", "generic", generic_input, str(out), "--shard-bytes", "300KB",
                                   "--quiet"], capture_output=True, text=True, timeout=SUBPROCESS)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("wdsprep: error: ") and "no space left" in lines[0]
    assert _temporaries(out) == [] and not (out / "manifest.json").exists()
    for name in os.listdir(out):  # what is left are complete shards, kept for a resume
        if name.endswith(".tar"):
            with tarfile.open(out / name) as archive:
                assert archive.getmembers()


# ------------------------------------------------------------------------------------ one convert at a time
def test_a_second_convert_refuses_while_one_runs_and_proceeds_after_kill_9(tmp_path, generic_input):
    (tmp_path / "stallingsource.py").write_text(STALLING_SOURCE)  # stalls mid-shard until killed
    out, marker = tmp_path / "out", tmp_path / "stalled"
    env = dict(os.environ, STALL_MARKER=str(marker), PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    command = CLI + ["convert", "stallingsource:SOURCE", generic_input, str(out), "--shard-bytes", "300KB", "--quiet"]
    holder = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        wait_for(lambda: marker.exists() or holder.poll() is not None, "the first convert to stall mid-shard")
        assert holder.poll() is None, "the first convert should still be running"
        second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=SUBPROCESS)
        assert holder.poll() is None, "the first convert should still be running"
        assert second.returncode == 1
        assert second.stderr.strip().splitlines() == [
            f"wdsprep: error: {out}: output directory in use by another wdsprep convert (pid {holder.pid}); "
            "wait for it to finish or choose another output"
        ]
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # the CLI and its workers (a session of their own)
        holder.wait(timeout=EVENT)
    after = subprocess.run([*command[:4], "generic", *command[5:]], capture_output=True, text=True, timeout=SUBPROCESS)
    assert after.returncode == 0, after.stderr
    assert _temporaries(out) == []
    reference = convert("generic", generic_input, str(tmp_path / "reference"), shard_bytes="300KB")
    assert wdsprep.stream.load_manifest(str(out)).splits == reference.splits


def test_the_lock_is_released_when_a_conversion_fails(tmp_path):
    out = tmp_path / "out"
    for _ in range(2):  # the second run would be refused if the first had kept the lock
        with pytest.raises(wdsprep.errors.InputError):
            convert("generic", str(tmp_path / "missing"), str(out))
    shutil.rmtree(out)
