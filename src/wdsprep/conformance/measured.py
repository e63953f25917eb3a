"""`wdsprep ARGS` in a child process that counts what it did: `run_measured(argv)`; and every reader
of shards on a list of datasets, in one child process that measures each read: `run_readers(plan)`.

The conformance suite's hostile-input tests judge a refusal by what the conversion did, never by
the clock: the bytes it read (`rchar` of /proc/self/io: every read(2), from files, archives or
pipes) plus the bytes Python's zlib inflated for it (zip members, gzip files, zlib chunks: the
work a decompression bomb asks for, which no read(2) shows), and the growth of its resident
memory (peak RSS over the RSS when `main` starts: numpy, h5py, blosc and every other
allocator alike; `VmHWM`, reset when `main` starts, not `ru_maxrss`, which counts the pytest process
the child was forked from). The child's address space is capped (`ADDRESS_SPACE_LIMIT`) so that code that
does expand a bomb fails inside its child instead of taking the machine's memory.

    python -m wdsprep.conformance.measured RESULT.json convert SOURCE INPUT OUTPUT ...

writes `{"status", "read_bytes", "inflated_bytes", "rss_growth"}` to RESULT.json (status: main's
return value); the command's stderr is the child's.

The readers (`READERS`: `wdsprep.dataset` with `wdsprep.decode()`, `wdsprep.MapDataset`, `wdsprep
inspect`, `wdsprep verify`, `wdsprep show`) are run on each dataset of a plan in turn by one child
(`python -m wdsprep.conformance.measured --readers`), kept for the life of the process that started
it: it takes one plan per line on its stdin and answers each when its results are written, so the
suite's classes share its imports (torch's among them). For each plan, each reader first reads a
clean dataset (its imports and caches are its baseline), then the child's address space is capped at
what it uses plus `READ_HEADROOM` (a reader that allocates what a bomb declares fails there, not in
the machine's memory; the cap is lifted again for the next plan's baseline), and each read of a
plan's dataset is measured alone: its peak RSS (`VmHWM`, reset before it) over its RSS before it,
what it raised (a wdsprep error as its one line; anything else, or an error of more than one line,
as the traceback) and what a command wrote to stderr.
"""
from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import resource
import select
import subprocess
import sys
import tempfile
import time
import traceback
import zlib
from typing import Callable

ADDRESS_SPACE_LIMIT = 8 << 30  # far above a conversion of the suite's inputs, below the machine
READ_HEADROOM = 1 << 30  # address space a reader may map beyond its baseline (far above a refusal's needs)
HANG_GUARD = 600 * float(os.environ.get("WDSPREP_TEST_TIMEOUT_SCALE", "1"))  # seconds; never a speed check


def _rchar() -> int:
    with open("/proc/self/io") as handle:
        return int(next(line for line in handle if line.startswith("rchar:")).split()[1])


def _status_bytes(field: str) -> int:
    """A memory line of /proc/self/status (`VmRSS`, `VmHWM`: kB) in bytes."""
    with open("/proc/self/status") as handle:
        return int(next(line for line in handle if line.startswith(field + ":")).split()[1]) * 1024


