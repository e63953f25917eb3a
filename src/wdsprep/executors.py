"""Where conversion units run: in-process, on a local process pool, or as Ray tasks.

`EXECUTORS` is the one table of `--executor` names (the CLI's choices come from it): name -> factory
`(workers, **options) -> executor`; `ray_executor` is imported only by its factory, so Ray is loaded
only when chosen and nothing here is imported back by it. An executor's `map_unordered(fn, tasks)` is
a generator of (task index, result or exception) in completion order; closing it stops the work.
Output bytes never depend on the executor or the worker count: each unit writes its own shard from
its own inputs, and the driver orders results by unit before writing the manifest.
"""
from __future__ import annotations

import concurrent.futures as futures
import multiprocessing
from typing import Any, Callable, Iterator, Sequence

from .errors import ConfigError


class InlineExecutor:
    name = "inline"

    def map_unordered(self, fn: Callable, tasks: Sequence[tuple]) -> Iterator[tuple[int, Any]]:
        for index, args in enumerate(tasks):
            try:
                yield index, fn(*args)
            except Exception as error:  # reported per unit by the driver
                yield index, error


class LocalExecutor:
    """A process pool of `workers` processes (spawned, so no state leaks in from the driver)."""

    name = "local"

    def __init__(self, workers: int):
        if workers < 1:
            raise ConfigError(f"--workers must be at least 1 (got {workers})")
        self.workers = workers

    def map_unordered(self, fn: Callable, tasks: Sequence[tuple]) -> Iterator[tuple[int, Any]]:
        if self.workers == 1 or len(tasks) <= 1:
            yield from InlineExecutor().map_unordered(fn, tasks)
            return
        context = multiprocessing.get_context("spawn")
        with futures.ProcessPoolExecutor(max_workers=self.workers, mp_context=context) as pool:
            pending = {pool.submit(fn, *args): index for index, args in enumerate(tasks)}
            try:
                for future in futures.as_completed(pending):
                    index = pending[future]
                    error = future.exception()
                    yield index, (error if error is not None else future.result())
            except BaseException:
                for future in pending:
                    future.cancel()
                raise


def _ray(workers: int = 1, **options: Any):
    try:
        from .ray_executor import RayExecutor  # imports ray (seconds): only when asked for
    except ImportError as error:
        raise ConfigError(f"--executor ray needs Ray: pip install 'wdsprep[ray]' ({error})") from None
    return RayExecutor(workers=workers, **options)


def _local(workers: int = 1, **options: Any) -> LocalExecutor:
    return LocalExecutor(workers)  # no options: a local pool has nothing to tune but its size


EXECUTORS: dict[str, Callable[..., Any]] = {"local": _local, "ray": _ray}  # --executor NAME -> factory


def get_executor(name: str, workers: int = 1, **options: Any):
    if name not in EXECUTORS:
        raise ConfigError(f"unknown executor {name!r} (known: {', '.join(sorted(EXECUTORS))})")
    return EXECUTORS[name](workers=workers, **options)
