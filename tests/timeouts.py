"""Hang guards for a loaded machine, in one place.

These limits only stop a test that would otherwise hang; no test asserts that anything is fast
(speed claims live in `make bench`). They are generous on purpose: a CI machine running other jobs
on every core must not fail a correct change. Scale them all with WDSPREP_TEST_TIMEOUT_SCALE.
"""
import os
import time

SCALE = float(os.environ.get("WDSPREP_TEST_TIMEOUT_SCALE", "1"))
SUBPROCESS = 600 * SCALE  # one CLI run, torchrun job or conversion in a child process
EVENT = 180 * SCALE  # waiting for something observable: a file appearing, a server going idle, a child exiting


def wait_for(condition, what: str, limit: float = EVENT, poll: float = 0.02):
    """Poll `condition()` until it returns something true (returned) or `limit` seconds pass (fails)."""
    deadline = time.monotonic() + limit
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {limit:.0f} s waiting for {what}")
        time.sleep(poll)
