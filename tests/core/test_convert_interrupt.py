"""Ctrl-C at any moment of `wdsprep convert`: exactly one line, exit 130, no traceback, no temporary
file, no process left behind.

A terminal's Ctrl-C sends SIGINT to the whole foreground process group, the pool's workers
included: each run here is a session of its own and gets `killpg(SIGINT)`, as from a terminal. The
conversion is the stalling plugin source of test_conversion (unit train/2 stops half-way through its
shard for an hour), so it never finishes on its own and every moment can be hit without a race:
while the pool's workers start (they are still importing), at several points after the lock is
taken (planning, fingerprinting, units in flight), and mid-shard, with a pool and inline. A read-only
command (`verify`, `inspect`) interrupted says so without asking for a re-run: it has nothing to resume."""
import os
import pathlib
import signal
import socket
import subprocess
import sys
import textwrap
import time
import tomllib

import pytest

from tests.timeouts import EVENT, wait_for

from .test_conversion import STALLING_SOURCE

CLI = [sys.executable, "-m", "wdsprep"]
INTERRUPTED = ["wdsprep: interrupted (re-run the same command to resume)"]


def _start(tmp_path, generic_input, workers):
    (tmp_path / "stallingsource.py").write_text(STALLING_SOURCE)
    out, marker = tmp_path / "out", tmp_path / "stalled"
    env = dict(os.environ, STALL_MARKER=str(marker), PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    command = CLI + ["convert", "stallingsource:SOURCE", generic_input, str(out), "--shard-bytes", "300KB",
                     "--workers", str(workers), "--quiet"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    return process, out, marker


def _group(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:
                continue  # it exited while we looked
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append(int(entry))
    return found


def _children(pid: int) -> list[int]:
    children = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                children += [int(child) for child in handle.read().split()]
        except OSError:
            continue
    return children


def _ctrl_c(process, out, done_allowed: bool = False):
    """SIGINT to the process group, as Ctrl-C does; then the contract: the one line and exit 130, or,
    with `done_allowed` (the work may have finished before the signal), also exit 0 with nothing
    said (the caller then checks that the output is whole), and a manifest left beside the one line
    only if the output verifies whole."""
    assert process.poll() is None, process.stderr.read().decode()
    os.killpg(process.pid, signal.SIGINT)
    try:
        _, err = process.communicate(timeout=EVENT)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    lines = err.decode().splitlines()
    if done_allowed and (process.returncode, lines) == (0, []):
        wait_for(lambda: not _group(process.pid), "every process of the conversion to exit")
        return
    assert (process.returncode, lines) == (130, INTERRUPTED), err.decode()
    left = sorted(os.listdir(out)) if out.exists() else []
    assert not [name for name in left if name.endswith(".tmp")], left
    wait_for(lambda: not _group(process.pid), "every process of the conversion to exit")
    if "manifest.json" in left:  # only where the work may have been done when the signal came: then whole
        assert done_allowed, left
        assert subprocess.run(CLI + ["verify", str(out), "--quiet"], capture_output=True).returncode == 0


pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads /proc")


def test_ctrl_c_while_the_pool_starts_is_one_line(tmp_path, generic_input):
    process, out, _ = _start(tmp_path, generic_input, workers=2)
    try:  # the resource tracker and the first worker exist: that worker has only begun to start up
        wait_for(lambda: len(_children(process.pid)) >= 2 or process.poll() is not None, "the pool's first worker to start")
    finally:
        _ctrl_c(process, out)


@pytest.mark.parametrize("delay", [0.0, 0.15, 0.4, 0.8])
def test_ctrl_c_at_any_moment_after_the_start_is_one_line(tmp_path, generic_input, delay):
    process, out, _ = _start(tmp_path, generic_input, workers=2)
    try:
        wait_for(lambda: (out / ".wdsprep.lock").exists() or process.poll() is not None, "the conversion to take its lock")
        time.sleep(delay)  # some moment of planning, fingerprinting, pool start or units in flight
    finally:
        _ctrl_c(process, out)


@pytest.mark.parametrize("workers", [1, 2])
def test_ctrl_c_mid_shard_removes_the_shard_being_written(tmp_path, generic_input, workers):
    process, out, marker = _start(tmp_path, generic_input, workers)
    try:
        wait_for(lambda: marker.exists() and any(n.endswith(".tmp") for n in os.listdir(out)) or process.poll() is not None,
                 "unit train/2 to stall half-way through its shard")
    finally:
        _ctrl_c(process, out)
    assert any(name.endswith(".tar") for name in os.listdir(out)), "finished shards stay for the resume"


@pytest.mark.parametrize("delay", [0.1, 0.3, 0.6, 1.0, 1.5])
def test_ctrl_c_while_units_finish_is_one_line_or_the_conversion_is_whole(tmp_path, generic_input, delay):
    """A plain conversion of many small units: results flow back while the signal comes (the pool's
    own thread is busy); a run that finished first must have written a whole, verified output."""
    out = tmp_path / "out"
    command = CLI + ["convert", "generic", generic_input, str(out), "--shard-bytes", "40KB", "--workers", "2", "--quiet"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        wait_for(lambda: (out / ".wdsprep.lock").exists() or process.poll() is not None, "the conversion to take its lock")
        time.sleep(delay)
    finally:
        if process.poll() is None:
            _ctrl_c(process, out, done_allowed=True)
    if process.returncode == 0:  # it finished before the signal (or as it came): the output is whole
        assert process.stderr.closed or process.stderr.read() == b""  # closed: _ctrl_c read it, empty
        assert subprocess.run(CLI + ["verify", str(out), "--quiet"], capture_output=True).returncode == 0


def test_ctrl_c_just_as_the_conversion_ends_is_one_line_or_nothing(tmp_path, generic_input):
    """Ctrl-C the moment the manifest appears (the work is done, the command is returning or the
    interpreter exiting): either exit 130 with the one line, or exit 0 with nothing said and a whole
    output; never killed by the signal without a word, never a traceback from the shutdown. Five
    tries: the late moments are hit most of the time each."""
    for attempt in range(5):
        out = tmp_path / f"out{attempt}"
        command = CLI + ["convert", "generic", generic_input, str(out), "--shard-bytes", "40KB", "--workers", "2", "--quiet"]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        try:
            wait_for(lambda: (out / "manifest.json").exists() or process.poll() is not None, "the manifest to appear")
        finally:
            if process.poll() is None:
                _ctrl_c(process, out, done_allowed=True)
        if process.returncode == 0:
            assert process.stderr.closed or process.stderr.read() == b""  # closed: _ctrl_c read it, empty
            assert subprocess.run(CLI + ["verify", str(out), "--quiet"], capture_output=True).returncode == 0


def _request_received(listener) -> socket.socket | None:
    """The connection a command made to `listener` once its first request has been read whole (the
    command is then waiting for an answer that never comes), or None while none has come."""
    listener.settimeout(0.05)
    try:
        connection, _ = listener.accept()
    except TimeoutError:
        return None
    connection.settimeout(EVENT)
    received = b""
    while b"\r\n\r\n" not in received and (chunk := connection.recv(4096)):
        received += chunk
    return connection


@pytest.mark.parametrize("command", ["verify", "inspect"])
def test_ctrl_c_of_a_read_only_command_says_interrupted_without_a_resume_to_run(command):
    """A read-only command has nothing to resume: its Ctrl-C line does not ask for a re-run. The
    command is caught waiting on a server that has taken its request and never answers, so the
    signal comes while it waits, without a race."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/out"
        process = subprocess.Popen(CLI + [command, url, "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   start_new_session=True)
        connection = None
        try:
            connection = wait_for(lambda: _request_received(silent) or process.poll() is not None,
                                  f"`wdsprep {command}` to send its first request")
            assert process.poll() is None, process.stderr.read().decode()
            os.killpg(process.pid, signal.SIGINT)
            _, err = process.communicate(timeout=EVENT)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            if isinstance(connection, socket.socket):
                connection.close()
    assert (process.returncode, err.decode().splitlines()) == (130, ["wdsprep: interrupted"]), err.decode()


@pytest.mark.parametrize("command", ["verify", "inspect", "reindex"])
@pytest.mark.parametrize("name", ["train-00000-00.tar", "manifest.json"])
def test_a_fifo_under_a_dataset_name_is_one_line_never_waited_on(tmp_path, generic_input, command, name):
    """A FIFO where a shard or the manifest should be (nobody writes to it: opening it to read would
    wait forever) is refused as it is opened: exit 1, one line naming it and what it is."""
    out = tmp_path / "out"
    converted = subprocess.run(CLI + ["convert", "generic", generic_input, str(out), "--quiet"], capture_output=True,
                               text=True, timeout=EVENT)
    assert converted.returncode == 0, converted.stderr
    (out / name).unlink()
    os.mkfifo(out / name)
    ran = subprocess.run(CLI + [command, str(out), "--quiet"], capture_output=True, text=True, timeout=EVENT)
    said = [line for line in ran.stderr.splitlines() if "FIFO" in line]
    assert ran.returncode == 1 and len(said) == 1, ran.stderr
    assert f"{out / name}: " in said[0] and "a FIFO, not a regular file" in said[0], ran.stderr


# The first moments of `wdsprep convert`, before any file is touched, are imports: the Ctrl-C comes as
# the import of a named module begins (in the order a run meets them: the package root's, the command
# table's, numpy, the convert command's, the driver's), sent by the child to itself (a real SIGINT,
# raised as KeyboardInterrupt by Python's own handler right there). The child starts the command the
# two ways a user does: `python -m wdsprep` and the console script pyproject.toml declares.
_CTRL_C_AT_IMPORT = textwrap.dedent("""
    import importlib, importlib.abc, os, runpy, signal, sys

    how, target = sys.argv.pop(1), sys.argv.pop(1)

    class CtrlC(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, module=None):
            if name == target:
                sys.meta_path.remove(self)
                os.kill(os.getpid(), signal.SIGINT)
            return None

    sys.meta_path.insert(0, CtrlC())
    if how == "-m":
        runpy.run_module("wdsprep", run_name="__main__", alter_sys=True)
    else:  # the console script: `from MODULE import FUNCTION; sys.exit(FUNCTION())`, as pip writes it
        module, _, function = how.partition(":")
        sys.exit(getattr(importlib.import_module(module), function)())
""")
EARLY = ["wdsprep.cli", "numpy", "wdsprep.commands.convert", "wdsprep.conversion"]


def _console_script() -> str:
    pyproject = tomllib.loads((pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    return pyproject["project"]["scripts"]["wdsprep"]


@pytest.mark.parametrize("how", ["-m", "console script"])
@pytest.mark.parametrize("target", EARLY)
def test_ctrl_c_in_the_first_moments_is_one_line(tmp_path, generic_input, how, target):
    """Exit 130 with the one line (the resume line once the command is known), no traceback, nothing
    written; and the module named was indeed being imported (the signal came, or the run would finish)."""
    out = tmp_path / "out"
    entry = "-m" if how == "-m" else _console_script()
    result = subprocess.run([sys.executable, "-c", _CTRL_C_AT_IMPORT, entry, target, "convert", "generic",
                             generic_input, str(out), "--quiet"], capture_output=True, text=True, timeout=EVENT)
    lines = result.stderr.splitlines()
    assert result.returncode == 130 and len(lines) == 1, result.stderr
    assert lines[0] in ("wdsprep: interrupted", INTERRUPTED[0]), result.stderr
    if target == "wdsprep.conversion":  # the command runs: the line asks for the resume
        assert lines == INTERRUPTED
    assert not out.exists() or not [name for name in os.listdir(out) if name.endswith((".tar", ".tmp", ".json"))]
