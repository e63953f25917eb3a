"""Where conversion units run: in-process, on a local process pool, or as Ray tasks.

`EXECUTORS` is the one table of `--executor` names (the CLI's choices come from it): name -> an
`ExecutorKind`, which makes the executor (`kind(workers, **options)`) and declares the executor's own
command-line flags (`add_arguments(parser)`, and `options_from(args)`: the parsed flags as that
factory's options), so the core CLI names no executor's flag; a bare factory
`(workers, **options) -> executor` may stand in the table too (`executor_kind` gives it no flags).
`ray_executor` is imported only by its factory, so Ray is loaded only when chosen (the Ray flags are
declared here) and nothing here is imported back by it. An executor's `map_unordered(fn, tasks)` is
a generator of (task index, result or exception) in completion order; closing it stops the work.
Output bytes never depend on the executor or the worker count: each unit writes its own shard from
its own inputs, and the driver orders results by unit before writing the manifest.

Ctrl-C belongs to the driver. A terminal sends SIGINT to every process of the foreground group,
worker processes included; `process_pool`'s workers start with SIGINT blocked (the signal mask is
inherited through fork and exec, so this holds from their first instruction on, while they import),
so they never print a KeyboardInterrupt traceback. The driver gets the KeyboardInterrupt, and a
pool left by any exception terminates its workers at once instead of waiting for their units.
"""
from __future__ import annotations

import argparse
import concurrent.futures as futures
import contextlib
import multiprocessing.context
import signal
import threading
from dataclasses import dataclass
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


@contextlib.contextmanager
def _ctrl_c_held():
    """Hold a Ctrl-C that arrives inside the block until its end, in the main thread (where Python
    runs signal handlers); elsewhere a no-op. The pool's bookkeeping (a worker started, its thread
    started, a task queued) is thereby never cut in half. Nested holds pass the signal outwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held and callable(previous):
            previous(signal.SIGINT, None)  # Python's default handler raises KeyboardInterrupt here
        elif held and previous == signal.SIG_DFL:
            signal.raise_signal(signal.SIGINT)  # what the held signal would have done


class _WorkerProcess(multiprocessing.context.SpawnProcess):
    """A spawned process that starts with SIGINT blocked (only the driver handles Ctrl-C)."""

    started: list | None = None  # the context's list of started workers, set by `_WorkerContext`

    def start(self) -> None:
        with _ctrl_c_held():
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # inherited by the child
            try:
                super().start()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            if self.started is not None:
                self.started.append(self)

    def __getstate__(self) -> dict:  # what spawn sends the child: the parent's bookkeeping stays here
        return {name: value for name, value in self.__dict__.items() if name != "started"}


class _WorkerContext(multiprocessing.context.SpawnContext):
    """The spawn context, with `_WorkerProcess` workers; remembers the started ones to stop them."""

    def __init__(self):
        super().__init__()
        self.started: list[_WorkerProcess] = []

    def Process(self, *args, **kwargs):  # noqa: N802 - the multiprocessing context's name
        process = _WorkerProcess(*args, **kwargs)
        process.started = self.started
        return process


class _Pool(futures.ProcessPoolExecutor):
    """A process pool whose `submit` (which may start a worker and the pool's own thread) is never
    cut in half by Ctrl-C: the signal is held until it returns (`Executor.map` submits through it)."""

    def submit(self, fn, /, *args, **kwargs):
        with _ctrl_c_held():
            return super().submit(fn, *args, **kwargs)


@contextlib.contextmanager
def process_pool(workers: int) -> Iterator[futures.ProcessPoolExecutor]:
    """A pool of `workers` spawned processes that ignore Ctrl-C (see the module docstring). Leaving
    the block normally waits for the pool; leaving it by an exception (Ctrl-C, a closed generator,
    a full disk) terminates the workers and cancels what has not started, so nothing they were
    writing outlives the driver's clean-up."""
    context = _WorkerContext()
    with _ctrl_c_held():
        pool = _Pool(max_workers=workers, mp_context=context)
    try:
        yield pool
    except BaseException:
        for process in context.started:
            if process.is_alive():
                process.terminate()  # the pool sees its workers gone and fails what is left
        raise
    finally:  # one shutdown that waits for the pool's own thread (quick: no unit is left running), so
        with _ctrl_c_held():  # that no thread of it is left at exit, even on a second Ctrl-C
            pool.shutdown(wait=True, cancel_futures=True)


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
        with process_pool(self.workers) as pool:
            pending = {pool.submit(fn, *args): index for index, args in enumerate(tasks)}
            for future in futures.as_completed(pending):
                index = pending[future]
                error = future.exception()
                yield index, (error if error is not None else future.result())


@dataclass(frozen=True)
class ExecutorKind:
    """One `--executor` choice: its factory and its own command-line flags (default: none)."""

    make: Callable[..., Any]  # (workers, **options) -> an executor with `map_unordered`
    add_arguments: Callable[[argparse.ArgumentParser], None] = lambda parser: None
    options_from: Callable[[argparse.Namespace], dict] = lambda args: {}  # the flags given -> factory options

    def __call__(self, workers: int = 1, **options: Any):
        return self.make(workers=workers, **options)

    def flag_names(self) -> set[str]:
        """The names (`args` attributes) of the flags this executor declares."""
        probe = argparse.ArgumentParser(add_help=False)
        self.add_arguments(probe)
        return set(vars(probe.parse_args([])))


def executor_kind(entry: Callable[..., Any]) -> ExecutorKind:
    """An `EXECUTORS` entry as an `ExecutorKind` (a bare factory declares no flags)."""
    return entry if isinstance(entry, ExecutorKind) else ExecutorKind(entry)


def _ray(workers: int = 1, **options: Any):
    try:
        from .ray_executor import RayExecutor  # imports ray (seconds): only when asked for
    except ImportError as error:
        raise ConfigError(f"--executor ray needs Ray: pip install 'wdsprep[ray]' ({error})") from None
    return RayExecutor(workers=workers, **options)


def _local(workers: int = 1, **options: Any) -> LocalExecutor:
    return LocalExecutor(workers)  # no options: a local pool has nothing to tune but its size


def _ray_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ray-address", default=None, help="existing Ray cluster (ray.init(address=...))")
    parser.add_argument("--ray-retries", type=int, default=None, help="attempts after a failed unit on Ray (default 2)")


def _ray_options(args: argparse.Namespace) -> dict:
    options = {"address": args.ray_address, "retries": args.ray_retries}
    return {name: value for name, value in options.items() if value is not None}  # unset: the executor's default


EXECUTORS: dict[str, Callable[..., Any]] = {  # --executor NAME -> ExecutorKind (or a bare factory)
    "local": ExecutorKind(_local),
    "ray": ExecutorKind(_ray, _ray_arguments, _ray_options),
}


def get_executor(name: str, workers: int = 1, **options: Any):
    if name not in EXECUTORS:
        raise ConfigError(f"unknown executor {name!r} (known: {', '.join(sorted(EXECUTORS))})")
    return EXECUTORS[name](workers=workers, **options)
