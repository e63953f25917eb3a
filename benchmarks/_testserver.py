"""The project's test HTTP server (`python -m wdsprep.testing http`) in a process of its own, for the
benchmarks that read through it: `server(root)` starts it, `ask(process, command)` sends it one
command (`stats`, `clear`, `shape RATE TOTAL LATENCY SETUP`) and returns its answer."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys


def server(root: pathlib.Path) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([sys.executable, "-m", "wdsprep.testing", "http", str(root)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    url = process.stdout.readline().strip()
    if not url:
        process.kill()
        raise RuntimeError("the test http server did not start")
    return process, url


def ask(process: subprocess.Popen, command: str) -> dict:
    process.stdin.write(command + "\n")
    process.stdin.flush()
    return json.loads(process.stdout.readline())
