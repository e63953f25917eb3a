"""`--executor ray`: conversion units as Ray tasks, on a local Ray or an existing cluster.

Each unit is one Ray task that builds the unit's shard(s), publishes them to the output store and
returns the manifest rows; the driver (`wdsprep.conversion`) orders the results by unit and writes the
manifest last, exactly as with the local process pool, so the bytes do not depend on the executor.

- No address (and no `RAY_ADDRESS` in the environment): a private local Ray with `workers` CPUs is
  started for the conversion and shut down at the end. If the caller already called `ray.init()`,
  that Ray is used and left running.
- `address="auto" | "HOST:PORT" | "ray://HOST:10001"`: `ray.init(address=...)` joins an existing
  cluster. Tasks are limited only by the cluster's CPUs (one CPU per task), or by `workers` when it
  is more than 1. The input must be readable, and the output writable, at the same path or URL on
  every node (shared filesystem or object storage).
- `runtime_env` (e.g. `{"env_vars": {...}}`, `{"pip": ["wdsprep[ray,s3]"]}`) is the job's Ray
  runtime environment when this executor starts or joins Ray, and each task's when Ray was already
  initialized by the caller.
- A unit whose task fails (an exception in the build, a worker or node that died) is resubmitted up
  to `retries` times (default 2, or `$WDSPREP_RAY_RETRIES`); after that it is handed back to the
  driver as a `UnitFailedError` naming the last cause, and the driver reports the unit with its
  inputs and writes no manifest.
"""
from __future__ import annotations

import logging
import os
import socket
import sys
from typing import Any, Callable, Iterator, Sequence

from . import errors  # UnitFailedError is named through its home: this module re-exports no exception
from .checks import whole_number
from .errors import ConfigError

try:
    import ray
except ImportError as error:  # `executors._ray` turns this into the install hint
    raise ImportError(f"ray is not installed ({error})") from None

DEFAULT_RETRIES = 2
LOCAL_OBJECT_STORE_BYTES = 128 * 1024 * 1024  # results are a few manifest rows: keep Ray's store small


def _run_unit(fn: Callable, args: tuple, extra_paths: Sequence[str], driver_cwd: str):
    """The Ray task: run one unit as if in the driver's directory.

    Relative input paths in a unit's items resolve against the driver's working directory when it
    exists on this node (same machine, or a shared filesystem mounted at the same path); a worker
    of a cluster started elsewhere would otherwise resolve them against its own directory. The
    driver's import paths are added on a single-machine Ray only (see `_extra_paths`).
    """
    if driver_cwd and os.path.isdir(driver_cwd) and os.getcwd() != driver_cwd:
        os.chdir(driver_cwd)
    for path in extra_paths:
        if path not in sys.path:
            sys.path.append(path)
    return fn(*args)


def _unwrap(error: BaseException) -> tuple[BaseException, str]:
    """The user exception inside a RayTaskError (with the remote traceback), else the Ray error."""
    if isinstance(error, ray.exceptions.RayTaskError):
        cause = getattr(error, "cause", None)
        if isinstance(cause, BaseException):
            return cause, str(error)
    return error, ""


def _check_reachable(address: str, timeout: float = 10.0) -> None:
    """Fail fast on a `HOST:PORT` (or `ray://HOST:PORT`) nobody listens on: `ray.init` would retry
    for minutes, printing connection warnings."""
    target = address.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return  # "auto", "local" or a form Ray resolves itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as error:
        raise ConfigError(
            f"cannot reach the Ray cluster at {address!r} ({error.strerror or error}); "
            "start it with `ray start --head` or check --ray-address"
        ) from None


