"""`Kept`: values by key, the most recently used kept while their weights add up to a budget.

The one least-recently-used store of the read side: the shard indexes a process has loaded
(stream/reading/read.py `IndexCache`) and a worker's interleaving schedules (stream/mix.py). Thread-
safe, and a forked child (a DataLoader worker) starts with the parent's values behind a lock of its
own, so a lock held in the parent at the fork never blocks the child. Depends on nothing, so any
module may import it.
"""
from __future__ import annotations

import collections
import os
import threading
from typing import Any, Callable, Hashable


def _one(value: Any) -> int:
    return 1


class Kept:
    """The most recently used values whose `weight`s add up to at most `budget` (each weighs 1 by
    default: the latest `budget`), and always the latest one."""

    def __init__(self, budget: int, weight: Callable[[Any], int] = _one):
        self.budget, self.weight = budget, weight
        self._items: collections.OrderedDict = collections.OrderedDict()  # oldest use first
        self._held = 0  # the kept values' weights together
        self._pid, self._lock = os.getpid(), threading.Lock()

    def _locked(self) -> threading.Lock:
        if self._pid != os.getpid():
            self._pid, self._lock = os.getpid(), threading.Lock()
        return self._lock

    def get(self, key: Hashable) -> Any:
        """The value kept under `key` (now the most recently used), or None."""
        with self._locked():
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: Hashable, value: Any) -> Any:
        """Keep `value` under `key`, dropping the least recently used past the budget; returns it."""
        with self._locked():
            old = self._items.pop(key, None)
            if old is not None:
                self._held -= self.weight(old)
            self._items[key] = value
            self._held += self.weight(value)
            while self._held > self.budget and len(self._items) > 1:
                self._held -= self.weight(self._items.popitem(last=False)[1])
        return value
