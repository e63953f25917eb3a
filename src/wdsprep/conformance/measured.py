"""`wdsprep ARGS` in a child process that counts what it did: `run_measured(argv)`.

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
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import zlib

ADDRESS_SPACE_LIMIT = 8 << 30  # far above a conversion of the suite's inputs, below the machine
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


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1], sys.argv[2:]))