class RayExecutor:
    name = "ray"

    def __init__(
        self,
        workers: int = 1,
        address: str | None = None,
        retries: int | None = None,
        runtime_env: dict | None = None,
        num_cpus_per_task: float = 1,
        init_options: dict | None = None,
        **unknown: Any,
    ):
        if unknown:
            raise ConfigError(f"unknown Ray executor option(s): {', '.join(sorted(unknown))}")
        if workers < 1:
            raise ConfigError(f"--workers must be at least 1 (got {workers})")
        meaning = f"attempts of a failed unit after its first on Ray; default {DEFAULT_RETRIES}"
        if retries is not None:
            retries = whole_number(retries, "retries", 0, meaning)
        elif "WDSPREP_RAY_RETRIES" in os.environ:  # read when the executor is made, never at import
            retries = whole_number(os.environ["WDSPREP_RAY_RETRIES"], "WDSPREP_RAY_RETRIES", 0, meaning)
        else:
            retries = DEFAULT_RETRIES
        self.workers = int(workers)
        self.address = address or os.environ.get("RAY_ADDRESS") or None
        self.retries = int(retries)
        self.runtime_env = runtime_env
        self.num_cpus_per_task = num_cpus_per_task
        self.init_options = dict(init_options or {})
        self.attempts: dict[int, int] = {}  # task index -> attempts made (for reports and tests)

    # ------------------------------------------------------------------ connection
    def _connect(self) -> bool:
        """Start or join Ray; True when this executor started it (and must shut it down)."""
        if ray.is_initialized():
            return False
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        quiet = dict(log_to_driver=False, logging_level=logging.ERROR, configure_logging=True)
        options = dict(quiet, **self.init_options)
        if self.runtime_env is not None:
            options["runtime_env"] = self.runtime_env
        try:
            if self.address:
                _check_reachable(self.address)
                ray.init(address=self.address, **options)
            else:
                options.setdefault("object_store_memory", LOCAL_OBJECT_STORE_BYTES)
                # "local": a private instance, never one that `ray start` left running
                ray.init(address="local", num_cpus=self.workers, include_dashboard=False, **options)
        except ConnectionError as error:
            raise ConfigError(f"cannot connect to the Ray cluster at {self.address!r}: {error}") from None
        return True

    def _max_in_flight(self) -> int:
        if self.workers > 1 or not self.address:
            return self.workers
        cpus = int(ray.cluster_resources().get("CPU", 1) // max(self.num_cpus_per_task, 1e-9))
        return max(cpus, 1)

    def _extra_paths(self, started: bool) -> list[str]:
        # When every node is this machine, let tasks import what the driver can (e.g. a
        # `module:OBJECT` source plugin found through the driver's sys.path). The nodes of a real
        # cluster have their own environment: there, wdsprep and plugins must be installed.
        if not started or self.address:
            try:
                here = ray.util.get_node_ip_address()
                nodes = [node for node in ray.nodes() if node.get("Alive")]
            except Exception:
                return []
            if not nodes or any(node.get("NodeManagerAddress") != here for node in nodes):
                return []
        return [path for path in sys.path if path and os.path.isdir(path)]

    # ------------------------------------------------------------------ running
    def map_unordered(self, fn: Callable, tasks: Sequence[tuple]) -> Iterator[tuple[int, Any]]:
        if not tasks:
            return
        started = self._connect()
        pending: dict[Any, int] = {}
        try:
            task_options = dict(num_cpus=self.num_cpus_per_task, max_retries=0, retry_exceptions=False)
            if self.runtime_env is not None and not started:
                task_options["runtime_env"] = self.runtime_env  # Ray was up already: per task
            remote = ray.remote(_run_unit).options(**task_options)
            fn_ref = ray.put(fn)
            paths = self._extra_paths(started)
            cwd = os.getcwd()
            limit = self._max_in_flight()
            if started and not self.address:
                # our private Ray has exactly `workers` CPUs, so Ray itself bounds what runs; one
                # task queued beside them starts the moment a CPU frees instead of after a round
                # trip through this driver
                limit += 1
            queue = list(range(len(tasks)))
            queue.reverse()  # pop() from the end: units start in plan order
            self.attempts = {}

            def submit(index: int) -> None:
                self.attempts[index] = self.attempts.get(index, 0) + 1
                pending[remote.remote(fn_ref, tasks[index], paths, cwd)] = index

            while queue or pending:
                while queue and len(pending) < limit:
                    submit(queue.pop())
                ready, _ = ray.wait(list(pending), num_returns=1)
                ref = ready[0]
                index = pending.pop(ref)
                try:
                    result = ray.get(ref)
                except Exception as error:  # a build exception, or a worker / node that died
                    if self.attempts[index] <= self.retries:
                        submit(index)  # retried at once: it stays in flight, within the limit
                        continue
                    cause, trace = _unwrap(error)
                    yield index, errors.UnitFailedError(cause, self.attempts[index], trace)
                    continue
                yield index, result
        finally:
            for ref in pending:
                try:
                    ray.cancel(ref, force=True)
                except Exception:  # already finished or gone
                    pass
            if started:
                ray.shutdown()