def _reset_peak() -> None:
    """Start the peak RSS (`VmHWM`) afresh: `getrusage`'s `ru_maxrss` also counts what the process
    had before it exec'd python -- the pytest process it was forked from."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        pass  # kernels before 4.0: VmHWM then also counts the imports, which only loosens the bound


class _CountingDecompressor:
    """A zlib decompressobj that adds what it returns to the count."""

    def __init__(self, inner, counter: list):
        self._inner, self._counter = inner, counter

    def decompress(self, data, max_length=0):
        out = self._inner.decompress(data, max_length)
        self._counter[0] += len(out)
        return out

    def flush(self, *args):
        out = self._inner.flush(*args)
        self._counter[0] += len(out)
        return out

    def __getattr__(self, name):  # eof, unused_data, unconsumed_tail, copy
        return getattr(self._inner, name)


def _count_inflation(counter: list) -> None:
    decompressobj, decompress = zlib.decompressobj, zlib.decompress

    def counting_decompressobj(*args, **kwargs):
        return _CountingDecompressor(decompressobj(*args, **kwargs), counter)

    def counting_decompress(*args, **kwargs):
        out = decompress(*args, **kwargs)
        counter[0] += len(out)
        return out

    zlib.decompressobj, zlib.decompress = counting_decompressobj, counting_decompress


def _child(result_path: str, argv: list[str]) -> int:
    inflated = [0]
    _count_inflation(inflated)
    from ..cli import main

    _reset_peak()
    rss_before, read_before = _status_bytes("VmRSS"), _rchar()
    status = main(argv)
    read_bytes = _rchar() - read_before
    peak = _status_bytes("VmHWM")
    with open(result_path, "w") as handle:
        json.dump({"status": status, "read_bytes": read_bytes, "inflated_bytes": inflated[0],
                   "rss_growth": max(0, peak - rss_before)}, handle)
    return 0


def _limit_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))


def run_measured(argv: list[str]) -> tuple[dict, int, str]:
    """`wdsprep *argv` in a child process: (its counts, or {} if it died before writing them; the
    child's exit status, negative for a signal; its stderr)."""
    if not os.path.exists("/proc/self/io"):
        import pytest

        pytest.skip("counting a child's reads needs Linux's /proc/self/io")
    with tempfile.TemporaryDirectory() as scratch:
        result = os.path.join(scratch, "result.json")
        child = subprocess.run([sys.executable, "-m", "wdsprep.conformance.measured", result, *map(str, argv)],
                               capture_output=True, text=True, timeout=HANG_GUARD, preexec_fn=_limit_address_space)
        counts = {}
        if os.path.exists(result):
            with open(result) as handle:
                counts = json.load(handle)
    return counts, child.returncode, child.stderr


# -- every reader of shards, measured
def _read_dataset(location: str, split: str, scratch: str) -> None:
    import wdsprep

    for _ in wdsprep.dataset(location, split, shuffle_buffer=0).compose(wdsprep.decode()):
        pass


def _read_mapdataset(location: str, split: str, scratch: str) -> None:
    import wdsprep

    samples = wdsprep.MapDataset(location, split, decode=True)
    for position in range(len(samples)):
        samples[position]


def _command(*argv: str) -> Callable:
    def run(location: str, split: str, scratch: str) -> tuple[int, str]:
        from ..cli import main

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main([arg.format(location=location, split=split, scratch=scratch) for arg in argv])
        return status, err.getvalue()

    return run


READERS: dict[str, Callable] = {  # name -> run(location, split, scratch): None, or a command's (status, stderr)
    "dataset": _read_dataset,
    "MapDataset": _read_mapdataset,
    "inspect": _command("inspect", "{location}", "--split", "{split}", "--samples", "1"),
    "verify": _command("verify", "{location}", "--quiet"),
    "show": _command("show", "{location}", "--split", "{split}", "--samples", "1", "--out", "{scratch}/show.html", "--quiet"),
}


def _read(reader: Callable, location: str, split: str, scratch: str) -> dict:
    """One reader on one dataset: {"status": 0 | 1 | "traceback", "error": its line(s), "rss_growth"}."""
    from ..errors import WdsprepError

    _reset_peak()
    before = _status_bytes("VmRSS")
    try:
        done = reader(location, split, scratch)
        status, error = done if done is not None else (0, "")
        error = "\n".join(line for line in error.splitlines() if not line.startswith("wdsprep: warning: "))
        if status not in (0, 1) or len(error.strip().splitlines()) > 1:
            status = "traceback"
    except WdsprepError as caught:
        status, error = 1, f"{type(caught).__name__}: {caught}"
    except BaseException:  # noqa: BLE001 - MemoryError, RecursionError, ...: what the user would see
        status, error = "traceback", traceback.format_exc()
    growth = max(0, _status_bytes("VmHWM") - before)
    return {"status": status, "error": error.strip(), "rss_growth": growth}


def _read_plan(plan: dict) -> dict:
    """A plan's reads (`run_readers`): the baseline with the address space the child started with,
    the datasets' with `READ_HEADROOM` above what the baseline left mapped."""
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
    scratch = plan["scratch"]
    baseline = {name: _read(reader, *plan["clean"], scratch) for name, reader in READERS.items()}
    resource.setrlimit(resource.RLIMIT_AS, (min(_status_bytes("VmSize") + READ_HEADROOM, hard), hard))
    results = {kind: {name: _read(reader, location, split, scratch) for name, reader in READERS.items()}
               for kind, (location, split) in plan["datasets"].items()}
    return {"baseline": baseline, "results": results}


DONE = "wdsprep-readers-done"  # the child's answer to a plan, one line on its stdout


def _readers_child() -> int:
    """The reader child's loop: a line `[plan path, result path]` (JSON) in, the plan's reads written
    to the result path, a line `[DONE, result path]` out; until its stdin closes."""
    for line in sys.stdin:
        plan_path, result_path = json.loads(line)
        with open(plan_path) as handle:
            found = _read_plan(json.load(handle))
        with open(result_path, "w") as handle:
            json.dump(found, handle)
        print(json.dumps([DONE, result_path]), flush=True)
    return 0


_reader_child: tuple[subprocess.Popen, object] | None = None  # (the child, the file its stderr goes to)


def _started_reader_child() -> tuple[subprocess.Popen, object]:
    """The reader child of this process: started at first use (and again if it died), its stdin closed
    at exit (its loop then ends)."""
    global _reader_child
    if _reader_child is None or _reader_child[0].poll() is not None:
        log = tempfile.TemporaryFile("w+")
        child = subprocess.Popen([sys.executable, "-m", "wdsprep.conformance.measured", "--readers"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1, preexec_fn=_limit_address_space)
        atexit.register(child.stdin.close)
        _reader_child = (child, log)
    return _reader_child


def _stderr_of(log) -> str:
    log.seek(0)
    text = log.read()
    log.seek(0, io.SEEK_END)
    return text[-20000:]


def run_readers(clean: tuple[str, str], datasets: dict[str, tuple[str, str]]) -> tuple[dict, int, str]:
    """Every reader of `READERS` on each of `datasets` ({name: (location, split)}), in this process's
    reader child, after reading `clean` (location, split) as its baseline: ({"baseline": {reader: read},
    "results": {name: {reader: read}}}, or {} if the child died or hung; its exit status, or 0 while it
    lives; what it wrote to stderr), each read being {"status": 0, 1 or "traceback", "error",
    "rss_growth"} (see the module docstring). A child that hangs past `HANG_GUARD` is killed."""
    if not os.path.exists("/proc/self/status"):
        import pytest

        pytest.skip("measuring a child's peak memory needs Linux's /proc/self/status")
    child, log = _started_reader_child()
    with tempfile.TemporaryDirectory() as scratch:
        result, plan = os.path.join(scratch, "result.json"), os.path.join(scratch, "plan.json")
        with open(plan, "w") as handle:
            json.dump({"clean": list(clean), "datasets": {name: list(where) for name, where in datasets.items()},
                       "scratch": scratch}, handle)
        try:
            child.stdin.write(json.dumps([plan, result]) + "\n")
            child.stdin.flush()
        except OSError:  # it died between plans
            return {}, child.wait(), _stderr_of(log)
        if not _answered(child, json.dumps([DONE, result]).encode()):
            return {}, child.wait(), _stderr_of(log)
        with open(result) as handle:
            return json.load(handle), 0, _stderr_of(log)


def _answered(child: subprocess.Popen, answer: bytes) -> bool:
    """Whether the child wrote the line `answer` (among any others) before it died or `HANG_GUARD`
    passed (then it is killed: a hang guard, never a speed check)."""
    deadline, pending = time.monotonic() + HANG_GUARD, b""
    fd = child.stdout.fileno()
    while True:
        lines = pending.split(b"\n")
        if any(line.strip() == answer for line in lines[:-1]):
            return True
        pending = lines[-1]
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            child.kill()
            return False
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return False
        pending += chunk


if __name__ == "__main__":
    if sys.argv[1] == "--readers":
        sys.exit(_readers_child())
    sys.exit(_child(sys.argv[1], sys.argv[2:]))
